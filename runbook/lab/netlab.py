"""The embedded lab: two (or three) "Sparks" on this one machine.

Each node is a network namespace ``nl-<name>`` whose PID 1 is ``nodeinit.sh`` (own UTS, mount and
PID namespaces; see that file), which becomes the node's sshd. Topology::

    root netns (the "laptop" running the runbook)
      nlbr0 10.77.0.1/24 --+-- nl-m-head    <-> eth0 10.77.0.11/24  [nl-head,    hostname spark-head]
                           +-- nl-m-worker  <-> eth0 10.77.0.12/24  [nl-worker,  hostname spark-worker]
                           +-- nl-m-worker2 <-> eth0 10.77.0.13/24  [nl-worker2, hostname spark-worker2]  (3 nodes)
      guard routes: unreachable 10.77.0.0/16 and 169.254.77.0/24 (lab prefixes never follow the default route)

    2 nodes: nl-head:enp1s0f0np0 169.254.77.1/24 mtu 9000 <-veth-> nl-worker:enp1s0f0np0 169.254.77.2/24
    3 nodes: every node's enp1s0f0np0 (169.254.77.1/.2/.3, mtu 9000) is a veth into bridge nlfab0
             (root netns, mtu 9000, no IP address)

Nodes have no default route. After sshd answers, ``dockerd`` is started in each node over SSH (as a
runbook would on a real node) and a tiny busybox image ``spark-runbook/lab-runtime:1`` is imported on
the head and shipped to the workers with ``docker save | docker load``.

Public API: :func:`up`, :func:`down`, :func:`status`, :func:`info`, :class:`LabInfo`, :class:`LabNode`.
Everything here needs root; every subprocess has a timeout; every failure is a :class:`LabError`.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from runbook.errors import LabError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LAB_DIR = REPO_ROOT / ".lab"
NODEINIT = Path(__file__).with_name("nodeinit.sh")

NODE_NAMES = ("head", "worker", "worker2")
BRIDGE = "nlbr0"
BRIDGE_IP = "10.77.0.1"
MGMT_PREFIX = "10.77.0"
FABRIC_BRIDGE = "nlfab0"
FABRIC_IF = "enp1s0f0np0"
FABRIC_PREFIX = "169.254.77"
FABRIC_MTU = 9000
GUARD_ROUTES = ("10.77.0.0/16", "169.254.77.0/24")
IMAGE = "spark-runbook/lab-runtime:1"
STATE_FILE = "lab.json"
MARKER = Path("/run/spark-runbook-lab.json")   # which lab_dir owns the (machine-wide) nl-* names
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# binary -> Debian package. `up` installs what is missing.
REQUIRED_BINARIES = {
    "sshd": "openssh-server", "iperf3": "iperf3", "ethtool": "ethtool", "ping": "iputils-ping",
    "sshfs": "sshfs", "busybox": "busybox-static", "dockerd": "docker.io", "rsync": "rsync",
    "ssh": "openssh-client", "ssh-keygen": "openssh-client", "ip": "iproute2",
    "unshare": "util-linux", "nsenter": "util-linux",
    # the weights step's nfs mode in the lab: userspace NFS server (head) and client (worker)
    "ganesha.nfsd": "nfs-ganesha", "nfs-cat": "libnfs-utils",
}
APT_PACKAGES = ("openssh-server", "iperf3", "ethtool", "iputils-ping", "sshfs", "busybox-static",
                "docker.io", "rsync", "nfs-ganesha", "nfs-ganesha-vfs", "libnfs-utils")
SBIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

Log = Callable[[str], None]


def _default_log(msg: str) -> None:
    print(f"[lab] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# data types

@dataclass(frozen=True)
class LabNode:
    """One lab node: ``name`` is the runbook's node name, ``alias`` the ssh_config alias/hostname."""
    name: str          # head / worker / worker2
    alias: str         # spark-head / spark-worker / spark-worker2
    rank: int
    netns: str         # nl-head
    mgmt_ip: str       # 10.77.0.11
    fabric_if: str     # enp1s0f0np0
    fabric_ip: str     # 169.254.77.1
    mgmt_veth: str     # root-netns end of the management veth (nl-m-head)


@dataclass
class LabInfo:
    lab_dir: Path
    ssh_config: Path
    key: Path
    known_hosts: Path
    nodes: list[LabNode]
    timings: dict[str, float] = field(default_factory=dict)
    image: str = IMAGE
    image_ids: dict[str, str] = field(default_factory=dict)   # node name -> image ID
    reused: bool = False          # True: a healthy running lab was found and returned as is

    @property
    def image_id_identical(self) -> bool:
        ids = set(self.image_ids.values())
        return len(ids) == 1 and "" not in ids

    def node(self, name: str) -> LabNode:
        for n in self.nodes:
            if name in (n.name, n.alias, n.netns):
                return n
        raise KeyError(name)

    @property
    def head(self) -> LabNode:
        return self.nodes[0]

    def ssh_argv(self, target: str, command: str | None = None) -> list[str]:
        """argv for OpenSSH to a node alias (or a lab IP) using the lab's config."""
        argv = ["ssh", "-F", str(self.ssh_config), target]
        return argv + [command] if command is not None else argv

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("lab_dir", "ssh_config", "key", "known_hosts"):
            d[k] = str(d[k])
        d["image_id_identical"] = self.image_id_identical
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LabInfo":
        return cls(lab_dir=Path(d["lab_dir"]), ssh_config=Path(d["ssh_config"]), key=Path(d["key"]),
                   known_hosts=Path(d["known_hosts"]), nodes=[LabNode(**n) for n in d["nodes"]],
                   timings=dict(d.get("timings", {})), image=d.get("image", IMAGE),
                   image_ids=dict(d.get("image_ids", {})), reused=bool(d.get("reused", False)))


