"""Training dumps of a target's hidden states, located without reading a tensor (no torch).

``patchcraft probe`` runs a draft on the states it was trained on; this
module finds them in the files the training pipelines write and names each
by its Hugging Face index (``hs[0]`` the embedding output, ``hs[k]`` the
output of layer ``k-1``). What it returns are :class:`TensorRef` records:
a file, a byte offset, a dtype and a shape; the harness maps only those
bytes (:mod:`patchcraft.harness.draft_probe`). Three layouts
(docs/probe.md, "Dumps"):

- ``plain``, patchcraft's own: safetensors files, one sequence each, with
  ``input_ids`` ``[T]`` and ``hs.<k>`` ``[T, hidden]`` per HF index ``k``.
- ``speculators``: ``hs_<i>.safetensors`` as vllm-project/speculators'
  ``scripts/data_generation_offline.py`` writes them: ``token_ids`` ``[T]``
  and ``hidden_states`` ``[T, slots, hidden]``, the slots in the order of
  the ``eagle_aux_hidden_state_layer_ids`` given to vLLM
  (``scripts/launch_vllm.py``; id ``j`` is ``hs[j]``, the last one the
  verifier's). The file does not name them: ``--states`` does.
- ``specforge``: ``.ckpt`` files as sgl-project/SpecForge's
  ``scripts/prepare_hidden_states.py`` writes them (``torch.save`` of
  ``input_ids``, ``loss_mask``, ``hidden_state`` and ``aux_hidden_state``
  ``[1, T, 3*hidden]``, the three captures concatenated in SGLang's capture
  order). Read here by a restricted unpickler that builds no object; the
  states are not named in the file either: ``--states``.
"""

from __future__ import annotations

import collections
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.safetensors_header import read_header

PLAIN, SPECULATORS, SPECFORGE = "plain", "speculators", "specforge"

#: Bytes per element of each safetensors dtype name the probe reads.
ITEM_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "U8": 1, "I8": 1, "BOOL": 1}
_TORCH_STORAGES = {
    "BFloat16Storage": "BF16",
    "HalfStorage": "F16",
    "FloatStorage": "F32",
    "DoubleStorage": "F64",
    "LongStorage": "I64",
    "IntStorage": "I32",
    "ShortStorage": "I16",
    "ByteStorage": "U8",
    "CharStorage": "I8",
    "BoolStorage": "BOOL",
}
_STATE_KEY = re.compile(r"hs\.(\d+)")


@dataclass(frozen=True)
class TensorRef:
    """One tensor in a file: ``shape`` elements of ``dtype`` at ``offset`` (``stride``: in elements, None = contiguous)."""

    path: Path
    offset: int
    dtype: str
    shape: tuple[int, ...]
    stride: Optional[tuple[int, ...]] = None

    @property
    def extent(self) -> int:
        """Bytes from ``offset`` to the end of the last element."""
        if not self.shape or 0 in self.shape:
            return 0 if self.shape else ITEM_SIZE[self.dtype]
        stride = self.stride or _contiguous(self.shape)
        last = sum((n - 1) * s for n, s in zip(self.shape, stride))
        return (last + 1) * ITEM_SIZE[self.dtype]


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


@dataclass(frozen=True)
class StateRef:
    """One hidden state of one sequence: slot ``slot`` of ``tensor`` viewed as ``[T, slots, hidden]``."""

    tensor: TensorRef
    slot: int
    slots: int


@dataclass(frozen=True)
class Sample:
    """One sequence of a dump: its token ids and its states by HF index."""

    path: Path
    input_ids: TensorRef
    states: dict[int, StateRef]

    @property
    def tokens(self) -> int:
        return self.input_ids.shape[0]


@dataclass(frozen=True)
class Dump:
    """A dump's layout: its format, the HF indices it holds (stored order), their width, and its files."""

    path: Path
    format: str
    states: tuple[int, ...]
    hidden_size: int
    files: tuple[Path, ...]
    named_by: str  # "the file's keys" | "--states"

    def samples(self) -> Iterator[Sample]:
        """Each file's sequence, read (its header only) as it is reached."""
        for path in self.files:
            yield read_sample(path, self.format, self.states, self.hidden_size)


# -- finding the files ------------------------------------------------------------------


