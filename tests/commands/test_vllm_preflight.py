"""``patchcraft run``'s vLLM preflight, in process, on the fetched 0.34.0 tree as released (no overlay, no vLLM)
and on a private patched copy of it (what the overlay serves).

The judge is ``check-draft --engine vllm``'s (:func:`patchcraft.analysis.vllm_draft_check.check_vllm_draft`): a
refusal prints its report, the failing checks and the fixes proven by running the whole check again. The
end-to-end runs, with the overlay and a stand-in server, are tests/commands/test_run_vllm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import vllm_release_package
from drafts import HIDDEN, LAYERS, kimi_target, sglang_draft, speculators_draft
from patchcraft.base.errors import PatchcraftError
from patchcraft.commands._vllm_preflight import run_vllm_preflight

APPLY = "`patchcraft apply --engine vllm {package} --model deepseek_v2.{cls}`"


def _argv(tmp_path: Path, ids: list[int], **speculative) -> list[str]:
    config = {"method": "eagle3", "model": str(speculators_draft(tmp_path / "draft", ids)), **speculative}
    return ["vllm", "serve", str(kimi_target(tmp_path / "kimi")), "--speculative-config", json.dumps(config)]


def _serve(target: Path, draft: Path) -> list[str]:
    return ["vllm", "serve", str(target), "--speculative-config", json.dumps({"method": "eagle3", "model": str(draft)})]


def _deepseek_v3(directory: Path) -> Path:
    """A DeepSeek-V3-shaped target config (the Kimi incident's language model, served directly)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_hidden_layers": LAYERS,
        "hidden_size": HIDDEN,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _patched() -> Path:
    """0.34.0 after `patchcraft apply --engine vllm` (a private copy; the fetched tree is never written)."""
    from patchcraft.analysis.vllm_applied import applied_vllm_tree
    from patchcraft.base.vllm_tree import resolve_vllm_target

    applied = applied_vllm_tree(
        resolve_vllm_target(str(vllm_release_package("0.34.0"))), "deepseek_v2.DeepseekV3ForCausalLM"
    )
    assert applied.tree is not None, applied.why
    return applied.tree.package


def test_the_unpatched_release_is_refused_for_id_0(tmp_path: Path, capsys) -> None:
    """check-draft's report: the failing run check, and the fix proven with the vLLM patch."""
    pytest.importorskip("torch")
    package = vllm_release_package("0.34.0")
    code = run_vllm_preflight(_argv(tmp_path, [0, 3, 31]), package, None)
    out, err = capsys.readouterr()
    assert code == 1 and "refused to launch" in err and "--no-preflight" in err, err
    assert "  FAIL  run          vLLM will crash in the forward: TypeError" in out, out
    assert "mismatch: vLLM will crash in the forward" in out
    assert (
        "suggested: keep top-level eagle_aux_hidden_state_layer_ids = [0, 3, 31] after "
        + APPLY.format(package=package, cls="DeepseekV2ForCausalLM")
        + " [proven by running the code on the CPU harness: vLLM 0.34.0 feeds hs[0], hs[3], hs[31]]"
    ) in out


def test_ids_without_0_are_launched_as_trained(tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    code = run_vllm_preflight(_argv(tmp_path, [2, 30, 58]), vllm_release_package("0.34.0"), None)
    out, err = capsys.readouterr()
    assert code == 0 and out == "", out
    assert "patchcraft run: ok: vLLM will feed the draft [hs[2], hs[30], hs[58]], as trained" in err
    assert "patchcraft run: trained  hs[2], hs[30], hs[58] (speculators" in err, err


def test_a_draft_the_old_judge_launched_is_refused_with_check_draft_s_fix(tmp_path: Path, capsys) -> None:
    """Where the two judges differed: ids only in eagle_config.layer_ids, trained on hf:2,30,58.

    The preflight's former judge (analysis.vllm_launch_check, removed) read the top-level ids alone (none: the
    defaults [2, 30, 58], as trained) and launched;
    0.34.0's default runner (V2) reads eagle_config.layer_ids and feeds hs[3], hs[31], hs[59]. check-draft's
    judge refuses and prints the proven fix: the trained ids at the top level, read first.
    """
    pytest.importorskip("torch")
    draft = sglang_draft(tmp_path / "draft", None)
    config = json.loads((draft / "config.json").read_text())
    config["eagle_config"] = {"layer_ids": [3, 31, 59]}
    (draft / "config.json").write_text(json.dumps(config))
    argv = _serve(kimi_target(tmp_path / "kimi"), draft)
    code = run_vllm_preflight(argv, vllm_release_package("0.34.0"), "hf:2,30,58")
    out, err = capsys.readouterr()
    assert code == 1 and "refused to launch" in err, out + err
    assert "ids [3, 31, 59] from eagle_config.layer_ids" in out
    assert (
        "  FAIL  convention   vLLM will feed hs[3], hs[31], hs[59] but the draft was trained on hs[2], hs[30], hs[58]"
        in out
    )
    assert (
        "suggested: set top-level eagle_aux_hidden_state_layer_ids = [2, 30, 58] (this vLLM tree as it is: no patch "
        "needed) [proven by running the code on the CPU harness: vLLM 0.34.0 feeds hs[2], hs[30], hs[58]]"
    ) in out
    # The fix, applied: launched.
    config["eagle_aux_hidden_state_layer_ids"] = [2, 30, 58]
    (draft / "config.json").write_text(json.dumps(config))
    assert run_vllm_preflight(argv, vllm_release_package("0.34.0"), "hf:2,30,58") == 0


def test_the_kimi_incident_draft_on_deepseek_v3_unpatched_and_patched(tmp_path: Path, capsys) -> None:
    """The incident's draft (ids only in eagle_config, trained on hf:0,3,31) on 0.34.0 DeepSeek-V3: refused on
    both trees, with the fix each needs; the fixed config is launched on the patched tree and refused unpatched."""
    pytest.importorskip("torch")
    draft = sglang_draft(tmp_path / "draft", [2, 30, 58])
    argv = _serve(_deepseek_v3(tmp_path / "dsv3"), draft)
    unpatched, patched = vllm_release_package("0.34.0"), _patched()
    fed = "[proven by running the code on the CPU harness: vLLM 0.34.0 feeds hs[0], hs[3], hs[31]]"

    assert run_vllm_preflight(argv, unpatched, "hf:0,3,31") == 1
    out, err = capsys.readouterr()
    assert (
        "  FAIL  convention   vLLM will feed hs[2], hs[30], hs[58] but the draft was trained on hs[0], hs[3], hs[31]"
        in out
    )
    assert (
        f"suggested: set top-level eagle_aux_hidden_state_layer_ids = [0, 3, 31] after {APPLY.format(package=unpatched, cls='DeepseekV3ForCausalLM')} {fed}"
        in out
    ), out
    assert "[0, 3, 31] this vLLM tree as it is: run: vLLM will crash in the forward: TypeError" in out
    assert "refused to launch" in err

    assert run_vllm_preflight(argv, patched, "hf:0,3,31") == 1
    out, err = capsys.readouterr()
    assert (
        f"suggested: set top-level eagle_aux_hidden_state_layer_ids = [0, 3, 31] (this vLLM tree as it is: no patch "
        f"needed) {fed}"
    ) in out, out
    assert "refused to launch" in err

    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [0, 3, 31]}))
    assert run_vllm_preflight(argv, patched, "hf:0,3,31") == 0
    out, err = capsys.readouterr()
    assert out == "" and "ok: vLLM will feed the draft [hs[0], hs[3], hs[31]], as trained" in err, out + err
    assert run_vllm_preflight(argv, unpatched, "hf:0,3,31") == 1
    out, _ = capsys.readouterr()
    assert "  FAIL  run          vLLM will crash in the forward: TypeError" in out


