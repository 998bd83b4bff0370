"""Gang backends: each renders the same plan into its own scheduler's objects."""
