"""Run an EAGLE-3 draft's first step with SGLang's own draft code, on its training states.

``patchcraft probe`` asks which hidden states a draft's weights expect. This
module answers it by running the release's ``srt/models/llama_eagle3.py``
as the server would for the first draft step, on CPU: the methods that
matter are compiled from the release's files (``LlamaModel.forward`` and
``LlamaDecoderLayer.forward`` of ``llama_eagle3.py``, ``LlamaAttention``
and ``LlamaMLP`` of ``llama.py``, ``LlamaForCausalLMEagle3.load_weights``),
and what they call on is a stand-in: linear layers, RMSNorm (SGLang's fused
add form), rotary embedding, causal attention over one sequence (the
draft-extend prefill), SiLU-and-mul, the logits processor (``hidden @
lm_head.T``). The weights reach the stand-ins through the release's own
``load_weights`` (its names, its ``q/k/v`` and ``gate/up`` stacking, its
legacy-name map and its ``d2t`` -> ``hot_token_id``), each tensor mapped
from its file when it is read (:class:`patchcraft.reading.training_dumps.TensorRef`).

The step, per sequence of a dump (``T`` tokens, states ``g``): position ``t``
takes the embedding of token ``t+1`` and ``cat(g_a[t], g_b[t], ...)`` and
its top-k (through ``hot_token_id`` when the draft has ``d2t``, as
``eagle_worker`` maps them) is scored against token ``t+2``; this is the
alignment of SpecForge's and speculators' training (docs/probe.md).
"""

from __future__ import annotations

import ast
import copy
import mmap
from dataclasses import dataclass
from pathlib import Path
from types import FunctionType
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from patchcraft.base.errors import PatchcraftError
from patchcraft.harness.probe_standins import (
    DraftBatch,
    NoDualGemm,
    ProbeAttention,
    ProbeEmbedding,
    ProbeLinear,
    ProbeRMSNorm,
    ProbeRotary,
    SiluAndMul,
    standin_module,
)
from patchcraft.harness.standins import HarnessError
from patchcraft.reading.training_dumps import Sample, StateRef, TensorRef

_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "U8": torch.uint8,
    "I8": torch.int8,
    "BOOL": torch.bool,
}
_MAPS: dict[Path, mmap.mmap] = {}
#: The dtype the draft runs in (its checkpoints are bf16).
COMPUTE_DTYPE = torch.bfloat16


# -- tensors from files -------------------------------------------------------------------


def tensor_of(ref: TensorRef) -> torch.Tensor:
    """``ref``'s tensor, mapped copy-on-write from its file: only the pages read are read."""
    mapped = _MAPS.get(ref.path)
    if mapped is None:
        with open(ref.path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        _MAPS[ref.path] = mapped
    dtype = _DTYPES[ref.dtype]
    item = torch.empty((), dtype=dtype).element_size()
    count = ref.extent // item
    if count == 0:
        return torch.empty(ref.shape, dtype=dtype)
    flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=ref.offset)
    if ref.stride is None:
        return flat.view(ref.shape)
    return flat.as_strided(ref.shape, ref.stride)


def release_maps() -> None:
    """Forget the mapped files (their pages go when the last tensor on them does)."""
    _MAPS.clear()


def state_of(ref: StateRef) -> torch.Tensor:
    tensor = tensor_of(ref.tensor)
    width = tensor.shape[-1] // ref.slots
    return tensor[:, ref.slot * width : (ref.slot + 1) * width]


# -- the release's code, compiled ---------------------------------------------------------


