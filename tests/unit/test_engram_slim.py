"""The slim Engram source dir (recipe A's /engram-src): run for real as the node-side script."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SLIM = Path(__file__).resolve().parents[2] / "runbook" / "engram_tools" / "slim.py"


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


def _run(src: Path, dst: Path, *extra: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, str(SLIM), "--src", str(src), "--dst", str(dst), *extra],
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


def test_a_shared_source_is_symlinked_never_copied(tmp_path):
    """A worker reading the head's Engram source over NFS: the slim dir points at the shared shards (absolute
    symlinks; the launch mounts the source at the same path in the container) instead of copying ~190 GiB."""
    src, dst = _source(tmp_path), tmp_path / "cache" / "engram-src"
    code, summary = _run(src, dst, "--symlink")
    assert code == 0 and summary["ok"], summary
    shards = sorted(p.name for p in dst.glob("*.safetensors"))
    assert shards == ["model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"]
    for name in shards + ["config.json"]:
        assert (dst / name).is_symlink() and os.readlink(dst / name) == str(src / name)
        assert (dst / name).read_bytes() == (src / name).read_bytes()
    assert not (dst / "model.safetensors.index.json").is_symlink()     # the slim index is the dir's own
    code, again = _run(src, dst, "--symlink")
    assert code == 0 and set(again["files"].values()) == {"present"}
    code, linked = _run(src, dst)                      # the same dir made for a local source: real links again
    assert code == 0 and set(linked["files"].values()) == {"linked"}
    assert all(not (dst / s).is_symlink() for s in shards)


def test_the_launch_mounts_a_shared_source_where_the_symlinks_point():
    """exl3-v41 with WEIGHT_SYNC=nfs: the worker's rank gets its Engram source at the same path in the
    container; the head (a local source) and an rsync worker do not."""
    from runbook.launch.render import NodeFacts, render
    from runbook.profile import REPO_ROOT, load_profile
    facts = {n: NodeFacts(home="/home/spark") for n in ("head", "worker")}
    nfs = render(load_profile(REPO_ROOT / "env" / "exl3-v41.env"), facts)
    shared = "/home/spark/.cache/dsv41-flash-exl3/engram-src"
    assert f"{shared}:{shared}:ro" in nfs.rank("worker").docker_argv
    assert f"{shared}:{shared}:ro" not in nfs.rank("head").docker_argv
    rsync = render(load_profile(REPO_ROOT / "env" / "exl3-v41.env", {"WEIGHT_SYNC": "rsync"}), facts)
    assert f"{shared}:{shared}:ro" not in rsync.rank("worker").docker_argv
