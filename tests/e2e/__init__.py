"""End-to-end tests against a real cluster (skipped without one); see README.md here."""