class DraftSource:
    """The classes of one model file, each method compiled on its own (annotations dropped)."""

    def __init__(self, path: Path, names: Mapping[str, Any]) -> None:
        self.path = path
        try:
            self.tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            raise PatchcraftError(f"{path}: cannot read the draft code ({exc})") from None
        self.names = dict(names)

    def cls(self, name: str) -> ast.ClassDef:
        found = [n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name == name]
        if not found:
            raise HarnessError(f"{self.path.name} has no class {name}")
        return found[-1]

    def assigned(self, cls: str) -> set[str]:
        """The ``self.<name>`` an ``__init__`` of ``cls`` assigns."""
        found: set[str] = set()
        for node in self.cls(cls).body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        for target in targets:
                            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                                if target.value.id == "self":
                                    found.add(target.attr)
        return found

    def init_text(self, cls: str) -> str:
        for node in self.cls(cls).body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                return ast.unparse(node)
        return ""

    def methods(self, cls: str) -> dict[str, FunctionType]:
        """Every method of ``cls`` but ``__init__``, compiled with this file's stand-in names as globals."""
        found = {}
        for node in self.cls(cls).body:
            if isinstance(node, ast.FunctionDef) and node.name != "__init__":
                found[node.name] = self._compile(cls, node)
        return found

    def _compile(self, cls: str, node: ast.FunctionDef) -> FunctionType:
        node = _without_annotations(node)
        node.decorator_list = []
        module = ast.Module(body=[node], type_ignores=[])
        ast.fix_missing_locations(module)
        namespace: dict[str, Any] = {"__builtins__": __builtins__, "__name__": f"sglang.srt.models.{self.path.stem}"}
        namespace.update(self.names)
        exec(compile(module, str(self.path), "exec"), namespace)
        func = namespace[node.name]
        func.__qualname__ = f"{cls}.{node.name}"
        return func


def _without_annotations(node: ast.FunctionDef) -> ast.FunctionDef:
    """A copy of ``node`` (its line numbers kept, for tracebacks into the release's file) without annotations."""
    node = copy.deepcopy(node)
    node.returns = None
    for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
        arg.annotation = None
    for extra in (node.args.vararg, node.args.kwarg):
        if extra is not None:
            extra.annotation = None
    return node


# -- the draft ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftShape:
    """What the release's ``__init__`` would build from the draft's ``config.json``."""

    hidden: int
    hidden_in: int
    states: int  # fc input width / hidden_in: the wiring's length
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int
    eps: float
    theta: float
    tie: bool
    bias: bool
    layers_attr: str  # "midlayer" (to 0.5.11) or "layers" (from 0.5.12)
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool


def draft_shape(config: Mapping[str, Any], fc_in: int, source: DraftSource) -> DraftShape:
    """The draft's shape, with the options the release's ``LlamaModel.__init__`` reads (and only those)."""
    init = source.init_text("LlamaModel")
    hidden = int(config["hidden_size"])
    hidden_in = int(config.get("target_hidden_size") or hidden)
    built = _fc_states(init, config)
    if hidden_in and fc_in != built * hidden_in:
        raise PatchcraftError(
            f"the draft's fc.weight takes {fc_in} inputs, but {source.path.name} builds its fc for {built} states "
            f"of {hidden_in} ({built * hidden_in}): SGLang would not load it"
        )
    heads = int(config.get("num_attention_heads") or 1)
    rope = config.get("rope_parameters") or {}
    eagle = config.get("eagle_config") or {}
    return DraftShape(
        hidden=hidden,
        hidden_in=hidden_in,
        states=fc_in // hidden_in,
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate=int(config.get("intermediate_size") or 4 * hidden),
        vocab=int(config.get("vocab_size") or 0),
        draft_vocab=int(config.get("draft_vocab_size") or config.get("vocab_size") or 0),
        eps=float(config.get("rms_norm_eps") or 1e-6),
        theta=float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        tie=bool(config.get("tie_word_embeddings", False)),
        bias=bool(config.get("bias", False)),
        layers_attr="layers" if "self.layers" in init else "midlayer",
        norm_before_fc="norm_before_fc" in init and bool(eagle.get("norm_before_fc", config.get("norm_before_fc"))),
        fc_norm="use_fc_norm" in init and bool(config.get("fc_norm") or config.get("use_aux_norm")),
        norm_output="norm_output" in init and bool(config.get("norm_output", False)),
    )


