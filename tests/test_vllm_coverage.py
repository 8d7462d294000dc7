"""docs/coverage.md's vLLM section says what ``tools/sweep_vllm.py`` finds (issue 34, coverage).

The section covers every vLLM release from 0.8.5 (``tools.sweep_vllm.RELEASES``);
running the sweep on all of them means fetching each (a ~400 MB wheel once),
so the suite checks the releases it caches anyway: the fast tier runs the
sweep on 0.11.2 (every class) and 0.34.0 (a few classes of each kind), the
full tier (``-m slow``) on a spread, every class, and each compares the rows
with the section's table. Rewrite the section with
``python -m tools.sweep_vllm --all --write-docs`` (or name the releases).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import vllm_release_package
from tools import coverage, sweep_vllm
from tools.sweep_vllm import RELEASES, WHOLE, Row

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "coverage.md"

#: 0.34.0 in the fast tier: a class of each kind (patched, not-needed through the mixin, not-applicable with no
#: capture loop, unsupported wrapper, a setter that crashes), not all 79.
FAST_034 = (
    "deepseek_v2.DeepseekV3ForCausalLM",
    "kimi_k25.KimiK25ForConditionalGeneration",
    "llama.LlamaForCausalLM",
    "mimo.MiMoForCausalLM",
    "llava.LlavaForConditionalGeneration",
    "lilicorr.LiLiCorrForCausalLM",
    "deepseek_v32.nvidia.DeepseekV32ForCausalLM",  # a vllm/models/<family>/ platform module (issue 46)
    "kimi_k3.nvidia.KimiLinearForCausalLM",  # a capture before the layer loop, made a copy (issue 46)
)


def _documented(version: str) -> dict[str, Row]:
    rows = [r for r in sweep_vllm.documented(PAGE.read_text(encoding="utf-8")) if r.release == version]
    return {r.cls: r for r in rows}


def _compare(version: str, found: list[Row], every: bool) -> None:
    documented = _documented(version)
    assert found, f"the sweep found no row for {version}"
    stale = (
        f"docs/coverage.md's vLLM rows of {version} are stale: run python -m tools.sweep_vllm {version} --write-docs"
    )
    for row in found:
        assert row.cls != WHOLE, f"{version}: {row.defaults}"
        assert documented.get(row.cls) == row, f"{stale}\n  swept:      {row}\n  documented: {documented.get(row.cls)}"
    if every:
        assert set(documented) == {r.cls for r in found}, stale


def test_the_section_names_every_release_and_counts_its_rows() -> None:
    text = PAGE.read_text(encoding="utf-8")
    _, section, _ = sweep_vllm.split_page(text)
    assert section is not None and text.count(sweep_vllm.START) == 1
    counts = section.partition("### Counts per release")[2].partition("###")[0]
    listed = re.findall(r"^\| (0\.[0-9.a-z]+) \| (\d+|[^|]+) \|", counts, flags=re.M)
    assert [v for v, _ in listed] == list(RELEASES), "a release is missing from the counts (none is skipped silently)"
    rows = sweep_vllm.documented(text)
    for version, classes in listed:
        mine = [r for r in rows if r.release == version]
        assert mine, f"{version} has no row in the table"
        if classes.isdigit():
            assert len(mine) == int(classes), f"{version}: the counts say {classes} classes, the table has {len(mine)}"
        else:  # not fetched or not followed: one row says why
            assert [r.cls for r in mine] == [WHOLE] and mine[0].defaults == classes.strip()
    # the section renders back to itself from its rows (so a partial --write-docs keeps the others)
    wall = section.partition("The last `--all` run took ")[2].partition(".\n")[0]
    assert sweep_vllm.render(rows, wall) == section


def test_coverage_table_keeps_the_section_before_the_release_history() -> None:
    from tools.sweep import START as HISTORY

    text = PAGE.read_text(encoding="utf-8")
    section = coverage.vllm()
    assert section and section in text and text.index(section) < text.index(HISTORY)
    assert section in coverage.render([], [])
    assert sweep_vllm.START not in coverage.render([], [], vllm_section="")


def test_write_docs_replaces_only_the_named_releases(tmp_path: Path) -> None:
    page = tmp_path / "coverage.md"
    text = PAGE.read_text(encoding="utf-8")
    page.write_text(text, encoding="utf-8")
    documented = [r for r in sweep_vllm.documented(text) if r.release == "0.11.2"]
    sweep_vllm.write_docs(documented, page)
    assert page.read_text(encoding="utf-8") == text
    changed = [Row(**{**r.__dict__, "patch": "unsupported: planted"}) for r in documented[:1]]
    sweep_vllm.write_docs(changed, page)
    after = sweep_vllm.documented(page.read_text(encoding="utf-8"))
    assert [r for r in after if r.release == "0.11.2"] == changed
    assert [r for r in after if r.release != "0.11.2"] == [
        r for r in sweep_vllm.documented(text) if r.release != "0.11.2"
    ]


def test_write_docs_with_classes_replaces_only_their_rows(tmp_path: Path) -> None:
    """``--class``: one class's rows of a release are rewritten, every other row of that release kept."""
    page = tmp_path / "coverage.md"
    text = PAGE.read_text(encoding="utf-8")
    page.write_text(text, encoding="utf-8")
    before = sweep_vllm.documented(text)
    mimo = next(r for r in before if r.release == "0.11.2" and r.cls == "mimo.MiMoForCausalLM")
    changed = Row(**{**mimo.__dict__, "patch": "unsupported: planted"})
    sweep_vllm.write_docs([changed], page, only=[mimo.cls])
    after = sweep_vllm.documented(page.read_text(encoding="utf-8"))
    assert after == [changed if r == mimo else r for r in before]


def test_an_unfetchable_release_is_a_row_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(version: str) -> Path:
        raise RuntimeError("pip could not download vllm==9.9.9: no such version")

    monkeypatch.setattr(sweep_vllm, "fetch", refuse)
    (row,) = sweep_vllm.sweep("9.9.9")
    assert row.cls == WHOLE and row.defaults.startswith("not fetched: pip could not download")


def test_fast_011_every_class() -> None:
    _compare("0.11.2", sweep_vllm.sweep("0.11.2", vllm_release_package("0.11.2")), every=True)


def test_fast_034_a_class_of_each_kind() -> None:
    found = sweep_vllm.sweep("0.34.0", vllm_release_package("0.34.0"), only=FAST_034)
    assert {r.cls for r in found} == set(FAST_034)
    _compare("0.34.0", found, every=False)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.9.2", "0.17.0", "0.18.0", "0.33.0", "0.34.0"])
def test_spread_every_class(version: str) -> None:
    _compare(version, sweep_vllm.sweep(version, vllm_release_package(version)), every=True)
