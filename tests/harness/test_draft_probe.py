"""``harness.draft_probe``: SGLang's llama_eagle3.py, run on stand-ins, computes what the training forward computed."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import release_package  # noqa: E402
from patchcraft.base.errors import PatchcraftError  # noqa: E402
from patchcraft.harness import draft_probe as probe  # noqa: E402
from patchcraft.harness.probe_standins import DRAFT_NAMES  # noqa: E402
from patchcraft.reading.checkpoint_tensors import checkpoint_tensors  # noqa: E402

import probe_drafts as drafts  # noqa: E402

A = (0, 2, 3)


def _step(version: str, draft: Path, tensors=None):
    package = release_package(version)
    eagle3 = probe.DraftSource(package / "srt/models/llama_eagle3.py", DRAFT_NAMES)
    llama = probe.DraftSource(package / "srt/models/llama.py", DRAFT_NAMES)
    import json

    config = json.loads((draft / "config.json").read_text())
    tensors = tensors or checkpoint_tensors(draft)
    shape = probe.draft_shape(config, tensors["fc.weight"].shape[1], eagle3)
    loaded = probe.load_draft(eagle3, shape, tensors, torch.float32)
    return probe.DraftStep(
        eagle3, llama, shape, loaded, loaded.weights["model.embed_tokens.weight"].float(), torch.float32
    ), loaded


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_sglang_code_agrees_with_the_training_forward(version: str) -> None:
    torch.set_num_threads(1)
    draft = drafts.built("draft", A)
    step, loaded = _step(version, draft)
    model = drafts.TinyDraft(3)
    weights = checkpoint_tensors(draft)
    with torch.no_grad():
        for name, value in model.named().items():
            value.copy_(probe.tensor_of(weights[name]).float())
    target, used = drafts.TinyTarget(), drafts.vocabulary()
    assert torch.equal(loaded.hot_token_id, used)  # d2t + arange: the draft id's target id
    for ids in drafts.sequences(6, seed=9):
        states = [s.to(torch.bfloat16).float() for s in target.states(ids)]
        hidden = [states[k][:-2] for k in A]
        ours = step.logits(ids[1:-1], hidden)
        with torch.no_grad():
            theirs = model(target.embed[ids[1:-1]].bfloat16().float()[None], torch.cat(hidden, -1)[None])[0]
        # float32 on both sides: the same function up to rounding (rope, norms, attention, MLP, lm_head)
        assert torch.allclose(ours, theirs, atol=1e-3, rtol=1e-3), (ours - theirs).abs().max()
        assert torch.equal(step.top_k(ids[1:-1], hidden, 1)[:, 0], used[theirs.argmax(-1)])


def test_a_tensor_load_weights_puts_nowhere_is_missing() -> None:
    draft = drafts.built("draft", A)
    tensors = checkpoint_tensors(draft)
    tensors["fcx.weight"] = tensors.pop("midlayer.hidden_norm.weight")  # a name SGLang's loader skips
    package = release_package("0.5.10")
    eagle3 = probe.DraftSource(package / "srt/models/llama_eagle3.py", DRAFT_NAMES)
    import json

    shape = probe.draft_shape(json.loads((draft / "config.json").read_text()), 96, eagle3)
    loaded = probe.load_draft(eagle3, shape, tensors, torch.bfloat16)
    assert loaded.missing == ("model.midlayer.hidden_norm.weight",)


def test_a_shape_the_config_does_not_build_is_one_line() -> None:
    draft = drafts.built("draft", A)
    tensors = checkpoint_tensors(draft)
    package = release_package("0.5.10")
    eagle3 = probe.DraftSource(package / "srt/models/llama_eagle3.py", DRAFT_NAMES)
    import json

    config = json.loads((draft / "config.json").read_text())
    config["intermediate_size"] = 32
    shape = probe.draft_shape(config, 96, eagle3)
    with pytest.raises(
        PatchcraftError, match="gate_up_proj.weight is \\[128, 32\\], but llama_eagle3.py builds it as \\[64, 32\\]"
    ):
        probe.load_draft(eagle3, shape, tensors, torch.bfloat16)


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_an_fc_the_release_does_not_build_is_one_line(version: str) -> None:
    """0.5.10 sizes the fc for three states; 0.5.23 for num_aux_hidden_states (else the config's ids, else 3)."""
    import json

    draft = drafts.built("draft", A)
    eagle3 = probe.DraftSource(release_package(version) / "srt/models/llama_eagle3.py", DRAFT_NAMES)
    config = json.loads((draft / "config.json").read_text())
    with pytest.raises(PatchcraftError, match="builds its fc for 3 states of 32 \\(96\\): SGLang would not load it"):
        probe.draft_shape(config, 128, eagle3)
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2, 3]
    if version == "0.5.23":
        assert probe.draft_shape(config, 128, eagle3).states == 4
    else:
        with pytest.raises(PatchcraftError, match="builds its fc for 3 states"):
            probe.draft_shape(config, 128, eagle3)
