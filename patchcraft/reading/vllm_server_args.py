"""A vLLM server command line, read for ``patchcraft run``'s preflight without importing vLLM.

Which commands serve vLLM (:func:`serves_vllm`): ``vllm serve ...`` (the
``vllm`` console script), ``python -m vllm.entrypoints.openai.api_server
...`` and ``python -m vllm.entrypoints.cli.main serve ...``. What the
preflight needs from them (:func:`parse_vllm_args`): the target model (the
positional ``MODEL`` of ``serve``, or ``--model``), its ``--revision`` and
``--hf-config-path``, the speculative config (``--speculative-config JSON``,
whose ``method`` and ``model`` say which draft is served and how), and the
parallel sizes (``--tensor-parallel-size``/``-tp``,
``--pipeline-parallel-size``/``-pp``). Flags are read as ``--flag value`` or
``--flag=value``, with ``_`` or ``-`` (vLLM accepts both), the last one
winning.

What is not read is named in ``unchecked`` and the launch is refused
rather than passed on a guess: ``--speculative-config.KEY`` (vLLM's dotted
form), an abbreviation of ``--speculative-config`` or another
``--speculative-*`` flag (the releases before 0.9), a ``--config`` file, a
speculative config that is not a JSON object, or a model given both as
``MODEL`` and ``--model``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

SPECULATIVE = "--speculative-config"
#: The modules whose ``python -m`` run a vLLM server; the ``serve`` subcommand's positional is the model.
_ENTRY_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main", "vllm.entrypoints.api_server")
_VALUE_FLAGS = {
    "--model": "model",
    "--revision": "revision",
    "--hf-config-path": "hf_config_path",
    SPECULATIVE: "speculative",
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
    "--config": "config",
}


@dataclass(frozen=True)
class VllmServerArgs:
    """What the preflight reads from a vLLM command line."""

    model: str | None = None
    revision: str | None = None
    hf_config_path: str | None = None
    #: The ``--speculative-config`` object (``{}``: none given).
    speculative: dict[str, Any] = field(default_factory=dict)
    tp: int = 1
    pp: int = 1
    #: What was not read, by what it concerns: the preflight refuses rather than guess.
    unchecked: dict[str, str] = field(default_factory=dict)
    #: ``eager`` (``--enforce-eager``, ``-O0``, a compilation config of mode 0) or ``compiled`` (vLLM's default):
    #: which fused add-norm runs on a platform depends on it (reading.vllm_norm_dispatch).
    compilation: str = "compiled"

    @property
    def method(self) -> str | None:
        value = self.speculative.get("method")
        return str(value) if value is not None else None

    @property
    def draft(self) -> str | None:
        value = self.speculative.get("model")
        return str(value) if value is not None else None


def _server_argv(argv: Sequence[str]) -> tuple[list[str], bool] | None:
    """The server's own arguments in ``argv`` and whether a positional MODEL may come first; None: not vLLM."""
    args = list(argv)
    if args and os.path.basename(args[0]) == "vllm":
        rest = args[1:]
        return (rest[1:], True) if rest[:1] == ["serve"] else (rest, False)
    for index, token in enumerate(args[:-1]):
        module = args[index + 1]
        if token == "-m" and (module == "vllm" or module in _ENTRY_MODULES):
            rest = args[index + 2 :]
            if module.endswith("cli.main") or module == "vllm":
                return (rest[1:], True) if rest[:1] == ["serve"] else (rest, False)
            return rest, False
    return None


def serves_vllm(argv: Sequence[str]) -> bool:
    """Whether ``argv`` starts a vLLM server (``vllm serve``, ``python -m vllm.entrypoints...``)."""
    return _server_argv(argv) is not None


