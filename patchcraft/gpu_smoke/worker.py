"""One ``sglang.Engine`` run in its own process (GPU only).

``python -m patchcraft.gpu_smoke.worker JOB.json`` reads
``{"engine_kwargs": {...}, "prompts": [[ids]], "sampling_params": {...},
"generate_kwargs": {...}, "out": "result.json", "expect_sglang_under":
"/tmp/..." | null}`` (``generate_kwargs``, optional: extra keywords for
``Engine.generate``, e.g. ``return_logprob``), runs the
prompts one at a time (so every forward batch belongs to one request) and
writes ``{"output_ids": [[...]], "meta_info": [...], "elapsed_s": ...,
"sglang_file": ..., "sglang_version": ...}``.

A separate process per engine keeps the probed copy of SGLang (first on
``PYTHONPATH``) and the plain installation apart, and frees GPU memory
between the speculative and the baseline run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    import sglang

    sg_file = str(Path(sglang.__file__).resolve())
    want = job.get("expect_sglang_under")
    if want and not sg_file.startswith(str(Path(want).resolve())):
        print(f"worker: sglang imported from {sg_file}, expected the probed copy under {want}", file=sys.stderr)
        return 3
    engine = sglang.Engine(**job["engine_kwargs"])
    try:
        outputs, metas = [], []
        start = time.perf_counter()
        for prompt in job["prompts"]:
            res = engine.generate(
                input_ids=prompt, sampling_params=job["sampling_params"], **job.get("generate_kwargs", {})
            )
            if isinstance(res, list):
                res = res[0]
            outputs.append([int(t) for t in res["output_ids"]])
            metas.append(_jsonable(res.get("meta_info", {})))
        elapsed = time.perf_counter() - start
    finally:
        engine.shutdown()
    Path(job["out"]).write_text(
        json.dumps(
            {
                "output_ids": outputs,
                "meta_info": metas,
                "elapsed_s": elapsed,
                "sglang_file": sg_file,
                "sglang_version": getattr(sglang, "__version__", None),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
