"""Step 02's share to N-1 workers at once: the real rsync (its remote shell a local one) and the real verifier on
each worker, every worker's rows kept, a failing worker named, a cut file never under its final name."""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from runbook import weights as W
from runbook.checks import Status
from runbook.weights.sharing import PARTIAL_DIR
from runbook.weights.transfer import share_to_workers
from support.doubles import LocalNode

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed (make lab-deps)")

BIG = "model-00001-of-00002.safetensors"
WORKERS = ("worker", "worker2", "worker3")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A verified head tree: two shards and a config, with the head's manifest (what step 02 shares)."""
    src = tmp_path_factory.mktemp("head") / "weights"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "tiny"}')
    (src / BIG).write_bytes(os.urandom(12 << 20))
    (src / "model-00002-of-00002.safetensors").write_bytes(os.urandom(300_000))
    expected = {"revision": "r" * 40, "files": [
        {"path": p.name, "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(src.iterdir())]}
    assert W.verify_dir(src, expected)["ok"]
    return src


def _nodes(tmp_path, names=WORKERS):
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
           "LANG": "C.UTF-8"}
    head = LocalNode("head", 0, home=tmp_path / "head", fabric_ip="10.81.0.11", env=env)
    workers = [LocalNode(n, k + 1, home=tmp_path / n, fabric_ip=f"10.81.0.{12 + k}", env=env)
               for k, n in enumerate(names)]
    return head, workers


def _shell(tmp_path, body: str) -> str:
    """rsync's remote shell: drops the host and runs rsync's server side locally, after ``body``."""
    path = tmp_path / f"shell-{abs(hash(body))}"
    path.write_text(f"#!/bin/sh\n{body}\nshift\nexec \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def _rows(result):
    return {c.name: c for c in result.checks}


def test_every_worker_receives_at_once_is_verified_and_a_failing_one_is_named(weights, tmp_path):
    head, workers = _nodes(tmp_path)
    # a barrier in the remote shell: each transfer waits until all three have started (one after the other,
    # the first would wait alone and give up)
    gate = tmp_path / "gate"
    gate.mkdir()
    shell = _shell(tmp_path, f"touch {gate}/$$; i=0; while [ $(ls {gate} | wc -l) -lt 3 ]; do "
                             f"i=$((i+1)); [ $i -gt 600 ] && echo 'barrier: alone' >&2 && exit 97; sleep 0.05; done")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where worker2's weights directory should be")
    dst = {"worker": tmp_path / "w1" / "m", "worker2": blocked / "m", "worker3": tmp_path / "w3" / "m"}
    manifest = W.read_manifest(weights)

    results = share_to_workers(workers, lambda w: W.rsync_to_worker(
        head, w, str(weights), str(dst[w.name]), target="localhost", ssh=shell, head_manifest=manifest,
        python=sys.executable), parallel=True)

    assert list(results) == list(WORKERS)                    # rank order, whatever order they finished in
    for name in ("worker", "worker3"):
        rows = _rows(results[name])
        assert [c.name for c in results[name].checks] == ["weights.rsync", "weights.verified", "weights.parity"]
        assert all(c.status is Status.PASS for c in results[name].checks), results[name].checks
        assert rows["weights.rsync"].node == name and rows["weights.verified"].node == name
        assert rows["weights.verified"].data["files_hashed"] == 3          # each worker hashed its own bytes
        assert (dst[name] / BIG).read_bytes() == (weights / BIG).read_bytes()
    failed = results["worker2"].checks
    assert [c.name for c in failed] == ["weights.rsync"] and failed[0].failed
    assert failed[0].node == "worker2" and "head -> worker2" in failed[0].observed
    assert "Not a directory" in failed[0].observed          # the tail of rsync's own message


def test_a_cut_transfer_leaves_no_file_under_its_final_name_and_a_rerun_completes(weights, tmp_path):
    # the head's rsync, as rendered, is cut (SIGTERM: a timeout, a Ctrl-C) 3 s into the 12 MiB shard at 2 MB/s
    bindir = tmp_path / "cut-bin"
    bindir.mkdir()
    real = shutil.which("rsync")
    (bindir / "rsync").write_text(f'#!/bin/sh\ncase "$1" in --server) exec {real} "$@";; esac\n'
                                  f'exec timeout -s TERM 3 {real} --bwlimit=2m "$@"\n')
    (bindir / "rsync").chmod(0o755)
    head, (worker,) = _nodes(tmp_path, ["worker"])
    cut_head = LocalNode("head", 0, home=tmp_path / "head", fabric_ip="10.81.0.11", path_first=[bindir],
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
    dst = tmp_path / "w" / "m"
    manifest = W.read_manifest(weights)
    first = W.rsync_to_worker(cut_head, worker, str(weights), str(dst), target="localhost", ssh=_shell(tmp_path, ":"),
                              head_manifest=manifest, python=sys.executable)
    assert [c.name for c in first.checks] == ["weights.rsync"] and first.checks[0].failed
    assert first.checks[0].node == "worker" and "rsync said:" in first.checks[0].observed
    assert not (dst / BIG).exists()                          # --partial left the half shard here
    kept = dst / PARTIAL_DIR / BIG
    assert not kept.exists() or kept.stat().st_size < (weights / BIG).stat().st_size
    again = W.rsync_to_worker(head, worker, str(weights), str(dst), target="localhost",
                              ssh=_shell(tmp_path, ":"), head_manifest=manifest, python=sys.executable)
    assert all(c.status is Status.PASS for c in again.checks), again.checks
    assert (dst / BIG).read_bytes() == (weights / BIG).read_bytes() and not (dst / PARTIAL_DIR).exists()


def test_a_share_that_raises_becomes_one_row_naming_its_worker_and_the_others_go_on(tmp_path):
    from runbook.checks import check
    from runbook.errors import RemoteError
    from runbook.weights.sharing import ShareResult
    _, workers = _nodes(tmp_path)

    def share(worker):
        if worker.name == "worker2":
            raise RemoteError("command timed out after 21600 s (its 1 process(es) on the node were killed)",
                              node="head", observed="rsync -a ... 10.81.0.13:/m/")
        return ShareResult("rsync", checks=[check("weights.parity", True, node=worker.name)])

    results = share_to_workers(workers, share, parallel=True)
    assert [c.status for c in results["worker"].checks] == [Status.PASS] == [c.status for c in results["worker3"].checks]
    (row,) = results["worker2"].checks
    assert row.name == "weights.share" and row.failed and row.node == "worker2"
    assert "worker2: command timed out" in row.observed and "10.81.0.13" in row.observed
