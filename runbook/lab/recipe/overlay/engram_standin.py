"""The lab recipe's stand-in for recipe A's file-backed Engram: per rank and Engram layer, attach the node's packed
file the way recipe A's row store does and print the same boot-log lines (the lab's vLLM serves no Engram).

    python3 engram_standin.py <vllm argv ...>     # start.sh runs it when DSV41_SOURCE is set

Recipe A (overlay/engram_file_backend.py + overlay/row_store.cpp, fork copy @ e2944b3): the rank's row range
comes from the hash layout (whole prime-sized columns per rank), the table's row count from the source shard's
safetensors header; ``DSV41_PACKED_DIR/engram-l{L}-r{rank}of{tp}.bin`` is attached only if it is a file and its
4096-byte header's first six little-endian u64 (magic, layer, lo, hi, rows, row bytes 264) are this rank's.
Otherwise "... does not match this rank ...; ignoring, using checkpoint" (stderr) and ``packed=False``; a file
with no full header or shorter than its rows aborts the rank ("Engram retrieval failed: ...", exit 134 here).
Then one ``File-backed Engram layer=L rank=r/tp rows=[lo,hi) cache=0.0GiB packed=...`` line per layer (stdout).

The layout is this recipe's own code (trial division is exact and fast for these sizes), as the real reader has
its own copy apart from the packer: a disagreement between the two is what the header check exists to catch.
Standard library only.
"""
from __future__ import annotations

import json
import os
import struct
import sys

MAGIC = 0x31344E4531565344          # row_store.cpp kPackedMagic, compared as a little-endian u64
HEADER = 4096
ROW_BYTES = 264


def _say(msg: str) -> None:
    print(f"[lab-recipe] {msg}", flush=True)


def _prime(n: int) -> bool:
    if n < 2 or n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def head_sizes(cfg: dict) -> list[list[int]]:
    """Prime bucket sizes per layer: per n-gram order the walk restarts at vocab-1 and takes the next unused prime."""
    used: set[int] = set()
    out = []
    for _ in cfg["engram_layer_ids"]:
        sizes = []
        for _order in range(int(cfg["engram_max_ngram_size"]) - 1):
            cur = int(cfg["engram_vocab_size"]) - 1
            for _head in range(int(cfg["engram_n_heads"])):
                cur += 1
                while cur in used or not _prime(cur):
                    cur += 1
                used.add(cur)
                sizes.append(cur)
        out.append(sizes)
    return out


def table_rows(src: str, layer: int) -> int:
    """The table's row count from the source shard's safetensors header (engram_file_backend._tensor_span)."""
    with open(os.path.join(src, "model.safetensors.index.json"), encoding="utf-8") as f:
        shard = json.load(f)["weight_map"][f"layers.{layer}.engram.embed.weight"]
    with open(os.path.join(src, shard), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return int(json.loads(f.read(n))[f"layers.{layer}.engram.embed.weight"]["shape"][0])


def _flag(argv: list[str], name: str, default: int) -> int:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith(name + "="):
            return int(a.split("=", 1)[1])
    return default


def _abort(reason: str) -> None:
    print(f"Engram retrieval failed: {reason} (errno=0)", file=sys.stderr, flush=True)
    sys.exit(134)


def attach(path: str, layer: int, lo: int, hi: int, rows: int) -> bool:
    """row_store_attach_packed: True attached, False ignored (the fallback line printed); aborts when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        head = os.pread(fd, HEADER, 0)
        if len(head) < HEADER:
            _abort("packed Engram shard has no header")
        fields = struct.unpack_from("<6Q", head)
        if fields != (MAGIC, layer, lo, hi, rows, ROW_BYTES):
            print(f"Engram: packed shard {path} does not match this rank (layer={layer} lo={lo} hi={hi}); "
                  "ignoring, using checkpoint", file=sys.stderr, flush=True)
            return False
        if os.fstat(fd).st_size < HEADER + (hi - lo) * ROW_BYTES:
            _abort("packed Engram shard is truncated")
        return True
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    src = os.environ.get("DSV41_SOURCE", "")
    packed_dir = os.environ.get("DSV41_PACKED_DIR", "")
    try:
        with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        cfg = config if "engram_layer_ids" in config else config["text_config"]
        layers = [int(x) for x in cfg["engram_layer_ids"]]
        sizes = head_sizes(cfg)
        rows = {layer: table_rows(src, layer) for layer in layers}
    except (OSError, KeyError, ValueError, TypeError) as exc:
        # recipe A's model build fails here; the lab's vLLM has no Engram to build, so it only says so
        _say(f"Engram stand-in: no Engram source at DSV41_SOURCE={src} ({type(exc).__name__}: {exc}); "
             "nothing attached (run 03_engram)")
        return 0
    tp = _flag(argv, "--tensor-parallel-size", 1)
    pp = _flag(argv, "--pipeline-parallel-size", 1)
    nnodes = _flag(argv, "--nnodes", 1)
    per_node = max(1, tp * pp // max(1, nnodes))
    node_rank = _flag(argv, "--node-rank", 0)
    # vLLM numbers the ranks TP innermost (global = stage x tp + tp_rank): a rank on a later pipeline stage holds
    # the same TP shard as its twin on stage 0, and recipe A's row store names the file by that TP rank
    for rank in sorted({g % tp for g in range(node_rank * per_node, (node_rank + 1) * per_node)}):
        for layer, cols in zip(layers, sizes):
            part = -(-len(cols) // tp)
            start, end = min(rank * part, len(cols)), min(rank * part + part, len(cols))
            lo, hi = sum(cols[:start]), sum(cols[:end])
            packed = False
            shard = os.path.join(packed_dir, f"engram-l{layer}-r{rank}of{tp}.bin") if packed_dir else ""
            if shard and os.path.isfile(shard):
                packed = attach(shard, layer, lo, hi, rows[layer])
            print(f"File-backed Engram layer={layer} rank={rank}/{tp} rows=[{lo},{hi}) cache=0.0GiB "
                  f"packed={packed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
