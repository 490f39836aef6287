"""Step 04 creates every writable bind-mount source as the SSH user before ``docker run`` (seed A's launch_cluster
``mkdir -p`` of its caches): dockerd creates a missing source as root, and the next run as the user -- a JIT
cache, recipe B's ``vllm-cache/tmp`` -- cannot write there."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from runbook.launch.server import writable_bind_sources
from runbook.profile import load_profile
from runbook.review import review

ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted((ROOT / "env").glob("*.env"))
_LINE = re.compile(r"^\[([\w-]+)\] \[(\w+)\] (.*)$")


def test_writable_sources_are_the_rw_host_directories_in_order():
    argv = ["docker", "run", "-d", "--name", "x",
            "-v", "/w/model:/model:ro", "-v", "/c:/root/.cache/vllm", "-v", "/c/triton:/root/.triton/cache",
            "-v", "/c/x:/x:ro,z", "-v", "/c/y:/y:z", "-v", "hfvol:/cache/huggingface", "-v", "/c:/again",
            "-e", "A=-v", "--entrypoint", "bash", "img"]
    assert writable_bind_sources(argv) == ["/c", "/c/triton", "/c/y"]
    assert writable_bind_sources([]) == []


def _launch_runs(text: str) -> list[tuple[str, str]]:
    """(node, command) of every [run] in the review's 04_launch section, each command's last line (the start line
    carries the generated entrypoint before it)."""
    section = re.split(r"\n## \d\d_", text.split("\n## 04_launch", 1)[1], maxsplit=1)[0]
    out, cur = [], None
    for line in section.splitlines():
        m = _LINE.match(line)
        if line.startswith("# the rendered plan"):
            cur = None              # the plan's text until the next command line belongs to no command
        elif m:
            cur = [m.group(1), m.group(2), m.group(3)]
            out.append(cur)
        elif cur is not None and not line.startswith("#"):
            cur[2] += "\n" + line
    return [(n, c.splitlines()[-1]) for n, kind, c in out if kind == "run"]


def test_every_docker_profile_makes_its_rw_bind_sources_before_the_rank_starts():
    checked = 0
    for path in PROFILES:
        profile = load_profile(path)
        if profile.runtime != "docker":
            continue
        runs = _launch_runs(review(path, home="/home/spark"))
        for node in (n.name for n in profile.nodes):
            mine = [c for n, c in runs if n == node]
            start = next(i for i, c in enumerate(mine) if " docker run -d " in c)
            argv = shlex.split(mine[start][mine[start].index("docker run -d "):])
            sources = writable_bind_sources(argv)
            assert sources, (path.name, node)
            assert all(s.startswith("/home/spark/") for s in sources)
            made = [c for c in mine[:start] if c.startswith("mkdir -p -- ")]
            assert made, f"{path.name} {node}: no mkdir before docker run"
            assert shlex.split(made[-1])[3:] == sources, (path.name, node)
            checked += 1
    assert checked >= 11         # exl3-v41 and dspark-v4: 2 ranks each, tp3-dspark: 3, tp4-v41: 4


def test_recipe_b_tmp_and_recipe_a_jit_caches_are_among_them():
    def sources(name: str) -> list[str]:
        runs = _launch_runs(review(ROOT / "env" / f"{name}.env", home="/home/spark"))
        return shlex.split(next(c for n, c in runs if n == "worker" and c.startswith("mkdir -p -- ")))[3:]
    assert sources("dspark-v4") == ["/home/spark/.cache/huggingface", "/home/spark/.cache/huggingface/vllm-cache/tmp"]
    a = sources("exl3-v41")
    assert {"/home/spark/.cache/vllm-dsv41-flash-exl3/triton", "/home/spark/.cache/vllm-dsv41-flash-exl3/tilelang"} <= set(a)
