"""Stand-in decoder layers with SGLang's deferred all-reduce, for a two-rank gloo run.

The MLP returns a per-rank partial sum when the release's own
``should_fuse_mlp_allreduce_with_next_layer`` says to fuse, and the next
layer's input norm reduces it (layers/communicator.py, ``prepare_attn``).
The model loop captures the embedding (layer id -1, as patchcraft's forward
edit does) and ``hidden_states + residual`` at the top of each layer in
``layers_to_capture``, as glm4_moe.py and gpt_oss.py do in 0.5.2-0.5.20.

Each layer has its own communicator stand-in; the patched setter's own
marking loop (cut from the patched release file, passed in as text) runs on
the stand-in model before the forward, as the setter runs before SGLang's
first forward. The speculative algorithm tells EAGLE, EAGLE-3 and MTP apart
as SGLang's ``SpeculativeAlgorithm`` does: all three are ``is_eagle()``,
only EAGLE-3 is ``is_eagle3()``.
"""

from __future__ import annotations

import ast
import builtins
import os
import textwrap
from types import SimpleNamespace

import torch
import torch.distributed as dist

H, I, T, LAYERS = 8, 16, 3, 6
#: ``layers_to_capture`` for draft ids [-1, 1, 3]: the embedding, and the tops of layers 2 and 4,
#: which read the outputs of layers 1 and 3.
CAPTURE = (2, 4)
READ = tuple(i - 1 for i in CAPTURE)


class Algo:
    """``SpeculativeAlgorithm``: EAGLE, EAGLE3 and FROZEN_KV_MTP are ``is_eagle()``; only EAGLE3 is ``is_eagle3()``."""

    def __init__(self, name: str) -> None:
        assert name in ("EAGLE", "EAGLE3", "MTP"), name
        self.name = name

    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        return self.name == "EAGLE3"

    def is_frozen_kv_mtp(self) -> bool:
        return self.name == "MTP"

    def is_dflash(self) -> bool:
        return False

    def is_none(self) -> bool:
        return False


def decision_source(text: str) -> str:
    """The release's ``LayerCommunicator.should_fuse_mlp_allreduce_with_next_layer``, dedented."""
    module = ast.parse(text)
    for stmt in module.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == "LayerCommunicator":
            for item in stmt.body:
                if isinstance(item, ast.FunctionDef) and item.name == "should_fuse_mlp_allreduce_with_next_layer":
                    lines = text.splitlines(keepends=True)[item.lineno - 1 : item.end_lineno]
                    return textwrap.dedent("".join(lines))
    raise LookupError("no LayerCommunicator.should_fuse_mlp_allreduce_with_next_layer")