def node_specs(nodes: int = 2) -> list[LabNode]:
    if nodes not in (2, 3):
        raise LabError("the lab supports 2 or 3 nodes", observed=f"nodes={nodes}", expected="2 or 3",
                       fix="set LAB_NODES=2 (TP=2) or 3")
    return [LabNode(name=name, alias=f"spark-{name}", rank=i, netns=f"nl-{name}",
                    mgmt_ip=f"{MGMT_PREFIX}.{11 + i}", fabric_if=FABRIC_IF,
                    fabric_ip=f"{FABRIC_PREFIX}.{1 + i}", mgmt_veth=f"nl-m-{name}")
            for i, name in enumerate(NODE_NAMES[:nodes])]


def _fabric_veth(node: LabNode) -> str:   # root-netns end of a node's fabric veth (3-node topology)
    return f"nl-f-{node.name}"


# --------------------------------------------------------------------------------------------------
# small helpers

def _tail(text: str, n: int = 600) -> str:
    text = (text or "").strip()
    return text if len(text) <= n else "…" + text[-n:]


def _run(argv: list[str], *, timeout: float = 30, check: bool = True, input: str | bytes | None = None,
         stdin=None, what: str = "", fix: str = "", node: str = "", env: dict | None = None,
         text: bool = True) -> subprocess.CompletedProcess:
    """Run a local command with a timeout; raise LabError on failure (when check)."""
    try:
        kw = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL if stdin is None else stdin}
        return_ = subprocess.run(argv, capture_output=True, text=text, timeout=timeout, env=env, **kw)
    except FileNotFoundError:
        raise LabError(what or f"cannot run {argv[0]}", node=node, observed=f"{argv[0]}: command not found",
                       expected=f"{argv[0]} installed", fix=fix or "install the lab's apt packages "
                       "(`up` does this itself when run as root)") from None
    except subprocess.TimeoutExpired as exc:
        out = exc.stderr or exc.stdout or b""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        raise LabError(what or f"command timed out: {shlex.join(argv)}", node=node,
                       observed=f"no result after {timeout:.0f} s; {_tail(out, 300)}",
                       expected=f"done within {timeout:.0f} s",
                       fix=fix or "the machine may be overloaded; retry, or run `down` then `up`") from None
    if check and return_.returncode != 0:
        err = return_.stderr if text else return_.stderr.decode(errors="replace")
        raise LabError(what or f"command failed: {shlex.join(argv)}", node=node,
                       observed=f"rc={return_.returncode}: {_tail(err)}", expected="rc=0", fix=fix)
    return return_


def _require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise LabError(f"lab {action} needs root (it creates network namespaces, veth links, routes "
                       "and mounts)", observed=f"running as uid {os.geteuid()}", expected="uid 0 (root)",
                       fix=f"run it as root, e.g. `sudo {sys.executable} -m runbook lab {action}`")


def _netns_exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _proc_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _proc_nspid(pid: int) -> list[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _netns_pids(ns: str) -> list[int]:
    if not _netns_exists(ns):
        return []
    res = _run(["ip", "netns", "pids", ns], timeout=10, check=False)
    return [int(x) for x in res.stdout.split() if x.isdigit()]


def _node_pid1(ns: str) -> int | None:
    """Host PID of the node's PID 1 (the sshd that nodeinit.sh became)."""
    for pid in _netns_pids(ns):
        nspid = _proc_nspid(pid)
        if len(nspid) >= 2 and nspid[-1] == 1:
            return pid
    return None


@contextlib.contextmanager
def _locked(lab_dir: Path, timeout: float = 180) -> Iterator[None]:
    lab_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lab_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    raise LabError("another lab up/down is still running", observed=f"{lab_dir}/.lock held "
                                   f"for more than {timeout:.0f} s", fix="wait for it to finish, or end "
                                   "the process holding the lock") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


class _Timer:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - t, 3)

    def total(self) -> dict[str, float]:
        self.timings["total"] = round(time.monotonic() - self.t0, 3)
        return dict(self.timings)


def _read_state(lab_dir: Path) -> dict | None:
    try:
        return json.loads((lab_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _write_state(lab_dir: Path, state: dict) -> None:
    tmp = lab_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(lab_dir / STATE_FILE)


# --------------------------------------------------------------------------------------------------
# packages

def _missing_binaries() -> dict[str, str]:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])
    return {b: pkg for b, pkg in REQUIRED_BINARIES.items() if shutil.which(b, path=path) is None}