def _fc_states(init: str, config: Mapping[str, Any]) -> int:
    """How many states the release's ``LlamaModel.__init__`` sizes the fc for (3 before ``num_aux_hidden_states``)."""
    if "num_aux_hidden_states" not in init:
        return 3
    eagle = config.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    return int(config.get("num_aux_hidden_states") or (len(ids) if ids else 3))


def _parameters(shape: DraftShape) -> dict[str, tuple[int, ...]]:
    """The parameters the release's module tree has (names as ``named_parameters`` gives them)."""
    h, d = shape.hidden, shape.head_dim
    layer = "model.layers.0" if shape.layers_attr == "layers" else "model.midlayer"
    found: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (shape.vocab, h),
        "model.fc.weight": (h, shape.states * shape.hidden_in),
        f"{layer}.self_attn.qkv_proj.weight": ((shape.heads + 2 * shape.kv_heads) * d, 2 * h),
        f"{layer}.self_attn.o_proj.weight": (h, shape.heads * d),
        f"{layer}.mlp.gate_up_proj.weight": (2 * shape.intermediate, h),
        f"{layer}.mlp.down_proj.weight": (h, shape.intermediate),
        f"{layer}.input_layernorm.weight": (h,),
        f"{layer}.hidden_norm.weight": (h,),
        f"{layer}.post_attention_layernorm.weight": (h,),
        "model.norm.weight": (h,),
    }
    if shape.bias:
        found["model.fc.bias"] = (h,)
    if shape.norm_before_fc:
        found["model.input_norm.weight"] = (shape.states * shape.hidden_in,)
    if shape.fc_norm:
        found.update({f"model.fc_norm.{i}.weight": (shape.hidden_in,) for i in range(shape.states)})
    if not shape.tie:
        found["lm_head.weight"] = (shape.draft_vocab, h)
    return found


_SHARDS = {"q": 0, "k": 1, "v": 2, 0: 0, 1: 1}


class _Skeleton(nn.Module):
    """Meta parameters under SGLang's names, each with a ``weight_loader`` that keeps what it is given."""

    def __init__(self, names: Mapping[str, tuple[int, ...]], sink: dict[str, Any]) -> None:
        super().__init__()
        for name, size in names.items():
            owner: nn.Module = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            param = nn.Parameter(torch.empty(size, device="meta"), requires_grad=False)
            param.weight_loader = _loader(name, sink)  # type: ignore[attr-defined]
            owner.register_parameter(leaf, param)


def _loader(name: str, sink: dict[str, Any]) -> Callable[..., None]:
    def load(param: Any, tensor: torch.Tensor, shard: Any = None) -> None:
        if shard is None:
            sink[name] = tensor
        else:
            sink.setdefault(name, {})[_SHARDS[shard]] = tensor

    return load


@dataclass
class LoadedDraft:
    """The weights as the release's ``load_weights`` placed them, and its ``hot_token_id``."""

    weights: dict[str, torch.Tensor]
    hot_token_id: Optional[torch.Tensor]
    missing: tuple[str, ...] = ()  # parameters no checkpoint tensor reached


