"""``analysis.probe``: a draft trained here on a known wiring, probed with real SGLang releases' draft code.

The draft (tests/probe_drafts.py) is trained on ``[hs0, hs2, hs3]`` or on
``[hs1, hs4, hs5]`` of a tiny target whose states each hold one part of the
token; the probe must name the wiring it was trained on, by a clear margin,
from each dump format, and rank the +1-shifted wiring (what a +1 setter
feeds for ids read as ``hs[i]``) far below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import release_package, run_cli  # noqa: E402
from patchcraft.analysis.probe import ProbeInputs, probe, wirings  # noqa: E402
from patchcraft.base.target import resolve_target  # noqa: E402

from probe_drafts import built  # noqa: E402

A, B = (0, 2, 3), (1, 4, 5)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _dump(fmt: str, wiring: tuple[int, ...]) -> tuple[Path, tuple[int, ...] | None]:
    if fmt == "plain":
        return built("plain"), None
    if fmt == "speculators":
        return built("speculators"), tuple(range(6))
    return built("specforge", wiring), wiring


def _probe(version: str, wiring: tuple[int, ...], fmt: str, served: tuple[int, ...] | None):
    data, states = _dump(fmt, wiring)
    tree = resolve_target(str(release_package(version)))
    inputs = ProbeInputs(
        built("draft", wiring), data, tree, states=states, tokens=128, served=served, served_how="test"
    )
    return probe(inputs)


@pytest.mark.parametrize("wiring", [A, B], ids=["hs0-hs2-hs3", "hs1-hs4-hs5"])
@pytest.mark.parametrize("fmt", ["plain", "speculators", "specforge"])
def test_probe_names_the_trained_wiring(fmt: str, wiring: tuple[int, ...]) -> None:
    shifted = tuple(s + 1 for s in wiring) if fmt != "specforge" and max(wiring) < 5 else None
    report = _probe("0.5.10", wiring, fmt, shifted)
    assert report.best.states == wiring
    assert report.best.top1 >= 0.85
    assert report.margin >= 0.25, [(s.states, s.top1) for s in report.scores[:3]]
    if fmt == "specforge":  # the dump holds the trained states only: every other order is far below
        assert report.wirings == 6 and all(s.top1 <= 0.4 for s in report.scores[1:])
    if shifted is not None:
        assert report.served is not None and report.served.score is not None
        assert report.served.score.top1 <= 0.2
        assert report.served.rank is not None and report.served.rank > report.wirings // 2
        assert not report.ok


def test_the_two_drafts_disagree() -> None:
    """Each draft's best wiring is the other's poor one: the probe reads the weights, not the dump."""
    first, second = _probe("0.5.10", A, "plain", B), _probe("0.5.10", B, "plain", A)
    assert first.best.states == A and second.best.states == B
    assert first.served.score.top1 <= 0.2 and second.served.score.top1 <= 0.2


def test_the_layer_stack_release() -> None:
    """0.5.23's llama_eagle3.py (``self.layers``, the legacy-name map, the input layer's branch) reads the same weights."""
    report = _probe("0.5.23", A, "plain", A)
    assert report.best.states == A and report.ok and report.served.rank == 1


def test_wirings_are_ordered_choices_capped_to_layer_order() -> None:
    assert len(wirings((0, 3, 31, 59), 3, 120)) == 24
    assert wirings((0, 3), 3, 120) == []
    capped = wirings(tuple(range(8)), 3, 120)  # 336 ordered, 56 in layer order
    assert len(capped) == 56 and all(list(w) == sorted(w) for w in capped)


def _check_draft_json(capsys, draft: Path, trained_on: str) -> dict:
    code, out, _ = run_cli(
        capsys,
        "check-draft",
        str(draft),
        "--release",
        "0.5.10",
        "--model",
        "llama",
        "--num-layers",
        "6",
        "--trained-on",
        trained_on,
        "--format",
        "json",
    )
    document = json.loads(out)
    document["exit_code"] = code
    return document


def test_check_draft_measured_gives_the_hf_advice(capsys, tmp_path: Path) -> None:
    """``--trained-on measured:REPORT`` on the probed draft: the checks, verdict and fixes of ``hf:`` with the true indices."""
    draft, report = built("draft", A), tmp_path / "probe.json"
    code, _, err = run_cli(
        capsys, "probe", str(draft), "--data", str(built("plain")), "--release", "0.5.10", "--served", "hf:1,3,4",
        "--tokens", "128", "--report", str(report), "--format", "json",
    )  # fmt: skip
    assert code == 1, err
    measured = _check_draft_json(capsys, draft, f"measured:{report}")
    told = _check_draft_json(capsys, draft, "hf:0,2,3")

    def advice(document: dict) -> tuple:
        checks = [(c["name"], c["ok"]) for c in document["checks"]]
        keys = ("exit_code", "suggested_ids", "suggested_after_apply", "suggestion", "fixes")
        return checks, document["trained_on"]["hs"], *(document[k] for k in keys)

    assert advice(measured) == advice(told)
    assert measured["fixes"], "the draft's ids [-1, 1, 2] need apply on 0.5.10: there is a fix to give"
    assert "measured:" in json.dumps(measured) and "measured:" not in json.dumps(told)