def _ensure_packages(log: Log, timeout: float = 600) -> list[str]:
    """Install the lab's apt packages if a needed binary is absent. Returns the packages installed."""
    missing = _missing_binaries()
    if not missing:
        return []
    pkgs = sorted(set(missing.values()) | set(APT_PACKAGES))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log(f"missing {', '.join(sorted(missing))}: installing apt packages {' '.join(pkgs)} "
        f"(timeout {timeout:.0f} s) …")
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends", *pkgs]
    res = _run(cmd, timeout=timeout, check=False, env=env, what="apt-get install for the lab")
    if res.returncode != 0:
        log("apt-get install failed; running apt-get update and retrying …")
        _run(["apt-get", "-o", "DPkg::Lock::Timeout=120", "update"], timeout=240, env=env, what="apt-get update for the lab",
             fix="check that the Debian mirror is reachable")
        _run(cmd, timeout=timeout, env=env, what="apt-get install for the lab",
             fix=f"install by hand: apt-get install -y {' '.join(pkgs)}")
    still = _missing_binaries()
    if still:
        raise LabError("lab tools still missing after apt-get install", observed=", ".join(sorted(still)),
                       expected="all present", fix=f"apt-get install -y {' '.join(sorted(set(still.values())))}")
    log("packages installed")
    return pkgs


# --------------------------------------------------------------------------------------------------
# files: keys, ssh_config, known_hosts, sshd_config, /etc/hosts

def _paths(lab_dir: Path) -> tuple[Path, Path, Path]:
    return lab_dir / "ssh_config", lab_dir / "id_ed25519", lab_dir / "known_hosts"


def _keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_suffix(".pub").exists():
        return
    for p in (path, path.with_suffix(".pub")):
        p.unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], timeout=30,
         what=f"ssh-keygen {path.name}")


def _ssh_common(key: Path, known_hosts: Path) -> list[str]:
    return ["  User root", "  Port 22", f"  IdentityFile {key}", "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {known_hosts}", "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes", "  BatchMode yes", "  PasswordAuthentication no",
            "  ConnectTimeout 5", "  ServerAliveInterval 10", "  LogLevel ERROR"]


