"""A draft's and its target's ``config.json``, and the draft's fc width from its weights' header.

What the check of a draft reads before it judges anything
(:mod:`patchcraft.analysis.draft_check`): the draft's ids in every place a
format keeps them (``eagle_config``'s, which SGLang reads, the top level's,
which vLLM and speculators read), its sizes, the input width of its
``fc.weight`` from the safetensors header (JSON, without torch), and the
target's layer count and hidden size (top level or its text config).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.safetensors_header import read_header

_TEXT_CONFIGS = ("text_config", "language_config", "llm_config")


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PatchcraftError(f"{path}: no such file") from None
    except OSError as exc:
        raise PatchcraftError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PatchcraftError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PatchcraftError(f"{path}: expected a JSON object")
    return data


def _config_path(path: Path) -> Path:
    if path.is_dir():
        return path / "config.json"
    if not path.exists():
        raise PatchcraftError(f"{path}: no such file or directory")
    return path


def _ids(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise PatchcraftError(f"{where}: expected a list of integers, got {value!r}")
    return tuple(value)


def _int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise PatchcraftError(f"{where}: expected a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class DraftConfig:
    """The fields of a draft's ``config.json`` (SGLang and speculators formats)."""

    path: Path
    architectures: tuple[str, ...]
    layer_ids: tuple[int, ...] | None  # eagle_config.eagle_aux_hidden_state_layer_ids: what SGLang reads
    speculators_ids: tuple[int, ...] | None  # top-level ids of a speculators-format config
    is_speculators: bool
    target_hidden_size: int | None
    hidden_size: int | None
    fc_in: int | None
    fc_source: str
    #: top-level eagle_aux_hidden_state_layer_ids in any format: SGLang ignores them, vLLM reads them first
    top_level_ids: tuple[int, ...] | None = None
    #: the whole config.json: the training presets read ids from fields no engine reads
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def read_draft(directory: Path) -> DraftConfig:
    """Read ``DRAFT_DIR/config.json`` and the ``fc.weight`` shape of its weights."""
    path = _config_path(directory)
    config = _load_json(path)
    eagle = config.get("eagle_config")
    if eagle is not None and not isinstance(eagle, dict):
        raise PatchcraftError(f"{path}: eagle_config: expected an object")
    layer_ids = _ids(
        (eagle or {}).get("eagle_aux_hidden_state_layer_ids"), f"{path}: eagle_config.eagle_aux_hidden_state_layer_ids"
    )
    is_speculators = "speculators_model_type" in config or "speculators_config" in config
    top_level_ids = _ids(config.get("eagle_aux_hidden_state_layer_ids"), f"{path}: eagle_aux_hidden_state_layer_ids")
    speculators_ids = top_level_ids if is_speculators else None
    layer_config = config.get("transformer_layer_config") if is_speculators else None
    hidden = (layer_config or {}).get("hidden_size") if isinstance(layer_config, dict) else None
    fc_in, fc_source = fc_input_width(path.parent)
    return DraftConfig(
        path=path,
        architectures=tuple(str(a) for a in config.get("architectures") or ()),
        layer_ids=layer_ids,
        speculators_ids=speculators_ids,
        is_speculators=is_speculators,
        target_hidden_size=_int(config.get("target_hidden_size"), f"{path}: target_hidden_size"),
        hidden_size=_int(hidden if hidden is not None else config.get("hidden_size"), f"{path}: hidden_size"),
        fc_in=fc_in,
        fc_source=fc_source,
        top_level_ids=top_level_ids,
        raw=config,
    )


def _is_fc(name: str) -> bool:
    return name == "fc.weight" or (name.endswith(".fc.weight") and "layers." not in name and "mlp" not in name)


def fc_input_width(directory: Path) -> tuple[int | None, str]:
    """The fc input width from ``fc.weight``'s shape ``[out, in]``; (None, why) if absent."""
    files = sorted(directory.glob("*.safetensors"))
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _load_json(index).get("weight_map") or {}
        named = [f for k, f in weight_map.items() if _is_fc(k)]
        files = [directory / named[0]] if named else files
    for path in files:
        header = read_header(path)
        for name, entry in header.items():
            if name == "__metadata__" or not _is_fc(name) or not isinstance(entry, dict):
                continue
            shape = entry.get("shape")
            if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(s, int) for s in shape)):
                raise PatchcraftError(f"{path}: {name}: expected a 2-d shape, got {shape!r}")
            return shape[1], f"{name} {shape[0]}x{shape[1]} in {path.name}"
    return None, "no fc.weight in a safetensors file"


@dataclass(frozen=True)
class TargetConfig:
    path: Path
    architectures: tuple[str, ...]
    num_layers: int | None
    hidden_size: int | None
    #: Every top-level field of the config and of its text config (the text config's win): the switches a
    #: forward reads (Kimi-K3's ``attn_res_block_size``), to tell which side of one this target runs.
    fields: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def read_target(path: Path) -> TargetConfig:
    """The target's layer count and hidden size (top level or its text config)."""
    config_path = _config_path(path)
    config = _load_json(config_path)
    scopes = [config] + [config[k] for k in _TEXT_CONFIGS if isinstance(config.get(k), dict)]
    layers = next((s["num_hidden_layers"] for s in scopes if "num_hidden_layers" in s), None)
    hidden = next((s["hidden_size"] for s in scopes if "hidden_size" in s), None)
    return TargetConfig(
        path=config_path,
        architectures=tuple(str(a) for a in config.get("architectures") or ()),
        num_layers=_int(layers, f"{config_path}: num_hidden_layers"),
        hidden_size=_int(hidden, f"{config_path}: hidden_size"),
        fields={k: v for scope in scopes for k, v in scope.items()},
    )


def with_ids(draft: DraftConfig, ids: tuple[int, ...]) -> DraftConfig:
    """``draft`` with ``eagle_config.eagle_aux_hidden_state_layer_ids`` set to ``ids``, as a fix sets them."""
    raw = dict(draft.raw)
    eagle = dict(raw.get("eagle_config") or {})
    eagle["eagle_aux_hidden_state_layer_ids"] = list(ids)
    raw["eagle_config"] = eagle
    return replace(draft, layer_ids=tuple(ids), raw=raw)
