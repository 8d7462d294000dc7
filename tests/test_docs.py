"""Generated docs stay in step with the code that generates them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_transforms_page_is_generated_from_the_examples() -> None:
    result = subprocess.run([sys.executable, "scripts/document_transforms.py", "--check"], cwd=ROOT)
    assert result.returncode == 0, "docs/transforms.md is stale: run python scripts/document_transforms.py"


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "pip install -e '.[test]' && python -m pytest"
    assert command in readme and command in ci
