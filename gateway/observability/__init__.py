"""What the gateway tells its operator: Prometheus metrics and health."""
