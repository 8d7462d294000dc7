"""A server command line read the way the release's ``ServerArgs`` reads it, without importing SGLang.

What ``patchcraft run``'s preflight needs from ``python -m sglang.launch_server ...``
(or ``sglang serve``, or a launcher that passes the flags on): the speculative
algorithm, the draft and target paths (and their revisions), TP and PP. It
reads them as that release's argparse parser would:

- **The release's own flags**, read with ``ast`` from ``srt/server_args.py``
  (``parser.add_argument("--x", ...)``) and, from 0.5.12, from the annotated
  fields the parser is generated from (``name: A[T, "help"]`` or
  ``A[T, Arg(cli_name=..., aliases=[...])]`` in ``server_args.py`` and
  ``srt/arg_groups/``). argparse accepts any unambiguous prefix of a flag
  (``--speculative-algo EAGLE3``), so abbreviations are resolved against
  that table; an ambiguous one is left alone (the server refuses it too).
- **``--config FILE``** (0.5.3 on): as ``prepare_server_args`` does, only the
  exact token ``--config`` followed by a ``.yaml``/``.yml`` file is merged;
  the file's keys become ``--key value`` *before* the rest of the command
  line, so a flag on the command line wins. ``--config=FILE`` is not merged
  by SGLang, so not here either (a note says so).

When the release's flags cannot be read, the known spellings are used and any
token that may abbreviate one of them is reported as not checked.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

from patchcraft.base.errors import PatchcraftError
from patchcraft.base.tree_version import tree_noun

#: The release's ``dest`` -> the ServerArgs field the preflight reads.
WANTED = {
    "speculative_algorithm": "algorithm",
    "speculative_draft_model_path": "draft_path",
    "model_path": "model_path",
    "tp_size": "tp",
    "tensor_parallel_size": "tp",  # the dest before 0.5.14 (from_cli_args copies it to tp_size)
    "pp_size": "pp",
    "pipeline_parallel_size": "pp",
    "revision": "revision",
    "speculative_draft_model_revision": "draft_revision",
}
#: The release's switches (``store_true`` flags, no value) the preflight reads -> the ServerArgs field they turn off.
SWITCHES = {"enforce_disable_flashinfer_allreduce_fusion": "allreduce_fusion"}
#: The server flag that turns FlashInfer's all-reduce fusion off (0.5.10 on).
NO_FUSION_FLAG = "--enforce-disable-flashinfer-allreduce-fusion"
#: The spellings used when a release's flags cannot be read (every release defines these).
KNOWN = {
    "--speculative-algorithm": "speculative_algorithm",
    "--speculative-draft-model-path": "speculative_draft_model_path",
    "--speculative-draft-model": "speculative_draft_model_path",
    "--model-path": "model_path",
    "--tp-size": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--pp-size": "pp_size",
    "--pipeline-parallel-size": "pp_size",
    "--revision": "revision",
    "--speculative-draft-model-revision": "speculative_draft_model_revision",
    NO_FUSION_FLAG: "enforce_disable_flashinfer_allreduce_fusion",
}
SERVER_ARGS = "srt/server_args.py"
ARG_GROUPS = "srt/arg_groups"


@dataclass(frozen=True)
class ServerArgs:
    """The flags of a server command line that the preflight reads (as SGLang's ServerArgs would)."""

    algorithm: str | None = None
    draft_path: str | None = None
    model_path: str | None = None
    tp: int = 1
    pp: int = 1
    revision: str | None = None
    draft_revision: str | None = None
    #: False: the command passes --enforce-disable-flashinfer-allreduce-fusion (every layer reduces before a capture).
    allreduce_fusion: bool = True
    #: What was resolved on the way, for the output: ``--speculative-algo`` as ``--speculative-algorithm``, the config file.
    notes: tuple[str, ...] = ()
    #: Why a value the preflight needs could not be read, per field: the preflight refuses to say ok then.
    unchecked: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseFlags:
    """A release's long options (option string -> dest), read from its source."""

    options: dict[str, str]
    #: The release defines ``--config`` (its prepare_server_args merges the YAML file).
    config: bool
    files: tuple[Path, ...]


def flag_files(package: Path) -> list[Path]:
    """The files a release's parser is built from: ``srt/server_args.py``, and ``srt/arg_groups/`` from 0.5.12."""
    main = package / SERVER_ARGS
    if not main.is_file():
        return []
    groups = package / ARG_GROUPS
    return [main, *(sorted(groups.rglob("*.py")) if groups.is_dir() else [])]


def release_flags(package: Path | None) -> ReleaseFlags | None:
    """The long options of the release at ``package``, or None when its ``server_args.py`` is not there."""
    files = flag_files(package) if package is not None else []
    if not files:
        return None
    options: dict[str, str] = {}
    for path in files:
        try:
            data = path.read_bytes()
            if path.name != "server_args.py" and b"add_argument" not in data and b": A[" not in data:
                continue  # a hook or helper that defines no flag: not worth a parse
            tree = ast.parse(data, filename=str(path))
        except (OSError, SyntaxError, ValueError) as exc:
            raise PatchcraftError(f"{path}: cannot read the release's server flags ({exc})") from None
        for names, dest in _flags_of(tree):
            for name in names:
                options.setdefault(name, dest)
    return ReleaseFlags(options, "--config" in options, tuple(files))


def _flags_of(tree: ast.Module) -> Iterator[tuple[list[str], str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            found = _added_argument(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found = _annotated_field(node.target.id, node.annotation)
        else:
            continue
        if found is not None:
            yield found


def _added_argument(call: ast.Call) -> tuple[list[str], str] | None:
    """``parser.add_argument("--a", "--b", dest=...)``: its long options and dest."""
    names = [
        a.value
        for a in call.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")
    ]
    if not names:
        return None
    dest = _keyword(call, "dest")
    return names, dest if isinstance(dest, str) else names[0][2:].replace("-", "_")


def _annotated_field(name: str, annotation: ast.expr) -> tuple[list[str], str] | None:
    """``name: A[T, "help"]`` or ``A[T, Arg(...)]``: the options the release generates for it (arg_utils)."""
    if not (
        isinstance(annotation, ast.Subscript)
        and isinstance(annotation.value, ast.Name)
        and annotation.value.id in ("A", "Annotated")
    ):
        return None
    parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else []
    meta = parts[1] if len(parts) > 1 else None
    cli_name: Any = None
    aliases: Any = []
    if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
        if _keyword(meta, "no_cli") is True:
            return None
        cli_name = _keyword(meta, "cli_name")
        aliases = _keyword(meta, "aliases") or []
    elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
        return None  # no Arg and no help string: not registered from the field
    first = cli_name if isinstance(cli_name, str) else "--" + name.replace("_", "-")
    return [first, *(a for a in aliases if isinstance(a, str))], name


def _keyword(call: ast.Call, name: str) -> Any:
    for keyword in call.keywords:
        if keyword.arg == name:
            try:
                return ast.literal_eval(keyword.value)
            except ValueError:
                return None
    return None


def parse_server_args(argv: Sequence[str], package: Path | None = None) -> ServerArgs:
    """Read the preflight's flags from ``argv`` as the release at ``package`` would (see the module docstring)."""
    flags = release_flags(package)
    args, notes = list(argv), []
    if flags is not None and flags.config:
        args, note = merge_config(args)
        notes += [note] if note else []
    found: dict[str, str] = {}
    unchecked: dict[str, str] = {}
    off: set[str] = set()
    for index, arg in enumerate(args):
        if not arg.startswith("--") or arg == "--":
            continue
        name, eq, value = arg.partition("=")
        dest, note = _resolve(name, flags)
        if dest is None:
            for wanted in _could_be(name, flags) if note else ():
                unchecked[WANTED[wanted]] = note or ""
            continue
        if dest in SWITCHES:
            off.add(SWITCHES[dest])
            notes += [note] if note else []
            continue
        if dest not in WANTED:
            continue
        if note:
            notes.append(note)
        if not eq:
            if index + 1 >= len(args):
                continue
            value = args[index + 1]
        found[WANTED[dest]] = value  # the last one wins, as in argparse
    if "--config" in argv and flags is not None and not flags.config:
        notes.append(
            f"{tree_noun(package) if package else 'this release'} has no --config flag: the config file is not read"
        )
    parsed = _server_args(found, tuple(notes), unchecked)
    return replace(parsed, allreduce_fusion=False) if "allreduce_fusion" in off else parsed


def _resolve(name: str, flags: ReleaseFlags | None) -> tuple[str | None, str | None]:
    """``(dest, note)`` for one option token, as argparse resolves it (exact, else a unique prefix).

    A None dest with a note: the token may stand for a flag the preflight
    reads, and which one is not known (ambiguous on this release, or the
    release's flags could not be read).
    """
    options = flags.options if flags is not None else KNOWN
    if name in options:
        return options[name], None
    spellings = sorted(option for option in options if option.startswith(name))
    dests = {options[option] for option in spellings}
    if flags is None:
        if dests & set(WANTED):
            return (
                None,
                f"{name} may abbreviate {', '.join(spellings)}, and this release's {SERVER_ARGS} was not found to resolve it",
            )
        return None, None
    if len(dests) == 1:
        return dests.pop(), f"{name} read as {min(spellings, key=len)} (argparse accepts a unique prefix)"
    if dests & set(WANTED):
        return (
            None,
            f"{name} is ambiguous on this release ({', '.join(spellings)}): SGLang's parser refuses it; spell the flag out",
        )
    return None, None  # not a flag of this release: the server's parser deals with it


def _could_be(name: str, flags: ReleaseFlags | None) -> list[str]:
    options = flags.options if flags is not None else KNOWN
    return sorted({dest for option, dest in options.items() if option.startswith(name) and dest in WANTED})


def _server_args(found: dict[str, str], notes: tuple[str, ...], unchecked: dict[str, str]) -> ServerArgs:
    values: dict[str, Any] = {k: v for k, v in found.items() if k not in ("tp", "pp")}
    for key in ("tp", "pp"):
        if key in found:
            try:
                values[key] = int(found[key])
            except ValueError:
                raise PatchcraftError(f"the command's --{key}-size is {found[key]!r}, not a number") from None
    return ServerArgs(**values, notes=notes, unchecked=unchecked)


def merge_config(argv: list[str]) -> tuple[list[str], str | None]:
    """``--config FILE`` merged as the release's ConfigArgumentMerger does: the file's flags first, the command line after."""
    indices = [i for i, arg in enumerate(argv) if arg == "--config"]
    if not indices:
        if any(arg.startswith("--config=") for arg in argv):
            return (
                argv,
                "--config=FILE is not merged by SGLang (only `--config FILE`): the file's flags are not applied",
            )
        return argv, None
    if len(indices) > 1:
        raise PatchcraftError("the command gives --config more than once; SGLang refuses that too")
    index = indices[0]
    if index == len(argv) - 1:
        raise PatchcraftError("the command ends with --config and no file; SGLang refuses that too")
    path = Path(argv[index + 1])
    merged = config_flags(path) + argv[:index] + argv[index + 2 :]
    return merged, f"--config {path} read (its flags first, the command line's after)"


def config_flags(path: Path) -> list[str]:
    """The ``--key value`` tokens a YAML config file stands for (bools, lists and mappings as SGLang writes them)."""
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise PatchcraftError(f"{path}: --config must be a YAML file (.yaml or .yml), as SGLang requires")
    try:
        import yaml
    except ImportError:
        raise PatchcraftError(f"{path}: reading --config needs PyYAML (pip install pyyaml)") from None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PatchcraftError(f"{path}: cannot read the --config file ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise PatchcraftError(f"{path}: the --config file is not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PatchcraftError(f"{path}: the --config file must hold a mapping of flags at its top level")
    tokens: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            tokens += [flag] if value else []
        elif isinstance(value, list):
            tokens += [flag, *map(str, value)] if value else []
        elif isinstance(value, dict):
            tokens += [flag, json.dumps(value)]
        else:
            tokens += [flag, str(value)]
    return tokens


def flag_for(package: Path | None, dest: str) -> str:
    """The release's long option for ``ServerArgs.dest`` (``--x-y`` for ``x_y`` when its flags cannot be read)."""
    guess = "--" + dest.replace("_", "-")
    try:
        flags = release_flags(package)
    except PatchcraftError:
        flags = None
    if flags is None:
        return guess
    named = [option for option, d in flags.options.items() if d == dest]
    return guess if guess in named or not named else named[0]
