"""Prometheus metrics: the registry, the gang signals, and the secured /metrics endpoint."""