def load_draft(
    source: DraftSource, shape: DraftShape, tensors: Mapping[str, TensorRef], dtype: torch.dtype
) -> LoadedDraft:
    """Run the release's ``LlamaForCausalLMEagle3.load_weights`` on the checkpoint's tensors (mapped, not read)."""
    names = _parameters(shape)
    sink: dict[str, Any] = {}
    skeleton = _Skeleton(names, sink)
    top = standin_module("LlamaForCausalLMEagle3", source.methods("LlamaForCausalLMEagle3"), {})
    for child in ("model", "lm_head"):
        if hasattr(skeleton, child):
            top.add_module(child, getattr(skeleton, child))
    setattr(top, "hot_token_id", None)
    try:
        getattr(top, "load_weights")((name, tensor_of(ref)) for name, ref in tensors.items())
    except HarnessError:
        raise
    except Exception as exc:
        raise HarnessError(f"{source.path.name}: load_weights raised {type(exc).__name__}: {exc}") from None
    weights: dict[str, torch.Tensor] = {}
    for name, size in names.items():
        value = sink.get(name)
        if isinstance(value, dict):
            if sorted(value) != list(range(3 if "qkv" in name else 2)):
                continue
            value = torch.cat([value[i] for i in sorted(value)], dim=0)
        if value is None:
            continue
        if tuple(value.shape) != size:
            raise PatchcraftError(
                f"the draft's {name} is {list(value.shape)}, but {source.path.name} builds it as {list(size)} "
                "from the draft's config.json"
            )
        weights[name] = value if value.dtype == dtype or name == "model.embed_tokens.weight" else value.to(dtype)
    missing = tuple(n for n in names if n not in weights)
    hot = getattr(top, "hot_token_id")
    return LoadedDraft(weights, hot.long() if isinstance(hot, torch.Tensor) else None, missing=missing)


