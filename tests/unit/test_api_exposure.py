"""API_HOST: where the API binds, how the runbook reaches it (direct or an SSH forward), the key a bind beyond
loopback needs (generated into the secrets file), and the per-node exposure audit rows."""
from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

from runbook.checks import Status
from runbook.errors import ProfileError, RemoteError
from runbook.launch import exposure
from runbook.profile import REPO_ROOT, load_profile
from runbook.remote import LocalForward, SshSettings, forward_ssh_argv
from runbook.secrets import SecretsError, generate_api_key, load_secrets
from runbook.api import endpoint
from support.doubles import FakeCluster, FakeNode

ENV = REPO_ROOT / "env"


def _lab(**overrides):
    return load_profile(ENV / "lab.env", {"HEAD_SSH": "root@10.77.0.11", "SSH_CONFIG": "", **overrides})


# ----------------------------------------------------------------------------- the profile key

@pytest.mark.parametrize("value,tunnel,key", [("127.0.0.1", True, False), ("169.254.77.1", True, True),
                                               ("0.0.0.0", False, True), ("10.77.0.11", False, True)])
def test_where_the_api_binds_decides_the_route_and_the_key(value, tunnel, key):
    profile = _lab(API_HOST=value)
    assert endpoint.tunnelled(profile) is tunnel and endpoint.key_required(profile) is key
    if not tunnel:     # reached directly: 0.0.0.0 through the head's SSH host, an address as it is
        assert endpoint.base_url(profile) == "http://10.77.0.11:8000"
    assert ("SSH forward" in endpoint.api_address(profile)) is tunnel


@pytest.mark.parametrize("name", ["lab", "exl3-v41", "dspark-v4", "tp3-dspark", "lab-tp3", "lab-tp4", "lab-tp2pp2"])
def test_every_shipped_profile_binds_loopback(name):
    assert load_profile(ENV / f"{name}.env").api_host == "127.0.0.1"


@pytest.mark.parametrize("value,words", [("localhost", "expected an IPv4 address to bind"),
                                         ("224.0.0.1", "cannot be bound"), ("10.0.0", "expected an IPv4")])
def test_a_bad_api_host_is_refused_naming_the_key(value, words):
    with pytest.raises(ProfileError) as err:
        _lab(API_HOST=value)
    text = str(err.value)
    assert "API_HOST" in text and words in text and "fix" in text


# ----------------------------------------------------------------------------- the generated key

def test_generated_key_lands_in_a_private_secrets_file_and_is_read_back(tmp_path):
    path = tmp_path / "cfg" / "secrets.env"
    key, where = generate_api_key(environ={}, secrets_file=path)
    assert where == path and len(key) > 40 and key.startswith("sr-")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_secrets(environ={}, secrets_file=path).api_key == key
    assert not list(path.parent.glob("*.partial"))
    with pytest.raises(SecretsError, match="already sets an API key"):
        generate_api_key(environ={}, secrets_file=path)


def test_generated_key_keeps_the_files_other_lines_and_refuses_a_readable_file(tmp_path):
    path = tmp_path / "secrets.env"
    path.write_text("HF_TOKEN=hf_" + "a" * 30)             # no trailing newline
    path.chmod(0o600)
    key, _ = generate_api_key(environ={}, secrets_file=path)
    secrets = load_secrets(environ={}, secrets_file=path)
    assert secrets.hf_token == "hf_" + "a" * 30 and secrets.api_key == key
    other = tmp_path / "open.env"
    other.write_text("HF_TOKEN=x\n")
    other.chmod(0o644)
    with pytest.raises(SecretsError, match="chmod 600"):
        generate_api_key(environ={}, secrets_file=other)
    assert other.read_text() == "HF_TOKEN=x\n"


def test_a_key_generated_after_a_redactor_was_built_is_masked_once_it_refreshes(tmp_path, monkeypatch):
    from runbook.secrets import redactor_from_env
    path = tmp_path / "secrets.env"
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(path))
    redactor = redactor_from_env()                      # built at the run's start: no key yet
    key, _ = generate_api_key()
    assert key in redactor.redact(f"Bearer-less echo {key}")
    redactor.add_current()
    assert key not in redactor.redact(f"echo {key}") and "***" in redactor.redact(f"echo {key}")


