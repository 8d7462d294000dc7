import os

import pytest

from patchcraft.gpu_smoke.engine_args import (
    ALLREDUCE_FUSION_OFF_KEY,
    CUDA_GRAPH_BS_KEYS,
    ENGINE_PATH,
    PREFILL_GRAPH_OFF_KEYS,
    allreduce_fusion_note,
    baseline_generate_kwargs,
    build_engine_kwargs,
    check_engine_kwargs,
    engine_generate_params,
    greedy_sampling_params,
    server_args_fields,
)
from patchcraft.gpu_smoke.wheels import source_reader, wheel_version

from .conftest import _wheel


def test_engine_kwargs_shape():
    kw = build_engine_kwargs("/m", "/d", tp_size=8)
    assert kw["model_path"] == "/m" and kw["tp_size"] == 8
    assert kw["speculative_algorithm"] == "EAGLE3"
    assert kw["speculative_draft_model_path"] == "/d"
    assert kw["skip_tokenizer_init"] is True
    assert kw["disable_cuda_graph"] is False  # CUDA graphs stay on
    assert kw["speculative_eagle_topk"] == 1
    assert kw["speculative_num_draft_tokens"] == kw["speculative_num_steps"] + 1
    assert 0 < kw["mem_fraction_static"] <= 0.5
    assert kw["cuda_graph_max_bs"] == 1 and kw["max_running_requests"] == 1
    assert kw["log_level"] == "warning"
    base = build_engine_kwargs("/m", None, speculative=False)
    assert not any(k.startswith("speculative") for k in base)
    with pytest.raises(ValueError):
        build_engine_kwargs("/m", None)  # speculation without a draft
    sp = greedy_sampling_params(16)
    assert sp["temperature"] == 0.0 and sp["max_new_tokens"] == 16


# What both engines must get, per release (read from the real server_args.py):
# the prefill-side graph off under its release's name (nothing to switch off in
# 0.5.9, where piecewise graphs are opt-in), the decode graph batch-size knob
# under its name, and at tp > 1 the allreduce fusion off where the field exists.
RELEASE_KWARGS = {
    "0.5.9": ({"cuda_graph_max_bs": 1}, False),
    "0.5.10": ({"cuda_graph_max_bs": 1, "disable_piecewise_cuda_graph": True}, True),
    "0.5.14": ({"cuda_graph_max_bs_decode": 1, "disable_prefill_cuda_graph": True}, True),
    "0.5.23": ({"cuda_graph_max_bs_decode": 1, "disable_prefill_cuda_graph": True}, True),
}
RELEASE_SPECIFIC = set(CUDA_GRAPH_BS_KEYS) | set(PREFILL_GRAPH_OFF_KEYS) | {ALLREDUCE_FUSION_OFF_KEY}


@pytest.mark.parametrize("version", sorted(RELEASE_KWARGS))
@pytest.mark.parametrize("tp", [1, 2])
def test_both_engines_get_the_release_switches(version, tp):
    read = source_reader(_wheel(version))
    fields = server_args_fields(read)
    want, has_fusion_field = RELEASE_KWARGS[version]
    want = dict(want, max_running_requests=1)
    if tp > 1 and has_fusion_field:
        want[ALLREDUCE_FUSION_OFF_KEY] = True
    spec = build_engine_kwargs("/m", "/d", tp_size=tp, fields=fields)
    base = build_engine_kwargs("/m", None, tp_size=tp, speculative=False, fields=fields)
    for kw in (spec, base):
        assert {k: kw[k] for k in kw if k in RELEASE_SPECIFIC or k == "max_running_requests"} == want
        assert check_engine_kwargs(kw, read) == []
    assert {k: v for k, v in spec.items() if not k.startswith("speculative")} == base
    note = allreduce_fusion_note(spec)
    if tp == 1:
        assert note == "not applicable (tp 1)"
    elif has_fusion_field:
        assert note.startswith("disabled (enforce_disable_flashinfer_allreduce_fusion=True)")
    else:
        assert note.startswith("release default")
    # the baseline asks for the top-2 logprobs the margin-aware comparison needs
    assert baseline_generate_kwargs(read) == {"return_logprob": True, "top_logprobs_num": 2}


