"""Orchestration tests: pure helpers, the probe, and run_cuda_smoke end to end
against a *fake* sglang package (real SGLang needs a GPU).

The fake package has the same module layout the probe relies on
(``sglang/srt/model_executor/model_runner.py`` with ``ModelRunner.forward``)
and an ``Engine`` that replays forward batches prepared by the test from the
Hugging Face reference, so the whole chain - temporary probed copy, child
processes, PYTHONPATH order, recording, record assignment, comparison,
summary and exit code - runs on a CPU.
"""

import hashlib
import json
import textwrap

import pytest

from patchcraft.ui import console
from patchcraft.ui.machine_output import verdict_code
from patchcraft.base.errors import PatchcraftError
from patchcraft.gpu_smoke import probe_records as records
from patchcraft.gpu_smoke import cuda_smoke as smoke
from patchcraft.gpu_smoke.engine_args import build_engine_kwargs
from patchcraft.harness.gpu_summary import engine_failure


# ---------------------------------------------------------------- helpers


def test_default_layer_ids_and_prompts():
    assert smoke.default_layer_ids(4) == [-1, 1, 2]
    assert smoke.default_layer_ids(61) == [-1, 1, 30]
    with pytest.raises(ValueError):
        smoke.default_layer_ids(2)
    p = smoke.make_prompts(256)
    assert p == smoke.make_prompts(256) and [len(x) for x in p] == [7, 16, 29, 48]
    assert all(2 <= t < 256 for x in p for t in x)
    big = smoke.make_prompts(163840)
    assert all(1000 <= t < 100000 for x in big for t in x)


def _rec(torch, seq, mode, ids, pos, width=6, bs=1):
    return {
        "seq": seq,
        "pid": 1,
        "mode": mode,
        "batch_size": bs,
        "input_ids": torch.tensor(ids),
        "positions": torch.tensor(pos),
        "hidden_states": torch.zeros(len(ids), width),
    }


def test_assign_records():
    torch = pytest.importorskip("torch")
    prompts = [[5, 6, 7], [8, 9]]
    outputs = [[10, 11, 12], [13, 14]]
    recs = [
        _rec(torch, 0, "DECODE", [0, 0], [0, 0]),  # graph-capture dummy run
        _rec(torch, 1, "EXTEND", [5, 6, 7], [0, 1, 2]),
        _rec(torch, 2, "TARGET_VERIFY", [10, 99, 98], [3, 4, 5]),
        _rec(torch, 3, "TARGET_VERIFY", [11, 12, 97], [4, 5, 6]),
        _rec(torch, 4, "TARGET_VERIFY", [50, 1, 2], [5, 6, 7]),  # not the output token
        _rec(torch, 5, "EXTEND", [8, 9], [0, 1]),
        _rec(torch, 6, "TARGET_VERIFY", [13, 1, 1], [2, 4, 5]),  # not a chain
        _rec(torch, 7, "TARGET_VERIFY", [13, 3, 3], [2, 3, 4], bs=2),
    ]
    a = records.assign_records(list(reversed(recs)), prompts, outputs)  # order restored by seq
    got = [(i.phase, i.prompt, i.sequence, i.positions) for i in a.items]
    assert got == [
        ("prefill", 0, [5, 6, 7], [0, 1, 2]),
        ("verify", 0, [5, 6, 7, 10, 99, 98], [3, 4, 5]),
        ("verify", 0, [5, 6, 7, 10, 11, 12, 97], [4, 5, 6]),
        ("prefill", 1, [8, 9], [0, 1]),
    ]
    assert sum(a.skipped.values()) == 4


def test_render_engine_failure():
    summary = engine_failure(2, "sglang engine run timed out after 8s (log: /w/spec.log)", "/w")
    assert verdict_code(summary.ok) == 1 and not summary.ok
    assert console.render_cuda_smoke(summary) == (
        "patchcraft smoke (cuda, tp=2): FAIL\n"
        "  [FAIL] sglang run: sglang engine run timed out after 8s (log: /w/spec.log)\n"
        "  files  /w"
    )


def test_no_cuda_is_an_environment_error(monkeypatch):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(PatchcraftError, match="CUDA is not available"):
        smoke.run_cuda_smoke(1, output_format="text")


def test_missing_sglang_is_an_environment_error(monkeypatch):
    monkeypatch.setattr(smoke, "_check_cuda", lambda tp: 1)
    monkeypatch.setattr(smoke.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PatchcraftError, match="sglang is not installed"):
        smoke.run_cuda_smoke(None, output_format="json")


