"""Recipe A's image checks before the launch (issue #22 risks): the moving :2.9bpw tag against the pinned checkout's
recipe stamp (a WARN naming both), and the GPU self-check (run when EXPECT_GPU=1; a failure stops the start)."""
from __future__ import annotations

import re
import subprocess

import pytest

from runbook.checks import Status
from runbook.launch import selfcheck
from runbook.profile import REPO_ROOT, load_profile
from support.doubles import FakeCluster, FakeNode, exact, res

IMAGE = "ghcr.io/miaai-lab/deepseek-v4.1-flash-exl3-2x-dgx-sparks:2.9bpw"
CHECKOUT = "/home/spark/recipes/DeepSeek-v4.1-Flash-EXL3-2x-DGX-Sparks"


def _profile(**ov):
    return load_profile(REPO_ROOT / "env" / "exl3-v41.env", {k: str(v) for k, v in ov.items()})


def _cluster(rules):
    head = FakeNode("head", 0, rules=[(exact('printf %s "$HOME"'), res(0, "/home/spark")), *rules])
    return FakeCluster([head, FakeNode("worker", 1, rules=[])]), head


def test_the_stamp_is_seed_as_overlay_recipe_hash(tmp_path):
    """The command hashes what seed A hashes: Dockerfile + overlay/ files/ tests/, relative, C-sorted, no caches."""
    (tmp_path / "overlay" / "__pycache__").mkdir(parents=True)
    (tmp_path / "files").mkdir()
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "overlay" / "exl3.py").write_text("a\n")
    (tmp_path / "overlay" / "__pycache__" / "exl3.cpython-312.pyc").write_text("junk\n")
    (tmp_path / "files" / "k.json").write_text("{}\n")
    (tmp_path / "README.md").write_text("not in the image\n")
    got = subprocess.run(["bash", "-c", selfcheck.stamp_command(str(tmp_path))], capture_output=True, text=True,
                         timeout=30).stdout.strip()
    listing = subprocess.run(["bash", "-c", f"cd {tmp_path} && sha256sum Dockerfile files/k.json overlay/exl3.py"],
                             capture_output=True, text=True, timeout=30).stdout
    import hashlib
    assert got == hashlib.sha256(listing.encode()).hexdigest()


@pytest.mark.parametrize("label,status", [("abc123", Status.PASS), ("fff000", Status.WARN), ("", Status.WARN)])
def test_a_stamp_that_differs_is_a_warning_naming_both(label, status):
    cluster, head = _cluster([(re.compile(r"^cd .*sha256sum \| awk"), res(0, "abc123\n")),
                              (exact(selfcheck.label_command(IMAGE)), res(0, label + "\n"))])
    row = selfcheck.stamp_check(cluster, _profile())
    assert row.status is status, row.observed
    if status is Status.WARN and label:
        assert "abc123" in row.observed and "fff000" in row.observed and "docker build" in row.fix
    assert head.commands[1].startswith(f"cd {CHECKOUT} && ")


@pytest.mark.parametrize("code,status", [(0, Status.PASS), (1, Status.FAIL)])
def test_the_gpu_self_check_runs_the_recipes_tests_and_a_failure_stops_the_start(code, status):
    cluster, head = _cluster([(re.compile(r"^set -o pipefail; timeout 900 docker run --rm --gpus all "
                                          r"-e EXL3_SELFCHECK_GPU=1 --entrypoint bash "),
                               res(code, "test_engram_dequant: OK\n" if not code else "FP8 rows read as uint8\n"))])
    row = selfcheck.gpu_selfcheck(cluster, _profile())
    assert row.status is status
    assert "test_exl3_overlay.py && python3 /opt/dsv41/test_engram_dequant.py" in head.commands[-1]


def test_not_applicable_without_a_gpu_on_the_lab_and_for_recipe_b():
    cluster, head = _cluster([])
    assert selfcheck.gpu_selfcheck(cluster, _profile(EXPECT_GPU=0)).status is Status.NA
    b = load_profile(REPO_ROOT / "env" / "dspark-v4.env")
    assert selfcheck.gpu_selfcheck(cluster, b).status is Status.NA
    assert selfcheck.stamp_check(cluster, b).status is Status.NA
    lab = load_profile(REPO_ROOT / "env" / "lab.env")
    assert selfcheck.gpu_selfcheck(cluster, lab).status is Status.NA
    assert head.commands == []