def _write_files(lab_dir: Path, specs: list[LabNode]) -> None:
    ssh_config, key, known_hosts = _paths(lab_dir)
    _keygen(key, "spark-runbook-lab")
    key.chmod(0o600)
    (lab_dir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())

    hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    hosts += [f"{n.fabric_ip}\t{n.alias}" for n in specs]
    kh_lines = []
    for n in specs:
        nd = lab_dir / "nodes" / n.name
        for sub in ("nvme", "docker", "sbin", "etc", "home"):
            (nd / sub).mkdir(parents=True, exist_ok=True)
        (nd / "home").chmod(0o700)
        hk = nd / "ssh_host_ed25519_key"
        _keygen(hk, n.alias)
        hk.chmod(0o600)
        pub = " ".join(hk.with_suffix(".pub").read_text().split()[:2])
        kh_lines.append(f"{n.alias},{n.mgmt_ip},{n.fabric_ip} {pub}")
        (nd / "etc" / "hostname").write_text(n.alias + "\n")
        (nd / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
        nvme_id = nd / "nvme" / "WHOAMI"
        if not nvme_id.exists():
            nvme_id.write_text(f"this is {n.alias}'s local NVMe (lab)\n")
        (nd / "sshd_config").write_text("\n".join([
            "# generated by runbook.lab.netlab: sshd of lab node " + n.alias,
            "Port 22", "ListenAddress 0.0.0.0", f"HostKey {hk}", "PidFile /run/sshd.pid",
            f"AuthorizedKeysFile {lab_dir / 'authorized_keys'}",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no", "UseDNS no",
            "PrintMotd no", "MaxStartups 64:30:128", "MaxSessions 64", "LogLevel INFO",
            "Subsystem sftp internal-sftp", "",
        ]))
    known_hosts.write_text("\n".join(kh_lines) + "\n")
    # Inside the nodes /etc/ssh/ssh_config is node-private (bind mount): plain `ssh spark-worker`,
    # `ssh 169.254.77.2`, rsync -e ssh and sshfs work node to node over the fabric (names resolve to
    # fabric IPs through the node's /etc/hosts), with host keys pinned. The host's file is untouched.
    try:
        system_cfg = Path("/etc/ssh/ssh_config").read_text()
    except OSError:
        system_cfg = ""
    node_cfg = ["# generated by runbook.lab.netlab: node-private /etc/ssh/ssh_config of the lab nodes",
                f"Host {' '.join(n.alias for n in specs)} {FABRIC_PREFIX}.* {MGMT_PREFIX}.*",
                *_ssh_common(key, known_hosts), "", "# --- the host's /etc/ssh/ssh_config follows ---",
                system_cfg]
    # The node's own ~/.bashrc (its home is node-private): the host's file may run slow shell setup (here
    # `pyenv init`, ~1 s) on every ssh command; nodes get sshd's plain root PATH.
    bashrc = ("# ~/.bashrc of a lab node (runbook.lab.netlab; the node's home is private to it).\n"
              "# The host's ~/.bashrc is not used inside the nodes: its shell setup made every ssh command\n"
              "# about 1 s slower. PATH is sshd's default for root, as on a freshly installed node.\n")
    for n in specs:
        (lab_dir / "nodes" / n.name / "etc" / "ssh_config").write_text("\n".join(node_cfg))
        (lab_dir / "nodes" / n.name / "home" / ".bashrc").write_text(bashrc)

    common = _ssh_common(key, known_hosts)
    lines = ["# generated by runbook.lab.netlab; aliases of the lab nodes (management path) and the",
             "# fabric IPs (reachable only from inside a node). Host keys are pinned in known_hosts.", ""]
    for n in specs:
        lines += [f"Host {n.alias}", f"  HostName {n.mgmt_ip}", *common, ""]
    ips = " ".join([n.mgmt_ip for n in specs] + [n.fabric_ip for n in specs])
    lines += [f"Host {ips}", *common, ""]
    ssh_config.write_text("\n".join(lines))


def _runtime_rootfs_tar() -> bytes:
    """A deterministic busybox-static rootfs for `docker import`."""
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise LabError("busybox-static is missing", observed="/bin/busybox not found",
                       fix="apt-get install -y busybox-static")
    applets = _run([str(busybox), "--list"], timeout=10).stdout.split()
    buf = io.BytesIO()

    def add(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.mtime, ti.uid, ti.gid = kind, mode, 0, 0, 0
        ti.linkname, ti.size = link, len(data)
        tar.addfile(ti, io.BytesIO(data) if data else None)

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "root", "run", "var", "usr", "mnt"):
            add(d, tarfile.DIRTYPE, 0o755)
        add("tmp", tarfile.DIRTYPE, 0o1777)
        add("sbin", tarfile.SYMTYPE, 0o777, link="bin")
        add("usr/bin", tarfile.SYMTYPE, 0o777, link="../bin")
        add("usr/sbin", tarfile.SYMTYPE, 0o777, link="../bin")
        add("bin/busybox", tarfile.REGTYPE, 0o755, busybox.read_bytes())
        for a in sorted(set(applets) - {"busybox"}):
            add(f"bin/{a}", tarfile.SYMTYPE, 0o777, link="busybox")
        add("etc/passwd", tarfile.REGTYPE, 0o644, b"root:x:0:0:root:/root:/bin/sh\n")
        add("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\n")
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------
# network

def _cgroup_mounts() -> str:
    lines = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2") and parts[1].startswith("/sys/fs/cgroup/"):
            lines.append(f"{parts[2]} {parts[1]} {parts[3]}")
    return "\n".join(lines)


def _create_network(specs: list[LabNode]) -> None:
    three = len(specs) == 3
    cmds = [f"route replace unreachable {r}" for r in GUARD_ROUTES]
    cmds += [f"link add {BRIDGE} type bridge", f"addr add {BRIDGE_IP}/24 dev {BRIDGE}", f"link set {BRIDGE} up"]
    if three:
        cmds += [f"link add {FABRIC_BRIDGE} mtu {FABRIC_MTU} type bridge"]
    cmds += [f"netns add {n.netns}" for n in specs]
    for n in specs:
        cmds += [f"link add {n.mgmt_veth} type veth peer name eth0 netns {n.netns}",
                 f"link set {n.mgmt_veth} master {BRIDGE} up"]
    if three:
        for n in specs:
            cmds += [f"link add {_fabric_veth(n)} mtu {FABRIC_MTU} type veth peer name {FABRIC_IF} "
                     f"mtu {FABRIC_MTU} netns {n.netns}",
                     f"link set {_fabric_veth(n)} master {FABRIC_BRIDGE} up"]
    else:
        a, b = specs
        cmds += [f"link add {FABRIC_IF} mtu {FABRIC_MTU} netns {a.netns} type veth peer name {FABRIC_IF} "
                 f"mtu {FABRIC_MTU} netns {b.netns}"]
    _run(["ip", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30,
         what="creating the lab network (root netns)", fix="run `down` to clear leftovers, then `up` again")
    if three:
        # the fabric bridge carries no address at all (not even IPv6 link-local) and comes up last
        Path(f"/proc/sys/net/ipv6/conf/{FABRIC_BRIDGE}/disable_ipv6").write_text("1\n")
        _run(["ip", "link", "set", FABRIC_BRIDGE, "up"], timeout=10)
    for n in specs:
        ncmds = ["link set lo up", f"addr add {n.mgmt_ip}/24 dev eth0", "link set eth0 up",
                 f"link set {FABRIC_IF} mtu {FABRIC_MTU}", f"addr add {n.fabric_ip}/24 dev {FABRIC_IF}",
                 f"link set {FABRIC_IF} up"]
        _run(["ip", "-n", n.netns, "-batch", "-"], input="\n".join(ncmds) + "\n", timeout=30, node=n.alias,
             what=f"configuring addresses in {n.netns}")


def _link_states(ns: str | None) -> dict[str, dict]:
    argv = ["ip", "-j"] + (["-n", ns] if ns else []) + ["link", "show"]
    res = _run(argv, timeout=10, check=False)
    if res.returncode != 0:
        return {}
    try:
        return {l["ifname"]: l for l in json.loads(res.stdout or "[]")}
    except ValueError:
        return {}


def _wait_carrier(specs: list[LabNode], timeout: float = 15) -> None:
    want: dict[str | None, list[str]] = {n.netns: ["eth0", FABRIC_IF] for n in specs}
    want[None] = [BRIDGE] + [n.mgmt_veth for n in specs]
    if len(specs) == 3:
        want[None] += [FABRIC_BRIDGE] + [_fabric_veth(n) for n in specs]
    deadline = time.monotonic() + timeout
    while True:
        down_links = []
        for ns, ifs in want.items():
            states = _link_states(ns)
            for i in ifs:
                if states.get(i, {}).get("operstate") != "UP":
                    down_links.append(f"{ns or 'root'}:{i}={states.get(i, {}).get('operstate', 'absent')}")
        if not down_links:
            return
        if time.monotonic() > deadline:
            raise LabError("lab links did not reach carrier state UP", observed=", ".join(down_links),
                           expected="state UP on every lab link", fix="run `down` then `up`; check `ip -br link`")
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------------
# nodes

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


_POPENS: dict[str, subprocess.Popen] = {}   # node name -> `ip netns exec … unshare` started by this process


def _start_node(lab_dir: Path, n: LabNode, cgroups: str) -> int:
    nd = lab_dir / "nodes" / n.name
    env = {"PATH": NODE_PATH, "HOME": "/root", "LANG": "C.UTF-8", "NL_HOSTNAME": n.alias,
           "NL_NODE_DIR": str(nd), "NL_CGROUP_MOUNTS": cgroups, "NL_HOME_SHARE": " ".join(home_shares(lab_dir))}
    with open(nd / "node.log", "ab") as logf:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", n.netns, "unshare", "--uts", "--ipc", "--mount", "--pid", "--fork",
             "--kill-child", "--mount-proc", "/bin/sh", str(NODEINIT)],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, close_fds=True)
    _POPENS[n.name] = proc
    return proc.pid


