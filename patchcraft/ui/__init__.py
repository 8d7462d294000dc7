"""What the user sees: the machine-readable output (exit codes, JSON, GitHub annotations) and the console (every styled byte)."""
