"""The runbook's real SSH path against a real OpenSSH server on loopback (tests/support/sshd.py), not a double:
fabric commands and their timeout, OpenSSH local forwards, a changed host key and the exit codes through
``python -m runbook`` in a subprocess. Needs root (the sshd logs its sessions in as root); skipped otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from runbook.errors import ExitStatus, RemoteError
from runbook.launch.readiness import api_get
from runbook.remote import Cluster, LocalForward, ssh_settings
from support.profiles import ROOT
from support.sshd import HEAD, Sshd, available, free_port

pytestmark = pytest.mark.skipif(bool(available()), reason=available() or "real sshd available")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    with Sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def http_server():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"served " + self.path.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _pids(pattern: str) -> list[int]:
    """Live processes whose whole command line is ``pattern`` (zombies have none)."""
    out = subprocess.run(["pgrep", "-x", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _gone(pattern: str, within: float = 5.0) -> bool:
    """Whether no process runs ``pattern`` once a SIGKILL sent before this call has been delivered."""
    deadline = time.monotonic() + within
    while _pids(pattern) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _pids(pattern)


def _cli(*args: str, prefix: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([*prefix, sys.executable, "-m", "runbook", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


# ---------------------------------------------------------------------------------------- remote command timeout

@pytest.mark.parametrize("template", [
    "sleep {sleep}",
    # a shell that would start the next one when its child is killed: its process group goes too
    "for i in 1 2 3; do sleep {sleep}; done",
])
def test_a_command_past_its_timeout_raises_and_is_stopped_on_the_node(sshd, template):
    leftover = f"sleep 30.{os.getpid()}"             # this test's own: no other process runs this command line
    command = template.format(sleep=leftover.split()[1])
    cluster = Cluster.from_profile(sshd.profile())
    with cluster:
        started = time.monotonic()
        with pytest.raises(RemoteError) as err:
            cluster.head.run(command, timeout=2)
        took = time.monotonic() - started
        text = str(err.value)
        assert "timed out after 2 s" in text and f"$ {command}" in text, text
        assert err.value.exit_code == ExitStatus.REMOTE_FAILED
        # not a timing check: the sleep lasts 30 s, so returning well before it means the timeout cut it
        assert took < 20, f"the call returned after {took:.1f} s: it waited for the command"
        # closing the channel does not stop a command on a real sshd (no pty, no signal): the runbook must
        assert _gone(leftover), f"{leftover!r} still runs on the node after its timeout: {_pids(leftover)}"
        assert "process(es) on the node were killed" in text, text
        # the connection stays usable for the next command
        assert cluster.head.read("echo still-here").stdout.strip() == "still-here"
    log = cluster.log.entries
    timed_out = [e for e in log if e["exit_code"] == 124]
    assert [e["command"] for e in timed_out] == [command]     # the marker is not part of the command as logged
    assert any("kill -KILL" in e["command"] for e in log), log    # the kill is a command run, so it is logged


def test_a_command_within_its_timeout_keeps_its_output_and_exit_code(sshd):
    with Cluster.from_profile(sshd.profile()) as cluster:
        res = cluster.head.read("echo out; echo err >&2; exit 3", timeout=10)
        assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")
        assert res.command == "echo out; echo err >&2; exit 3"
        with pytest.raises(RemoteError) as err:
            cluster.worker.run("false", timeout=10)
        assert "command failed with exit code 1" in str(err.value)


# ---------------------------------------------------------------------------------------- SSH local forward

def test_a_forward_relays_through_the_real_sshd_and_ends_with_close(sshd, http_server):
    forward = LocalForward(HEAD, ssh_settings(sshd.profile()), "127.0.0.1", http_server).open()
    spec = f"127.0.0.1:{forward.local_port}:127.0.0.1:{http_server}"
    try:
        assert forward.alive()
        ssh = [p for p in _pids_of_forward(spec)]
        assert ssh, "no ssh process holds the forward"
        with urllib.request.urlopen(f"http://{forward.url_host}/health", timeout=10) as answer:
            assert answer.read() == b"served /health"
    finally:
        forward.close()
    assert not forward.alive()
    assert _wait_no_forward(spec), "the forward's ssh outlived close()"


def _pids_of_forward(spec: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "--", f"-L {spec}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _wait_no_forward(spec: str) -> bool:
    deadline = time.monotonic() + 5
    while _pids_of_forward(spec) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _pids_of_forward(spec)


def test_a_forward_to_a_port_nobody_serves_gives_the_runbooks_no_answer(sshd):
    """The target behind the forward refuses: the forward opens (sshd connects on demand), and the runbook's API
    probe through it reports no HTTP answer -- it does not hang and does not read as a server."""
    closed = free_port()
    profile = sshd.profile(PORT=closed)
    forward = LocalForward(HEAD, ssh_settings(profile), "127.0.0.1", closed).open()
    try:
        code, text = api_get(f"http://{forward.url_host}", "/health", "", timeout=5)
        assert code == 0 and text, (code, text)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://{forward.url_host}/health", timeout=5).read()
    finally:
        forward.close()


@pytest.mark.parametrize("case", ["sshd gone", "key not authorized", "host key changed"])
def test_a_forward_the_node_refuses_says_why_in_the_runbooks_words(sshd, tmp_path, case):
    settings = ssh_settings(sshd.profile())
    if case == "sshd gone":
        target, said = sshd.add_alias("rt-closed", port=free_port()), "Connection refused"
    elif case == "key not authorized":
        settings.key_file = sshd.other_key()       # in SSH_KEY and in the alias' IdentityFile (ssh offers both)
        target, said = sshd.add_alias("rt-otherkey", key=sshd.other_key()), "Permission denied (publickey)"
    else:
        other = tmp_path / "known_hosts"
        other.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 "
                         "AAAAC3NzaC1lZDI1NTE5AAAAIHvVxs6tEo0W9P0cO5kBfT1m8LqkFS5mNVDQ0d3iNzXY\n")
        settings.known_hosts = other
        target, said = HEAD, "Host key verification failed"
    with pytest.raises(RemoteError) as err:
        LocalForward(target, settings, "127.0.0.1", 9).open(attempts=2)
    text = str(err.value)
    # the runbook's own words (what, on which node, the fix) around what the real ssh said
    assert f"could not open an SSH forward to 127.0.0.1:9 on {target}" in text, text
    assert said in err.value.observed, err.value.observed
    assert f"check `ssh {target}` works" in err.value.fix


# ---------------------------------------------------------------------------------------- changed host key, CLI

def test_a_changed_host_key_is_refused_by_the_cli_with_its_fix_and_changes_nothing(tmp_path):
    with Sshd(tmp_path / "node") as server:
        profile = server.profile_file(PORT=free_port())
        before = _cli("status", "--profile", str(profile))
        assert before.returncode == ExitStatus.SERVER_DOWN, before.stdout + before.stderr   # the premise: it reads
        server.rotate_host_key()
        known = server.known_hosts.read_bytes()
        home = sorted(p.name for p in (server.root / "home").iterdir())
        got = _cli("status", "--profile", str(profile))
        out = got.stdout + got.stderr
        assert got.returncode == ExitStatus.REMOTE_FAILED, out
        assert f"host key of {HEAD} does not match {server.known_hosts}" in out, out
        assert "ssh-keygen -R" in out and "verify the new key out of band" in out, out
        assert "verdict: unknown" in out and "Traceback" not in out, out
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" not in out, "the forward's ssh text instead of the runbook's"
        # nothing changed: the pinned key is kept, nothing was written on the node
        assert server.known_hosts.read_bytes() == known
        assert sorted(p.name for p in (server.root / "home").iterdir()) == home


# ---------------------------------------------------------------------------------------- exit codes, CLI

def test_exit_4_a_stop_that_cannot_reach_every_node(sshd):
    """stop on a head that answers and a worker whose sshd is gone: the head is stopped (nothing ran there), the
    worker's row fails, exit 4 (ACTION_FAILED); the cluster lock taken on the head is released."""
    profile = sshd.profile_file(WORKER_SSH=sshd.add_alias("rt-worker-gone", port=free_port()))
    got = _cli("stop", "--profile", str(profile))
    out = got.stdout + got.stderr
    assert got.returncode == ExitStatus.ACTION_FAILED, out
    assert "stop failed: [worker] cannot connect to rt-work" in out, out
    assert not (sshd.root / "home" / ".spark-runbook.lock").exists()