def test_kwargs_match_release_server_args(sglang_wheel):
    read = source_reader(sglang_wheel)
    fields = server_args_fields(read)
    assert {"model_path", "tp_size", "speculative_algorithm", "skip_tokenizer_init"} <= fields
    kw = build_engine_kwargs("/m", "/d", tp_size=2, fields=fields)
    assert check_engine_kwargs(kw, read) == []
    base = build_engine_kwargs("/m", None, speculative=False, fields=fields)
    assert check_engine_kwargs(base, read) == []
    # mutation: an unknown knob is reported
    assert check_engine_kwargs(dict(kw, speculative_bogus_knob=1), read) == [
        "ServerArgs has no field 'speculative_bogus_knob'"
    ]
    if wheel_version(sglang_wheel) == "0.5.23":
        # 0.5.14 renamed the graph batch-size knob and the piecewise switch; the adapted kwargs use the new names
        assert "cuda_graph_max_bs_decode" in kw and "cuda_graph_max_bs" not in kw
        assert check_engine_kwargs(build_engine_kwargs("/m", "/d"), read) == [
            "ServerArgs has no field 'cuda_graph_max_bs'",
            "ServerArgs has no field 'disable_piecewise_cuda_graph'",
        ]
    else:
        assert "cuda_graph_max_bs" in kw


def test_generate_params_parsed_statically():
    src = (
        "class EngineBase:\n    def generate(self, prompt): pass\n"
        "class Engine(EngineBase):\n"
        "    def generate(self, prompt=None, sampling_params=None, input_ids=None, *, return_logprob=False,"
        " top_logprobs_num=None): pass\n"
    )
    read = _reader({ENGINE_PATH: src})
    assert engine_generate_params(read) == {
        "prompt",
        "sampling_params",
        "input_ids",
        "return_logprob",
        "top_logprobs_num",
    }
    assert baseline_generate_kwargs(read) == {"return_logprob": True, "top_logprobs_num": 2}
    old = _reader({ENGINE_PATH: "class Engine:\n    def generate(self, prompt=None, return_logprob=False): pass\n"})
    assert baseline_generate_kwargs(old) == {}  # no top_logprobs_num: exact comparison
    assert engine_generate_params(_reader({})) is None and baseline_generate_kwargs(_reader({})) == {}


def _reader(files):
    return lambda rel: files.get(rel)


def test_field_parser_dataclass_layout():
    src = (
        "from dataclasses import dataclass\n"
        "@dataclass\nclass ServerArgs:\n"
        "    model_path: str\n    tp_size: int = 1\n    _private: int = 0\n"
        "    def method(self):\n        x: int = 3\n"
    )
    assert server_args_fields(_reader({"sglang/srt/server_args.py": src})) == {"model_path", "tp_size"}


def test_field_parser_namespace_layout():
    files = {
        "sglang/srt/server_args.py": (
            "from sglang.srt.arg_groups.fields.spec import Spec\n"
            "from sglang.srt.arg_groups.fields import collect_input_fields\n"
            "class ServerArgs:\n    pass\n"
            "_INPUT_NAMESPACES = [Spec]\n"
            "_a, _d, _n = collect_input_fields(_INPUT_NAMESPACES)\n"
        ),
        "sglang/srt/arg_groups/fields/spec.py": (
            "class Spec:\n    _NS_PATH = 'spec'\n    speculative_algorithm: str = None\n"
        ),
    }
    assert server_args_fields(_reader(files)) == {"speculative_algorithm"}
    del files["sglang/srt/arg_groups/fields/spec.py"]
    with pytest.raises(ValueError, match="Spec"):
        server_args_fields(_reader(files))


def test_wheel_cache_and_offline_failure(tmp_path, monkeypatch):
    """The wheel fixture: a cached wheel without pip, one in $PATCHCRAFT_SGLANG_WHEELS first; offline, a skip."""
    import zipfile

    monkeypatch.setenv("PATCHCRAFT_CACHE", str(tmp_path))
    monkeypatch.delenv("PATCHCRAFT_SGLANG_WHEELS", raising=False)
    (tmp_path / "wheels").mkdir()
    whl = tmp_path / "wheels" / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("sglang/srt/server_args.py", "class ServerArgs:\n    model_path: str = ''\n")
    assert _wheel("9.9.9") == whl  # cached: no pip call
    assert server_args_fields(source_reader(whl)) == {"model_path"}
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / whl.name).write_bytes(whl.read_bytes())
    monkeypatch.setenv("PATCHCRAFT_SGLANG_WHEELS", os.pathsep.join([str(tmp_path / "none"), str(extra)]))
    assert _wheel("9.9.9") == extra / whl.name
    # not cached and no index reachable -> a clean skip
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    with pytest.raises(pytest.skip.Exception, match="sglang==9.9.8 wheel unavailable"):
        _wheel("9.9.8")
