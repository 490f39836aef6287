"""The lab's tiny model, shaped so tensor parallel 3 can shard it (three-node lab, env/lab-tp3.env).

    make_tiny_tp3_model(out_dir, seed=0) -> Path
    python -m runbook.lab.tinymodel_tp3 --out DIR        (with the lab venv's python, like tinymodel)

The default tiny model (:mod:`runbook.lab.tinymodel`) cannot run at TP=3, for three independent reasons,
each a hard ``divide()``/config check in vLLM 0.32 (CPU build)::

    num_attention_heads 4   % 3 != 0   "Total number of attention heads (4) must be divisible by tensor parallel size (3)."
    num_key_value_heads 2:  3 % 2 != 0 (kv heads are split when >= TP, replicated only when TP % kv == 0)
    vocab 2048 (padded to 64: 2048) % 3 != 0   VocabParallelEmbedding: "2048 is not divisible by 3"
    intermediate_size 512   % 3 != 0   MergedColumnParallelLinear gate_up shard

This variant keeps everything else of :func:`runbook.lab.tinymodel.make_tiny_model` (tokenizer recipe,
chat template, deterministic weights, the JSON rig) and only changes the shape, without editing that
module: 6 heads, 3 KV heads, head_dim 64, hidden 384, intermediate 768, and a tokenizer trained to a
vocabulary of 1920 (= 64 x 30, so the padded vocabulary splits into 3 x 640).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from unittest import mock

from . import tinymodel

TP3_TEXT_DIMS = {
    "hidden_size": 384,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 4096,
}
TP3_VOCAB_SIZE = 1920          # multiple of 64 (vLLM's vocab padding) and of 3
VOCAB_PADDING = 64             # vLLM DEFAULT_VOCAB_PADDING_SIZE


def shardable(dims: dict, vocab_size: int, tp: int) -> list[str]:
    """Why a model of these dims cannot run at tensor parallel ``tp`` in vLLM ([] = it can)."""
    why = []
    heads, kv = dims["num_attention_heads"], dims["num_key_value_heads"]
    if heads % tp:
        why.append(f"num_attention_heads {heads} % TP {tp} != 0")
    if kv >= tp and kv % tp or kv < tp and tp % kv:
        why.append(f"num_key_value_heads {kv} neither divisible by TP {tp} nor dividing it")
    padded = -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        why.append(f"vocab {vocab_size} (padded to {padded}) % TP {tp} != 0")
    if dims["intermediate_size"] % tp:
        why.append(f"intermediate_size {dims['intermediate_size']} % TP {tp} != 0")
    return why


def make_shaped_model(out_dir, dims: dict, vocab_size: int, *, seed: int = 0, rigged: bool = True) -> Path:
    """:func:`tinymodel.make_tiny_model` (llama) with other text dims and vocabulary size: the stand-ins shaped for a
    tensor/pipeline-parallel size the default tiny model cannot split (TP=3 here, TP=4 and PP=2 in tinymodel_tp4)."""
    defaults = tinymodel.train_tokenizer.__defaults__           # (special_tokens, vocab_size)
    with mock.patch.dict(tinymodel.TEXT_DIMS, dims), \
            mock.patch.object(tinymodel.train_tokenizer, "__defaults__", (defaults[0], vocab_size)):
        return tinymodel.make_tiny_model(out_dir, arch="llama", rigged=rigged, seed=seed)


def make_tiny_tp3_model(out_dir, seed: int = 0, rigged: bool = True) -> Path:
    """The tiny model with :data:`TP3_TEXT_DIMS` and a 1920-token vocabulary."""
    return make_shaped_model(out_dir, TP3_TEXT_DIMS, TP3_VOCAB_SIZE, seed=seed, rigged=rigged)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runbook.lab.tinymodel_tp3",
                                 description="Make the tiny random model shaped for TP=3 (no downloads).")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(make_tiny_tp3_model(args.out, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