def test_a_wide_bind_without_a_key_gets_one_before_the_launch(tmp_path, monkeypatch):
    path = tmp_path / "secrets.env"
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(path))
    loopback = exposure.ensure_api_key(_lab())
    assert loopback.status is Status.PASS and "only the head reaches it" in loopback.observed and not path.exists()
    dry = exposure.ensure_api_key(_lab(API_HOST="0.0.0.0"), dry_run=True)
    assert dry.status is Status.WARN and not path.exists()               # a dry run changes nothing
    made = exposure.ensure_api_key(_lab(API_HOST="0.0.0.0"))
    assert made.status is Status.PASS and "generated VLLM_API_KEY" in made.observed and str(path) in made.observed
    key = load_secrets().api_key
    assert key and key not in made.observed
    again = exposure.ensure_api_key(_lab(API_HOST="0.0.0.0"))
    assert "API key required (from file)" in again.observed and load_secrets().api_key == key


# ----------------------------------------------------------------------------- the exposure audit

SS_OPEN = textwrap.dedent("""\
    LISTEN 0 128 0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=101,fd=3))
    LISTEN 0 4096 127.0.0.1:8000 0.0.0.0:* users:(("python",pid=300,fd=20))
    LISTEN 0 4096 *:29501 *:* users:(("python",pid=300,fd=12))
    LISTEN 0 128 [::1]:6010 [::]:* users:(("sshd",pid=102,fd=9))
""")
NO_FIREWALL = "### nft\n### iptables\n### ufw\nStatus: inactive\n"
DEFAULT_DROP = ("### nft\ntable inet spark {\n\tchain input {\n\t\ttype filter hook input priority filter; policy drop;\n"
                "\t\tip saddr 169.254.77.2 accept\n\t}\n}\n### iptables\n### ufw\n")


def _node(ss: str, firewall: str, name="head", rank=0):
    return FakeNode(name, rank, read_only=True, rules=[(r"^ss -H -ltnp", ss), (r"### nft", firewall)])


def test_listeners_beyond_loopback_without_a_default_deny_firewall_warn_with_the_rule():
    row = exposure.node_exposure(_node(SS_OPEN, NO_FIREWALL), _lab(), peers=["169.254.77.2"], key_set=False)
    assert row.status is Status.WARN and row.node == "head"
    assert "on every address: 22 sshd, 29501 python" in row.observed
    assert "8000" not in row.observed and "6010" not in row.observed          # loopback only: not exposed
    assert "no default-deny firewall: any host on this node's networks reaches port(s) 29501" in row.observed
    assert "ip saddr 169.254.77.2 accept" in row.fix


def test_listeners_on_the_fabric_address_only_need_no_firewall():
    """vLLM's TP/NCCL ports bound to the fabric address reach only the peers; SSH is the one wide listener."""
    ephemeral = "".join(f'LISTEN 0 128 10.0.0.1:{34000 + i} 0.0.0.0:* users:(("VLLM::Worker_TP",pid=9,fd={i}))\n'
                        for i in range(12))
    ss = SS_OPEN.replace("*:29501", "10.0.0.1:29501") + ephemeral
    row = exposure.node_exposure(_node(ss, NO_FIREWALL), _lab(), peers=["10.0.0.2"], key_set=False)
    assert row.status is Status.PASS, row.observed
    assert "on every address: 22 sshd" in row.observed and "only SSH is reachable beyond the fabric" in row.observed
    assert "on the fabric address only: 13 ports 29501-34011 (VLLM::Worker_TP, python)" in row.observed


def test_a_default_deny_firewall_passes():
    row = exposure.node_exposure(_node(SS_OPEN, DEFAULT_DROP), _lab(), peers=["169.254.77.2"], key_set=False)
    assert row.status is Status.PASS and "policy drop" in row.observed


def test_an_api_wider_than_the_profile_says_fails():
    wide = SS_OPEN.replace("127.0.0.1:8000", "0.0.0.0:8000")
    row = exposure.node_exposure(_node(wide, NO_FIREWALL), _lab(), peers=[], key_set=False)
    assert row.status is Status.FAIL and "the profile binds it to 127.0.0.1" in row.observed
    keyless = exposure.node_exposure(_node(wide, NO_FIREWALL), _lab(API_HOST="0.0.0.0"), peers=[], key_set=False)
    assert keyless.status is Status.FAIL and "without an API key" in keyless.observed


