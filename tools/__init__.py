"""Development tools over the real CLI (the release sweep, the coverage table); not part of the wheel."""