def _wait_port(n: LabNode, lab_dir: Path, deadline: float) -> None:
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
                    logs += f"{f}: {_tail((nd / f).read_text(), 400)} "
            raise LabError("the node's sshd did not come up", node=n.alias,
                           observed=f"no SSH banner on {n.mgmt_ip}:22; {logs}",
                           expected="sshd listening within 10 s",
                           fix="run `down` then `up`", evidence=str(nd))
        time.sleep(0.05)


def _ssh(cfg: Path, target: str, command: str, *, timeout: float = 30, check: bool = True,
         stdin=None, input=None, what: str = "", text: bool = True) -> subprocess.CompletedProcess:
    return _run(["ssh", "-F", str(cfg), target, command], timeout=timeout, check=check, stdin=stdin,
                input=input, what=what or f"ssh {target} {command[:60]!r}", node=target, text=text)


def _dockerd_script(n: LabNode) -> str:
    return f"""
if ! docker info >/dev/null 2>&1; then
  if ! pgrep -x dockerd >/dev/null; then
    rm -f /run/docker.pid /run/docker.sock
    nohup setsid dockerd --cgroup-parent /{n.netns} > /run/dockerd.log 2>&1 < /dev/null &
  fi
  i=0; while [ $i -lt 150 ]; do docker info >/dev/null 2>&1 && break; sleep 0.2; i=$((i+1)); done
fi
if ! v=$(docker info --format '{{{{.ServerVersion}}}}' 2>&1); then
  echo "dockerd does not answer: $v" >&2; tail -n 15 /run/dockerd.log >&2; exit 1
fi
echo "version=$v"
echo "image=$(docker image inspect --format '{{{{.Id}}}}' {IMAGE} 2>/dev/null)"
"""


def _parse_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _image_id(cfg: Path, n: LabNode) -> str:
    res = _ssh(cfg, n.alias, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}", timeout=30, check=False)
    return res.stdout.strip() if res.returncode == 0 else ""


def _ensure_image(lab_dir: Path, specs: list[LabNode], ids: dict[str, str], log: Log) -> dict[str, str]:
    cfg = _paths(lab_dir)[0]
    head = specs[0]
    if not ids.get(head.name):
        log(f"importing {IMAGE} on {head.alias} (busybox-static rootfs)")
        _ssh(cfg, head.alias, f"docker import --change 'CMD [\"/bin/sh\"]' - {IMAGE}",
             input=_runtime_rootfs_tar(), text=False, timeout=120, what=f"docker import {IMAGE}")
        ids[head.name] = _image_id(cfg, head)
    for w in specs[1:]:
        if ids.get(w.name) == ids[head.name]:
            continue
        log(f"shipping {IMAGE} {head.alias} -> {w.alias} (docker save | docker load)")
        save = subprocess.Popen(["ssh", "-F", str(cfg), head.alias, f"docker save {IMAGE}"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _ssh(cfg, w.alias, "docker load", stdin=save.stdout, timeout=120, what=f"docker load on {w.alias}")
        finally:
            save.stdout.close()
            try:
                save.wait(timeout=30)
            except subprocess.TimeoutExpired:
                save.kill()
                save.wait(timeout=5)
        if save.returncode != 0:
            raise LabError(f"docker save {IMAGE} failed", node=head.alias,
                           observed=f"rc={save.returncode}: {_tail(save.stderr.read().decode(errors='replace'))}")
        ids[w.name] = _image_id(cfg, w)
    return ids


# --------------------------------------------------------------------------------------------------
# teardown

def _kill_node(ns: str, name: str) -> list[str]:
    """End every process of the lab node in netns ``ns``. Returns notes on what was done."""
    notes = []
    pids = _netns_pids(ns)
    dockerds = [p for p in pids if _proc_comm(p) == "dockerd"]
    for p in dockerds:                       # graceful first: dockerd stops its containers
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while dockerds and time.monotonic() < deadline and any(_pid_alive(p) for p in dockerds):
        time.sleep(0.1)
    pid1 = _node_pid1(ns)
    if pid1:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid1, signal.SIGKILL)    # the node's PID namespace dies with its PID 1
        notes.append(f"killed {ns} PID 1 (host pid {pid1})")
    deadline = time.monotonic() + 5
    while True:
        left = [p for p in _netns_pids(ns) if _pid_alive(p)]
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


def _rm_cgroups(names: list[str]) -> int:
    removed = 0
    root = Path("/sys/fs/cgroup")
    if not root.is_dir():
        return 0
    for ctrl in root.iterdir():
        for name in names:
            top = ctrl / f"nl-{name}"
            if not top.is_dir():
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top, topdown=False), key=lambda t: -len(t[0])):
                for _ in range(20):
                    try:
                        os.rmdir(dirpath)
                        removed += 1
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)
    return removed


