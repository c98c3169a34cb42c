"""Configuration: the settings (environment, `.env`), the YAML loader, and the server and security models."""
