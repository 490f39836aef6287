#!/usr/bin/env python3
"""Verify packed Engram files against the source checkpoint.

STANDALONE, STDLIB ONLY (shipped next to ``layout.py``)::

    python3 check.py --src ENGRAM_SRC_DIR --packed PACKED_DIR --tp 2 --rank R [--layers 1,14] [--samples 256]

Per layer file: the 48 header bytes (magic, layer, lo, hi, total_rows, row_bytes) against the
layout computed from config.json, the rest of the 4096-byte header is zero, the exact size, and
the first, the last and ``--samples`` random rows compared byte-for-byte with the source
(256 weight bytes + 8 scale bytes read from the safetensors shard). Prints one JSON line;
exit 0 if every file passes, 1 if any check failed, 2 if the source/layout was refused.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

try:
    from . import layout as L
except ImportError:                    # run as a script next to layout.py (nodes); also under
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # python3 -I / PYTHONSAFEPATH
    import layout as L  # type: ignore[no-redef]

TOOL = "engram-check"


def check_file(path: str, rr: L.RankRange, wloc: L.TensorLoc, sloc: L.TensorLoc,
               samples: int, rng: random.Random) -> dict:
    res = {"path": path, "layer": rr.layer, "lo": rr.lo, "hi": rr.hi, "expected_bytes": rr.packed_bytes,
           "problems": [], "rows_checked": 0, "mismatched_rows": []}
    if not os.path.exists(path):
        res["problems"].append("missing")
        res["ok"] = False
        return res
    size = os.path.getsize(path)
    res["bytes"] = size
    with open(path, "rb") as f:
        header = f.read(L.HEADER_BYTES)
    try:
        got = L.parse_header(header)
    except L.LayoutError as exc:
        got = {}
        res["problems"].append(str(exc))
    want = L.parse_header(rr.header())
    res["header"] = got
    for key, value in want.items():
        if got.get(key) != value:
            res["problems"].append(f"header {key}={got.get(key)!r}, expected {value!r}")
    if len(header) == L.HEADER_BYTES and any(header[L.HEADER_STRUCT.size:]):
        res["problems"].append("header padding (bytes 48..4095) is not zero")
    if size != rr.packed_bytes:
        res["problems"].append(f"size {size} bytes, expected {rr.packed_bytes} "
                               f"(4096 + {rr.rows} rows x {rr.row_bytes})")
    rows = {0, rr.rows - 1} if rr.rows else set()
    if rr.rows:
        rows.update(rng.randrange(rr.rows) for _ in range(min(samples, rr.rows)))
    pf = os.open(path, os.O_RDONLY)
    fw = os.open(wloc.path, os.O_RDONLY)
    fs = os.open(sloc.path, os.O_RDONLY)
    try:
        for i in sorted(rows):
            a = rr.lo + i
            packed = L.read_exact(pf, rr.row_bytes, L.HEADER_BYTES + i * rr.row_bytes)
            src = L.source_rows(fw, fs, wloc, sloc, a, 1)
            res["rows_checked"] += 1
            if packed != src:
                if len(res["mismatched_rows"]) < 16:
                    res["mismatched_rows"].append(a)
        if res["mismatched_rows"]:
            res["problems"].append(f"{len(res['mismatched_rows'])}+ sampled row(s) differ from the "
                                   f"source, first global row {res['mismatched_rows'][0]}")
    finally:
        for fd in (pf, fw, fs):
            os.close(fd)
    res["ok"] = not res["problems"]
    return res


def run(args) -> dict:
    cfg = L.load_config(args.src, args.config)
    layout = L.EngramLayout.from_config(cfg, args.tp, args.dp)
    layers = [int(x) for x in args.layers.split(",") if x.strip()] if args.layers else list(layout.layer_ids)
    names = [n for layer in layers for n in (L.weight_name(layer), L.scale_name(layer))]
    locs = L.locate_tensors(args.src, names)
    rng = random.Random(args.seed)
    files = []
    for layer in layers:
        wloc, sloc = locs[L.weight_name(layer)], locs[L.scale_name(layer)]
        L.validate_tables(layout, layer, wloc, sloc)
        rr = layout.rank_range(layer, args.rank, args.dp_rank)
        files.append(check_file(os.path.join(args.packed, rr.file_name), rr, wloc, sloc, args.samples, rng))
    return {"tool": TOOL, "ok": all(f["ok"] for f in files), "tp": args.tp, "rank": args.rank,
            "samples": args.samples, "files": files}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Verify packed Engram files (stdlib only).")
    p.add_argument("--src", required=True)
    p.add_argument("--packed", required=True, help="dir holding engram-l*-r*of*.bin")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--dp-rank", type=int, default=0)
    p.add_argument("--layers", default="")
    p.add_argument("--config", default=None)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        out, code = run(args), 0
        code = 0 if out["ok"] else 1
    except (L.LayoutError, OSError) as exc:
        out, code = {"tool": TOOL, "ok": False, "error": str(exc), "tp": args.tp, "rank": args.rank}, 2
    print(json.dumps(out, sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