def test_every_node_gets_a_row_and_an_unreadable_node_warns(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "k" * 12)
    broken = FakeNode("worker", 1, read_only=True, rules=[(r"^ss ", RemoteError("connection lost", node="worker"))])
    rows = exposure.exposure_checks(FakeCluster([_node(SS_OPEN, DEFAULT_DROP), broken]), _lab())
    assert [r.node for r in rows] == ["head", "worker"]
    assert rows[0].status is Status.PASS and rows[1].status is Status.WARN and "connection lost" in rows[1].observed


# ----------------------------------------------------------------------------- the SSH forward

FAKE_SSH = textwrap.dedent('''\
    #!{python}
    """Stands in for OpenSSH's local forward: relays 127.0.0.1:P to host:port; any target but node-ok fails."""
    import socket, sys, threading
    args = sys.argv[1:]
    if "-N" not in args or "-L" not in args:
        sys.stderr.write(f"fake ssh: only -N -L forwards, got {{args}}\\n"); sys.exit(2)
    target = args[-1]
    if target != "node-ok":
        sys.stderr.write(f"ssh: Could not resolve hostname {{target}}: Name or service not known\\n"); sys.exit(255)
    spec = args[args.index("-L") + 1]
    bind, lport, host, port = spec.split(":")
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, int(lport))); srv.listen(8)
    def pipe(a, b):
        while (data := a.recv(65536)):
            b.sendall(data)
        b.shutdown(socket.SHUT_WR)
    while True:
        c, _ = srv.accept()
        u = socket.create_connection((host, int(port)))
        threading.Thread(target=pipe, args=(c, u), daemon=True).start()
        threading.Thread(target=pipe, args=(u, c), daemon=True).start()
''')


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH.format(python=sys.executable))
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return ssh


@pytest.fixture
def api_server():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok " + self.path.encode())

        def log_message(self, *args):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


def _pids_of(ssh: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", str(ssh)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_forward_argv_keeps_the_profiles_ssh_settings():
    ssh = SshSettings(ssh_config=Path("/c"), key_file=Path("/k"), known_hosts=Path("/kh"), connect_timeout=7)
    argv = forward_ssh_argv(ssh, "spark1", 41000, "127.0.0.1", 8888)
    joined = " ".join(argv)
    assert argv[0] == "ssh" and argv[-1] == "spark1" and "-L 127.0.0.1:41000:127.0.0.1:8888" in joined
    assert "-F /c" in joined and "-i /k" in joined and "UserKnownHostsFile=/kh" in joined
    assert "StrictHostKeyChecking=yes" in joined and "ConnectTimeout=7" in joined and "BatchMode=yes" in joined
    lab = forward_ssh_argv(SshSettings(accept_new_host_keys=True), "n", 1, "h", 2)
    assert "StrictHostKeyChecking=accept-new" in lab


def test_forward_relays_then_closes_and_ends_with_its_process(fake_ssh, api_server):
    forward = LocalForward("node-ok", SshSettings(connect_timeout=2), "127.0.0.1", api_server).open()
    try:
        assert forward.alive() and _pids_of(fake_ssh)
        with urllib.request.urlopen(f"http://{forward.url_host}/health", timeout=5) as r:
            assert r.read() == b"ok /health"
    finally:
        forward.close()
    assert not forward.alive()
    deadline = time.monotonic() + 5
    while _pids_of(fake_ssh) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pids_of(fake_ssh)
    # a runbook process killed outright takes its forward with it (the wrapper reads EOF on its stdin)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from runbook.remote import LocalForward, SshSettings
        f = LocalForward("node-ok", SshSettings(connect_timeout=2), "127.0.0.1", {api_server}).open()
        print(f.local_port, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    port = int(child.stdout.readline())
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert _pids_of(fake_ssh)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    deadline = time.monotonic() + 5
    while _pids_of(fake_ssh) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pids_of(fake_ssh), "the forward outlived the process that opened it"


def test_a_forward_that_cannot_open_says_why(fake_ssh):
    with pytest.raises(RemoteError) as err:
        LocalForward("node-gone", SshSettings(connect_timeout=1), "127.0.0.1", 1).open()
    text = str(err.value)
    assert "Could not resolve hostname node-gone" in text and "API_HOST=0.0.0.0" in text
    assert not _pids_of(fake_ssh)
