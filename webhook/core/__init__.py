"""The pure core: Trainer objects in, scheduling plans and field errors out. No I/O here."""
