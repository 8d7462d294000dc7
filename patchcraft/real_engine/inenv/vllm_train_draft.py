"""The seed's incident in small, for vLLM: a tiny EAGLE-3 draft trained on ``[hs0, hs2, hs3]`` of a tiny Llama.

``ENV/bin/python vllm_train_draft.py OUT_DIR`` (inside an engine environment, or any Python with torch,
transformers and safetensors) writes into OUT_DIR:

* ``target/``: a 6-layer Llama (tiny_models), its embedding at scale 0.3 so that its greedy output follows
  its input (something to learn);
* ``draft-fixed/``: the draft, config ids ``[0, 2, 3]``: in vLLM's convention (id X is hs[X]) exactly what it
  was trained on, once id 0 is a copy of the embedding (patchcraft apply) or the add-norm runs out of place;
* ``draft-miswired/``: the same weights, config ids ``[1, 2, 3]``: what a pipeline that writes SGLang's
  ``+1`` ids, or forgets the embedding, puts in the config: vLLM feeds hs[1], hs[2], hs[3];
* ``training.json``: the data, the steps, the losses and the draft's next-token accuracy on held-out
  sequences fed each wiring (the draft alone, on its training states: the check that settles it).

The draft's forward is eagle3_torch's (the engines' own computation); it is trained on the target's
greedy sequences: at position t it sees the states of token t and the embedding of token t+1, and
predicts token t+2, as EAGLE's draft step does.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import eagle3_torch  # noqa: E402
import tiny_models  # noqa: E402

FAMILY, NUM_LAYERS = "llama", 6
TRAINED_ON = (0, 2, 3)
FIXED_IDS, MISWIRED_IDS = [0, 2, 3], [1, 2, 3]
PROMPT_LEN, GEN_LEN = 8, 40
TRAIN_SEQS, HELD_OUT = 96, 16
STEPS, LR, EMBED_STD = 600, 2e-3, 0.3


def sequences(model: Any, n: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(3, tiny_models.VOCAB, (PROMPT_LEN,), generator=generator).tolist()
        out.append(prompt + tiny_models.greedy_of(model, prompt, GEN_LEN))
    return out


def examples(model: Any, seqs: list[list[int]], feed: tuple[int, ...]) -> list[tuple[Any, Any, Any]]:
    """Per sequence: (tokens t+1, states of t from ``feed``, labels t+2; the random prompt's own are ignored)."""
    out = []
    for seq in seqs:
        hs = tiny_models.states_of(model, seq)
        feats = torch.cat([hs[k] for k in feed], -1)[:-2]
        labels = torch.tensor(seq[2:])
        labels[: PROMPT_LEN - 2] = -100
        out.append((torch.tensor(seq[1:-1]), feats, labels))
    return out


def accuracy(params: dict[str, Any], cfg: dict[str, Any], embed: Any, data: list[Any]) -> float:
    right = total = 0
    with torch.no_grad():
        for nxt, feats, labels in data:
            pred = eagle3_torch.draft_logits(params, cfg, embed[nxt], feats).argmax(-1)
            keep = labels != -100
            right += int((pred[keep] == labels[keep]).sum())
            total += int(keep.sum())
    return right / max(total, 1)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: vllm_train_draft.py OUT_DIR", file=sys.stderr)
        return 2
    started = time.monotonic()
    out = Path(argv[1])
    torch.manual_seed(0)
    target = tiny_models.build_target(FAMILY, NUM_LAYERS, out / "target", seed=0, embed_std=EMBED_STD)
    model = tiny_models.load_target(FAMILY, target)
    config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    embed = model.model.embed_tokens.weight.detach().float()
    seqs = sequences(model, TRAIN_SEQS + HELD_OUT, seed=1)
    train, held = seqs[:TRAIN_SEQS], seqs[TRAIN_SEQS:]
    train_data = examples(model, train, TRAINED_ON)
    held_fixed = examples(model, held, TRAINED_ON)
    held_miswired = examples(model, held, tuple(MISWIRED_IDS))
    cfg = tiny_models.draft_config(config, FIXED_IDS)
    params = {
        k: v.float().clone().requires_grad_(True)
        for k, v in tiny_models.draft_tensors(3, config["vocab_size"], 2).items()
    }
    optimizer = torch.optim.AdamW(list(params.values()), lr=LR, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        batch = [train_data[(step * 8 + i) % len(train_data)] for i in range(8)]
        loss = sum(
            F.cross_entropy(eagle3_torch.draft_logits(params, cfg, embed[n], f), y, ignore_index=-100)
            for n, f, y in batch
        ) / len(batch)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        for group in optimizer.param_groups:
            group["lr"] = LR * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        optimizer.step()
        if step % 100 == 0 or step == STEPS - 1:
            losses.append([step, round(float(loss), 4)])
    final = {k: v.detach() for k, v in params.items()}
    for name, ids in (("draft-fixed", FIXED_IDS), ("draft-miswired", MISWIRED_IDS)):
        tiny_models.save_draft(out / name, tiny_models.draft_config(config, ids), final)
    report = {
        "target": str(target),
        "num_layers": NUM_LAYERS,
        "trained_on": [f"hs[{k}]" for k in TRAINED_ON],
        "fixed_ids": FIXED_IDS,
        "miswired_ids": MISWIRED_IDS,
        "sequences": {"train": TRAIN_SEQS, "held_out": HELD_OUT, "prompt_len": PROMPT_LEN, "generated": GEN_LEN},
        "steps": STEPS,
        "losses": losses,
        "accuracy_held_out_fixed": round(accuracy(final, cfg, embed, held_fixed), 4),
        "accuracy_held_out_miswired": round(accuracy(final, cfg, embed, held_miswired), 4),
        "held_out_prompts": [s[:PROMPT_LEN] for s in held],
        "wall_s": round(time.monotonic() - started, 1),
    }
    (out / "training.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if k != "held_out_prompts"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