class DraftStep:
    """The draft's first step, SGLang's ``LlamaModel.forward`` on stand-ins holding the loaded weights."""

    def __init__(
        self,
        eagle3: DraftSource,
        llama: DraftSource,
        shape: DraftShape,
        loaded: LoadedDraft,
        embedding: torch.Tensor,
        dtype: torch.dtype,
    ) -> None:
        self.shape, self.dtype, self.hot_token_id = shape, dtype, loaded.hot_token_id
        w = loaded.weights
        layer_prefix = "model.layers.0" if shape.layers_attr == "layers" else "model.midlayer"

        def lw(name: str) -> torch.Tensor:
            return w[f"{layer_prefix}.{name}"]

        d = shape.head_dim
        attention = standin_module(
            "LlamaAttention",
            llama.methods("LlamaAttention"),
            {
                "qkv_proj": ProbeLinear(lw("self_attn.qkv_proj.weight")),
                "o_proj": ProbeLinear(lw("self_attn.o_proj.weight")),
                "rotary_emb": ProbeRotary(d, d, shape.theta),
                "attn": ProbeAttention(shape.heads, shape.kv_heads, d, d**-0.5),
                "hidden_size": 2 * shape.hidden,
                "total_num_heads": shape.heads,
                "num_heads": shape.heads,
                "total_num_kv_heads": shape.kv_heads,
                "num_kv_heads": shape.kv_heads,
                "head_dim": d,
                "rotary_dim": d,
                "q_size": shape.heads * d,
                "kv_size": shape.kv_heads * d,
                "scaling": d**-0.5,
                "start_layer": 0,
            },
        )
        mlp = standin_module(
            "LlamaMLP",
            llama.methods("LlamaMLP"),
            {
                "gate_up_proj": ProbeLinear(lw("mlp.gate_up_proj.weight")),
                "down_proj": ProbeLinear(lw("mlp.down_proj.weight")),
                "act_fn": SiluAndMul(),
                "dual_gemm": NoDualGemm(),
            },
        )
        eps = shape.eps
        layer = standin_module(
            "LlamaDecoderLayer",
            eagle3.methods("LlamaDecoderLayer"),
            {
                "self_attn": attention,
                "mlp": mlp,
                "input_layernorm": ProbeRMSNorm(lw("input_layernorm.weight"), eps),
                "hidden_norm": ProbeRMSNorm(lw("hidden_norm.weight"), eps),
                "post_attention_layernorm": ProbeRMSNorm(lw("post_attention_layernorm.weight"), eps),
                "hidden_size": shape.hidden,
                "layer_id": 0,
                "is_input_layer": True,
            },
        )
        fc_norm = (
            nn.ModuleList([ProbeRMSNorm(w[f"model.fc_norm.{i}.weight"], eps) for i in range(shape.states)])
            if shape.fc_norm
            else None
        )
        self.model = standin_module(
            "LlamaModel",
            eagle3.methods("LlamaModel"),
            {
                "embed_tokens": ProbeEmbedding(embedding),
                "fc": ProbeLinear(w["model.fc.weight"], w.get("model.fc.bias"), pair=False),
                shape.layers_attr: nn.ModuleList([layer]) if shape.layers_attr == "layers" else layer,
                "norm": ProbeRMSNorm(w["model.norm.weight"], eps),
                "is_mrope_enabled": False,
                "input_norm": ProbeRMSNorm(w["model.input_norm.weight"], eps) if shape.norm_before_fc else None,
                "fc_norm": fc_norm,
                "norm_output": shape.norm_output,
                "num_aux_hidden_states": shape.states,
                "hidden_size_in": shape.hidden_in,
                "vocab_size": shape.vocab,
            },
        )
        self.lm_head = embedding if shape.tie else w["lm_head.weight"]

    def top_k(self, input_ids: torch.Tensor, states: Sequence[torch.Tensor], k: int) -> torch.Tensor:
        """The draft's top-``k`` target token ids at each position (``[T, k]``): one forward, one sequence."""
        logits = self.logits(input_ids, states)
        index = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
        if self.hot_token_id is not None:
            index = self.hot_token_id[index]
        return index

    def logits(self, input_ids: torch.Tensor, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """The draft's logits over its own vocabulary at each position (``[T, draft vocab]``)."""
        hidden = torch.cat([s.to(self.dtype) for s in states], dim=-1)
        positions = torch.arange(input_ids.shape[0])
        try:
            with torch.no_grad():
                out = self.model.forward(input_ids, positions, DraftBatch(hidden))
        except HarnessError:
            raise
        except Exception as exc:
            raise HarnessError(f"the draft's forward raised {type(exc).__name__}: {exc}") from None
        logits_input = out[0] if isinstance(out, tuple) else out
        return F.linear(logits_input.to(self.lm_head.dtype), self.lm_head)


# -- scoring --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """One sequence of a dump in memory: its ids and its states by HF index."""

    input_ids: torch.Tensor
    states: dict[int, torch.Tensor]

    @property
    def scored(self) -> int:
        return max(0, self.input_ids.shape[0] - 2)


def load_samples(
    samples: Iterable[Sample], tokens: int, on_tokens: Optional[Callable[[int], None]] = None
) -> list[Loaded]:
    """Sequences of the dump until ``tokens`` scored positions (the last one cut to fit), states mapped."""
    found: list[Loaded] = []
    total = 0
    for sample in samples:
        if total >= tokens:
            break
        take = min(sample.tokens, tokens - total + 2)
        if take < 3:
            continue
        ids = tensor_of(sample.input_ids)[:take].long()
        states = {k: state_of(ref)[:take] for k, ref in sample.states.items()}
        found.append(Loaded(ids, states))
        total += take - 2
        if on_tokens is not None:
            on_tokens(total)
    return found


@dataclass(frozen=True)
class Score:
    """A wiring's accuracy: positions scored, top-1 and top-k hits."""

    wiring: tuple[int, ...]
    tokens: int
    top1: int
    topk: int

    @property
    def top1_rate(self) -> float:
        return self.top1 / self.tokens if self.tokens else 0.0

    @property
    def topk_rate(self) -> float:
        return self.topk / self.tokens if self.tokens else 0.0


def score(step: DraftStep, samples: Sequence[Loaded], wiring: Sequence[int], k: int, tokens: int) -> Score:
    """Run ``step`` with the states ``wiring`` names on the first ``tokens`` positions of ``samples``."""
    top1 = topk = counted = 0
    for sample in samples:
        if counted >= tokens:
            break
        n = min(sample.scored, tokens - counted)
        ids = sample.input_ids[: n + 2]
        states = [sample.states[s][: n + 1] for s in wiring]
        index = step.top_k(ids[1 : n + 1], [s[:n] for s in states], k)
        labels = ids[2 : n + 2]
        top1 += int((index[:, 0] == labels).sum())
        topk += int((index == labels[:, None]).any(dim=-1).sum())
        counted += n
    return Score(tuple(wiring), counted, top1, topk)
