"""The HTTP side: the ASGI apps, JSON logs, and `serve`, which runs them over TLS."""
