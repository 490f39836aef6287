"""A real, throwaway OpenSSH server on loopback for tests of the runbook's real SSH path (fabric connections,
OpenSSH forwards, host-key checks, the CLI), with the ssh config, key and known_hosts a profile points at.

    with Sshd(tmp_path) as sshd:                 # /usr/sbin/sshd -D on 127.0.0.1:<free port>, as root
        profile = sshd.profile()                 # env/lab.env with LAB=0 and SSH_* pointing at it
        sshd.rotate_host_key()                   # a new host key, sshd restarted; known_hosts keeps the old one

Everything lives under the given directory; sshd runs in private mount and pid namespaces (``unshare``) with its
own /run and its own root home (``root/home``), so the host is not touched and the node sees only its own
processes. Teardown kills sshd and every process its sessions left."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
HEAD, WORKER = "rt-head", "rt-worker"         # the two ssh aliases of the profile: both reach the one sshd

__all__ = ["SSHD", "HEAD", "WORKER", "Sshd", "available", "descendants", "free_port"]


def available() -> str:
    """Why a real sshd cannot run here ('' when it can)."""
    if os.geteuid() != 0:
        return "a real sshd on loopback needs root (its sessions log in as root)"
    missing = [t for t in (SSHD, "ssh", "ssh-keygen", "unshare") if not shutil.which(t)]
    return f"missing {', '.join(missing)}" if missing else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (sshd's per-connection children, their shells and commands)."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _keygen(path: Path, comment: str) -> None:
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)


class Sshd:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.host_key = self.root / "ssh_host_ed25519_key"
        self.client_key = self.root / "id_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        self.config = self.root / "sshd_config"
        self.log = self.root / "sshd.log"

    # -- files ---------------------------------------------------------------------------------------------------
    def _write_files(self) -> None:
        _keygen(self.host_key, "real-tests-sshd")
        _keygen(self.client_key, "real-tests-client")
        (self.root / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        self.config.write_text("\n".join([
            "# throwaway sshd of tests/support/sshd.py",
            "ListenAddress 127.0.0.1", f"HostKey {self.host_key}", f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no", "UseDNS no", "PrintMotd no",
            "AllowTcpForwarding yes", "MaxStartups 64:30:128", "MaxSessions 64", "LogLevel VERBOSE",
            "Subsystem sftp internal-sftp", ""]))
        self.record_host_key()
        common = ["  HostName 127.0.0.1", f"  Port {self.port}", "  User root", f"  IdentityFile {self.client_key}",
                  "  IdentitiesOnly yes", f"  UserKnownHostsFile {self.known_hosts}", "  StrictHostKeyChecking yes",
                  "  BatchMode yes"]
        self.ssh_config.write_text("\n".join([f"Host {HEAD}", *common, f"Host {WORKER}", *common, ""]))

    def add_alias(self, alias: str, *, port: int = 0, key: Path | None = None) -> str:
        """One more Host block in the ssh config: this sshd reached on another ``port`` (a closed one: a node
        whose sshd is gone) or with another ``key`` (one its authorized_keys does not hold)."""
        with open(self.ssh_config, "a") as f:
            f.write("\n".join([f"Host {alias}", "  HostName 127.0.0.1", f"  Port {port or self.port}", "  User root",
                               f"  IdentityFile {key or self.client_key}", "  IdentitiesOnly yes",
                               f"  UserKnownHostsFile {self.known_hosts}", "  StrictHostKeyChecking yes",
                               "  BatchMode yes", ""]))
        return alias

    def other_key(self) -> Path:
        """A client key this sshd does not authorize."""
        key = self.root / "id_other"
        if not key.exists():
            _keygen(key, "real-tests-unauthorized")
        return key

    def record_host_key(self) -> None:
        """known_hosts := the current host key (for both aliases: fabric and OpenSSH look up [127.0.0.1]:port)."""
        pub = " ".join(self.host_key.with_suffix(".pub").read_text().split()[:2])
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub}\n")

    # -- process -------------------------------------------------------------------------------------------------
    def start(self) -> "Sshd":
        why = available()
        if why:
            pytest.skip(why)
        if not self.port:
            self.port = free_port()
            self._write_files()
        # a private /run (sshd refuses to start without its privilege-separation directory /run/sshd), a private
        # home (root's: the cluster lock and the pid files land there, not in the host's /root) and a private pid
        # namespace: the runbook's `ps`, kill and stop see only this node's processes (never the host's, nor the
        # lab's vLLM ranks), and when sshd (its pid 1) dies every process in it dies too
        script = ('mount --make-rprivate / && mount -t tmpfs -o mode=755 tmpfs /run && mkdir -m 755 /run/sshd && '
                  f'mount --bind "$3" /root && exec {SSHD} -D -e -f "$1" -p "$2"')
        home = self.root / "home"
        home.mkdir(mode=0o700, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                                          "sh", "-c", script, "sh", str(self.config), str(self.port), str(home)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-2.0-"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not answer on 127.0.0.1:{self.port} in 10 s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """sshd and everything its sessions started (sshd gives each connection its own session, so they are
        found by parentage, not by process group)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for pid in [proc.pid, *descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)

    def rotate_host_key(self) -> None:
        """A reinstalled node: a new host key, sshd restarted on the same port; known_hosts is left as it was."""
        self.stop()
        _keygen(self.host_key, "real-tests-sshd-new")
        self.start()

    def __enter__(self) -> "Sshd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what the runbook is given --------------------------------------------------------------------------------
    def profile_keys(self) -> dict[str, str]:
        """Profile keys of a non-lab profile whose two nodes are this sshd (absolute paths)."""
        return {"LAB": "0", "HEAD_SSH": HEAD, "WORKER_SSH": WORKER, "SSH_CONFIG": str(self.ssh_config),
                "SSH_KEY": str(self.client_key), "KNOWN_HOSTS": str(self.known_hosts), "SSH_CONNECT_TIMEOUT": "5",
                # LAB=0 clones the recipe from a URL: never fetched by these tests (nothing leaves loopback)
                "RECIPE_REPO": "https://github.com/spark-runbook/not-fetched-by-tests.git"}

    def profile(self, **keys):
        from support.profiles import profile_from
        return profile_from("env/lab.env", **{**self.profile_keys(), **keys})

    def profile_file(self, **keys) -> Path:
        """env/lab.env with these keys written over it, as a file the CLI's --profile reads."""
        from support.profiles import ROOT
        want = {**self.profile_keys(), **{k: str(v) for k, v in keys.items()}}
        lines, seen = [], set()
        for line in (ROOT / "env" / "lab.env").read_text().splitlines():
            key = line.split("=", 1)[0]
            if "=" in line and not line.startswith("#") and key in want:
                lines.append(f"{key}={want[key]}")
                seen.add(key)
            else:
                lines.append(line)
        lines += [f"{k}={v}" for k, v in want.items() if k not in seen]
        path = self.root / "real-tests.env"
        path.write_text("\n".join(lines) + "\n")
        return path
