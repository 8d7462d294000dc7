#!/usr/bin/env python3
"""Generate docs/coverage.md (the logic is tools/coverage.py).

python scripts/coverage_table.py           # rewrite docs/coverage.md
python scripts/coverage_table.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tools/ is not installed (not in the wheel)

from tools.coverage import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], Path(__file__).resolve().parent.parent / "docs" / "coverage.md"))
