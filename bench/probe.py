"""Benchmark ``patchcraft probe`` on a Kimi-size EAGLE-3 draft with random weights.

    python bench/probe.py [--tokens 2048] [--release 0.5.23] [--quick]

The draft is the shape of a Kimi-K2.5 EAGLE-3 head: hidden 7168, one decoder
layer (64 heads of 128, 8 KV heads, MLP 18432), fc over three 7168-wide
states, draft vocabulary 32,000 mapped by ``d2t`` into the target's 163,840;
its weights are random bf16 (about 2 GB on disk). It has no embedding of its
own: the probe reads the target's, one tensor of a two-shard checkpoint whose
index names it (the shard is written sparse, with random rows only for the
tokens the dump uses: what the probe reads is what it would read of a real
one). The dump is the plain layout with the Kimi team's four states
``hs[0], hs[3], hs[31], hs[59]``, random bf16, in sequences of 1,026 tokens.

Two whole ``patchcraft probe`` processes are measured, wall time and peak
resident memory (``wait4``'s ``ru_maxrss``), on the machine's cores:

- the four-state dump: 24 wirings screened, the best and the served one
  (``--served hf:3,31,59``) scored on every position;
- the dump's first three states only (``--states hf:0,3,31``: their 6 orders).

``--quick`` runs a tiny draft instead (tests/test_bench_probe.py). The
figures go in docs/performance.md by hand, with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

KIMI = dict(hidden=7168, heads=64, kv_heads=8, head_dim=128, intermediate=18432, draft_vocab=32000, vocab=163840)
QUICK = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, draft_vocab=500, vocab=2000)
STATES = (0, 3, 31, 59)
SEQUENCE = 1026  # 1,024 scored positions each


def write_draft(directory: Path, shape: dict, seed: int = 0) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    h, d = shape["hidden"], shape["head_dim"]

    def rand(*size: int) -> torch.Tensor:
        return (torch.randn(size, generator=g) / size[-1] ** 0.5).to(torch.bfloat16)

    tensors = {
        "fc.weight": rand(h, 3 * h),
        "midlayer.self_attn.q_proj.weight": rand(shape["heads"] * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(shape["kv_heads"] * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(shape["kv_heads"] * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, shape["heads"] * d),
        "midlayer.mlp.gate_proj.weight": rand(shape["intermediate"], h),
        "midlayer.mlp.up_proj.weight": rand(shape["intermediate"], h),
        "midlayer.mlp.down_proj.weight": rand(h, shape["intermediate"]),
        "midlayer.input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "midlayer.hidden_norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "midlayer.post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "lm_head.weight": rand(shape["draft_vocab"], h),
    }
    hot = torch.randperm(shape["vocab"], generator=g)[: shape["draft_vocab"]].sort().values
    tensors["d2t"] = hot - torch.arange(shape["draft_vocab"])
    tensors["t2d"] = torch.zeros(shape["vocab"], dtype=torch.bool)
    tensors["t2d"][hot] = True
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": shape["intermediate"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "head_dim": d,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "vocab_size": shape["vocab"],
        "draft_vocab_size": shape["draft_vocab"],
        "tie_word_embeddings": False,
        "target_hidden_size": h,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True},
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def write_target(directory: Path, shape: dict, used: "object", seed: int = 1) -> None:
    """A two-shard checkpoint; shard 1 holds the embedding, written sparse but for the rows ``used``."""
    import torch

    name = "language_model.model.embed_tokens.weight"
    h, vocab = shape["hidden"], shape["vocab"]
    directory.mkdir(parents=True)
    header = json.dumps({name: {"dtype": "BF16", "shape": [vocab, h], "data_offsets": [0, vocab * h * 2]}}).encode()
    header += b" " * (-len(header) % 8)
    shard = directory / "model-00001-of-00002.safetensors"
    with open(shard, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        start = handle.tell()
        handle.truncate(start + vocab * h * 2)
        g = torch.Generator().manual_seed(seed)
        for row in sorted(set(int(i) for i in used)):  # type: ignore[attr-defined]
            handle.seek(start + row * h * 2)
            handle.write(torch.randn(h, generator=g).to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    (directory / "model-00002-of-00002.safetensors").write_bytes(b"never read")
    index = {"weight_map": {name: shard.name, "lm_head.weight": "model-00002-of-00002.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "num_hidden_layers": 61, "hidden_size": h}
    (directory / "config.json").write_text(json.dumps(config))


def write_dump(directory: Path, shape: dict, tokens: int, seed: int = 2) -> "object":
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    directory.mkdir(parents=True)
    used = []
    count = -(-tokens // (SEQUENCE - 2))
    for i in range(count):
        ids = torch.randint(shape["vocab"], (SEQUENCE,), generator=g)
        used.append(ids)
        tensors = {"input_ids": ids}
        for k in STATES:
            tensors[f"hs.{k}"] = torch.randn(SEQUENCE, shape["hidden"], generator=g).to(torch.bfloat16)
        save_file(tensors, str(directory / f"seq_{i}.safetensors"))
    return torch.cat(used)


def measure(command: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, peak resident MiB (``wait4``'s ``ru_maxrss`` of that process), exit code and stdout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = code
        out.seek(0)
        err.seek(0)
        if code not in (0, 1):
            raise SystemExit(f"probe failed ({code}): {err.read().decode()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, code, out.read().decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--quick", action="store_true", help="a tiny draft (the test's smoke run)")
    args = parser.parse_args()
    from conftest import release_package

    shape = QUICK if args.quick else KIMI
    package = release_package(args.release)
    work = Path(tempfile.mkdtemp(prefix="patchcraft-bench-probe-"))
    before = os.getloadavg()
    try:
        t0 = time.perf_counter()
        write_draft(work / "draft", shape)
        used = write_dump(work / "dump", shape, args.tokens)
        write_target(work / "target", shape, used)
        written = time.perf_counter() - t0
        base = [sys.executable, "-m", "patchcraft", "probe", str(work / "draft"), str(package)]
        base += ["--data", str(work / "dump"), "--target", str(work / "target"), "--tokens", str(args.tokens)]
        rows = []
        for label, extra in (
            ("4 states (24 wirings), served hs[3], hs[31], hs[59]", ["--served", "hf:3,31,59"]),
            ("3 states (6 orders)", ["--states", "hf:0,3,31"]),
        ):
            wall, peak, code, out = measure(base + extra + ["--format", "json"])
            document = json.loads(out)
            rows.append((label, wall, peak, document["wirings"], document["tokens"]))
        load = os.getloadavg()
        print(f"load average at the start: {before[0]:.2f} (1 min), {before[1]:.2f} (5 min)")
        print(f"shape {shape}, release {args.release}, {os.cpu_count()} cores, files written in {written:.0f} s")
        print(f"load average at the end: {load[0]:.2f} (1 min), {load[1]:.2f} (5 min)")
        print("| run | wirings | positions | wall | peak memory |")
        print("|---|---|---|---|---|")
        for label, wall, peak, wirings, tokens in rows:
            print(f"| {label} | {wirings} | {tokens} | {wall:.1f} s | {peak / 1024:.2f} GiB |")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
