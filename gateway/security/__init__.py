"""Who may call what, and what a call may carry: authentication, scopes, rate and size limits, tool vetting."""
