"""A legacy setter (it takes no ids) on a tree whose runner passes ids: the row says the server crashes.

SGLang 0.4.6 has a setter without ids and a runner that calls it without
them, so "ids cannot be passed" is the whole story there. A fork that grew
its own EAGLE-3 code from 0.4.x (SGLang-FluentLLM: ``--eagle3-layers-to-capture``
passed by ``ModelRunner``) keeps Llama's old setter, so the ids are passed
and the call raises TypeError at start-up: the row must say so, as
``explain`` does. The trees are written here from text (no SGLang code).
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

MODEL = """from torch import nn


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList()
        self.layers_to_capture = []

    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(len(self.layers)):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            hidden_states, residual = self.layers[i](positions, hidden_states, forward_batch, residual)
        if len(aux_hidden_states) == 0:
            return hidden_states
        return hidden_states, aux_hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.capture_aux_hidden_states = False

    def set_eagle3_layers_to_capture(self):
        self.capture_aux_hidden_states = True
        num_layers = self.config.num_hidden_layers
        self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]


EntryClass = LlamaForCausalLM
"""

RUNNER = """class ModelRunner:
    def __init__(self, server_args):
        self.eagle3_layers_to_capture = server_args.eagle3_layers_to_capture
        self.model = None

    def initialize(self):
        if self.spec_algorithm.is_eagle3():
            self.model.set_eagle3_layers_to_capture({ids})
"""

ROW = "llama.LlamaForCausalLM"


def tree(tmp_path: Path, ids: str) -> Path:
    package = tmp_path / "fork" / "python" / "sglang"
    (package / "srt" / "models").mkdir(parents=True)
    (package / "srt" / "model_executor").mkdir()
    (package / "__init__.py").write_text("")
    (package / "srt" / "models" / "llama.py").write_text(MODEL)
    (package / "srt" / "model_executor" / "model_runner.py").write_text(RUNNER.format(ids=ids))
    return package


def row(capsys, *argv: str) -> tuple[int, dict]:
    code, out, _ = run_cli(capsys, *argv, "--format", "json")
    return code, {m["model"]: m for m in json.loads(out)["models"]}[ROW]


def test_ids_passed_to_a_legacy_setter_are_a_start_up_crash(tmp_path: Path, capsys) -> None:
    package = tree(tmp_path, "self.eagle3_layers_to_capture")
    code, llama = row(capsys, "verify", str(package))
    assert code == 0 and llama["status"] == "unsupported", llama
    message = llama["message"]
    assert "takes no layer_ids parameter (legacy setter)" in message, message
    assert "ids cannot be passed" not in message, message  # the runner does pass them
    assert "model_runner.py:8 (ModelRunner.initialize) passes ids to it" in message, message
    assert "TypeError" in message and "-1 cannot be requested" in message, message
    # Named, it fails the run, with the same reason.
    code, named = row(capsys, "verify", "--model", "llama", str(package))
    assert code == 1 and named["message"] == message


def test_a_runner_that_calls_it_without_ids_keeps_the_release_reason(tmp_path: Path, capsys) -> None:
    package = tree(tmp_path, "")
    code, llama = row(capsys, "verify", str(package))
    assert code == 0 and llama["status"] == "unsupported", llama
    assert llama["message"].endswith(
        "takes no layer_ids parameter (legacy setter); ids cannot be passed, so -1 cannot be requested"
    ), llama["message"]
