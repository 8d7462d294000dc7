"""SGLang on this machine's CPU: a release's environment, its run script and what is known of each release.

No CPU ``sgl_kernel`` is installable (``sglang-kernel`` holds CUDA builds;
SGLang's CPU backend targets Xeon AMX and is built from source), and the
release pins a CUDA torch (0.5.23: ``torch==2.14.1``). So the environment
holds the CPU torch the test extra pins, the release ``--no-deps``, and its
non-CUDA dependencies installed beside that torch (the torch pin in the
same pip command keeps it); the 8 CPU ops the engine imports from
``sgl_kernel`` are patchcraft's own stand-ins (``inenv/sglang_standins/``),
installed by the run script before sglang is imported, with the
torch-native fixes EAGLE-3 needs (``inenv/sglang_runtime.py``). torchvision
is not installed: the registry's builds do not load against the CPU torch
(``operator torchvision::nms does not exist``), and the run script serves a
placeholder for the import ``srt/multimodal/internvl_utils.py`` makes.
"""

from __future__ import annotations

from pathlib import Path

from patchcraft.real_engine.environments import EngineEnv, EnvSpec

ENGINE = "sglang"
DEFAULT_RELEASE = "0.5.23"
TORCH = "torch==2.13.0"
INENV = Path(__file__).resolve().parent / "inenv"

#: The release's dependencies that a CPU run of a text model imports, without the CUDA ones
#: (cuda-python, flashinfer, flash-attn-4, sglang-kernel, sgl-deep-*, nvidia-*, quack, tilelang,
#: torch_memory_saver, torchaudio, torchcodec, torchvision, timm). Pins are 0.5.23's where it pins.
DEPENDENCIES = (
    "triton",  # SGLang imports triton at module level; TRITON_INTERPRET=1 runs its kernels on CPU
    "aiohttp",
    "anthropic>=0.20.0",
    "blobfile==3.0.0",
    "build",
    "compressed-tensors==0.18.0",
    "datasets",
    "distro",
    "easydict",
    "einops",
    "fastapi",
    "gguf",
    "interegular",
    "IPython",
    "llguidance>=1.7.6,<2.0.0",
    "mistral_common>=1.11.5",
    "modelscope",
    "msgspec",
    "ninja",
    "numba==0.65.1",
    "numpy",
    "openai==2.8.0",
    "openai-harmony==0.0.4",
    "orjson",
    "outlines==0.1.11",
    "packaging",
    "partial_json_parser",
    "pillow",
    "prometheus-client>=0.20.0",
    "psutil",
    "pybase64",
    "pydantic",
    "python-dateutil<3",
    "python-multipart",
    "pyzmq>=25.1.2",
    "regex",
    "requests",
    "safetensors",
    "scipy",
    "sentencepiece==0.2.1",
    "setproctitle",
    "tiktoken",
    "tokenizers==0.23.2",
    "uvicorn>=0.51",
    "uvloop",
    "watchfiles",
    "xgrammar==0.2.7",
    "xxhash",
    "zstandard",
)
#: Where a release's own pins differ from 0.5.23's (its wheel's Requires-Dist), by package name.
RELEASE_PINS: dict[str, tuple[str, ...]] = {
    "0.5.23": ("transformers==5.19.0",),
    "0.5.22": ("transformers==5.19.0",),
    "0.5.21": ("transformers==5.12.1", "tokenizers==0.22.2", "tomli"),
    "0.5.20": ("transformers==5.12.1", "tokenizers==0.22.2", "xgrammar==0.2.1", "sentencepiece", "tomli"),
    "0.5.18": ("transformers==5.12.1", "tokenizers", "xgrammar==0.2.1", "sentencepiece", "tomli"),
    "0.5.16": ("transformers==5.12.1", "tokenizers", "xgrammar==0.2.1", "sentencepiece"),
    "0.5.15": ("transformers==5.12.1", "tokenizers", "xgrammar==0.2.1", "sentencepiece", "llguidance>=0.7.11,<0.8.0"),
    "0.5.14": (
        "transformers==5.8.1",
        "tokenizers",
        "xgrammar==0.2.1",
        "sentencepiece",
        "llguidance>=0.7.11,<0.8.0",
        "mistral_common>=1.11.0",
    ),
    "0.5.15": (
        "stops",
        "DeepSeek-V3: models/deepseek_v2.py:61 imports the DSA indexer, whose jit_kernel/dsa/"
        "cutedsl_paged_mqa_logits.py:15 imports cutlass (the CUDA-only nvidia-cutlass-dsl); the registry drops the "
        "model and serves TransformersMoEForCausalLM, which EAGLE-3 cannot use ('TransformersMoEForCausalLM' object "
        "has no attribute 'get_embed_and_head', speculative/eagle_worker_v2.py:329); Llama without speculation runs",
    ),
    "0.5.10": (
        "transformers==5.3.0",
        "tokenizers",
        "xgrammar==0.1.32",
        "sentencepiece",
        "llguidance>=0.7.11,<0.8.0",
        "mistral_common>=1.9.0",
    ),
}