def test_exit_6_bench_against_a_closed_port():
    port = free_port()
    got = _cli("bench", "--base-url", f"http://127.0.0.1:{port}", "--model", "tiny", "--repeats", "1",
               "--concurrency", "1", "--prefill-tokens", "16", "--prompt-tokens", "16", "--decode-tokens", "4",
               "--timeout", "5")
    out = got.stdout + got.stderr
    assert got.returncode == ExitStatus.BENCH_FAILED, out
    assert "Connection refused" in out and "Traceback" not in out, out


def test_exit_7_lab_up_without_root_changes_nothing(tmp_path):
    """`lab up` as a user that is not root (a user namespace: uid 65534, no capabilities) refuses before it
    touches anything: exit 7 (LAB_FAILED); the lab folder is not even made."""
    lab_dir = tmp_path / "lab"
    got = _cli("lab", "up", "--lab-dir", str(lab_dir), prefix=("unshare", "--user"))
    out = got.stdout + got.stderr
    assert got.returncode == ExitStatus.LAB_FAILED, out
    assert "lab up needs root" in out and "running as uid 65534" in out, out
    assert not lab_dir.exists()


def test_exit_8_a_key_the_node_does_not_accept(sshd):
    """stop with a key the node's authorized_keys lacks: the lock cannot be taken, exit 8 (REMOTE_FAILED) with
    the runbook's fix; nothing ran."""
    profile = sshd.profile_file(SSH_KEY=str(sshd.other_key()), HEAD_SSH=sshd.add_alias("rt-head-otherkey",
                                                                                         key=sshd.other_key()))
    got = _cli("stop", "--profile", str(profile))
    out = got.stdout + got.stderr
    assert got.returncode == ExitStatus.REMOTE_FAILED, out
    assert "SSH key authentication to rt-head-otherkey failed" in out and "ssh-copy-id" in out, out
    assert not (sshd.root / "home" / ".spark-runbook.lock").exists()
