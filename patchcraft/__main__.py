from __future__ import annotations

from patchcraft.cli import main

if __name__ == "__main__":
    main()
