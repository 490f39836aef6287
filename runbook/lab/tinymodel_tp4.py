"""The lab's tiny model shaped for four ranks: tensor parallel 4, or TP2 x pipeline parallel 2 (issue 39).

    make_tiny_tp4_model(out_dir, seed=TP4_SEED) -> Path
    python -m runbook.lab.tinymodel_tp4 --out DIR        (with the lab venv's python, like tinymodel)

Like :mod:`runbook.lab.tinymodel_tp3`, it keeps everything of :func:`runbook.lab.tinymodel.make_tiny_model`
(tokenizer recipe, chat template, deterministic weights, the JSON rig) and changes only the shape, for the length
of the call: 8 attention heads and 4 KV heads (so TP=4 splits both, instead of replicating the default model's 2 KV
heads), head_dim 32 (a CPU attention size), hidden 256, intermediate 512, and 4 layers (2 per stage at PP=2). The
vocabulary stays 2048 (= 64 x 32: the padded vocabulary splits into 4 x 512).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .tinymodel_tp3 import make_shaped_model

TP4_TEXT_DIMS = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 4096,
}
TP4_VOCAB_SIZE = 2048
# Seed 0's greedy output under tool_choice=required repeats <tool_call> blocks until max_tokens, so vLLM's hermes
# parser returns no call and 06's tools.parallel / tools.forced_required fail; seeds 1, 2 and 5 stop after one
# call (seeds 0-5 served at TP=1 with 06's own requests, docs/four-nodes.md). The lab's tiny-tp4 is seed 1.
TP4_SEED = 1


def make_tiny_tp4_model(out_dir, seed: int = TP4_SEED, rigged: bool = True) -> Path:
    """The tiny model with :data:`TP4_TEXT_DIMS` and a 2048-token vocabulary (TP=4, or TP2 x PP2)."""
    return make_shaped_model(out_dir, TP4_TEXT_DIMS, TP4_VOCAB_SIZE, seed=seed, rigged=rigged)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.lab.tinymodel_tp4",
                                 description="Make the tiny random model shaped for TP=4 or TP2 x PP2 (no downloads).")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=TP4_SEED)
    args = ap.parse_args(argv)
    print(make_tiny_tp4_model(args.out, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