def parse_vllm_args(argv: Sequence[str]) -> VllmServerArgs:
    """Read ``argv`` (a vLLM command, see :func:`serves_vllm`) as the preflight needs it."""
    found = _server_argv(argv)
    args, positional = found if found is not None else (list(argv), False)
    values: dict[str, str] = {}
    unchecked: dict[str, str] = {}
    model_tag = None
    if positional and args and not args[0].startswith("-"):
        model_tag, args = args[0], args[1:]
    index = 0
    eager = False
    while index < len(args):
        token = args[index]
        index += 1
        if not token.startswith("-"):
            continue
        step, level = _compilation(token, args[index] if index < len(args) else None, unchecked)
        if step:
            eager = eager or level == 0
            index += step - 1
            continue
        name, has_value, value = token.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        if name.startswith(SPECULATIVE + "."):
            unchecked["speculative"] = f"{name}: the dotted form of --speculative-config is not read"
            continue
        if name != SPECULATIVE and len(name) > 3 and (SPECULATIVE.startswith(name) or name.startswith("--speculative")):
            unchecked["speculative"] = f"{name}: not read (only --speculative-config JSON is)"
            continue
        key = _VALUE_FLAGS.get(name)
        if key is None:
            continue
        if not has_value:
            if index >= len(args):
                unchecked[key] = f"{name} without a value"
                continue
            value = args[index]
            index += 1
        values[key] = value
    if "config" in values:
        unchecked["config"] = f"--config {values['config']}: the file's flags are not read"
    model = values.get("model")
    if model_tag is not None:
        if model is not None and model != model_tag:
            unchecked["model"] = f"the model is given twice ({model_tag} and --model {model})"
        model = model_tag
    return VllmServerArgs(
        model=model,
        revision=values.get("revision"),
        hf_config_path=values.get("hf_config_path"),
        speculative=_speculative(values.get("speculative"), unchecked),
        tp=_size(values.get("tp"), "tp", unchecked),
        pp=_size(values.get("pp"), "pp", unchecked),
        unchecked=unchecked,
        compilation="eager" if eager else "compiled",
    )


#: The flags that say whether vLLM compiles the model (``-O`` is the optimization level; 0 runs eager).
_EAGER_FLAGS = ("--enforce-eager",)
_LEVEL_FLAGS = ("-O", "--optimization-level", "--compilation-config", "-cc")


def _compilation(token: str, following: str | None, unchecked: dict[str, str]) -> tuple[int, int | None]:
    """How many tokens a compilation flag takes (0: not one) and the level it sets (0 eager; None: compiled)."""
    name, has_value, value = token.partition("=")
    name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
    if name in _EAGER_FLAGS:
        return 1, 0
    if name.startswith("-O") and name[2:].isdigit():  # -O0, -O3
        return 1, int(name[2:])
    if name.startswith(("--compilation-config.", "-cc.", "-O.")):
        unchecked["compilation"] = f"{name}: the dotted form of the compilation config is not read"
        return 1, None
    if name not in _LEVEL_FLAGS:
        return 0, None
    text = value if has_value else following
    taken = 1 if has_value else 2
    if text is None:
        unchecked["compilation"] = f"{name} without a value"
        return 1, None
    if text.isdigit():
        return taken, int(text)
    try:
        config = json.loads(text)
    except ValueError:
        unchecked["compilation"] = f"{name} {text}: not read"
        return taken, None
    mode = config.get("mode", config.get("level")) if isinstance(config, dict) else None
    if mode in (0, "0", "NONE", "none"):
        return taken, 0
    return taken, None


def _speculative(text: str | None, unchecked: dict[str, str]) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        unchecked["speculative"] = f"--speculative-config is not JSON ({exc})"
        return {}
    if not isinstance(value, dict):
        unchecked["speculative"] = "--speculative-config is not a JSON object"
        return {}
    return value


def _size(text: str | None, key: str, unchecked: dict[str, str]) -> int:
    if text is None:
        return 1
    try:
        return int(text)
    except ValueError:
        unchecked[key] = f"--{key} {text}: not a number"
        return 1