def test_other_states_than_trained_and_a_short_fc_are_refused(tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    package = vllm_release_package("0.34.0")
    assert run_vllm_preflight(_argv(tmp_path, [2, 30, 58]), package, "hf:3,31,59") == 1
    out, _ = capsys.readouterr()
    assert "mismatch: vLLM will feed hs[2], hs[30], hs[58] but the draft was trained on hs[3], hs[31], hs[59]" in out
    assert "suggested: set top-level eagle_aux_hidden_state_layer_ids = [3, 31, 59]" in out
    assert run_vllm_preflight(_argv(tmp_path / "two", [30, 58]), package, None) == 1  # the fc takes three states
    out, _ = capsys.readouterr()
    assert "  FAIL  fc-width     the draft's fc takes 21504 inputs but vLLM will feed 2 states" in out, out


def test_a_target_config_without_an_architecture_is_not_checked(tmp_path: Path) -> None:
    target = tmp_path / "bare"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 61, "hidden_size": 7168}))
    argv = _serve(target, speculators_draft(tmp_path / "draft", [2, 30, 58]))
    with pytest.raises(PatchcraftError, match="names no architecture.*--no-preflight"):
        run_vllm_preflight(argv, vllm_release_package("0.34.0"), None)


def test_no_torch_is_not_checked(tmp_path: Path, monkeypatch) -> None:
    """Without torch, vLLM's code does not run: one line naming --no-preflight, never an ok."""
    import dataclasses

    from patchcraft.analysis import vllm_draft_check

    real = vllm_draft_check.explain_vllm
    monkeypatch.setattr(vllm_draft_check, "_EXPLAINED", type(vllm_draft_check._EXPLAINED)())
    monkeypatch.setattr(
        vllm_draft_check, "explain_vllm", lambda *a, **k: dataclasses.replace(real(*a, **k), ran=False, fed="not run")
    )
    with pytest.raises(PatchcraftError, match="torch is not installed.*--no-preflight"):
        run_vllm_preflight(_argv(tmp_path, [2, 30, 58]), vllm_release_package("0.34.0"), None)


def test_a_launch_without_eagle3_has_nothing_to_check(tmp_path: Path) -> None:
    package = vllm_release_package("0.34.0")
    assert run_vllm_preflight(["vllm", "serve", "m"], package, None) == 0
    ngram = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    assert run_vllm_preflight(["vllm", "serve", "m", "--speculative-config", ngram], package, None) == 0


@pytest.mark.parametrize(
    "change, words",
    [
        ({"method": None}, "names no method"),
        ({"model": None}, "names no draft"),
        ({"model": "org/not-cached"}, "not in the local Hugging Face cache"),
    ],
)
def test_what_cannot_be_checked_is_never_ok(tmp_path: Path, monkeypatch, change: dict, words: str) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    argv = _argv(tmp_path, [2, 30, 58])
    config = {k: v for k, v in {**json.loads(argv[-1]), **change}.items() if v is not None}
    argv[-1] = json.dumps(config)
    with pytest.raises(PatchcraftError) as raised:
        run_vllm_preflight(argv, vllm_release_package("0.34.0"), None)
    assert words in str(raised.value) and "--no-preflight" in str(raised.value)


def test_pipeline_parallel_is_not_read(tmp_path: Path) -> None:
    with pytest.raises(PatchcraftError, match="--pipeline-parallel-size 2.*--no-preflight"):
        run_vllm_preflight(_argv(tmp_path, [2, 30, 58]) + ["-pp", "2"], vllm_release_package("0.34.0"), None)
