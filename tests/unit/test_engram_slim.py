"""The slim Engram source dir (recipe A's /engram-src): run for real as the node-side script."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SLIM = Path(__file__).resolve().parents[2] / "runbook" / "engram" / "slim.py"


def _source(root: Path) -> Path:
    src = root / "engram-src"
    src.mkdir()
    weight_map = {"model.layers.1.engram.embed.weight": "model-00047-of-00048.safetensors",
                  "model.layers.1.engram.embed.scale": "model-00047-of-00048.safetensors",
                  "model.layers.14.engram.embed.weight": "model-00048-of-00048.safetensors",
                  "model.layers.2.mlp.up_proj.weight": "model-00003-of-00048.safetensors"}
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 9},
                                                                  "weight_map": weight_map}))
    (src / "config.json").write_text(json.dumps({"engram_layer_ids": [1, 14]}))
    for shard in ("model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"):
        (src / shard).write_bytes(os.urandom(4096))
    return src


def _run(src: Path, dst: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, str(SLIM), "--src", str(src), "--dst", str(dst)],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_slim_dir_keeps_only_the_engram_tables_and_links_their_shards(tmp_path):
    src, dst = _source(tmp_path), tmp_path / "cache" / "engram-src"
    code, summary = _run(src, dst)
    assert code == 0 and summary["ok"], summary
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == ["model.layers.1.engram.embed.scale", "model.layers.1.engram.embed.weight",
                                           "model.layers.14.engram.embed.weight"]
    assert index["metadata"]["dsv41_engram_src"] == "embed-only"
    shards = sorted(p.name for p in dst.glob("*.safetensors"))
    assert shards == ["model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"]
    # hard links: no second copy of ~95 GiB shards on the same disk
    assert all(os.stat(dst / s).st_ino == os.stat(src / s).st_ino for s in shards)
    assert (dst / "config.json").is_file()
    code, again = _run(src, dst)                        # a re-run changes nothing
    assert code == 0 and set(again["files"].values()) == {"present"}


def test_a_missing_engram_shard_is_named(tmp_path):
    src = _source(tmp_path)
    (src / "model-00048-of-00048.safetensors").unlink()
    code, summary = _run(src, tmp_path / "dst")
    assert code == 2 and "model-00048-of-00048.safetensors" in summary["error"]
    assert not (tmp_path / "dst" / "model.safetensors.index.json").exists()