def dump_files(path: Path) -> tuple[str, tuple[Path, ...]]:
    """The format of the dump at ``path`` (a file or a directory) and its files, in a stable order."""
    if not path.exists():
        raise PatchcraftError(f"{path}: no such file or directory")
    if path.is_file():
        files = [path]
    else:
        files = sorted(
            (p for p in path.rglob("*") if p.is_file() and p.name.endswith((".safetensors", ".ckpt", ".ckpt.gz"))),
            key=_natural,
        )
    if not files:
        raise PatchcraftError(f"{path}: no .safetensors or .ckpt files: not a training dump")
    first = files[0]
    if first.name.endswith(".ckpt.gz"):
        raise PatchcraftError(
            f"{first}: a compressed SpecForge file: gunzip the dump first (gzip has no random access)"
        )
    if first.name.endswith(".ckpt"):
        return SPECFORGE, tuple(f for f in files if f.name.endswith(".ckpt"))
    header = read_header(first)
    if "hidden_states" in header and "token_ids" in header:
        return SPECULATORS, tuple(f for f in files if f.name.endswith(".safetensors"))
    if "input_ids" in header and any(_STATE_KEY.fullmatch(k) for k in header):
        return PLAIN, tuple(f for f in files if f.name.endswith(".safetensors"))
    raise PatchcraftError(
        f"{first}: not a training dump patchcraft reads (expected input_ids and hs.<k> tensors, "
        "speculators' token_ids and hidden_states, or a SpecForge .ckpt)"
    )


def _natural(path: Path) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(path)))


def open_dump(path: Path, states: Optional[Sequence[int]] = None) -> Dump:
    """The dump at ``path``; ``states``: the HF indices of its stored states, for the formats that do not name them."""
    fmt, files = dump_files(path)
    held, hidden, named_by = _first_layout(files[0], fmt, states)
    return Dump(path, fmt, held, hidden, files, named_by)


def _first_layout(path: Path, fmt: str, states: Optional[Sequence[int]]) -> tuple[tuple[int, ...], int, str]:
    if fmt == PLAIN:
        header = read_header(path)
        named = sorted(int(m.group(1)) for k in header if (m := _STATE_KEY.fullmatch(k)))
        if states is not None:
            absent = [k for k in states if k not in named]
            if absent:
                raise PatchcraftError(
                    f"{path}: --states names hs[{absent[0]}], which the dump does not hold "
                    f"(it holds {', '.join(f'hs[{k}]' for k in named)})"
                )
            return (
                tuple(states),
                _entry(path, header, f"hs.{states[0]}").shape[-1],
                "the file's keys, a subset by --states",
            )
        shape = _entry(path, header, f"hs.{named[0]}").shape
        return tuple(named), shape[-1], "the file's keys"
    tensors = _tensors(path, fmt)
    key = "hidden_states" if fmt == SPECULATORS else "aux_hidden_state"
    if key not in tensors:
        raise PatchcraftError(f"{path}: no {key} tensor: not a {fmt} dump")
    shape = _squeezed(tensors[key].shape)
    if fmt == SPECULATORS:
        if len(shape) != 3:
            raise PatchcraftError(f"{path}: hidden_states: expected [tokens, slots, hidden], got {list(shape)}")
        slots, hidden = shape[1], shape[2]
    else:
        slots = len(states) if states else 3
        if len(shape) != 2 or shape[1] % slots:
            raise PatchcraftError(f"{path}: aux_hidden_state: expected [tokens, {slots} x hidden], got {list(shape)}")
        hidden = shape[1] // slots
    if states is None:
        raise PatchcraftError(
            f"{path}: a {fmt} dump does not name the states it holds: pass --states hf:I,J,... "
            f"({slots} Hugging Face indices, in the order they are stored)"
        )
    if len(states) != slots:
        raise PatchcraftError(f"{path}: --states names {len(states)} states but the dump holds {slots}")
    return tuple(states), hidden, "--states"


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    while len(shape) > 2 and shape[0] == 1:
        shape = shape[1:]
    return shape


# -- one sequence ------------------------------------------------------------------------


def read_sample(path: Path, fmt: str, states: Sequence[int], hidden: int) -> Sample:
    """One file's sequence, checked: every tensor within the file, one length, ``hidden`` wide."""
    tensors = _tensors(path, fmt)
    ids_key = {PLAIN: "input_ids", SPECULATORS: "token_ids", SPECFORGE: "input_ids"}[fmt]
    if ids_key not in tensors:
        raise PatchcraftError(f"{path}: no {ids_key} tensor")
    ids = tensors[ids_key]
    ids = TensorRef(
        ids.path, ids.offset, ids.dtype, (_numel(ids.shape),), None if ids.stride is None else ids.stride[-1:]
    )
    found: dict[int, StateRef] = {}
    if fmt == PLAIN:
        for k in states:
            if f"hs.{k}" not in tensors:
                raise PatchcraftError(f"{path}: no hs.{k} tensor (the first file has one)")
            found[k] = StateRef(_flat(tensors[f"hs.{k}"], 1, path, f"hs.{k}"), 0, 1)
    else:
        key = "hidden_states" if fmt == SPECULATORS else "aux_hidden_state"
        if key not in tensors:
            raise PatchcraftError(f"{path}: no {key} tensor")
        ref = _flat(tensors[key], len(states), path, key)
        found = {k: StateRef(ref, slot, len(states)) for slot, k in enumerate(states)}
    for k, state in found.items():
        tokens, width = state.tensor.shape[0], state.tensor.shape[-1] // state.slots
        if width != hidden:
            raise PatchcraftError(f"{path}: hs[{k}] is {width} wide, the first file's states are {hidden}")
        if tokens != ids.shape[0]:
            raise PatchcraftError(f"{path}: {tokens} states but {ids.shape[0]} token ids")
    size = path.stat().st_size
    for ref in tensors.values():  # every tensor, used or not: a file cut short is refused whole
        if ref.offset + ref.extent > size:
            raise PatchcraftError(
                f"{path}: truncated: a tensor ends at byte {ref.offset + ref.extent}, the file has {size}"
            )
    return Sample(path, ids, found)


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def _flat(ref: TensorRef, slots: int, path: Path, name: str) -> TensorRef:
    """``ref`` as a contiguous ``[T, slots * hidden]`` tensor (leading 1s dropped)."""
    shape = _squeezed(ref.shape)
    if ref.stride is not None and tuple(ref.stride[-len(shape) :]) != _contiguous(shape):
        raise PatchcraftError(f"{path}: {name} is not stored contiguously")
    if len(shape) == 3:
        shape = (shape[0], shape[1] * shape[2])
    if len(shape) != 2:
        raise PatchcraftError(f"{path}: {name}: expected [tokens, hidden], got {list(ref.shape)}")
    return TensorRef(ref.path, ref.offset, ref.dtype, shape)


