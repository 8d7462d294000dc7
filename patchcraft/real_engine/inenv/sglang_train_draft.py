"""Train a tiny EAGLE-3 draft on ``[hs0, hs_a+1, hs_b+1]`` of a tiny DeepSeek-V3: ``python sglang_train_draft.py OUT_DIR``.

The seed's case in small (docs/real-engine.md, "A trained draft, miswired
and fixed"). Writes into OUT_DIR:

* ``target/``: a 4-layer DeepSeek-V3 (MLA, 4 routed experts + 1 shared), its
  embedding at scale 0.3 so its greedy output follows its input (at the
  smoke's 0.02 it repeats one token, which any draft predicts);
* ``draft-fixed/``: the draft, config ids ``[-1, a, b]`` (a=1, b=2): what it
  was trained on, hs[0], hs[2], hs[3], once SGLang captures the embedding;
* ``draft-miswired/``: the same weights, config ids ``[0, a, b]``: the config
  that unpatched SGLang serves (hs[1], hs[2], hs[3]);
* ``training.json``: the data, the steps, and the draft's next-token accuracy
  on held-out sequences fed each wiring.

The draft is SGLang's ``LlamaForCausalLMEagle3`` computed in torch
(``eagle3_torch.draft_logits``, as ``srt/models/llama_eagle3.py`` computes it: ``fc`` over the three states; one layer whose
attention takes ``[input_layernorm(embed(token t+1)), hidden_norm(fc)]``,
neox rope; the fc output as the residual; a final norm; its own lm_head;
the target's embedding), trained on the target's own greedy sequences: at
position t it sees the states of token t and the embedding of token t+1,
and predicts token t+2, as EAGLE's draft extend feeds it.
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

import sglang_models  # noqa: E402
from eagle3_torch import draft_logits  # noqa: E402  (the draft step as both engines compute it; one copy)
from sglang_runtime import load_standalone  # noqa: E402

NUM_LAYERS = 4
A, B = 1, 2  # trained on [hs0, hs[A+1], hs[B+1]]
TRAINED_ON = (0, A + 1, B + 1)
MISWIRED_FEED = (1, A + 1, B + 1)  # what unpatched SGLang feeds for the config [0, A, B]
PROMPT_LEN, GEN_LEN = 8, 40
TRAIN_SEQS, HELD_OUT = 96, 16
STEPS, LR = 120, 3e-3
EMBED_STD = 0.3


def sequences(model: Any, n: int, seed: int) -> list[list[int]]:
    """The target's own greedy continuations of random prompts (transformers' cached generate, fp32)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, 1024, (n, PROMPT_LEN), generator=g)
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=GEN_LEN,
            min_new_tokens=GEN_LEN,
            do_sample=False,
            pad_token_id=0,
        )
    return [list(map(int, row)) for row in out.tolist()]