def _teardown(lab_dir: Path, log: Log | None) -> list[str]:
    notes: list[str] = []
    for name in NODE_NAMES:
        ns = f"nl-{name}"
        if _netns_exists(ns):
            notes += _kill_node(ns, name)
    removed: list[str] = []
    ns_cmds = [f"netns del nl-{name}" for name in NODE_NAMES if _netns_exists(f"nl-{name}")]
    if ns_cmds:   # deleting a netns also deletes its veths (and so their root-netns peers)
        res = _run(["ip", "-force", "-batch", "-"], input="\n".join(ns_cmds) + "\n", timeout=30, check=False)
        removed += [c.split()[-1] for c in ns_cmds]
        if res.returncode != 0:
            notes.append(f"ip reported: {_tail(res.stderr, 300)}")
    all_links = [BRIDGE, FABRIC_BRIDGE] + [f"nl-m-{n}" for n in NODE_NAMES] + [f"nl-f-{n}" for n in NODE_NAMES]
    peers = [f"nl-m-{n}" for n in NODE_NAMES] + [f"nl-f-{n}" for n in NODE_NAMES]
    deadline = time.monotonic() + 2          # the root-netns veth peers vanish shortly after netns del
    while ns_cmds and any(_link_exists(l) for l in peers) and time.monotonic() < deadline:
        time.sleep(0.05)
    links = [l for l in all_links if _link_exists(l)]
    routes = _run(["ip", "-j", "route", "show", "type", "unreachable"], timeout=10, check=False)
    guards = []
    with contextlib.suppress(ValueError):
        guards = [r["dst"] for r in json.loads(routes.stdout or "[]") if r.get("dst") in GUARD_ROUTES]
    cmds = [f"link del {l}" for l in links] + [f"route del unreachable {g}" for g in guards]
    if cmds:
        res = _run(["ip", "-force", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30, check=False)
        removed += links + [f"route unreachable {g}" for g in guards]
        if res.returncode != 0:
            notes.append(f"ip reported: {_tail(res.stderr, 300)}")
    if removed:
        notes.append("removed " + ", ".join(removed))
    n = _rm_cgroups(list(NODE_NAMES))
    if n:
        notes.append(f"removed {n} cgroup dir(s) nl-*")
    # host mounts under the lab dir (none are made by a healthy lab; clean up anything left)
    for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
        mnt = line.split()[1]
        if mnt.startswith(str(lab_dir) + "/") or mnt.startswith("/run/netns/nl-"):
            _run(["umount", "-l", mnt], timeout=15, check=False)
            notes.append(f"unmounted {mnt}")
    state = _read_state(lab_dir) or {}
    for d in state.get("created_mountpoints", []):
        with contextlib.suppress(OSError):
            os.rmdir(d)
    (lab_dir / STATE_FILE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        if json.loads(MARKER.read_text()).get("lab_dir") == str(lab_dir):
            MARKER.unlink()
    leftover = [ns for ns in (f"nl-{x}" for x in NODE_NAMES) if _netns_exists(ns)] + \
               [l for l in all_links if _link_exists(l)]
    if leftover:
        raise LabError("lab teardown left things behind", observed=", ".join(leftover), expected="nothing",
                       fix="check `ip netns list` / `ip -br link`, then remove them by hand")
    return notes


def _lab_present() -> bool:
    return (any(_netns_exists(f"nl-{n}") for n in NODE_NAMES) or _link_exists(BRIDGE)
            or _link_exists(FABRIC_BRIDGE))


# --------------------------------------------------------------------------------------------------
# health

def _probe_node(cfg: Path | None, n: LabNode, state_node: dict | None) -> dict:
    d: dict = {"alias": n.alias, "netns": n.netns, "netns_exists": _netns_exists(n.netns),
               "mgmt_ip": n.mgmt_ip, "fabric_ip": n.fabric_ip}
    pid1 = _node_pid1(n.netns) if d["netns_exists"] and os.geteuid() == 0 else None
    if pid1 is None and state_node and _proc_comm(state_node.get("pid1", 0) or 0) == "sshd":
        pid1 = state_node["pid1"]
    d["sshd_pid"] = pid1
    d["sshd_alive"] = bool(pid1) and _pid_alive(pid1) and _proc_comm(pid1) == "sshd"
    link = _link_states(n.netns).get(FABRIC_IF, {}) if d["netns_exists"] and os.geteuid() == 0 else {}
    d["fabric_if"] = n.fabric_if
    d["fabric_state"] = link.get("operstate")
    d["fabric_mtu"] = link.get("mtu")
    d["ssh_ok"] = False
    d["hostname"] = None
    d["dockerd_alive"] = False
    d["docker_version"] = None
    d["image_id"] = None
    if d["sshd_alive"] and cfg is not None and cfg.exists():
        cmd = ("hostname; if v=$(docker version --format '{{.Server.Version}}' 2>/dev/null); then "
               "echo docker=1; echo version=$v; "
               f"echo image=$(docker image inspect --format '{{{{.Id}}}}' {IMAGE} 2>/dev/null); "
               "else echo docker=0; fi")
        try:
            res = _ssh(cfg, n.alias, cmd, timeout=20, check=False)
        except LabError as exc:
            d["ssh_error"] = exc.observed
        else:
            if res.returncode == 0:
                lines = res.stdout.splitlines()
                kv = _parse_kv("\n".join(lines[1:]))
                d["ssh_ok"] = True
                d["hostname"] = lines[0].strip() if lines else ""
                d["dockerd_alive"] = kv.get("docker") == "1"
                d["docker_version"] = kv.get("version") or None
                d["image_id"] = kv.get("image") or None
            else:
                d["ssh_error"] = _tail(res.stderr, 300)
    d["healthy"] = bool(d["netns_exists"] and d["sshd_alive"] and d["ssh_ok"] and d["hostname"] == n.alias
                        and d["fabric_state"] == "UP" and d["fabric_mtu"] == FABRIC_MTU
                        and d["dockerd_alive"] and d["image_id"])
    return d


def _status(lab_dir: Path) -> dict:
    state = _read_state(lab_dir)
    count = (state or {}).get("node_count") or (3 if _netns_exists("nl-worker2") else 2)
    specs = node_specs(count)
    cfg = _paths(lab_dir)[0]
    with ThreadPoolExecutor(max_workers=len(specs)) as ex:
        probes = list(ex.map(lambda n: _probe_node(cfg, n, (state or {}).get("pids", {}).get(n.name)), specs))
    routes = _run(["ip", "-j", "route", "show", "type", "unreachable"], timeout=10, check=False)
    guards: list[str] = []
    with contextlib.suppress(ValueError):
        guards = [r["dst"] for r in json.loads(routes.stdout or "[]")]
    ids = {p["image_id"] for p in probes}
    out = {
        "lab_dir": str(lab_dir),
        "state_file": (lab_dir / STATE_FILE).exists(),
        "node_count": count,
        "bridge_up": _link_exists(BRIDGE) and Path(f"/sys/class/net/{BRIDGE}/operstate").read_text().strip() == "up",
        "guard_routes": {g: g in guards for g in GUARD_ROUTES},
        "nodes": {p_n.name: p for p_n, p in zip(specs, probes)},
        "image": IMAGE,
        "image_id_identical": len(ids) == 1 and None not in ids,
        "running": any(p["netns_exists"] for p in probes),
        "as_root": os.geteuid() == 0,   # without root: no fabric link / PID 1 lookup, and no ssh key
    }
    out["healthy"] = (out["state_file"] and out["bridge_up"] and all(out["guard_routes"].values())
                      and all(p["healthy"] for p in probes) and out["image_id_identical"])
    return out


# --------------------------------------------------------------------------------------------------
# public API

def default_lab_dir() -> Path:
    """<repo>/.lab (gitignored)."""
    return DEFAULT_LAB_DIR


def info(lab_dir: Path | None = None) -> LabInfo | None:
    """The LabInfo recorded by the last successful ``up`` (no checks, no changes), or None."""
    state = _read_state(Path(lab_dir or DEFAULT_LAB_DIR).resolve())
    return LabInfo.from_dict(state["info"]) if state and "info" in state else None


def status(lab_dir: Path | None = None) -> dict:
    """JSON-able health of the lab: per node netns, sshd PID 1, ssh answer, fabric link, dockerd.

    Works without root too, but then the netns-level fields (fabric link, PID 1 lookup) stay empty.
    """
    return _status(Path(lab_dir or DEFAULT_LAB_DIR).resolve())


def _any_node_alive(lab_dir: Path) -> bool:
    """Whether the lab of ``lab_dir`` still has a live node. A lab whose node processes are gone
    (a crashed run, or a machine handed on after its processes were ended) is stale: its leftover
    namespaces and links are cleaned by the next ``up``, whichever folder it came from."""
    try:
        return any(n.get("sshd_alive") for n in _status(lab_dir)["nodes"].values())
    except Exception:  # noqa: BLE001 - unreadable state: be safe and treat it as alive
        return True


def up(lab_dir: Path | None = None, nodes: int = 2, *, log: Log | None = None) -> LabInfo:
    """Bring the lab up (idempotent) and return how to reach it.

    A healthy running lab with the same node count is returned as is (``reused=True``). Anything else
    that looks like a lab (namespaces, links, routes, dead nodes, cgroups) is torn down first.
    """
    log = log or _default_log
    timer = _Timer()
    _require_root("up")
    lab_dir = Path(lab_dir or DEFAULT_LAB_DIR).resolve()
    specs = node_specs(nodes)
    with _locked(lab_dir):
        with timer.phase("packages"):
            _ensure_packages(log)
        with contextlib.suppress(OSError, ValueError):
            other = json.loads(MARKER.read_text()).get("lab_dir")
            if other and other != str(lab_dir) and _lab_present() and _any_node_alive(Path(other)):
                raise LabError("another lab is running on this machine (the nl-* names are machine-wide)",
                               observed=f"lab from {other}", expected=f"no lab, or the lab of {lab_dir}",
                               fix=f"bring it down first: `python -m runbook lab down --lab-dir {other}`")
        state = _read_state(lab_dir)
        if state and state.get("node_count") == nodes and "info" in state:
            with timer.phase("check"):
                st = _status(lab_dir)
            if st["healthy"]:
                lab = LabInfo.from_dict(state["info"])
                lab.reused = True
                lab.image_ids = {k: v["image_id"] for k, v in st["nodes"].items()}
                lab.timings = timer.total()
                return lab
            bad = {k: [f for f in ("netns_exists", "sshd_alive", "ssh_ok", "dockerd_alive") if not v.get(f)]
                   for k, v in st["nodes"].items() if not v["healthy"]}
            log(f"existing lab is not healthy ({bad or 'bridge/routes'}); rebuilding")
        if _lab_present() or state:
            with timer.phase("clean"):
                notes = _teardown(lab_dir, None)
            if notes:
                log("cleaned stale lab state: " + "; ".join(notes))

        created: list[str] = []
        with timer.phase("files"):
            _write_files(lab_dir, specs)
            for mp in ("/mnt/nvme", "/var/lib/docker"):   # bind targets must exist on the shared root fs
                if not Path(mp).exists():
                    Path(mp).mkdir(parents=True)
                    created.append(mp)
            if not NODEINIT.exists():
                raise LabError("nodeinit.sh is missing", observed=str(NODEINIT), fix="reinstall the package")
        state = {"node_count": nodes, "lab_dir": str(lab_dir), "created_mountpoints": created,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pids": {}}
        _write_state(lab_dir, state)
        MARKER.write_text(json.dumps({"lab_dir": str(lab_dir)}) + "\n")

        with timer.phase("network"):
            _create_network(specs)
        with timer.phase("nodes"):
            cg = _cgroup_mounts()
            for n in specs:
                state["pids"][n.name] = {"unshare": _start_node(lab_dir, n, cg)}
        with timer.phase("carrier"):
            _wait_carrier(specs)
        with timer.phase("sshd"):
            deadline = time.monotonic() + 10
            for n in specs:
                _wait_port(n, lab_dir, deadline)
                state["pids"][n.name]["pid1"] = _node_pid1(n.netns)
            _write_state(lab_dir, state)
            cfg = _paths(lab_dir)[0]
            with ThreadPoolExecutor(max_workers=len(specs)) as ex:
                names = list(ex.map(lambda n: _ssh(cfg, n.alias, "hostname", timeout=20,
                                                   what="first ssh login").stdout.strip(), specs))
            for n, got in zip(specs, names):
                if got != n.alias:
                    raise LabError("lab node answers with the wrong hostname", node=n.alias,
                                   observed=got, expected=n.alias, fix="run `down` then `up`")
        with timer.phase("dockerd"):
            with ThreadPoolExecutor(max_workers=len(specs)) as ex:
                outs = list(ex.map(lambda n: _ssh(cfg, n.alias, _dockerd_script(n), timeout=60,
                                                  what="starting dockerd in the node").stdout, specs))
            ids = {n.name: _parse_kv(o).get("image", "") for n, o in zip(specs, outs)}
        with timer.phase("image"):
            ids = _ensure_image(lab_dir, specs, ids, log)
        ssh_config, key, known_hosts = _paths(lab_dir)
        lab = LabInfo(lab_dir=lab_dir, ssh_config=ssh_config, key=key, known_hosts=known_hosts, nodes=specs,
                      image_ids=ids)
        if not lab.image_id_identical:
            raise LabError(f"{IMAGE} differs between nodes after docker save/load", observed=str(ids),
                           expected="one image ID on every node", fix="run `down`, delete "
                           f"{lab_dir}/nodes/*/docker, then `up`")
        lab.timings = timer.total()
        state["info"] = lab.to_dict()
        _write_state(lab_dir, state)
        return lab


def down(lab_dir: Path | None = None, *, log: Log | None = None) -> None:
    """Remove everything ``up`` made (processes, netns, links, bridge, routes, mounts, cgroups).

    Files in the lab dir stay (keys, node dirs with their docker images and /mnt/nvme contents).
    """
    _require_root("down")
    lab_dir = Path(lab_dir or DEFAULT_LAB_DIR).resolve()
    with _locked(lab_dir):
        notes = _teardown(lab_dir, log)
    if log and notes:
        log("; ".join(notes))
