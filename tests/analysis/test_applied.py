"""The install after apply, in a private copy: what check-draft proves a fix that names ``patchcraft apply`` on."""

from __future__ import annotations

from conftest import copy_release, release_package
from patchcraft.analysis.applied import applied_model
from patchcraft.analysis.target_model import load_model
from patchcraft.base.target import resolve_target
from patchcraft.engine.records import Mode
from patchcraft.engine.tree_run import run, write_changes
from patchcraft.planning.runner_resets import runner_resets


def test_the_copy_holds_what_apply_writes_and_the_install_is_untouched():
    package = release_package("0.5.10")
    model = load_model(resolve_target(str(package)), "kimi_k25")
    before = (package / "srt" / "models" / "deepseek_v2.py").read_bytes()
    applied = applied_model(model)
    assert applied.model is not None and applied.why == ""
    after = applied.model
    assert after.patched and not model.patched
    assert after.tree.package != package and after.tree.version == model.tree.version
    # The runner is patched there too: no reset before CUDA-graph capture is left.
    assert runner_resets(model.tree) and not runner_resets(after.tree)
    assert "sglang/srt/model_executor/cuda_graph_runner.py" in applied.written
    assert (package / "srt" / "models" / "deepseek_v2.py").read_bytes() == before
    assert applied_model(model) is applied  # one copy per model for the command


def test_a_tree_apply_leaves_as_it_is_has_no_copy(tmp_path):
    package = copy_release("0.5.10", tmp_path)
    write_changes(run(resolve_target(str(package)), Mode.APPLY, ("kimi_k25",)).changes)
    applied = applied_model(load_model(resolve_target(str(package)), "kimi_k25"))
    assert applied.model is None and "would write nothing" in applied.why
