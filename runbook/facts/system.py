"""Read-only facts about a node's system: OS, memory, disk, ports, docker, GPU, clock.

Each fact is a command (``*_CMD``) and a pure parser. Parsers take the command's text output
and return typed values; they never touch a node.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from .node_paths import shell_path

OS_CMD = "cat /etc/os-release; echo '--'; uname -r; echo '--'; uname -m; echo '--'; hostname"


@dataclass
class OsInfo:
    pretty_name: str
    kernel: str
    machine: str
    hostname: str


def parse_os(text: str) -> OsInfo:
    """Parse ``OS_CMD`` output::

        PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
        ...
        --
        6.18.44-fc-v1045
        --
        x86_64
        --
        spark-head
    """
    sections = [s.strip() for s in text.split("\n--\n")]
    while len(sections) < 4:
        sections.append("")
    pretty = ""
    for line in sections[0].splitlines():
        if line.startswith("PRETTY_NAME="):
            pretty = line.split("=", 1)[1].strip().strip('"')
    return OsInfo(pretty, sections[1], sections[2], sections[3])


MEMINFO_CMD = "cat /proc/meminfo"


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` → bytes per field (``MemAvailable:  23456789 kB``)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+):\s+(\d+)(?:\s+kB)?", line)
        if m:
            value = int(m.group(2))
            out[m.group(1)] = value * 1024 if line.rstrip().endswith("kB") else value
    return out


PSI_MEMORY = "/proc/pressure/memory"
# one read of both memory signals, two lines: MemAvailable in kB (mawk's %d overflows past 2 GiB), then the PSI
# file on one line (empty when the kernel has no PSI: the file is absent, or present and unreadable with psi=0)
MEM_SAMPLE_CMD = (f"awk '/^MemAvailable:/{{print $2}}' /proc/meminfo; "
                  f"tr '\\n' ' ' 2>/dev/null < {PSI_MEMORY}; echo; ")


@dataclass
class Psi:
    """One line of a ``/proc/pressure/*`` file: the share of wall time (percent) some / all non-idle tasks were
    stalled, averaged over 10, 60 and 300 s, and the total stall in microseconds."""
    avg10: float
    avg60: float
    avg300: float
    total_us: int


_PSI_LINE = re.compile(r"\b(some|full)\s+avg10=(\d+(?:\.\d+)?)\s+avg60=(\d+(?:\.\d+)?)\s+"
                       r"avg300=(\d+(?:\.\d+)?)\s+total=(\d+)")


def parse_psi(text: str) -> dict[str, Psi] | None:
    """A pressure file (``/proc/pressure/memory``), as the kernel writes it or joined on one line::

        some avg10=0.00 avg60=0.00 avg300=0.00 total=0
        full avg10=0.87 avg60=1.48 avg300=1.02 total=95388065

    -> ``{"some": Psi, "full": Psi}``; None when the text has no such line (no PSI on this kernel)."""
    out = {m.group(1): Psi(float(m.group(2)), float(m.group(3)), float(m.group(4)), int(m.group(5)))
           for m in _PSI_LINE.finditer(text or "")}
    return out or None


@dataclass
class MemSample:
    """MemAvailable (bytes) and the memory pressure (PSI avg10, percent) of one node at one moment; each None
    when unreadable / absent (``psi`` False: the kernel has no /proc/pressure/memory)."""
    mem_available: int | None = None
    psi_some: float | None = None
    psi_full: float | None = None

    @property
    def psi(self) -> bool:
        return self.psi_some is not None or self.psi_full is not None


def parse_mem_sample(lines: list[str]) -> MemSample:
    """The two lines of ``MEM_SAMPLE_CMD`` (``["19873412", "some avg10=0.00 ... full avg10=0.00 ..."]``)."""
    mem_kb = lines[0].strip() if lines else ""
    psi = parse_psi(lines[1]) if len(lines) > 1 else None
    return MemSample(mem_available=int(mem_kb) * 1024 if mem_kb.isdigit() else None,
                     psi_some=psi["some"].avg10 if psi and "some" in psi else None,
                     psi_full=psi["full"].avg10 if psi and "full" in psi else None)


def disk_free_cmd(path: str) -> str:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent). ``~/`` is expanded on the
    node (:func:`shell_path`)."""
    return (f"p={shell_path(path)}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "
            f"echo \"$p\"; df -B1 --output=avail,size,target \"$p\" | tail -n 1")


@dataclass
class DiskFree:
    existing_path: str
    avail_bytes: int
    size_bytes: int
    mount: str


def parse_disk_free(text: str) -> DiskFree:
    """Output of ``disk_free_cmd``::

        /mnt/nvme
        52345678848 253950091264 /mnt/nvme
    """
    lines = [l for l in text.strip().splitlines() if l.strip()]
    if len(lines) < 2:
        raise ValueError(f"unexpected df output: {text!r}")
    avail, size, mount = lines[-1].split(None, 2)
    return DiskFree(lines[0].strip(), int(avail), int(size), mount.strip())


#: reading /proc/mounts never touches a mount, so it answers when a df or a stat under a dead network mount hangs
MOUNTS_CMD = "cat /proc/mounts"
#: filesystems whose server can go away under the mount (then every stat below it blocks)
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "glusterfs", "lustre", "fuse.sshfs", "fuse.rclone",
              "fuse.s3fs", "fuse.glusterfs")


@dataclass
class Mount:
    source: str
    mountpoint: str
    fstype: str


def _unescape_mount_field(field_text: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash in a path as octal escapes (\040 ...)
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)


def parse_network_mounts(text: str) -> list[Mount]:
    """The network filesystems of ``/proc/mounts``::

        169.254.77.1:/root/.cache/m /root/.cache/m fuse.sshfs ro,nosuid,nodev,relatime,user_id=0 0 0
        spark1:/srv/models /mnt/models nfs4 rw,relatime,vers=4.2,hard,proto=tcp 0 0
    """
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] in NETWORK_FS:
            mounts.append(Mount(_unescape_mount_field(parts[0]), _unescape_mount_field(parts[1]), parts[2]))
    return mounts


def unanswered_mounts_cmd(mounts: list[Mount], seconds: int = 5) -> str:
    """Each network mount stat'ed under a hard time limit (SIGKILL: a task blocked on a dead NFS server ignores
    SIGTERM); prints ``NOANSWER <mountpoint>`` for each that does not answer."""
    return "; ".join(f"timeout -s KILL {seconds} stat -f -c %T {shlex.quote(m.mountpoint)} >/dev/null 2>&1 || "
                     f"echo NOANSWER {shlex.quote(m.mountpoint)}" for m in mounts) or "true"


def parse_unanswered_mounts(text: str, mounts: list[Mount]) -> list[Mount]:
    """The mounts ``unanswered_mounts_cmd`` named (``NOANSWER /mnt/models``)."""
    dead = {line.split(None, 1)[1].strip() for line in text.splitlines() if line.startswith("NOANSWER ")}
    return [m for m in mounts if m.mountpoint in dead]


def disk_inodes_cmd(path: str) -> str:
    """Free and total inodes of the filesystem holding ``path`` (or its nearest existing parent),
    and its device number (``stat %d``: two paths with the same device are one filesystem, even
    under different mount points such as bind mounts). ``~/`` is expanded on the node."""
    p = shell_path(path)
    return (f"p={p}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "
            f"echo \"$p\"; df --output=iavail,itotal,target \"$p\" | tail -n 1; stat -c %d \"$p\"")


@dataclass
class DiskInodes:
    existing_path: str
    avail_inodes: int          # 0 with total 0: the filesystem allocates inodes dynamically (btrfs)
    total_inodes: int
    mount: str
    device: str                # st_dev of existing_path


def parse_disk_inodes(text: str) -> DiskInodes:
    """Output of ``disk_inodes_cmd`` (``df`` prints ``-`` where a filesystem has no inode count)::

        /mnt/nvme
        15523001 15597568 /mnt/nvme
        66306
    """
    lines = [l for l in text.strip().splitlines() if l.strip()]
    if len(lines) < 3:
        raise ValueError(f"unexpected df -i output: {text!r}")
    avail, total, mount = lines[-2].split(None, 2)
    number = lambda v: 0 if v == "-" else int(v)
    return DiskInodes(lines[0].strip(), number(avail), number(total), mount.strip(), lines[-1].strip())


LISTEN_CMD = "ss -ltnpH 2>/dev/null || ss -ltnH"


def parse_listening(text: str) -> dict[int, str]:
    """``ss -ltnpH`` → {port: process description}::

        LISTEN 0 128 0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=1,fd=3))
        LISTEN 0 4096 *:8000 *:* users:(("python3",pid=88,fd=12))
    """
    ports: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        local = parts[3]
        m = re.search(r":(\d+)$", local)
        if not m:
            continue
        users = re.findall(r'\("([^"]+)",pid=(\d+)', line)
        ports[int(m.group(1))] = ", ".join(f"{name}(pid {pid})" for name, pid in users)
    return ports


DOCKER_CMD = "docker version --format '{{.Server.Version}}' 2>&1"


def image_cmd(image: str) -> str:
    return (f"docker image inspect --format '{{{{.Id}}}} {{{{json .RootFS.Layers}}}}' "
            f"{shlex.quote(image)} 2>&1")


@dataclass
class ImageInfo:
    image_id: str
    layers: list[str]


def parse_image(text: str) -> ImageInfo | None:
    """``docker image inspect --format '{{.Id}} {{json .RootFS.Layers}}'`` → id and layer
    digests; ``None`` when the image is absent (``Error: No such image``)."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    m = re.match(r"^(sha256:[0-9a-f]{64})\s+(\[.*\])$", line)
    if not m:
        return None
    return ImageInfo(m.group(1), json.loads(m.group(2)))


@dataclass
class ImagePlan:
    action: str                      # none | ship | pull | fail
    reason: str
    targets: list[str] = field(default_factory=list)     # nodes to ship/pull to
    source: str = "head"


def plan_image(profile, infos: dict[str, ImageInfo | None]) -> ImagePlan:
    """Decide what to do from each node's image facts (pure)."""
    head = infos.get("head")
    others = {n: i for n, i in infos.items() if n != "head"}
    pinned = "@sha256:" in profile.image
    if head is None:
        # a lab profile's image is imported by `lab up`; a rehearsal pulls the recipe's from the lab registry
        if profile.is_lab:
            return ImagePlan("fail", f"{profile.image} is missing on the head (a lab profile never pulls: "
                                     "`python -m runbook lab up` imports the lab image)")
        if pinned:
            return ImagePlan("pull", f"{profile.image} is missing on the head; digest-pinned: pull it",
                             targets=sorted(infos))
        # a moving tag (seed A publishes one) is pulled once, on the head, and shipped from there, so every
        # rank runs the same bytes; the digest it resolved to is recorded and the run stays a candidate
        return ImagePlan("pull-head", f"{profile.image} is missing on the head and is a moving tag: pull it on "
                                      "the head only, record the digest it resolves to, ship it to the workers",
                         targets=sorted(infos))
    differ = [n for n, i in others.items() if i is None or list(i.layers) != list(head.layers)]
    if not differ:
        return ImagePlan("none", "same layer digests on every node")
    why = ", ".join(f"{n}: {'missing' if others[n] is None else 'different layers'}" for n in differ)
    if pinned and not profile.is_lab:
        return ImagePlan("pull", f"{why}; digest-pinned: pull on those nodes (falls back to shipping)",
                         targets=differ)
    return ImagePlan("ship", f"{why}; ship the head's image over the fabric", targets=differ)


CONTAINERS_CMD = "docker ps -a --format '{{.Names}}\t{{.Status}}\t{{.Image}}' 2>/dev/null"
VLLM_PROCS_CMD = "pgrep -af 'vllm|api_server' 2>/dev/null | grep -v pgrep || true"


def parse_vllm_processes(text: str) -> list[str]:
    return [l.strip() for l in text.splitlines() if l.strip() and "pgrep" not in l]


GPU_CMD = "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>&1 || echo 'nvidia-smi: command not found'"
DRIVER_CMD = ("nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 "
              "|| true")


def parse_gpus(text: str) -> list[str]:
    """``nvidia-smi -L`` → GPU names (``GPU 0: NVIDIA GB10 (UUID: GPU-…)``)."""
    return [m.group(1) for m in re.finditer(r"^GPU \d+: (.+?)(?: \(UUID.*)?$", text, re.M)]


CLOCK_CMD = "date +%s.%N"
