"""Where the runner reads the aux ids: the draft config on every release, a server flag or none on forks.

Each fork is a copy of 0.5.14 with its runner changed as such a fork changes
it; explain on it must name that place, serve what the runner really
passes, and call a call the setter cannot take a start-up crash.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import release_package
from patchcraft.analysis.explain import explain
from patchcraft.analysis.target_model import load_model
from patchcraft.base.target import resolve_target
from patchcraft.planning.id_source import IdSourceKind, id_source

RUNNER = "srt/model_executor/model_runner.py"
#: 0.5.14's ModelRunner.__init__ reads the draft config's nested ids.
FROM_CONFIG = """                    self.eagle_aux_hidden_state_layer_ids = eagle_config[
                        "eagle_aux_hidden_state_layer_ids"
                    ]
"""
FROM_FLAG = "                    self.eagle_aux_hidden_state_layer_ids = server_args.speculative_eagle_aux_layer_ids\n"
#: Its one configuring call.
CALL = "            self.model.set_eagle3_layers_to_capture(\n                self.eagle_aux_hidden_state_layer_ids\n            )\n"
NO_IDS = "            self.model.set_eagle3_layers_to_capture()\n"
LLAMA_SETTER = "    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):\n"
LEGACY_SETTER = "    def set_eagle3_layers_to_capture(self):\n        layer_ids = None\n"


def fork(release_copy, path: str, old: str, new: str) -> Path:
    package = release_copy("0.5.14")
    file = package / path
    text = file.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path}: {old!r}"
    file.write_text(text.replace(old, new), encoding="utf-8")
    return package


@pytest.mark.parametrize(
    ("version", "read_at"),
    [
        ("0.5.10", "model_runner.py:374"),
        ("0.5.14", "model_runner.py:467"),
        ("0.5.23", "model_runner_components/spec_aux_hidden_state.py:192"),
    ],
)
def test_every_release_reads_the_draft_config_s_eagle_config(version, read_at):
    source = id_source(resolve_target(str(release_package(version))))
    assert source.kind is IdSourceKind.EAGLE_CONFIG and source.from_draft
    assert source.field == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert source.read_at.endswith(read_at)
    assert source.setting((2, 30, 58)) == "set eagle_config.eagle_aux_hidden_state_layer_ids = [2, 30, 58]"


def test_a_fork_that_reads_a_server_flag_is_said_so(release_copy):
    package = fork(release_copy, RUNNER, FROM_CONFIG, FROM_FLAG)
    source = id_source(resolve_target(str(package)))
    assert source.kind is IdSourceKind.SERVER_FLAG and not source.from_draft
    assert source.field == "--speculative-eagle-aux-layer-ids"
    assert "not the draft config" in source.text and "model_runner.py:467" in source.text
    assert source.setting((2, 30, 58)) == "serve with --speculative-eagle-aux-layer-ids 2,30,58"
    result = explain(load_model(resolve_target(str(package)), "llama"), [2, 15, 28], 32, run_code=False)
    assert result.id_source == source and result.served == (3, 16, 29)


def test_a_runner_that_passes_no_ids_serves_the_defaults(release_copy):
    package = fork(release_copy, RUNNER, CALL, NO_IDS)
    source = id_source(resolve_target(str(package)))
    assert source.kind is IdSourceKind.NONE and not source.passes_ids and source.setting((1, 2, 3)) == ""
    result = explain(load_model(resolve_target(str(package)), "llama"), [2, 15, 28], 32, run_code=False)
    assert result.served == result.default_served == (2, 16, 29)
    assert any(w.kind == "legacy" and "runner passes no ids" in w.message for w in result.warnings)


def test_ids_passed_to_a_setter_that_takes_none_crash_at_start_up(release_copy):
    package = fork(release_copy, "srt/models/llama.py", LLAMA_SETTER, LEGACY_SETTER)
    result = explain(load_model(resolve_target(str(package)), "llama"), [2, 15, 28], 32, run_code=False)
    assert result.served == ()  # not "the defaults": the server does not start
    startup = result.findings("startup")
    assert startup and "takes none" in startup[0].message and "model_runner.py:1009" in startup[0].message
    assert "legacy" not in {w.kind for w in result.warnings}


def test_patchcraft_s_runner_edit_is_not_taken_for_the_source(release_copy):
    """After apply, 0.5.10's resets pass ``getattr(runner, "eagle_aux_hidden_state_layer_ids", None)``: still the config's."""
    from patchcraft.engine.records import Mode
    from patchcraft.engine.tree_run import run, write_changes

    package = release_copy("0.5.10")
    write_changes(run(resolve_target(str(package)), Mode.APPLY, ("runner",)).changes)
    source = id_source(resolve_target(str(package)))
    assert source.kind is IdSourceKind.EAGLE_CONFIG and source.read_at.endswith("model_runner.py:374")
    assert source.call == "model_runner.py:668 (ModelRunner.initialize)"


#: 0.5.23's runner passes the ids on as a keyword argument; the reading follows it to what it names.
KEYWORD = "            eagle_aux_hidden_state_layer_ids=self.spec_aux_config.eagle_aux_hidden_state_layer_ids,\n"


def test_a_keyword_spelt_in_another_script_is_still_followed(release_copy):
    """The reading skips runner modules whose text cannot pass the keyword; a fullwidth "e" passes it (Python
    normalises identifiers, NFKC), so the module is read and the keyword followed."""
    package = release_copy("0.5.23")
    file = package / "srt/model_executor/model_runner.py"
    text = file.read_text(encoding="utf-8")
    assert text.count(KEYWORD) == 1
    file.write_text(text.replace(KEYWORD, "            \uff45" + KEYWORD.lstrip()[1:]), encoding="utf-8")
    source = id_source(resolve_target(str(package)))
    assert source.kind is IdSourceKind.EAGLE_CONFIG
    assert source.read_at.endswith("model_runner_components/spec_aux_hidden_state.py:192")


@pytest.mark.parametrize(
    ("text", "passes"),
    [
        ("f(ids=x)", True),
        ("f(\n    ids  # the draft's\n    = x)", True),  # a comment and a line break between: still the keyword
        ("f(ids \\\n = x)", True),  # a backslash continuation
        ("self.ids = x", False),  # an attribute, not a keyword
        ("ids == x", False),
        ("my_ids=x", False),
    ],
)
def test_a_module_is_skipped_only_when_its_text_cannot_pass_the_keyword(text, passes):
    import ast

    from patchcraft.planning.id_source import _may_pass, _Module

    passed = any(k.arg == "ids" for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) for k in n.keywords)
    assert passed is passes  # what Python reads: the case says what it means to
    assert _may_pass(_Module(Path("m.py"), text), "ids") is passes
