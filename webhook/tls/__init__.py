"""TLS: development certificates and hot-reloaded server contexts."""
