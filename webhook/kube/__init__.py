"""The Kubernetes side: client configuration, watches and the cache they feed."""