def test_a_programming_error_is_not_an_environment_error(monkeypatch, tmp_path):
    """Only the environment's failures become exit 2; a bug keeps its traceback (the CLI's exit 3)."""
    monkeypatch.setattr(smoke, "_check_cuda", lambda tp: 1)
    monkeypatch.setattr(smoke, "_sglang_package", lambda: tmp_path)

    def bug(package):
        raise TypeError("a bug")

    monkeypatch.setattr(smoke, "source_reader", bug)
    with pytest.raises(TypeError, match="a bug"):
        smoke.run_cuda_smoke(None, output_format="json")


# ---------------------------------------------------------------- probe


def _fake_sglang(root, engine_kwargs_fields):
    pkg = root / "sglang"
    (pkg / "srt" / "model_executor").mkdir(parents=True)
    (pkg / "srt" / "speculative").mkdir(parents=True)
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "model_executor" / "__init__.py").write_text("")
    (pkg / "srt" / "speculative" / "spec_info.py").write_text("EAGLE3 = 'EAGLE3'\n")
    fields = "".join(f"    {k}: object = None\n" for k in sorted(engine_kwargs_fields))
    (pkg / "srt" / "server_args.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass ServerArgs:\n" + fields
    )
    (pkg / "srt" / "entrypoints").mkdir(parents=True)
    (pkg / "srt" / "entrypoints" / "engine.py").write_text(  # read statically, as the real one is
        "class Engine:\n"
        "    def generate(self, prompt=None, sampling_params=None, input_ids=None,\n"
        "                 return_logprob=False, logprob_start_len=None, top_logprobs_num=None):\n"
        "        pass\n"
    )
    (pkg / "srt" / "model_executor" / "model_runner.py").write_text(
        textwrap.dedent("""
        import types

        class ModelRunner:
            def __init__(self, is_draft_worker=False, tp_rank=0):
                self.is_draft_worker = is_draft_worker
                self.tp_rank = tp_rank

            def forward(self, forward_batch, skip_attn_backend_init=False):
                out = types.SimpleNamespace(hidden_states=forward_batch.fake_hs)
                return types.SimpleNamespace(logits_output=out)
    """)
    )
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        import json, os, types
        __version__ = "0.0.0+fake"

        class Engine:
            def __init__(self, **kw):
                self.spec = kw.get("speculative_algorithm") == "EAGLE3"
                if os.environ.get("FAKE_SGLANG_HANG"):
                    import subprocess, sys, time
                    # a child like SGLang's scheduler: must not outlive the timeout
                    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
                    with open(os.environ["FAKE_SGLANG_HANG"], "w") as f:
                        f.write(str(child.pid))
                    time.sleep(300)
                with open(os.environ["FAKE_SGLANG_SCRIPT"]) as f:
                    self.script = json.load(f)
                if self.spec:
                    import torch
                    from sglang.srt.model_executor.model_runner import ModelRunner
                    self.torch = torch
                    self.forwards = torch.load(os.environ["FAKE_SGLANG_FORWARDS"])
                    self.target, self.draft = ModelRunner(), ModelRunner(is_draft_worker=True)
                    self._run({"mode": "DECODE", "ids": [0, 0], "pos": [0, 0],
                               "hs": torch.zeros(2, 3)})  # graph-capture dummy batch

            def _run(self, f):
                t = self.torch
                fb = types.SimpleNamespace(
                    forward_mode=types.SimpleNamespace(name=f["mode"]), batch_size=1,
                    input_ids=t.tensor(f["ids"]), positions=t.tensor(f["pos"]), fake_hs=f["hs"])
                self.target.forward(fb)
                fb.fake_hs = f["hs"][:, :2]
                self.draft.forward(fb)  # draft outputs are never recorded

            def generate(self, input_ids, sampling_params, return_logprob=False, top_logprobs_num=None):
                key = json.dumps(input_ids)
                entry = self.script[key]
                if isinstance(entry, dict):  # {"spec": [...], "base": [...], "margins": [...]}
                    out, margins = entry["spec" if self.spec else "base"], entry["margins"]
                else:
                    out, margins = entry, [2.0] * len(entry)
                out = out[: sampling_params["max_new_tokens"]]
                meta = {"completion_tokens": len(out)}
                if return_logprob and top_logprobs_num:
                    meta["output_top_logprobs"] = [
                        [(-0.1, t, None), (-0.1 - m, (t + 1) % 256, None)][:top_logprobs_num]
                        for t, m in zip(out, margins)
                    ]
                if self.spec:
                    for f in self.forwards[key]:
                        self._run(f)
                    meta["spec_verify_ct"] = len(out)
                return {"output_ids": out, "meta_info": meta}

            def shutdown(self):
                pass
    """)
    )
    return pkg


def test_probe_is_added_to_a_copy_only(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from patchcraft.gpu_smoke import probe

    pkg = _fake_sglang(tmp_path / "site", ["model_path"])
    runner = pkg / "srt" / "model_executor" / "model_runner.py"
    before = runner.read_bytes()
    root = probe.make_probed_sglang_copy(pkg, tmp_path / "copy")
    assert runner.read_bytes() == before  # installation untouched
    copied = (root / "sglang" / "srt" / "model_executor" / "model_runner.py").read_text()
    assert copied.startswith(before.decode()) and probe.MARKER in copied
    assert (root / "sglang" / "srt" / f"{probe.PROBE_MODULE}.py").is_file()

    # the wrapper records target batches on rank 0 only
    ns = {}
    exec(compile(before, str(runner), "exec"), ns)
    MR = ns["ModelRunner"]
    probe.install(MR)
    probe.install(MR)  # idempotent
    out_dir = tmp_path / "rec"
    out_dir.mkdir()
    monkeypatch.setenv(probe.ENV_DIR, str(out_dir))

    class FB:
        forward_mode = type("M", (), {"name": "EXTEND"})()
        batch_size = 1
        input_ids = torch.tensor([3, 4])
        positions = torch.tensor([0, 1])
        fake_hs = torch.ones(2, 6)

    res = MR().forward(FB())
    assert torch.equal(res.logits_output.hidden_states, FB.fake_hs)
    MR(is_draft_worker=True).forward(FB())
    MR(tp_rank=1).forward(FB())
    files = sorted(out_dir.glob("rec-*.pt"))
    assert len(files) == 1
    rec = torch.load(str(files[0]))
    assert rec["mode"] == "EXTEND" and rec["input_ids"].tolist() == [3, 4]
    assert torch.equal(rec["hidden_states"], FB.fake_hs)


# ---------------------------------------------------------------- end to end


def _prepare(tmp_path, hf_model, bug=None, n_new=5, flip=None):
    """Script the fake engine from the HF reference; ``bug`` corrupts verify batches.

    ``flip``: the baseline's output for prompt 0 parts from the speculative one
    at token 2, where its top-2 margin is 0.05 (``"near-tie"``) or 1.0 (``"clear"``).
    """
    import torch

    from patchcraft.gpu_smoke.checkpoint import hf_reference_hidden_states

    prompts = smoke.make_prompts(256)
    script, forwards = {}, {}
    for p in prompts:
        out = [(sum(p) + 7 * i) % 250 + 2 for i in range(n_new)]
        full = p + out
        key = json.dumps(p)
        script[key] = out
        if flip and p == prompts[0]:
            margins = [2.0] * n_new
            margins[2] = 0.05 if flip == "near-tie" else 1.0
            script[key] = {"spec": out, "base": out[:2] + [(t + 3) % 250 + 2 for t in out[2:]], "margins": margins}
        fw = []

        def aux(seq, rows, which=(0, 2, 3)):
            hs = hf_reference_hidden_states(hf_model, seq)
            return torch.cat([hs[k][rows] for k in which], -1).to(torch.bfloat16).float()

        fw.append({"mode": "EXTEND", "ids": p, "pos": list(range(len(p))), "hs": aux(p, list(range(len(p))))})
        for s in range(n_new - 1):
            p0 = len(p) + s
            ids = [full[p0], (full[p0] + 1) % 256, 5, 6]
            pos = list(range(p0, p0 + 4))
            which = (3, 3, 2) if bug == "graph-default-layers" else (0, 2, 3)
            fw.append({"mode": "TARGET_VERIFY", "ids": ids, "pos": pos, "hs": aux(full[:p0] + ids, pos, which)})
        forwards[key] = fw
    (tmp_path / "script.json").write_text(json.dumps(script))
    torch.save(forwards, str(tmp_path / "forwards.pt"))
    return tmp_path / "script.json", tmp_path / "forwards.pt"


@pytest.fixture
def fake_env(tmp_path, monkeypatch, hf_model):
    fields = set(build_engine_kwargs("m", "d")) | {"cuda_graph_max_bs"}
    site = tmp_path / "site"
    pkg = _fake_sglang(site, fields)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setattr(smoke, "_check_cuda", lambda tp: 1 if tp is None else tp)
    return pkg


def _digest_tree(pkg):
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("bug", [None, "graph-default-layers"])
def test_run_cuda_smoke_end_to_end_with_fake_sglang(
    tmp_path, monkeypatch, capsys, fake_env, hf_model, tiny_target, bug
):
    script, forwards = _prepare(tmp_path, hf_model, bug=bug)
    monkeypatch.setenv("FAKE_SGLANG_SCRIPT", str(script))
    monkeypatch.setenv("FAKE_SGLANG_FORWARDS", str(forwards))
    before = _digest_tree(fake_env)
    work = tmp_path / "work"
    code = smoke.run_cuda_smoke(
        None,
        str(tiny_target),
        None,
        [-1, 1, 2],
        "json",
        max_new_tokens=5,
        timeout_s=120,
        work_dir=str(work),
    )
    out = json.loads(capsys.readouterr().out)
    assert _digest_tree(fake_env) == before  # the "installed" sglang was not modified
    assert not (work / "sglang-probed").exists()  # temporary copy removed
    assert out["layer_ids"] == [-1, 1, 2] and out["expected"] == ["hs[0]", "hs[2]", "hs[3]"]
    assert out["reference"] == "hf-full"
    assert out["sglang"]["version"] == "0.0.0+fake"
    checks = {c["name"].split(",")[0] + "/" + c["name"].split(",")[1].strip().split()[0]: c for c in out["checks"][:2]}
    prefill = checks["aux hidden states/prefill"]
    verify = checks["aux hidden states/verify"]
    assert out["records"]["used"] == 4 * 5  # 4 prefills + 16 verifies; dummy batch skipped
    assert out["lossless"]["ok"]
    assert out["speed"]["speculative"]["accept_length"] == 1.0
    assert prefill["ok"], prefill
    if bug is None:
        assert code == 0 and out["ok"], out["checks"]
        assert verify["ok"]
    else:
        assert code == 1 and not out["ok"]
        assert not verify["ok"]
        assert "entry 0 (layer id -1): expected hs[0]" in verify["message"]
        assert "closest reference is hs[3]" in verify["message"]
        assert out["aux"]["verify"]["first_mismatch"] == 0
        assert out["work_dir"] == str(work)


def test_layer_ids_must_agree_with_draft(tmp_path, fake_env, tiny_target):
    from patchcraft.gpu_smoke.draft_builder import make_tiny_eagle3_draft

    d = make_tiny_eagle3_draft(tmp_path / "draft", tiny_target, [-1, 1, 2])
    with pytest.raises(PatchcraftError, match="disagree with the draft"):
        smoke.run_cuda_smoke(1, str(tiny_target), str(d), [-1, 2, 3], "text", work_dir=str(tmp_path / "w"))


def test_tp_the_tiny_target_cannot_split_is_exit_2(tmp_path, fake_env):
    with pytest.raises(PatchcraftError, match="^ValueError: .*not divisible by tp_size=3"):
        smoke.run_cuda_smoke(3, None, None, None, "text", work_dir=str(tmp_path / "w"))


def test_a_draft_asking_for_layers_beyond_the_target_is_exit_2(tmp_path, fake_env, tiny_target):
    """Checked before any engine starts, not when the reference lacks the layer."""
    from patchcraft.gpu_smoke.draft_builder import make_tiny_eagle3_draft

    draft = make_tiny_eagle3_draft(tmp_path / "draft", tiny_target, [-1, 1, 2])
    config = json.loads((draft / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 1, 4]
    (draft / "config.json").write_text(json.dumps(config))
    with pytest.raises(PatchcraftError, match=r"layer ids \[4\] are beyond the target's 4 layers"):
        smoke.run_cuda_smoke(1, str(tiny_target), str(draft), None, "text", work_dir=str(tmp_path / "w"))


@pytest.mark.parametrize("flip", ["near-tie", "clear"])
def test_lossless_is_margin_aware_end_to_end(tmp_path, monkeypatch, capsys, fake_env, hf_model, tiny_target, flip):
    script, forwards = _prepare(tmp_path, hf_model, flip=flip)
    monkeypatch.setenv("FAKE_SGLANG_SCRIPT", str(script))
    monkeypatch.setenv("FAKE_SGLANG_FORWARDS", str(forwards))
    out_dir = tmp_path / "out"
    code = smoke.run_cuda_smoke(
        None,
        str(tiny_target),
        None,
        [-1, 1, 2],
        "text",
        max_new_tokens=5,
        timeout_s=120,
        work_dir=str(tmp_path / "work"),
        out_dir=str(out_dir),
    )
    summary = json.loads((out_dir / "summary.json").read_text())
    for name in ("spec.log", "base.log", "spec.json", "base.json"):
        assert (out_dir / name).is_file(), name
    assert summary["exit_code"] == code and summary["out_dir"] == str(out_dir)
    eng = summary["engine"]
    assert eng["baseline_generate"] == {"return_logprob": True, "top_logprobs_num": 2}
    for kw in (eng["speculative"], eng["baseline"]):
        assert kw["disable_piecewise_cuda_graph"] is True and kw["log_level"] == "warning"
        assert kw["cuda_graph_max_bs"] == 1 and kw["max_running_requests"] == 1
    assert eng["allreduce_fusion"] == "not applicable (tp 1)" and eng["timeout_s"] == 120
    text = capsys.readouterr().out
    assert "allreduce  FlashInfer allreduce fusion: not applicable (tp 1)" in text
    lossless = summary["lossless"]
    assert lossless["mode"] == "margin"
    if flip == "near-tie":
        assert code == 0 and summary["ok"], summary["checks"]
        assert lossless["near_ties"] == [{"prompt": 0, "position": 2, "margin": pytest.approx(0.05)}]
        assert "info   prompt 0: near tie at token 2 (margin 0.05 < 0.25)" in text
    else:
        assert code == 1 and not summary["ok"]
        assert lossless["first_divergence"] == {"prompt": 0, "position": 2}
        assert "baseline top-2 margin 1 >= 0.25, a clear choice" in lossless["message"]
        assert "[FAIL] lossless greedy output" in text


def test_engine_timeout_stops_the_run_and_its_children(tmp_path, monkeypatch, capsys, fake_env, tiny_target):
    import os
    import time

    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_SGLANG_HANG", str(pid_file))
    monkeypatch.setenv("FAKE_SGLANG_SCRIPT", str(tmp_path / "unused.json"))
    (tmp_path / "unused.json").write_text("{}")
    out_dir = tmp_path / "out"
    start = time.monotonic()
    code = smoke.run_cuda_smoke(
        None,
        str(tiny_target),
        None,
        [-1, 1, 2],
        "json",
        timeout_s=8,
        work_dir=str(tmp_path / "work"),
        out_dir=str(out_dir),
    )
    assert time.monotonic() - start < 60
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and "timed out after 8s" in out["checks"][0]["message"]
    assert json.loads((out_dir / "summary.json").read_text())["exit_code"] == 1
    assert (out_dir / "spec.log").is_file()
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":  # dead, waiting for a reaper
            break
        time.sleep(0.2)
    else:
        os.kill(child, 9)
        pytest.fail("the engine's child process outlived the timeout")


def test_probe_reads_the_rank_from_torch_distributed_without_tp_rank(tmp_path, monkeypatch):
    """0.5.16+ (e.g. 0.5.23): ModelRunner has no tp_rank; rank 1 must not record."""
    torch = pytest.importorskip("torch")
    import types

    from patchcraft.gpu_smoke import probe

    class Runner:  # like 0.5.23's ModelRunner: is_draft_worker, no tp_rank
        is_draft_worker = False

        def forward(self, forward_batch):
            return types.SimpleNamespace(logits_output=types.SimpleNamespace(hidden_states=torch.ones(2, 6)))

    probe.install(Runner)
    out_dir = tmp_path / "rec"
    out_dir.mkdir()
    monkeypatch.setenv(probe.ENV_DIR, str(out_dir))
    fb = types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(name="EXTEND"),
        batch_size=1,
        input_ids=torch.tensor([3, 4]),
        positions=torch.tensor([0, 1]),
    )
    rank = {"r": 1}
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: rank["r"])
    Runner().forward(fb)
    assert list(out_dir.glob("rec-*.pt")) == []  # rank 1: nothing
    rank["r"] = 0
    Runner().forward(fb)
    assert len(list(out_dir.glob("rec-*.pt"))) == 1
    # an explicit tp_rank still wins (0.5.10)
    r = Runner()
    r.tp_rank = 1
    r.forward(fb)
    assert len(list(out_dir.glob("rec-*.pt"))) == 1
