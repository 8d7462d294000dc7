#!/usr/bin/env python3
"""Generate docs/coverage.md (the logic is tools/coverage.py).

python scripts/coverage_table.py           # rewrite docs/coverage.md
python scripts/coverage_table.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools.coverage import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], Path(__file__).resolve().parent.parent / "docs" / "coverage.md"))
