"""The click commands that check a draft or its ids against an install: explain, check-draft, probe.

Each parses its flags into its command's options value and calls one
function in ``patchcraft.commands``, as :mod:`patchcraft.cli` does for the
others; :mod:`patchcraft.cli` adds them to its group and runs the error
policy. The options they share with other commands are
:mod:`patchcraft.cli_options`'s.
"""

from __future__ import annotations

import sys

import click

from patchcraft.cli_options import (
    compilation_option,
    engine_option,
    format_option,
    no_allreduce_fusion_option,
    overlay_option,
    platform_option,
    tp_option,
)


@click.command()
@click.argument("target", required=False, type=click.Path())
@click.option(
    "--layer-ids",
    required=True,
    metavar="IDS",
    help="Comma-separated aux layer ids, e.g. -1,2,30 (none: the defaults).",
)
@click.option("--num-layers", required=True, type=int, help="The target's num_hidden_layers.")
@click.option("--model", metavar="NAME", help="Model file stem or class, e.g. deepseek_v2.")
@click.option("--release", metavar="VERSION", help="Use SGLang VERSION from the cache instead of TARGET.")
@format_option()
@tp_option
@platform_option
@compilation_option
@no_allreduce_fusion_option
@overlay_option("Explain the overlay in DIR: the files `patchcraft run` serves.")
@engine_option(
    "The server: sglang or vllm (default: told from TARGET, else the installed one; --release means sglang).",
    detect=True,
)
def explain(
    target,
    layer_ids,
    num_layers,
    model,
    release,
    output_format,
    tp,
    platform,
    compilation,
    no_allreduce_fusion,
    overlay_dir,
    engine,
) -> None:
    """Show which hidden states these aux layer ids capture on this install."""
    from patchcraft.commands.explain import ExplainOptions, explain_command

    sys.exit(
        explain_command(
            ExplainOptions(
                layer_ids,
                num_layers,
                target,
                release,
                model,
                output_format,
                tp=tp,
                overlay=overlay_dir,
                engine=engine,
                allreduce_fusion=not no_allreduce_fusion,
                platform=platform,
                compilation=compilation,
            )
        )
    )


@click.command(name="check-draft")
@click.argument("draft_dir", type=click.Path())
@click.argument("target", required=False, type=click.Path())
@click.option(
    "--target", "target_model", metavar="DIR", type=click.Path(), help="The target model's directory (its config.json)."
)
@click.option(
    "--trained-on",
    metavar="CONV",
    help="How the draft was trained: hf:0,3,31 (HF hidden_states indices), specforge, specforge@<SGLang release>, speculators, speculators@0.4, eagle, modelopt, modelopt@vllm-dump, torchspec, torchspec@vllm-ebf869e, angelslim or automodel (docs/layer-ids.md).",
)
@click.option("--model", metavar="NAME", help="Model file stem or class (default: the target's architecture).")
@click.option("--num-layers", type=int, help="The target's num_hidden_layers (default: from --target).")
@click.option("--release", metavar="VERSION", help="Use SGLang VERSION from the cache instead of TARGET.")
@click.option("--no-cuda-graph", "no_cuda_graph", is_flag=True, help="The server runs with --disable-cuda-graph.")
@format_option()
@tp_option
@platform_option
@compilation_option
@no_allreduce_fusion_option
@overlay_option("Check against the overlay in DIR: the files `patchcraft run` serves.")
@click.option(
    "--engine",
    "engines",
    metavar="ENGINES",
    help="sglang (the default), vllm, or sglang,vllm: each engine's verdict and ids for this draft (docs/check-draft.md).",
)
@click.option("--vllm-target", metavar="PATH", type=click.Path(), help="vLLM's tree (default: the installed vllm).")
@click.option(
    "--vllm-release", metavar="VERSION", help="Use vLLM VERSION from the cache (patchcraft fetch --engine vllm)."
)
@click.option("--vllm-model", metavar="NAME", help="The class vLLM serves (default: --model, else the target's).")
def check_draft(
    draft_dir,
    target,
    target_model,
    trained_on,
    model,
    num_layers,
    release,
    no_cuda_graph,
    output_format,
    tp,
    platform,
    compilation,
    no_allreduce_fusion,
    overlay_dir,
    engines,
    vllm_target,
    vllm_release,
    vllm_model,
) -> None:
    """Check a draft's aux layer ids and fc width against this install and target."""
    from patchcraft.commands.check_draft import CheckDraftOptions, check_draft_command

    options = CheckDraftOptions(
        draft_dir,
        target_model,
        target,
        release,
        model,
        num_layers,
        trained_on,
        not no_cuda_graph,
        output_format,
        tp=tp,
        overlay=overlay_dir,
        allreduce_fusion=not no_allreduce_fusion,
        engines=engines,
        vllm_target=vllm_target,
        vllm_release=vllm_release,
        vllm_model=vllm_model,
        platform=platform,
        compilation=compilation,
    )
    sys.exit(check_draft_command(options))


@click.command()
@click.argument("draft_dir", type=click.Path())
@click.argument("target", required=False, type=click.Path())
@click.option(
    "--data",
    required=True,
    metavar="PATH",
    type=click.Path(),
    help="The training dump: a file or a directory (docs/probe.md).",
)
@click.option(
    "--states",
    metavar="hf:I,J,...",
    help="The HF indices of the dump's states, in stored order (speculators, SpecForge).",
)
@click.option(
    "--target",
    "target_model",
    metavar="DIR",
    type=click.Path(),
    help="The target model's directory: its config.json, and its embedding when the draft has none.",
)
@click.option("--served", metavar="hf:I,J,K", help="Compare with this wiring instead of the one this install serves.")
@click.option("--model", metavar="NAME", help="Model file stem or class (default: the target's architecture).")
@click.option("--num-layers", type=int, help="The target's num_hidden_layers (default: from --target).")
@click.option(
    "--release", metavar="VERSION", help="Run SGLang VERSION's draft code from the cache instead of TARGET's."
)
@click.option("--tokens", type=click.IntRange(min=1), default=512, show_default=True, help="Positions scored.")
@click.option(
    "--top-k", "top_k", type=click.IntRange(min=1), default=4, show_default=True, help="k of the top-k accuracy."
)
@click.option(
    "--report",
    metavar="FILE",
    type=click.Path(),
    help="Also write the JSON report to FILE (check-draft --trained-on measured:FILE).",
)
@format_option()
@overlay_option("Run the draft code of the overlay in DIR.")
def probe(
    draft_dir,
    target,
    data,
    states,
    target_model,
    served,
    model,
    num_layers,
    release,
    tokens,
    top_k,
    report,
    output_format,
    overlay_dir,
) -> None:
    """Measure which hidden states a draft's weights expect: run its first step on its training states."""
    from patchcraft.commands.probe import ProbeOptions, probe_command

    options = ProbeOptions(
        draft_dir,
        data,
        target,
        release,
        overlay_dir,
        target_model,
        states,
        served,
        model,
        num_layers,
        tokens,
        top_k,
        output_format,
        report,
    )
    sys.exit(probe_command(options))
