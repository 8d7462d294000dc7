"""A tiny target, its hidden states dumped in each format, and an EAGLE-3 draft trained on one wiring.

The target is made up (:class:`TinyTarget`): its states each hold a part of the
token, in an encoding of their own. Its text follows one rule: token ``t+2`` is
``RULE[token t]``, which a draft can only predict from the states at ``t``.
The draft is trained here (plain torch, fixed seed, a few seconds) with the
EAGLE-3 first step as SGLang's ``llama_eagle3.py`` computes it, and saved
under that file's parameter names (``midlayer.self_attn.q_proj.weight``, ...),
with ``d2t``/``t2d`` for a draft vocabulary smaller than the target's.
Shared by the probe's tests and bench/probe.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DRAFT_VOCAB, HIDDEN, LAYERS = 64, 48, 32, 5
HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 2, 1, 16, 64
SEQ = 24
NOISE = 0.3
#: Which base-4 digit of the token each state holds: [hs0, hs2, hs3] and [hs1, hs4, hs5] hold all three, [hs1, hs3, hs4] does not.
DIGITS = (0, 1, 2, 1, 0, 2)


class TinyTarget:
    """A made-up target whose states each hold one base-4 digit of the token, in an encoding of their own.

    ``hs[k][t]`` is ``codes[k][digit DIGITS[k] of token t]`` plus a little noise: a draft has to read
    every slot of its wiring (all three digits) and each in the encoding it was trained on, so
    only the wiring it was trained on predicts well.
    """

    def __init__(self, seed: int = 0, vocab: int = VOCAB, hidden: int = HIDDEN, layers: int = LAYERS) -> None:
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(vocab, hidden, generator=g)
        self.embed[:, 0] = torch.arange(vocab) % 2 * 6.0 - 3.0  # the token's parity, plain to see (sequences' rule)
        self.codes = [torch.randn(4, hidden, generator=g) for _ in range(layers + 1)]

    def states(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """``hs[0..LAYERS]`` of one sequence (``[T, hidden]`` each)."""
        g = torch.Generator().manual_seed(int((ids * torch.arange(1, len(ids) + 1)).sum()) % 2**31)
        found = []
        for k, codes in enumerate(self.codes):
            digit = (ids // 4 ** DIGITS[k % len(DIGITS)]) % 4
            found.append(codes[digit] + NOISE * torch.randn(len(ids), codes.shape[1], generator=g))
        return found


def vocabulary(seed: int = 0) -> torch.Tensor:
    """The target tokens the text uses (``DRAFT_VOCAB`` of ``VOCAB``): the draft vocabulary, in order."""
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed + 7))[:DRAFT_VOCAB].sort().values


def sequences(count: int, seed: int = 1, length: int = SEQ) -> list[torch.Tensor]:
    """Text where token ``t+2`` is ``RULES[parity of token t+1][token t]`` (two fixed permutations of the used tokens).

    The draft reads token ``t`` from the states at ``t`` and the rule from the embedding of token
    ``t+1``: a probe that fed it another token's embedding would score half as well.
    """
    used = vocabulary()
    lookups = []
    for rule_seed in (3, 4):
        lookup = torch.zeros(VOCAB, dtype=torch.long)
        lookup[used] = used[torch.randperm(DRAFT_VOCAB, generator=torch.Generator().manual_seed(rule_seed))]
        lookups.append(lookup)
    g = torch.Generator().manual_seed(seed)
    found = []
    for _ in range(count):
        ids = [int(used[i]) for i in torch.randint(DRAFT_VOCAB, (2,), generator=g)]
        while len(ids) < length:
            ids.append(int(lookups[ids[-1] % 2][ids[-2]]))
        found.append(torch.tensor(ids))
    return found


# -- dumps -------------------------------------------------------------------------------------


def dump_plain(directory: Path, target: TinyTarget, seqs: Sequence[torch.Tensor], dtype=torch.bfloat16) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    for i, ids in enumerate(seqs):
        states = target.states(ids)
        tensors = {"input_ids": ids.clone()}
        tensors.update({f"hs.{k}": s.to(dtype).contiguous() for k, s in enumerate(states)})
        save_file(tensors, str(directory / f"seq_{i}.safetensors"), metadata={"format": "patchcraft-states"})
    return directory


def dump_speculators(
    directory: Path, target: TinyTarget, seqs: Sequence[torch.Tensor], held: Sequence[int], dtype=torch.bfloat16
) -> Path:
    """``hs_<i>.safetensors``: ``hidden_states`` ``[T, slots, hidden]``, ``token_ids`` ``[T]`` (speculators' offline writer)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    for i, ids in enumerate(seqs):
        states = target.states(ids)
        stacked = torch.stack([states[k] for k in held], dim=1).to(dtype).contiguous()
        save_file({"hidden_states": stacked, "token_ids": ids.clone()}, str(directory / f"hs_{i}.safetensors"))
    return directory


def dump_specforge(
    directory: Path, target: TinyTarget, seqs: Sequence[torch.Tensor], held: Sequence[int], dtype=torch.bfloat16
) -> Path:
    """``data_<i>.ckpt`` as SpecForge's prepare_hidden_states.py saves them (torch.save of four tensors)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, ids in enumerate(seqs):
        states = target.states(ids)
        aux = torch.cat([states[k] for k in held], dim=-1).to(dtype).unsqueeze(0)
        record = {
            "input_ids": ids.clone(),
            "loss_mask": torch.ones_like(ids),
            "hidden_state": states[-1].to(dtype).unsqueeze(0),
            "aux_hidden_state": aux,
        }
        torch.save(record, directory / f"data_{i}.ckpt")
    return directory


# -- the draft ------------------------------------------------------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, positions: torch.Tensor, heads: int) -> torch.Tensor:
    """Neox-style rotary embedding of ``x`` ``[B, T, heads * HEAD_DIM]``."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    freqs = positions.float()[:, None] * inv[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x = x.view(*x.shape[:-1], heads, HEAD_DIM)
    x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


class TinyDraft(nn.Module):
    """The EAGLE-3 first step as llama_eagle3.py computes it, trainable (parameter names as the checkpoint's)."""

    def __init__(self, states: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        h = HIDDEN

        def lin(o: int, i: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(o, i) / i**0.5)

        self.params = nn.ParameterDict(
            {  # "." is no parameter name: "__" stands for it
                "fc__weight": lin(h, states * h),
                "midlayer__self_attn__q_proj__weight": lin(HEADS * HEAD_DIM, 2 * h),
                "midlayer__self_attn__k_proj__weight": lin(KV_HEADS * HEAD_DIM, 2 * h),
                "midlayer__self_attn__v_proj__weight": lin(KV_HEADS * HEAD_DIM, 2 * h),
                "midlayer__self_attn__o_proj__weight": lin(h, HEADS * HEAD_DIM),
                "midlayer__mlp__gate_proj__weight": lin(INTERMEDIATE, h),
                "midlayer__mlp__up_proj__weight": lin(INTERMEDIATE, h),
                "midlayer__mlp__down_proj__weight": lin(h, INTERMEDIATE),
                "midlayer__input_layernorm__weight": nn.Parameter(torch.ones(h)),
                "midlayer__hidden_norm__weight": nn.Parameter(torch.ones(h)),
                "midlayer__post_attention_layernorm__weight": nn.Parameter(torch.ones(h)),
                "norm__weight": nn.Parameter(torch.ones(h)),
                "lm_head__weight": lin(DRAFT_VOCAB, h),
            }
        )

    def named(self) -> dict[str, torch.Tensor]:
        """The parameters under their checkpoint names."""
        return {name.replace("__", "."): value for name, value in self.params.items()}

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        p = self.named()
        hidden = F.linear(hidden, p["fc.weight"])
        residual = hidden
        x = torch.cat(
            [_rms(embeds, p["midlayer.input_layernorm.weight"]), _rms(hidden, p["midlayer.hidden_norm.weight"])], -1
        )
        batch, tokens = x.shape[0], x.shape[1]
        positions = torch.arange(tokens)
        q = _rope(F.linear(x, p["midlayer.self_attn.q_proj.weight"]), positions, HEADS)
        k = _rope(F.linear(x, p["midlayer.self_attn.k_proj.weight"]), positions, KV_HEADS)
        v = F.linear(x, p["midlayer.self_attn.v_proj.weight"])
        q, k, v = (t.view(batch, tokens, -1, HEAD_DIM).transpose(1, 2) for t in (q, k, v))
        k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, tokens, -1)
        x = F.linear(attn, p["midlayer.self_attn.o_proj.weight"]) + residual
        residual = x
        x = _rms(x, p["midlayer.post_attention_layernorm.weight"])
        x = F.linear(
            F.silu(F.linear(x, p["midlayer.mlp.gate_proj.weight"])) * F.linear(x, p["midlayer.mlp.up_proj.weight"]),
            p["midlayer.mlp.down_proj.weight"],
        )
        x = _rms(x + residual, p["norm.weight"])
        return F.linear(x, p["lm_head.weight"])


def train_draft(
    directory: Path, target: TinyTarget, wiring: Sequence[int], steps: int = 300, seed: int = 0, ids_in_config=None
) -> Path:
    """Train a draft on ``wiring`` (HF indices) and save it as an SGLang-loadable EAGLE-3 checkpoint in ``directory``."""
    from safetensors.torch import save_file

    used = vocabulary()
    t2d = torch.full((VOCAB,), -1, dtype=torch.long)
    t2d[used] = torch.arange(DRAFT_VOCAB)
    draft = TinyDraft(len(wiring), seed)
    optimizer = torch.optim.Adam(draft.parameters(), lr=1e-2)
    embeds, hidden, labels = [], [], []
    for ids in sequences(64, seed=11):
        states = target.states(ids)
        embeds.append(target.embed[ids[1:-1]])
        hidden.append(torch.cat([states[k][:-2] for k in wiring], -1))
        labels.append(t2d[ids[2:]])
    e, h, y = torch.stack(embeds), torch.stack(hidden), torch.stack(labels)
    for step in range(steps):
        optimizer.zero_grad()
        part = slice((step % 4) * 16, (step % 4 + 1) * 16)
        loss = F.cross_entropy(draft(e[part], h[part]).flatten(0, 1), y[part].flatten())
        loss.backward()
        optimizer.step()
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: value.detach().to(torch.bfloat16).contiguous() for name, value in draft.named().items()}
    tensors["embed_tokens.weight"] = target.embed.to(torch.bfloat16).contiguous()
    tensors["d2t"] = (used - torch.arange(DRAFT_VOCAB)).contiguous()
    tensors["t2d"] = (t2d >= 0).contiguous()
    save_file(tensors, str(directory / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "target_hidden_size": HIDDEN,
    }
    if ids_in_config is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids_in_config), "use_aux_hidden_state": True}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def target_dir(directory: Path, target: TinyTarget, name: str = "model.embed_tokens.weight") -> Path:
    """A target checkpoint: its config.json (a llama of ``LAYERS + 1`` layers), the embedding in a shard the index names."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({name: target.embed.to(torch.bfloat16).contiguous()}, str(directory / "model-00001-of-00002.safetensors"))
    save_file(
        {"lm_head.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)},
        str(directory / "model-00002-of-00002.safetensors"),
    )
    index = {
        "weight_map": {name: "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}
    }
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    # hs[0..LAYERS] are the dump's states: with one layer more, hs[LAYERS] is a layer's input SGLang captures.
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": LAYERS + 1,
        "hidden_size": HIDDEN,
        "vocab_size": VOCAB,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# -- built once per test session ------------------------------------------------------------------

_BUILT: dict[tuple, Path] = {}
_ROOT: list[Path] = []


def _root() -> Path:
    if not _ROOT:
        import atexit
        import shutil
        import tempfile

        _ROOT.append(Path(tempfile.mkdtemp(prefix="patchcraft-probe-")))
        atexit.register(shutil.rmtree, _ROOT[0], True)  # gone when the session ends
    return _ROOT[0]


def built(kind: str, *args) -> Path:
    """``built("draft", (0, 2, 3))``, ``built("plain")``, ``built("speculators")``, ``built("specforge", (0, 2, 3))``,
    ``built("target")``: made once per session (one thread: these tiny tensors are slower on more)."""
    key = (kind,) + args
    if key not in _BUILT:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            where = _root() / "_".join(str(a) for a in key).replace(" ", "").replace(",", "-")
            target = TinyTarget()
            if kind == "draft":
                (wiring,) = args
                _BUILT[key] = train_draft(where, target, wiring, steps=200, ids_in_config=[s - 1 for s in wiring])
            elif kind == "plain":
                _BUILT[key] = dump_plain(where, target, sequences(12, seed=5))
            elif kind == "speculators":
                _BUILT[key] = dump_speculators(where, target, sequences(12, seed=5), range(LAYERS + 1))
            elif kind == "specforge":
                (held,) = args
                _BUILT[key] = dump_specforge(where, target, sequences(12, seed=5), held)
            elif kind == "target":
                _BUILT[key] = target_dir(where, target)
            else:
                raise ValueError(kind)
        finally:
            torch.set_num_threads(threads)
    return _BUILT[key]
