"""Development tools (the release sweep, the coverage table, the CPU harness and torch.compile sweeps); not part of the wheel."""
