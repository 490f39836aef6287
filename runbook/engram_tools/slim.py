#!/usr/bin/env python3
"""The slim Engram source directory recipe A mounts at ``/engram-src`` (seed A
``scripts/prepare_engram_src.py``): the Engram shards hard-linked (copied where a link is refused), the
checkpoint's ``config.json`` (the loader reads ``engram_layer_ids`` / ``engram_num_embeddings`` from it),
and an index whose ``weight_map`` keeps only the Engram tables. Without it vLLM's loader, pointed at the
full checkpoint's index by ``engram_table_dir``, looks for all 48 shards.

Stdlib only: shipped to and run on each node like ``pack.py``.

    python3 slim.py --src ~/.cache/dsv41-flash-exl3/engram-src --dst ~/.cache/vllm-dsv41-flash-exl3/engram-src
    python3 slim.py ... --symlink      # a worker whose source is the head's NFS export: no 190 GiB copy

Prints one JSON summary line; exit 0 done (or already done), 2 bad source.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
ENGRAM_SUFFIXES = (".engram.embed.weight", ".engram.embed.scale")
MARK = {"dsv41_engram_src": "embed-only"}


def slim_index(index: dict) -> dict:
    """The index keeping only the Engram tables (pure)."""
    weight_map = {k: v for k, v in (index.get("weight_map") or {}).items() if k.endswith(ENGRAM_SUFFIXES)}
    return {"metadata": {**(index.get("metadata") or {}), **MARK}, "weight_map": dict(sorted(weight_map.items()))}


def _atomic_json(path: str, doc: dict) -> None:
    tmp = f"{path}.partial"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _link(src: str, dst: str, symlink: bool = False) -> str:
    if symlink:          # the source is a share (NFS): point at it, never copy ~95 GiB per shard
        if os.path.islink(dst) and os.readlink(dst) == src:
            return "present"
        tmp = f"{dst}.partial"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(src, tmp)
        os.replace(tmp, dst)
        return "symlinked"
    if os.path.exists(dst) and not os.path.islink(dst) and os.path.getsize(dst) == os.path.getsize(src):
        return "present"
    tmp = f"{dst}.partial"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    try:
        os.link(src, tmp)
        how = "linked"
    except OSError:                       # another filesystem: a copy, under a temporary name
        shutil.copyfile(src, tmp)
        how = "copied"
    os.replace(tmp, dst)
    return how


def make(src: str, dst: str, symlink: bool = False) -> dict:
    """``symlink``: the shards are absolute symlinks to ``src`` (a shared source; the launch mounts ``src`` at
    the same path in the container so they resolve); otherwise hard links, or copies across filesystems."""
    src, dst = os.path.abspath(os.path.expanduser(src)), os.path.expanduser(dst)
    index_path = os.path.join(src, INDEX)
    if not os.path.isfile(index_path) or not os.path.isfile(os.path.join(src, CONFIG)):
        return {"ok": False, "error": f"{src} lacks {INDEX} or {CONFIG} (02_weights downloads them)"}
    with open(index_path) as fh:
        slim = slim_index(json.load(fh))
    shards = sorted(set(slim["weight_map"].values()))
    if not shards:
        return {"ok": False, "error": f"{index_path} maps no Engram tables (keys ending {ENGRAM_SUFFIXES})"}
    missing = [s for s in shards if not os.path.isfile(os.path.join(src, s))]
    if missing:
        return {"ok": False, "error": f"Engram shards missing in {src}: {', '.join(missing)}"}
    os.makedirs(dst, exist_ok=True)
    done = {s: _link(os.path.join(src, s), os.path.join(dst, s), symlink) for s in shards}
    done[CONFIG] = _link(os.path.join(src, CONFIG), os.path.join(dst, CONFIG), symlink)
    _atomic_json(os.path.join(dst, INDEX), slim)
    return {"ok": True, "dst": dst, "shards": shards, "tables": len(slim["weight_map"]), "files": done}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--dst", required=True)
    ap.add_argument("--symlink", action="store_true",
                    help="symlink the shards (SRC is a share, e.g. the head's export over NFS) instead of linking/copying")
    args = ap.parse_args(argv)
    summary = make(args.src, args.dst, symlink=args.symlink)
    print(json.dumps(summary))
    return 0 if summary["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