def compile_decision(source: str, world: int, algo):
    """Compile the release's function with the server state of an auto-enabled fusion (TP ``world``)."""
    env = {
        "is_dp_attention_enabled": lambda: False,
        "get_attn_tp_context": lambda: SimpleNamespace(input_scattered=False),
        "apply_flashinfer_allreduce_fusion": lambda batch_size: world > 1,  # ServerArgs auto-enabled it
        "_use_aiter": False,
        "get_tensor_model_parallel_world_size": lambda: world,
        "get_global_server_args": lambda: SimpleNamespace(
            enable_aiter_allreduce_fusion=False, enable_flashinfer_allreduce_fusion=world > 1
        ),
        "_is_flashinfer_available": True,
        "FUSE_ALLREDUCE_MAX_BATCH_SIZE": 2048,
        "global_server_args_dict": {"speculative_algorithm": algo, "enable_flashinfer_allreduce_fusion": world > 1},
        "is_enable_moe_cp_allgather": lambda: False,
        "get_parallel": lambda: SimpleNamespace(tp_size=world, moe_ep_size=1, moe_tp_size=world),
        "get_moe_a2a_backend": lambda: SimpleNamespace(is_none=lambda: True),
        "ScatterMode": SimpleNamespace(SCATTERED="scattered", MOE_FULL="moe_full"),
        "ForwardBatch": object,
        "get_exec": lambda: SimpleNamespace(comm=SimpleNamespace(enable_aiter_allreduce_fusion=False)),
    }
    func_node = ast.parse(source).body[0]
    params = {a.arg for a in ast.walk(func_node.args) if isinstance(a, ast.arg)}
    stored = {n.id for n in ast.walk(func_node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    free = {n.id for n in ast.walk(func_node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - stored
    unknown = free - params - set(env) - set(dir(builtins))
    assert not unknown, f"the release's decision reads names the stand-in does not provide: {sorted(unknown)}"
    namespace = dict(env)
    exec(compile(source, "<should_fuse_mlp_allreduce_with_next_layer>", "exec"), namespace)
    return namespace["should_fuse_mlp_allreduce_with_next_layer"]


def weights():
    gen = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(H, H, generator=gen, dtype=torch.float64) / H**0.5,
            torch.randn(H, I, generator=gen, dtype=torch.float64) / H**0.5,
            torch.randn(I, H, generator=gen, dtype=torch.float64) / I**0.5,
        )
        for _ in range(LAYERS)
    ]


def norm(x):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def communicators(algo, world: int, mark: str):
    """One communicator per layer; ``mark`` (the patched setter's loop, or "") runs on them first."""
    comms = [
        SimpleNamespace(
            _speculative_algo=algo,
            is_last_layer=i == LAYERS - 1,
            _context=SimpleNamespace(tp_size=world),
            layer_scatter_modes=SimpleNamespace(mlp_mode="full"),
        )
        for i in range(LAYERS)
    ]
    if mark:
        model = SimpleNamespace(
            layers=[SimpleNamespace(layer_communicator=c) for c in comms], layers_to_capture=list(CAPTURE)
        )
        exec(
            compile(textwrap.dedent(mark), "<patched setter: layer marks>", "exec"),
            {"enumerate": enumerate, "getattr": getattr, "hasattr": hasattr},
            {"self": SimpleNamespace(model=model)},
        )
    return comms


def forward(decide, rank: int, world: int, algo, mark: str = ""):
    """The model loop; returns the captured aux states (embedding first) and each layer's fusion decision."""
    reduce = (lambda t: (dist.all_reduce(t), t)[1]) if world > 1 else (lambda t: t)
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(T, H, generator=gen, dtype=torch.float64)  # the embedding: replicated
    residual = None
    batch = SimpleNamespace(input_ids=torch.zeros(T))
    comms = communicators(algo, world, mark)
    aux = [hidden.clone()]  # layer id -1: the embedding output (patchcraft's forward edit)
    fused = []
    for i, (wa, w1, w2) in enumerate(weights()):
        if i in CAPTURE:
            aux.append(hidden + residual)  # glm4_moe / gpt_oss: top of layer i
        # prepare_attn: reduce a deferred MLP output inside the input norm
        if residual is None:
            residual, h = hidden, norm(hidden)
        else:
            if getattr(hidden, "_sglang_needs_allreduce_fusion", False):
                hidden = reduce(hidden.clone())
            residual = hidden + residual
            h = norm(residual)
        hs = slice(rank * H // world, (rank + 1) * H // world)
        attn = reduce(h[:, hs] @ wa[hs, :])  # row-parallel o_proj
        residual = attn + residual
        h = norm(residual)
        cs = slice(rank * I // world, (rank + 1) * I // world)
        mlp = torch.nn.functional.gelu(h @ w1[:, cs]) @ w2[cs, :]  # column- then row-parallel: a partial sum
        fused.append(bool(decide(comms[i], batch)))
        if fused[-1]:
            mlp._sglang_needs_allreduce_fusion = True
        else:
            mlp = reduce(mlp)
        hidden = mlp
    return torch.stack(aux), fused


def worker(rank: int, world: int, source: str, init: str, out: str, algo_name: str = "EAGLE3", mark: str = "") -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        algo = Algo(algo_name)
        aux, fused = forward(compile_decision(source, world, algo), rank, world, algo, mark)
        torch.save({"aux": aux, "fused": fused}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def reference(source: str, algo_name: str = "EAGLE3", mark: str = ""):
    algo = Algo(algo_name)
    return forward(compile_decision(source, 1, algo), 0, 1, algo, mark)[0]


def decisions(source: str, world: int, algo_name: str, mark: str = "") -> list[bool]:
    """Each layer's decision, without running the layers (no process group needed)."""
    algo = Algo(algo_name)
    decide = compile_decision(source, world, algo)
    batch = SimpleNamespace(input_ids=torch.zeros(T))
    return [bool(decide(c, batch)) for c in communicators(algo, world, mark)]