def examples(
    model: Any, seqs: list[list[int]], feed: tuple[int, ...]
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per sequence: (tokens t+1, features of t from ``feed``, labels t+2 with -100 inside the prompt)."""
    out = []
    for seq in seqs:
        hs = sglang_models.hidden_states(model, seq)
        feats = torch.cat([hs[k] for k in feed], -1)[:-2]
        nxt = torch.tensor(seq[1:-1])
        labels = torch.tensor(seq[2:])
        labels[: PROMPT_LEN - 2] = -100  # the prompt's own tokens are random: nothing to learn
        out.append((nxt, feats, labels))
    return out


def accuracy(p: dict[str, torch.Tensor], cfg: dict[str, Any], embed: torch.Tensor, data: list[Any]) -> float:
    right = total = 0
    with torch.no_grad():
        for nxt, feats, labels in data:
            pred = draft_logits(p, cfg, embed[nxt], feats).argmax(-1)
            keep = labels != -100
            right += int((pred[keep] == labels[keep]).sum())
            total += int(keep.sum())
    return right / max(total, 1)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: sglang_train_draft.py OUT_DIR", file=sys.stderr)
        return 2
    started = time.monotonic()
    out = Path(argv[1])
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the cores are shared: more threads only contend
    checkpoint = load_standalone("checkpoint")
    draft_builder = load_standalone("draft_builder")
    target = out / "target"
    checkpoint.make_tiny_deepseek_v3(
        target, seed=0, stds={"embed": EMBED_STD}, **sglang_models.deepseek_config_overrides(NUM_LAYERS)
    )
    config = json.loads((target / "config.json").read_text())
    config["rope_scaling"] = dict(sglang_models.YARN_FACTOR_1)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    model = sglang_models.reference_model("deepseek_v3", target)
    embed = model.model.embed_tokens.weight.detach().float()

    cached = out / "data.pt"  # the data of a run killed in training (minutes on shared cores)
    if cached.exists():
        seqs, train_data, held_fixed, held_miswired = torch.load(str(cached))
    else:
        seqs = sequences(model, TRAIN_SEQS + HELD_OUT, seed=1)
        print(f"{len(seqs)} sequences in {time.monotonic() - started:.0f} s", flush=True)
        train, held = seqs[:TRAIN_SEQS], seqs[TRAIN_SEQS:]
        train_data = examples(model, train, TRAINED_ON)
        held_fixed = examples(model, held, TRAINED_ON)
        held_miswired = examples(model, held, MISWIRED_FEED)
        torch.save((seqs, train_data, held_fixed, held_miswired), str(cached))
    held = seqs[TRAIN_SEQS:]
    data_s = time.monotonic() - started

    cfg = draft_builder.eagle3_draft_config(config, [-1, A, B])
    params = {k: v.float().clone() for k, v in draft_builder.make_draft_tensors(cfg, seed=2).items()}
    params["embed_tokens.weight"] = embed.clone()
    trainable = [k for k, v in params.items() if v.is_floating_point() and k != "embed_tokens.weight"]
    for k in trainable:
        params[k].requires_grad_(True)
    optim = torch.optim.AdamW([params[k] for k in trainable], lr=LR, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        batch = [train_data[(step * 8 + i) % len(train_data)] for i in range(8)]
        loss = torch.stack(
            [
                F.cross_entropy(draft_logits(params, cfg, embed[nxt], feats), labels, ignore_index=-100)
                for nxt, feats, labels in batch
            ]
        ).mean()
        optim.zero_grad()
        loss.backward()
        for group in optim.param_groups:
            group["lr"] = LR * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        optim.step()
        if step % 20 == 0 or step == STEPS - 1:
            losses.append([step, round(float(loss.detach()), 4)])
            print(f"step {step} loss {float(loss.detach()):.4f}", flush=True)
    final = {k: v.detach() for k, v in params.items()}
    report = {
        "target": str(target),
        "num_layers": NUM_LAYERS,
        "embed_std": EMBED_STD,
        "trained_on": [f"hs[{k}]" for k in TRAINED_ON],
        "sequences": {"train": TRAIN_SEQS, "held_out": HELD_OUT, "prompt_len": PROMPT_LEN, "generated": GEN_LEN},
        "steps": STEPS,
        "losses": losses,
        "accuracy_train_wiring": round(accuracy(final, cfg, embed, train_data), 4),
        "accuracy_held_out_fixed": round(accuracy(final, cfg, embed, held_fixed), 4),
        "accuracy_held_out_miswired": round(accuracy(final, cfg, embed, held_miswired), 4),
        "miswired_feed": [f"hs[{k}]" for k in MISWIRED_FEED],
        "held_out_prompts": [s[:PROMPT_LEN] for s in held],
        "data_s": round(data_s, 1),
    }
    from safetensors.torch import save_file

    for name, ids in (("draft-fixed", [-1, A, B]), ("draft-miswired", [0, A, B])):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        draft_cfg = draft_builder.eagle3_draft_config(config, ids)
        draft_cfg["torch_dtype"] = "float32"
        save_file(
            {k: v.contiguous() for k, v in final.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"}
        )
        (folder / "config.json").write_text(json.dumps(draft_cfg, indent=2) + "\n")
    report["wall_s"] = round(time.monotonic() - started, 1)
    (out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "held_out_prompts"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
