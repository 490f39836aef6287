"""Generate a scaled-down DeepSeek-V4.1-style Engram source dir (for tests and the benchmark).

Same tensor names, dtypes (``F8_E4M3`` weight ``[N, 256]``, ``F8_E8M0`` scale ``[N, 8]``), shard
names (``model-00047-of-00048.safetensors``, ``model-00048-of-00048.safetensors``), a
``model.safetensors.index.json`` and a ``config.json`` (keys nested under ``text_config`` like the
real one) whose ``engram_num_embeddings`` is the prime layout of the chosen (small) vocab.

Content is deterministic and every row is distinct: a fixed pseudo-random 1 MiB block, rotated
per block, with the first 8 bytes of every row stamped with ``tag(tensor) + row`` (u64 LE). Only
stdlib; writes in 16 MiB blocks (bounded memory).

    python -m runbook.engram_tools.synth --dst /tmp/engram-src [--vocab 16000 | --table-gib 2.2] [--layers 1]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import random
import struct
import zlib
from array import array
from typing import Any, Mapping

try:
    from . import layout as L
except ImportError:                    # run as a script next to layout.py (nodes); also under
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # python3 -I / PYTHONSAFEPATH
    import layout as L  # type: ignore[no-redef]

BASE_BYTES = 1 << 20
WRITE_BLOCK = 16 << 20
ITEMSIZE = {"F8_E4M3": 1, "F8_E8M0": 1, "U8": 1, "I8": 1, "BF16": 2, "F16": 2, "F32": 4}
DEFAULT_VOCAB = 16000          # ~384k rows/layer, ~101 MB per layer table: a few hundred MB in all


def base_block(seed: int) -> bytes:
    b = random.Random(seed).randbytes(BASE_BYTES)
    return b + b                # doubled so any rotation is one slice


def tensor_tag(name: str) -> int:
    return (zlib.crc32(name.encode()) & 0xFFFFFF) << 40


def tensor_block(name: str, row_bytes: int, row0: int, rows: int, base: bytes) -> bytes:
    """Bytes of rows ``[row0, row0+rows)`` of tensor ``name`` (pure function of its arguments)."""
    out = bytearray()
    per = max(1, BASE_BYTES // row_bytes)
    r = row0
    end = row0 + rows
    tag = tensor_tag(name)
    while r < end:
        blk = r // per
        n = min(end - r, (blk + 1) * per - r)
        rot = (blk * 7919 + (tag >> 40)) % BASE_BYTES
        start = rot + (r - blk * per) * row_bytes
        piece = bytearray(base[start:start + n * row_bytes])
        if row_bytes >= 8 and row_bytes % 8 == 0:
            q = memoryview(piece).cast("Q")
            q[0::row_bytes // 8] = array("Q", range(tag + r, tag + r + n))
        out += piece
        r += n
    return bytes(out)


def write_safetensors(path: str, tensors: list[dict[str, Any]], base: bytes) -> dict[str, Any]:
    """tensors: [{"name", "dtype", "shape"}] in file order. Data is generated block-wise."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    plan = []
    for t in tensors:
        shape = [int(x) for x in t["shape"]]
        item = ITEMSIZE[t["dtype"]]
        row_bytes = shape[-1] * item
        rows = 1
        for x in shape[:-1]:
            rows *= x
        nbytes = rows * row_bytes
        header[t["name"]] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + nbytes]}
        plan.append((t["name"], row_bytes, rows))
        off += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, row_bytes, rows in plan:
            step = max(1, WRITE_BLOCK // row_bytes)
            for r in range(0, rows, step):
                f.write(tensor_block(name, row_bytes, r, min(step, rows - r), base))
    os.replace(tmp, path)
    return header


def engram_text_config(vocab_size: int, layer_ids=(1, 14), n_heads: int = 8, max_ngram_size: int = 4,
                       head_dim: int = 256) -> dict[str, Any]:
    lay = L.EngramLayout.from_params(layer_ids=layer_ids, vocab_size=vocab_size, n_heads=n_heads,
                                     max_ngram_size=max_ngram_size, head_dim=head_dim)
    return {"engram_layer_ids": list(layer_ids),
            "engram_num_embeddings": [lay.num_rows(l) for l in layer_ids],
            "engram_max_ngram_size": max_ngram_size, "engram_vocab_size": vocab_size,
            "engram_n_heads": n_heads, "engram_head_dim": head_dim, "engram_pad_token_id": 2}


def shard_name(i: int, total: int = 48) -> str:
    return f"model-{i:05d}-of-{total:05d}.safetensors"


def make_source(dst: str, *, vocab_size: int = DEFAULT_VOCAB, layer_ids=(1, 14), write_layers=None,
                n_heads: int = 8, max_ngram_size: int = 4, head_dim: int = 256, seed: int = 0,
                overrides: Mapping[str, Mapping[str, Any]] | None = None, index: bool = True,
                nest_text_config: bool = True) -> dict[str, Any]:
    """Write config.json, shard(s) and index into ``dst``. ``write_layers`` limits which layers'
    tables are written (the config still lists every layer). ``overrides`` patch a tensor's header
    entry, e.g. ``{"layers.1.engram.embed.scale": {"dtype": "U8"}}`` (for refusal tests)."""
    os.makedirs(dst, exist_ok=True)
    tcfg = engram_text_config(vocab_size, layer_ids, n_heads, max_ngram_size, head_dim)
    config = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
              **({"text_config": tcfg} if nest_text_config else tcfg)}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    base = base_block(seed)
    overrides = overrides or {}
    weight_map: dict[str, str] = {}
    total = 0
    write_layers = list(layer_ids) if write_layers is None else [int(x) for x in write_layers]
    first_shard = 48 - len(layer_ids) + 1
    for i, layer in enumerate(layer_ids):
        if layer not in write_layers:
            continue
        rows = tcfg["engram_num_embeddings"][i]
        w = {"name": L.weight_name(layer), "dtype": L.WEIGHT_DTYPE, "shape": [rows, head_dim]}
        s = {"name": L.scale_name(layer), "dtype": L.SCALE_DTYPE, "shape": [rows, head_dim // L.SCALE_GROUP]}
        k = {"name": f"layers.{layer}.engram.k_weight", "dtype": "BF16", "shape": [4, head_dim]}
        for t in (w, s):
            t.update(overrides.get(t["name"], {}))
        order = [k, w, s] if i % 2 == 0 else [k, s, w]       # both tensor orders are exercised
        name = shard_name(first_shard + i)
        header = write_safetensors(os.path.join(dst, name), order, base)
        for t in order:
            weight_map[t["name"]] = name
            b, e = header[t["name"]]["data_offsets"]
            total += e - b
    if index:
        with open(os.path.join(dst, L.INDEX_NAME), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return {"dst": dst, "config": config, "bytes": total, "layers_written": write_layers}


def vocab_for_table_bytes(table_bytes: int, n_columns: int = 24, row_bytes: int = 264) -> int:
    return max(64, int(table_bytes / row_bytes / n_columns) + 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dst", required=True)
    p.add_argument("--vocab", type=int, default=0)
    p.add_argument("--table-gib", type=float, default=0.0, help="size of one layer's table (weight+scale)")
    p.add_argument("--layers", default="", help="write only these layers' tables (e.g. 1)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    vocab = a.vocab or (vocab_for_table_bytes(int(a.table_gib * (1 << 30))) if a.table_gib else DEFAULT_VOCAB)
    layers = [int(x) for x in a.layers.split(",") if x] or None
    res = make_source(a.dst, vocab_size=vocab, write_layers=layers, seed=a.seed)
    print(json.dumps({"dst": res["dst"], "vocab": vocab, "bytes": res["bytes"],
                      "engram_num_embeddings": res["config"]["text_config"]["engram_num_embeddings"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
