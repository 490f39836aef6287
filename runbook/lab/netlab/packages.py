"""The apt packages the lab needs on this machine, installed by ``up`` when a binary is missing."""
from __future__ import annotations

import os
import shutil

from runbook.errors import LabError

from .host import run_local
from .spec import Log

# binary -> Debian package. `up` installs what is missing.
REQUIRED_BINARIES = {
    "sshd": "openssh-server", "iperf3": "iperf3", "ethtool": "ethtool", "ping": "iputils-ping",
    "sshfs": "sshfs", "busybox": "busybox-static", "dockerd": "docker.io", "rsync": "rsync",
    "ssh": "openssh-client", "ssh-keygen": "openssh-client", "ip": "iproute2",
    "unshare": "util-linux", "nsenter": "util-linux",
    # the weights step's nfs mode in the lab: userspace NFS server (head) and client (worker)
    "ganesha.nfsd": "nfs-ganesha", "nfs-cat": "libnfs-utils",
    # step 01 in a rehearsal: OpenMPI's real mpirun (and libmpi, which the all_reduce_perf simulator's ranks meet
    # through) and perftest's real binaries for the tools row (each node's /usr starts as this machine's)
    "mpirun": "openmpi-bin", "ib_write_bw": "perftest", "ib_write_lat": "perftest",
    # the lab's container registry (a rehearsal's image is pulled from it)
    "docker-registry": "docker-registry",
    # the non-root operator's sudo (and visudo, which checks its drop-in) and the kernel NFS server's exportfs
    # (its package and the exports file are real in a rehearsal; the kernel server itself cannot start here)
    "sudo": "sudo", "visudo": "sudo", "exportfs": "nfs-kernel-server",
}
APT_PACKAGES = ("openssh-server", "iperf3", "ethtool", "iputils-ping", "sshfs", "busybox-static",
                "docker.io", "rsync", "nfs-ganesha", "nfs-ganesha-vfs", "libnfs-utils", "openmpi-bin", "perftest",
                "docker-registry", "sudo", "nfs-kernel-server")
SBIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _missing_binaries() -> dict[str, str]:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])
    return {b: pkg for b, pkg in REQUIRED_BINARIES.items() if shutil.which(b, path=path) is None}


def ensure_packages(log: Log, timeout: float = 600) -> list[str]:
    """Install the lab's apt packages if a needed binary is absent. Returns the packages installed."""
    missing = _missing_binaries()
    if not missing:
        return []
    pkgs = sorted(set(missing.values()) | set(APT_PACKAGES))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log(f"missing {', '.join(sorted(missing))}: installing apt packages {' '.join(pkgs)} "
        f"(timeout {timeout:.0f} s) …")
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=120", "install", "-y", "--no-install-recommends", *pkgs]
    res = run_local(cmd, timeout=timeout, check=False, env=env, what="apt-get install for the lab")
    if res.returncode != 0:
        log("apt-get install failed; running apt-get update and retrying …")
        run_local(["apt-get", "-o", "DPkg::Lock::Timeout=120", "update"], timeout=240, env=env,
                  what="apt-get update for the lab", fix="check that the Debian mirror is reachable")
        run_local(cmd, timeout=timeout, env=env, what="apt-get install for the lab",
                  fix=f"install by hand: apt-get install -y {' '.join(pkgs)}")
    still = _missing_binaries()
    if still:
        raise LabError("lab tools still missing after apt-get install", observed=", ".join(sorted(still)),
                       expected="all present", fix=f"apt-get install -y {' '.join(sorted(set(still.values())))}")
    log("packages installed")
    return pkgs

