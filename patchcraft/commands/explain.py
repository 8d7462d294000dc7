"""``patchcraft explain``: which hidden states a list of aux layer ids captures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from patchcraft.ui import console
from patchcraft.ui.documents import explanation_json
from patchcraft.ui.explain_text import explanation_text
from patchcraft.analysis.explain import explanation, read_ids, run_harness
from patchcraft.analysis.target_model import load_model
from patchcraft.commands._targets import release_targets
from patchcraft.base.engines import ServingEngine, detect_engine
from patchcraft.base.errors import PatchcraftError
from patchcraft.base.layer_ids import parse_layer_ids
from patchcraft.ui.machine_output import verdict_code
from patchcraft.base.target import SglangTree, resolve_target
from patchcraft.base.vllm_tree import VllmTree


@dataclass(frozen=True)
class ExplainOptions:
    layer_ids: str
    num_layers: int
    target: str | None = None
    release: str | None = None
    model: str | None = None
    output_format: str = "text"
    #: Tensor parallelism the server runs with (all-reduce fusion matters only above 1).
    tp: int = 1
    #: An overlay directory (patchcraft overlay build): its files are the ones the server imports.
    overlay: str | None = None
    #: The serving engine (None: told from TARGET or the installs, base.engines.detect_engine).
    engine: ServingEngine | None = None
    #: False: the server runs with --enforce-disable-flashinfer-allreduce-fusion (``--no-allreduce-fusion``).
    allreduce_fusion: bool = True
    #: vLLM: the platform and compilation judged (None: the tree's build platform, else every one; both modes).
    platform: str | None = None
    compilation: str | None = None


def resolve_tree(target: str | None, release: str | None, overlay: str | None = None) -> SglangTree:
    """TARGET, or ``--release X`` (fetched into the cache), or the installed sglang; or an overlay's tree.

    An overlay (``--overlay DIR``, or its ``tree/sglang`` as TARGET) is taken only when it is safe to serve
    (:func:`patchcraft.overlay.check.overlay_target`): a verdict is never given on files a server would not import.
    """
    from patchcraft.overlay.check import overlay_target, require_usable_tree

    if overlay is not None:
        if target or release:
            raise PatchcraftError("--overlay is the target: give no TARGET or --release with it")
        return resolve_target(str(overlay_target(Path(overlay))))
    (chosen,) = release_targets((target,) if target else (), release) or (None,)
    tree = resolve_target(chosen)
    require_usable_tree(tree.package)
    return tree


def resolve_vllm_tree(target: str | None, release: str | None, overlay: str | None = None) -> VllmTree:
    """vLLM's TARGET, ``--release X`` (fetched slim into the cache) or the installed vllm; or a vLLM overlay's tree.

    An overlay is taken as :func:`resolve_tree` takes SGLang's: only once it is safe to serve, and only one
    built from a vLLM install (its manifest's ``engine``).
    """
    from patchcraft.base.vllm_fetch import fetch_vllm
    from patchcraft.base.vllm_tree import resolve_vllm_target
    from patchcraft.overlay.check import engine_of, overlay_target, require_usable_tree

    if overlay is not None:
        if target or release:
            raise PatchcraftError("--overlay is the target: give no TARGET or --release with it")
        package = overlay_target(Path(overlay))
        if engine_of(Path(overlay)) != ServingEngine.VLLM.value:
            raise PatchcraftError(f"{overlay}: an SGLang overlay; --engine vllm needs one built from a vLLM install")
        return resolve_vllm_target(str(package))
    if target and release:
        raise PatchcraftError("give either TARGET or --release, not both")
    tree = resolve_vllm_target(str(fetch_vllm(release)) if release else target)
    require_usable_tree(tree.package)
    return tree


def explain_command(options: ExplainOptions) -> int:
    """Print the explanation; exit 1 when any id will not capture what it says.

    A verdict whose inputs are all unchanged since it was given is replayed (:mod:`patchcraft.engine.verdict_cache`).
    """
    # --release and --overlay name SGLang's unless --engine says otherwise; else TARGET or the installs tell.
    told = options.engine or (ServingEngine.SGLANG if options.release or options.overlay else None)
    if detect_engine(options.target, told) is ServingEngine.VLLM:
        if not options.model:
            raise PatchcraftError("--engine vllm needs --model (a class such as DeepseekV3ForCausalLM, or a file stem)")
        vllm_tree = resolve_vllm_tree(options.target, options.release, options.overlay)
        return _remembered("explain-vllm", options, vllm_tree, lambda: _explain_vllm(options, vllm_tree))
    tree = resolve_tree(options.target, options.release, options.overlay)
    return _remembered("explain", options, tree, lambda: _explain_sglang(options, tree))


def _remembered(command: str, options: ExplainOptions, tree: SglangTree, compute: Callable[[], int]) -> int:
    from patchcraft.engine import verdict_cache

    return verdict_cache.answer(
        command, options, [tree], lambda: verdict_cache.tree_inputs(tree), [tree.package], compute
    )


def _explain_sglang(options: ExplainOptions, tree: SglangTree) -> int:
    model = load_model(tree, options.model)
    reading = read_ids(
        model,
        parse_layer_ids(options.layer_ids),
        options.num_layers,
        tp=options.tp,
        allreduce_fusion=options.allreduce_fusion,
    )
    result = explanation(reading, run_harness(reading))  # run_harness: the CPU harness, when torch is there
    code = verdict_code(not result.warnings)
    return console.print_report(
        options.output_format, code, lambda: explanation_json(result, code), lambda: explanation_text(result)
    )


def _explain_vllm(options: ExplainOptions, tree: VllmTree) -> int:
    """``--engine vllm``: the release's runners, gate, setter and forward run (docs/vllm.md)."""
    from patchcraft.analysis.vllm_explain import explain_vllm
    from patchcraft.ui.vllm_explain_text import vllm_explanation_json, vllm_explanation_text

    result = explain_vllm(
        tree,
        options.model or "",  # explain_command refuses --engine vllm without --model
        parse_layer_ids(options.layer_ids),
        options.num_layers,
        options.tp,
        platform=options.platform or tree.build_platform,
        compilation=options.compilation,
        per_platform=True,
    )
    code = verdict_code(not result.findings)
    return console.print_report(
        options.output_format, code, lambda: vllm_explanation_json(result, code), lambda: vllm_explanation_text(result)
    )