def _tensors(path: Path, fmt: str) -> dict[str, TensorRef]:
    return torch_zip_tensors(path) if fmt == SPECFORGE else safetensors_tensors(path)


def safetensors_tensors(path: Path) -> dict[str, TensorRef]:
    """Every tensor of a safetensors file, by name."""
    header = read_header(path)
    return {name: _entry(path, header, name) for name in header if name != "__metadata__"}


def _entry(path: Path, header: dict[str, Any], name: str) -> TensorRef:
    """Tensor ``name`` of the safetensors file whose header is ``header``; its data start after the header."""
    entry = header.get(name)
    if not isinstance(entry, dict):
        raise PatchcraftError(f"{path}: no tensor {name}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEM_SIZE:
        raise PatchcraftError(f"{path}: {name}: dtype {dtype!r} is not one the probe reads")
    if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise PatchcraftError(f"{path}: {name}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise PatchcraftError(f"{path}: {name}: bad data_offsets {offsets!r}")
    ref = TensorRef(path, _data_start(path) + offsets[0], dtype, tuple(shape))
    if offsets[1] - offsets[0] != ref.extent:
        raise PatchcraftError(
            f"{path}: {name}: data_offsets span {offsets[1] - offsets[0]} bytes, its shape needs {ref.extent}"
        )
    return ref


# -- torch.save files, read without torch ----------------------------------------------------


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: str


class _StorageType:
    def __init__(self, dtype: str) -> None:
        self.dtype = dtype


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple, stride: tuple, *rest: Any) -> tuple:
    return ("tensor", storage, offset, tuple(size), tuple(stride))


class _Unpickler(pickle.Unpickler):
    """Builds the tensors' places only: every class it is asked for outside this list is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _TORCH_STORAGES:
            return _StorageType(_TORCH_STORAGES[name])
        raise pickle.UnpicklingError(f"{module}.{name} is not a tensor")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"unexpected storage {pid!r}")
        return _Storage(str(pid[2]), pid[1].dtype)


def torch_zip_tensors(path: Path) -> dict[str, TensorRef]:
    """The top-level tensors of a ``torch.save`` file (its zip layout), by name."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
            if not pickles:
                raise PatchcraftError(f"{path}: no data.pkl: not a torch.save file")
            prefix = pickles[0][: -len("data.pkl")]
            loaded = _Unpickler(archive.open(pickles[0])).load()
            if not isinstance(loaded, dict):
                raise PatchcraftError(f"{path}: expected a dict of tensors")
            found = {}
            for name, value in loaded.items():
                if isinstance(value, tuple) and value and value[0] == "tensor":
                    _, storage, offset, size, stride = value
                    info = archive.getinfo(f"{prefix}data/{storage.key}")
                    if info.compress_type != zipfile.ZIP_STORED:
                        raise PatchcraftError(f"{path}: {name} is compressed inside the file")
                    start = _member_data(path, info) + offset * ITEM_SIZE[storage.dtype]
                    found[str(name)] = TensorRef(path, start, storage.dtype, size, stride)
            return found
    except (zipfile.BadZipFile, EOFError, KeyError) as exc:
        raise PatchcraftError(f"{path}: not a complete torch.save file (truncated?): {exc}") from None
    except pickle.UnpicklingError as exc:
        raise PatchcraftError(f"{path}: {exc}") from None
    except OSError as exc:
        raise PatchcraftError(f"{path}: cannot read ({exc.strerror})") from None


def _member_data(path: Path, info: zipfile.ZipInfo) -> int:
    """Where a stored zip member's bytes start: after its local header (30 bytes, its name, its extra field)."""
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise PatchcraftError(f"{path}: {info.filename}: bad zip local header")
    name_length, extra_length = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_length + extra_length


def _data_start(path: Path) -> int:
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
    return 8 + length
