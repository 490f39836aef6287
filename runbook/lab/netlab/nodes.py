"""The node processes: each node's PID 1 (``runbook/lab/nodeinit.sh``, which becomes its sshd) started in its
namespace, waited for, and ended; what of the host's home a node still sees; and the layers of its own /usr, /etc
and /var."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from runbook.errors import LabError

from .host import netns_pids, node_pid1, pid_alive, proc_comm, tail_text
from .aptproxy import node_apt_conf
from .spec import APT_PROXY_CONF, NODE_PATH, NODE_PRIVATE, NODEINIT, OVERLAY_DIR, OVERLAY_EMPTY, OVERLAYS, LabNode


def home_shares(lab_dir: Path, home: Path = Path("/root")) -> list[str]:
    """Entries of the host's home a node must still see under its private home: the Python installs the
    lab's venvs run on (pyenv keeps them under /root here), read-only. Everything else under ~ is the
    node's own, as on two Sparks: hub caches, `~/` weight paths, recipe checkouts."""
    bases = [Path(sys.base_prefix)]
    for venv in (lab_dir / "vllm-venv", lab_dir.parent / ".venv"):
        with contextlib.suppress(OSError):
            for line in (venv / "pyvenv.cfg").read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    bases.append(Path(value.strip()))
    out: list[str] = []
    for base in bases:
        with contextlib.suppress(ValueError):
            top = base.resolve().relative_to(home).parts[:1]
            if top and top[0] not in out:
                out.append(top[0])
    return out


def overlay_upper(lab_dir: Path, name: str, tree: str) -> Path:
    """The upper layer of node ``name``'s overlay over ``tree`` (one of spec.OVERLAYS): what the node changed."""
    return lab_dir / "nodes" / name / OVERLAY_DIR / tree.strip("/") / "upper"


def prepare_overlays(lab_dir: Path, name: str) -> None:
    """Node ``name``'s overlay layers before its PID 1 mounts them (nothing holds them then): the upper and work
    dirs of each of spec.OVERLAYS, and each dir of spec.OVERLAY_EMPTY (with its ``partial/``) opaque in its upper
    layer, owner and mode as on this machine, so the node sees it empty. Kept layers (an in-place restart) keep
    what the node changed."""
    for tree in OVERLAYS:
        upper = overlay_upper(lab_dir, name, tree)
        upper.mkdir(parents=True, exist_ok=True)
        (upper.parent / "work").mkdir(exist_ok=True)
    for path in OVERLAY_EMPTY:
        tree = next((t for t in OVERLAYS if path.startswith(t + "/")), None)
        if tree is None or not Path(path).is_dir():
            continue
        # every dir from the tree down (an upper dir's owner and mode are what the node sees), then partial/
        rel = Path(path).relative_to(tree)
        for host in [Path(tree, *rel.parts[:k]) for k in range(1, len(rel.parts) + 1)] + [Path(path) / "partial"]:
            if not host.is_dir():
                continue
            mine = overlay_upper(lab_dir, name, tree) / host.relative_to(tree)
            st = host.stat()
            mine.mkdir(exist_ok=True)
            os.chown(mine, st.st_uid, st.st_gid)
            mine.chmod(st.st_mode & 0o7777)
        os.setxattr(overlay_upper(lab_dir, name, tree) / rel, "trusted.overlay.opaque", b"y")


def remove_overlays(lab_dir: Path, name: str) -> str:
    """Remove node ``name``'s overlay layers (its package changes), once its PID 1 -- and with it the mount
    namespace that held the overlays -- is gone; a note ('' when there were none)."""
    top = lab_dir / "nodes" / name / OVERLAY_DIR
    if not top.exists():
        return ""
    shutil.rmtree(top)
    return f"removed {name}'s own /usr, /etc and /var layers"


def cgroup_mounts() -> str:
    """The host's cgroup mounts as ``fstype mountpoint options`` lines (nodeinit.sh mounts them again)."""
    lines = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2") and parts[1].startswith("/sys/fs/cgroup/"):
            lines.append(f"{parts[2]} {parts[1]} {parts[3]}")
    return "\n".join(lines)


_POPENS: dict[str, subprocess.Popen] = {}   # node name -> `ip netns exec … unshare` started by this process


def start_node(lab_dir: Path, n: LabNode, cgroups: str) -> int:
    """Start the node: nodeinit.sh as PID 1 of new UTS/IPC/mount/PID namespaces inside its netns."""
    nd = lab_dir / "nodes" / n.name
    prepare_overlays(lab_dir, n.name)
    env = {"PATH": NODE_PATH, "HOME": "/root", "LANG": "C.UTF-8", "NL_HOSTNAME": n.alias,
           "NL_NODE_DIR": str(nd), "NL_CGROUP_MOUNTS": cgroups, "NL_HOME_SHARE": " ".join(home_shares(lab_dir)),
           "NL_PRIVATE": "\n".join(f"{src} {dst}" for src, dst in NODE_PRIVATE.items()),
           "NL_OVERLAYS": " ".join(OVERLAYS), "NL_APT_CONF_FILE": APT_PROXY_CONF, "NL_APT_CONF": node_apt_conf()}
    with open(nd / "node.log", "ab") as logf:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", n.netns, "unshare", "--uts", "--ipc", "--mount", "--pid", "--fork",
             "--kill-child", "--mount-proc", "/bin/sh", str(NODEINIT)],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, close_fds=True)
    _POPENS[n.name] = proc
    return proc.pid


def wait_port(n: LabNode, lab_dir: Path, deadline: float) -> None:
    """Wait for the node's sshd banner on its management address; LabError with its logs if it died."""
    while True:
        with contextlib.suppress(OSError), socket.create_connection((n.mgmt_ip, 22), timeout=0.5) as s:
            if s.recv(4).startswith(b"SSH"):
                return
        proc = _POPENS.get(n.name)
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            nd = lab_dir / "nodes" / n.name
            logs = ""
            for f in ("node.log", "sshd.log"):
                with contextlib.suppress(OSError):
                    logs += f"{f}: {tail_text((nd / f).read_text(), 400)} "
            raise LabError("the node's sshd did not come up", node=n.alias,
                           observed=f"no SSH banner on {n.mgmt_ip}:22; {logs}",
                           expected="sshd listening within 10 s",
                           fix="run `down` then `up`", evidence=str(nd))
        time.sleep(0.05)


def kill_node(ns: str, name: str) -> list[str]:
    """End every process of the lab node in netns ``ns``. Returns notes on what was done."""
    notes = []
    pids = netns_pids(ns)
    dockerds = [p for p in pids if proc_comm(p) == "dockerd"]
    for p in dockerds:                       # graceful first: dockerd stops its containers
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while dockerds and time.monotonic() < deadline and any(pid_alive(p) for p in dockerds):
        time.sleep(0.1)
    pid1 = node_pid1(ns)
    if pid1:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid1, signal.SIGKILL)    # the node's PID namespace dies with its PID 1
        notes.append(f"killed {ns} PID 1 (host pid {pid1})")
    deadline = time.monotonic() + 5
    while True:
        left = [p for p in netns_pids(ns) if pid_alive(p)]
        if not left:
            break
        if time.monotonic() > deadline:      # stragglers entered with `ip netns exec` (no PID ns)
            for p in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            notes.append(f"killed {len(left)} leftover process(es) in {ns}")
            time.sleep(0.2)
            break
        time.sleep(0.05)
    proc = _POPENS.pop(name, None)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    return notes