def _name(requirement: str) -> str:
    for stop in "<>=!~[ ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.lower().replace("_", "-")


def dependencies(release: str) -> tuple[str, ...]:
    """The non-CUDA dependencies of ``release``: 0.5.23's, with the release's own pins where they differ."""
    pins = {_name(p): p for p in RELEASE_PINS.get(release, ("transformers",))}
    out = [pins.pop(_name(d), d) for d in DEPENDENCIES]
    return (*out, *pins.values())


#: Every release tried on this CPU: "runs" (the DeepSeek-V3 and Llama cases, EAGLE-3 included) or
#: "stops" with the first thing that stops it (file:line), as measured (docs/real-engine.md).
RELEASES: dict[str, tuple[str, str]] = {
    "0.5.23": (
        "runs",
        "offline Engine, EAGLE-3 steps 1 / topk 1 / 2 draft tokens, with the 8 stand-ins and the 3 torch-native fixes; "
        "DeepSeek-V3 [-1, 0, 1] unpatched: captured 2 of 3 aux hidden states (layers/aux_hidden_states.py:87, "
        "models/deepseek_v2.py:3245); patched: hs[0], hs[1], hs[2]",
    ),
    "0.5.22": (
        "runs",
        "as 0.5.23; DeepSeek-V3 [-1, 0, 1] unpatched: captured 2 of 3 aux hidden states "
        "(layers/aux_hidden_states.py:78, models/deepseek_v2.py:3191); patched: hs[0], hs[1], hs[2]",
    ),
    "0.5.20": (
        "runs",
        "as 0.5.23; DeepSeek-V3 [-1, 0, 1] unpatched: captured 2 of 3 aux hidden states "
        "(layers/aux_hidden_states.py:46, models/deepseek_v2.py:2883); patched: hs[0], hs[1], hs[2]",
    ),
    "0.5.16": (
        "runs",
        "the first release whose CPU path imports the 8 ops; DeepSeek-V3 [-1, 0, 1] unpatched: the target captures "
        "2 states without a check and the draft's fc fails on them (mat1 and mat2 shapes cannot be multiplied "
        "(8x1024 and 1536x512), models/llama_eagle3.py:221); patched: hs[0], hs[1], hs[2]",
    ),
    "0.5.15": (
        "stops",
        "DeepSeek-V3: models/deepseek_v2.py:61 imports the DSA indexer, whose jit_kernel/dsa/"
        "cutedsl_paged_mqa_logits.py:15 imports cutlass (the CUDA-only nvidia-cutlass-dsl); the registry drops the "
        "model and serves TransformersMoEForCausalLM, which EAGLE-3 cannot use ('TransformersMoEForCausalLM' object "
        "has no attribute 'get_embed_and_head', speculative/eagle_worker_v2.py:329); Llama without speculation runs",
    ),
    "0.5.10": (
        "stops",
        "EAGLE-3: NameError: name 'sgl_build_tree_kernel_efficient' is not defined (speculative/eagle_utils.py:137: "
        "0.5.10 has no CPU tree path), after the patched capture ran; Llama without speculation runs, greedy equal",
    ),
}


def env_spec(release: str) -> EnvSpec:
    return EnvSpec(
        name=f"sglang-cpu-{release}",
        engine=ENGINE,
        release=release,
        installs=((TORCH,), (f"sglang=={release}", "--no-deps"), (*dependencies(release), TORCH)),
        remove=(),
        # Only what pip put there: `import sglang` itself reaches torchvision from 0.5.20 on (the run serves a
        # placeholder), and the stand-ins travel with the run script, so a change to them rebuilds nothing.
        check=(
            "import importlib.metadata, torch, transformers, safetensors, triton; "
            "assert torch.__version__.endswith('+cpu'), torch.__version__; "
            f"assert importlib.metadata.version('sglang') == {release!r}, importlib.metadata.version('sglang')"
        ),
    )


def package(env: EngineEnv) -> Path:
    """The ``sglang`` package the environment imports: the tree patchcraft reads and patches."""
    return env.site_packages() / "sglang"


def script() -> Path:
    return INENV / "sglang_run.py"
