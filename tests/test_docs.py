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


def test_the_smoke_extra_has_a_cpu_route_that_satisfies_it() -> None:
    """``pip install 'patchcraft[smoke]'`` on a machine without a GPU pulled the CUDA torch (issue 45, item 9):
    README and docs/harness.md give the CPU build first, and the extra's torch requirement accepts it."""
    import tomllib

    from packaging.requirements import Requirement

    cpu_first = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The CPU harness: `patchcraft[smoke]` without a GPU")[1].split("\n## ")[0]
    assert f"{cpu_first} && pip install 'patchcraft[smoke]'" in section
    harness = (ROOT / "docs" / "harness.md").read_text(encoding="utf-8")
    assert harness.index(cpu_first) < harness.index("pip install 'patchcraft[smoke]'")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    [torch] = [Requirement(r) for r in extras["smoke"] if Requirement(r).name == "torch"]
    assert torch.specifier.contains("2.13.0+cpu", prereleases=True), torch
