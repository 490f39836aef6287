"""WEIGHT_TRANSPORT=stream (issue 39 item 5): the shipped sender and receiver over loopback with real sockets and
real files: every file verified on arrival, a corrupted byte caught (never under its final name), a wrong token
refused, a cut share resumed without re-sending the verified files; the step's ``stream_to_worker`` on local nodes;
the profile's validation of the key."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runbook import weights as W
from runbook.errors import ProfileError
from runbook.weights_tools import stream_share
from runbook.weights_tools.verify_manifest import MANIFEST_NAME
from support.doubles import LocalNode
from support.profiles import profile_from

TOOL = Path(stream_share.__file__)
BIG, SMALL, CONFIG = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"


def _tree(root: Path) -> dict:
    """A head tree (a subfolder too) and its expected document."""
    root.mkdir(parents=True)
    (root / CONFIG).write_text('{"model_type": "tiny"}')
    (root / BIG).write_bytes(os.urandom(5 << 20))
    (root / "sub").mkdir()
    (root / "sub" / SMALL).write_bytes(os.urandom(300_001))
    files = [CONFIG, BIG, f"sub/{SMALL}"]
    return {"revision": "r" * 40, "files": [
        {"path": p, "size": (root / p).stat().st_size, "sha256": hashlib.sha256((root / p).read_bytes()).hexdigest()}
        for p in files]}


def _run_pair(tmp_path: Path, src: Path, dst: Path, expected: dict, *, send_files=None, token=None,
              send_token=None, streams=3, chunk=1 << 20, timeout=3.0):
    """The receiver (a real process, bound to 127.0.0.2) and the sender (a real process, from 127.0.0.1):
    (receiver report, sender report, state the receiver announced)."""
    token = token or secrets.token_hex(32)
    (tmp_path / "exp.json").write_text(json.dumps(expected))
    tok, stok, state = tmp_path / "tok", tmp_path / "stok", tmp_path / "state"
    tok.write_text(token)
    stok.write_text(send_token or token)
    state.unlink(missing_ok=True)
    recv = subprocess.Popen([sys.executable, str(TOOL), "recv", "--dir", str(dst), "--expected",
                             str(tmp_path / "exp.json"), "--bind", "127.0.0.2", "--token-file", str(tok),
                             "--state-file", str(state), "--timeout", str(timeout)],
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not state.exists() and recv.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    announced = json.loads(state.read_text())
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    need = set(announced["need"])
    files = [f for f in (send_files or expected["files"]) if f["path"] in need]
    sent = None
    if files:
        (tmp_path / "need.json").write_text(json.dumps({"files": files}))
        out = subprocess.run([sys.executable, str(TOOL), "send", "--src", str(src), "--files",
                              str(tmp_path / "need.json"), "--host", "127.0.0.2", "--port", str(announced["port"]),
                              "--bind", "127.0.0.1", "--token-file", str(stok), "--streams", str(streams),
                              "--chunk", str(chunk), "--timeout", str(timeout)],
                             capture_output=True, text=True, timeout=60)
        sent = json.loads(out.stdout.splitlines()[-1])
    got = json.loads(recv.communicate(timeout=60)[0].splitlines()[-1])
    return got, sent, announced


def test_every_file_arrives_over_several_streams_verified_with_a_manifest(tmp_path):
    src, dst = tmp_path / "head", tmp_path / "worker" / "weights"
    expected = _tree(src)
    got, sent, announced = _run_pair(tmp_path, src, dst, expected)
    assert announced["need"] == [f["path"] for f in expected["files"]] and announced["skipped"] == []
    assert sent["ok"] and sent["streams"] == 3 and sent["bytes"] == sum(f["size"] for f in expected["files"])
    assert got["ok"], got
    assert sorted(got["received"]) == sorted(f["path"] for f in expected["files"])
    assert got["bytes_hashed_at_end"] == 0          # hashed once, on arrival; the manifest reuses it
    for f in expected["files"]:
        assert (dst / f["path"]).read_bytes() == (src / f["path"]).read_bytes()
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {f["path"]: f["sha256"] for f in expected["files"]}
    assert not list(dst.rglob("*" + stream_share.PART_SUFFIX)) and not (dst / stream_share.LEDGER).exists()
    # the worker's own verification agrees, without hashing again
    report = W.verify_dir(dst, expected)
    assert report["ok"] and report["bytes_hashed"] == 0


def test_a_corrupted_byte_is_caught_and_never_gets_the_final_name(tmp_path):
    src, dst = tmp_path / "head", tmp_path / "worker"
    expected = _tree(src)
    data = bytearray((src / BIG).read_bytes())
    data[3_000_000] ^= 0x01                          # the head's file changed after its manifest: one bit
    (src / BIG).write_bytes(bytes(data))
    got, sent, _ = _run_pair(tmp_path, src, dst, expected)
    assert sent["ok"]                                # the bytes crossed; the receiver's hash refuses them
    assert not got["ok"]
    assert list(got["failed"]) == [BIG] and got["failed"][BIG].startswith("sha256 ")
    assert not (dst / BIG).exists() and not (dst / f".{BIG}{stream_share.PART_SUFFIX}").exists()
    assert (dst / CONFIG).exists() and not (dst / MANIFEST_NAME).exists()     # no manifest for a bad tree


def test_a_wrong_token_is_refused_and_nothing_is_written(tmp_path):
    src, dst = tmp_path / "head", tmp_path / "worker"
    expected = _tree(src)
    got, sent, _ = _run_pair(tmp_path, src, dst, expected, send_token=secrets.token_hex(32), timeout=1.0)
    assert not sent["ok"] and any("refused the token" in e or "closed" in e or "Reset" in e for e in sent["errors"])
    assert not got["ok"] and got["refused_connections"] >= 1 and got["received"] == []
    assert set(got["failed"].values()) == {"not received"}
    assert not [p for p in dst.rglob("*") if p.is_file()]


def test_a_cut_share_resumes_and_keeps_the_verified_files(tmp_path):
    src, dst = tmp_path / "head", tmp_path / "worker"
    expected = _tree(src)
    first = [f for f in expected["files"] if f["path"] == BIG]
    got, sent, _ = _run_pair(tmp_path, src, dst, expected, send_files=first, timeout=1.0)     # the rest never comes
    assert sent["ok"] and not got["ok"] and got["received"] == [BIG]
    assert got["failed"] == {CONFIG: "not received", f"sub/{SMALL}": "not received"}
    kept = (dst / BIG).stat()
    assert (dst / stream_share.LEDGER).exists() and not (dst / MANIFEST_NAME).exists()

    got, sent, announced = _run_pair(tmp_path, src, dst, expected)
    assert announced["skipped"] == [BIG] and BIG not in announced["need"]
    assert sent["bytes"] == sum(f["size"] for f in expected["files"] if f["path"] != BIG)
    assert got["ok"] and BIG not in got["received"]
    assert (dst / BIG).stat().st_ino == kept.st_ino and (dst / BIG).stat().st_mtime_ns == kept.st_mtime_ns
    assert W.verify_dir(dst, expected)["ok"]

    # a third run: everything verified, nothing to send
    got, sent, announced = _run_pair(tmp_path, src, dst, expected)
    assert announced["need"] == [] and sent is None and got["ok"]


def test_a_range_outside_the_file_or_an_unexpected_path_is_refused(tmp_path):
    dst = tmp_path / "worker"
    dst.mkdir()
    expected = {"revision": "r" * 40, "files": [{"path": "a", "size": 10, "sha256": "0" * 64}]}
    token = secrets.token_hex(32)
    rx = stream_share.Receiver(str(dst), expected, token, timeout=1.0)
    state = tmp_path / "state"
    out = {}
    t = threading.Thread(target=lambda: out.update(rx.serve("127.0.0.2", 0, str(state))))
    t.start()
    while not state.exists():
        time.sleep(0.01)
    port = json.loads(state.read_text())["port"]
    import socket
    for header in ({"path": "../escape", "offset": 0, "length": 1}, {"path": "a", "offset": 5, "length": 6}):
        with socket.create_connection(("127.0.0.2", port)) as s:
            s.sendall(stream_share.MAGIC + token.encode())
            assert s.recv(2) == b"OK"
            h = json.dumps(header).encode()
            s.sendall(stream_share.HDR.pack(len(h)) + h)
            assert s.recv(10) == b""                 # dropped
    t.join(20)
    assert not out["ok"] and len([e for e in out["errors"] if e.startswith("Refused")]) == 2
    assert not (tmp_path / "escape").exists() and not (dst / "a").exists()


def _nodes(tmp_path):
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
           "LANG": "C.UTF-8"}
    head = LocalNode("head", 0, home=tmp_path / "head home", fabric_ip="127.0.0.1", env=env)
    worker = LocalNode("worker", 1, home=tmp_path / "worker home", fabric_ip="127.0.0.2", env=env)
    return head, worker


def test_stream_to_worker_shares_verifies_and_leaves_no_token(tmp_path):
    src = tmp_path / "head-weights"
    expected = _tree(src)
    assert W.verify_dir(src, expected)["ok"]
    head, worker = _nodes(tmp_path)
    dst = tmp_path / "worker-weights"
    result = W.stream_to_worker(head, worker, str(src), str(dst), python=sys.executable, timeout=5)
    rows = {c.name: c for c in result.checks}
    assert not [c for c in result.checks if c.failed], [(c.name, c.observed) for c in result.checks]
    assert "3 files" in rows["weights.stream"].observed and "127.0.0.2" in rows["weights.stream"].observed
    assert rows["weights.parity"].observed == "3 files identical"
    assert result.data["sent_bytes"] == sum(f["size"] for f in expected["files"])
    # the token was in two 0600 files, gone now; never in a command
    tools = [Path(head.home) / ".cache/spark-runbook/tools", Path(worker.home) / ".cache/spark-runbook/tools"]
    assert not [p for d in tools for p in d.iterdir() if p.name.endswith((".token", ".state", ".files", ".expected"))]
    commands = " ".join(str(c) for node in (head, worker) for c in node.commands)
    assert "--token-file" in commands and not any(len(w) == 64 and all(c in "0123456789abcdef" for c in w)
                                                  for w in commands.replace("'", " ").split())
    # a re-run sends nothing: the worker holds every file verified
    again = W.stream_to_worker(head, worker, str(src), str(dst), python=sys.executable, timeout=5)
    assert not [c for c in again.checks if c.failed] and again.data["sent_bytes"] == 0
    assert len(again.data["skipped"]) == 3


def test_stream_to_worker_names_a_file_that_fails_on_arrival(tmp_path):
    src = tmp_path / "head-weights"
    expected = _tree(src)
    assert W.verify_dir(src, expected)["ok"]
    manifest = W.read_manifest(src)
    (src / "sub" / SMALL).write_bytes(os.urandom(300_001))       # same size, other bytes than the manifest says
    head, worker = _nodes(tmp_path)
    result = W.stream_to_worker(head, worker, str(src), str(tmp_path / "w"), head_manifest=manifest,
                                python=sys.executable, timeout=2)
    row = {c.name: c for c in result.checks}["weights.stream"]
    assert row.failed and f"sub/{SMALL}: sha256" in row.observed
    assert "weights.parity" not in {c.name for c in result.checks}


def test_the_profile_key_is_validated_naming_it():
    assert profile_from("env/lab.env").weight_transport == "rsync"            # default unchanged
    assert profile_from("env/lab.env", WEIGHT_TRANSPORT="stream").weight_transport == "stream"
    with pytest.raises(ProfileError, match="WEIGHT_TRANSPORT"):
        profile_from("env/lab.env", WEIGHT_TRANSPORT="scp")
    with pytest.raises(ProfileError, match="WEIGHT_TRANSPORT=stream with WEIGHT_SYNC=download-both"):
        profile_from("env/lab.env", WEIGHT_TRANSPORT="stream", WEIGHT_SYNC="download-both")
    with pytest.raises(ProfileError, match="hub cache"):
        profile_from("env/tp3-dspark.env", WEIGHT_TRANSPORT="stream")
    assert profile_from("env/tp4-v41.env", WEIGHT_TRANSPORT="stream").weight_transport == "stream"


def test_three_workers_at_once_each_verified(tmp_path):
    """share_to_workers over stream_to_worker, three workers in parallel (the head's tools shipped once, each
    worker's receiver on its own address), every worker's rows kept."""
    from runbook.weights.transfer import share_to_workers
    src = tmp_path / "head-weights"
    expected = _tree(src)
    assert W.verify_dir(src, expected)["ok"]
    manifest = W.read_manifest(src)
    head, _ = _nodes(tmp_path)
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
           "LANG": "C.UTF-8"}
    workers = [LocalNode(f"worker{k}", k, home=tmp_path / f"w{k} home", fabric_ip=f"127.0.0.{k + 1}", env=env)
               for k in (1, 2, 3)]
    results = share_to_workers(workers, lambda w: W.stream_to_worker(
        head, w, str(src), str(tmp_path / f"{w.name}-weights"), head_manifest=manifest, python=sys.executable,
        timeout=5, streams=2), parallel=True)
    assert list(results) == ["worker1", "worker2", "worker3"]
    for name, r in results.items():
        assert not [c for c in r.checks if c.failed], (name, [(c.name, c.observed) for c in r.checks])
        assert f"127.0.0.{int(name[-1]) + 1}" in {c.name: c for c in r.checks}["weights.stream"].observed
        assert W.verify_dir(tmp_path / f"{name}-weights", expected)["ok"]
    assert sum(1 for c in head.commands if "stream_share.py" in str(c) and c.startswith("put")) <= 1


def test_a_receiver_that_cannot_start_is_named_with_its_reason(tmp_path):
    src = tmp_path / "head-weights"
    expected = _tree(src)
    assert W.verify_dir(src, expected)["ok"]
    head, worker = _nodes(tmp_path)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the worker's weights directory should be")
    result = W.stream_to_worker(head, worker, str(src), str(blocked / "m"), python=sys.executable, timeout=2,
                                ready_s=10)
    [row] = result.checks
    assert row.name == "weights.stream" and row.failed
    assert "did not listen" in row.observed and "Not a directory" in row.observed
    assert not any("stream_share.py send" in c for c in head.commands)       # nothing was sent


def test_a_dry_run_records_both_commands_and_sends_nothing(tmp_path):
    src = tmp_path / "head-weights"
    expected = _tree(src)
    assert W.verify_dir(src, expected)["ok"]
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
           "LANG": "C.UTF-8"}
    head = LocalNode("head", 0, home=tmp_path / "h", fabric_ip="127.0.0.1", env=env, dry_run=True)
    worker = LocalNode("worker", 1, home=tmp_path / "w", fabric_ip="127.0.0.2", env=env, dry_run=True)
    result = W.stream_to_worker(head, worker, str(src), str(tmp_path / "dst"), python="python3")
    [row] = result.checks
    assert row.name == "weights.stream" and row.status.name == "NA" and "dry run" in row.observed
    recv = [c for c in worker.runs() if "stream_share.py recv" in c]
    send = [c for c in head.runs() if "stream_share.py send" in c]
    assert len(recv) == 1 and "--bind 127.0.0.2" in recv[0] and "--token-file" in recv[0]
    assert len(send) == 1 and "--host 127.0.0.2" in send[0] and "--bind" not in send[0]
    assert not (tmp_path / "dst").exists()
