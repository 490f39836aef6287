"""A second Docker in a node: Debian testing's docker.io (28+) with the containerd image store, beside the node's own.

    root = provision(lab_dir, log)               # apt-get download (signatures checked by apt) + dpkg-deb -x, once
    ssh(cfg, alias, start_script(root))          # the daemon in the node: its own socket, data root, containerd
    node = Node(..., command_prefix=command_prefix(root))   # `docker` there is that daemon (a Spark's Docker)

The lab's nodes run bookworm's docker.io 20.10 (classic store, API 1.41), which never takes the ship path a Spark
with Docker 28 takes: ``docker save --platform`` from a store that keeps a pulled multi-arch index as an index.
This daemon does, on real binaries: Debian's own packages of the suite ``SUITES`` names first (forky, else sid),
unpacked into the lab dir (nothing is installed on this machine; they run on bookworm's libc). It shares the node's
network namespace with the node's dockerd, so it makes no bridge and no iptables rules (save/load/pull need none).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from runbook.errors import LabError

from .host import run_local
from .spec import REGISTRY, Log

#: Debian suites tried in order for a docker.io of the containerd-store era (28+: ``docker save --platform``)
SUITES = ("forky", "sid")
PACKAGES = ("docker.io", "docker-cli", "containerd")
DIR_NAME = "docker-c8d"
#: in the node (its /run and /mnt/nvme are its own)
RUN_DIR = "/run/docker-c8d"
SOCKET = f"{RUN_DIR}/docker.sock"
DATA_ROOT = "/mnt/nvme/.docker-c8d"
#: the containerd dockerd starts for itself (``--exec-root``/containerd): what ``ctr -a`` talks to
CONTAINERD_SOCKET = f"{RUN_DIR}/exec/containerd/containerd.sock"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def binaries(root: Path) -> dict[str, Path]:
    return {"docker": root / "usr/bin/docker", "dockerd": root / "usr/sbin/dockerd",
            "containerd": root / "usr/bin/containerd", "ctr": root / "usr/bin/ctr"}


def version(root: Path) -> str:
    """What ``provision`` unpacked (``<suite> docker.io <version>``), '' when nothing usable is there."""
    stamp = root / "VERSION"
    if not stamp.is_file() or not all(p.is_file() for p in binaries(root).values()):
        return ""
    return stamp.read_text().strip()


def provision(lab_dir: Path, log: Log, *, timeout: float = 300) -> Path:
    """``<lab_dir>/docker-c8d``: Debian's docker.io, docker-cli and containerd of the first suite in ``SUITES``
    that has them, downloaded by apt (Release signatures checked against the archive keyring) and unpacked.
    Idempotent; unpacked beside the final name and renamed into place, so a cut download leaves nothing half-made."""
    root = lab_dir / DIR_NAME
    if version(root):
        return root
    errors = []
    for suite in SUITES:
        work = Path(tempfile.mkdtemp(prefix=f".{DIR_NAME}-", dir=lab_dir))
        try:
            got = _download(work, suite, timeout)
            unpacked = work / "root"
            for deb in got:
                run_local(["dpkg-deb", "-x", str(deb), str(unpacked)], timeout=120, what=f"dpkg-deb -x {deb.name}")
            v = run_local([str(binaries(unpacked)["dockerd"]), "--version"], timeout=30).stdout.strip()
            (unpacked / "VERSION").write_text(f"{suite} {v}\n")
            if root.exists():
                shutil.rmtree(root)
            os.replace(unpacked, root)
            log(f"unpacked Debian {suite}'s docker.io into {root} ({v})")
            return root
        except LabError as exc:
            errors.append(f"{suite}: {exc}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    raise LabError("Debian's docker.io 28+ could not be downloaded", observed="; ".join(errors)[-800:],
                   expected=f"apt-get download {' '.join(PACKAGES)} from deb.debian.org ({' or '.join(SUITES)})",
                   fix="check that deb.debian.org is reachable from this machine")


def _download(work: Path, suite: str, timeout: float) -> list[Path]:
    """apt with a private sources list, lists dir and cache: this machine's apt state is not touched."""
    (work / "lists/partial").mkdir(parents=True)
    (work / "cache/archives/partial").mkdir(parents=True)
    sources = work / "sources.list"
    sources.write_text(f"deb [signed-by={KEYRING}] http://deb.debian.org/debian {suite} main\n")
    opts = [f"-oDir::Etc::SourceList={sources}", "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Cache={work / 'cache'}", "-oDebug::NoLocking=1",
            "-oAPT::Sandbox::User=root", "-qq"]
    run_local(["apt-get", *opts, "update"], timeout=timeout, what=f"apt-get update ({suite})")
    run_local(["sh", "-c", 'cd "$1" && shift && exec apt-get "$@"', "sh", str(work), *opts, "download",
               *PACKAGES], timeout=timeout, what=f"apt-get download {' '.join(PACKAGES)} ({suite})")
    debs = sorted(work.glob("*.deb"))
    if len(debs) != len(PACKAGES):
        raise LabError(f"apt-get download from {suite} gave {len(debs)} packages", observed=str([d.name for d in debs]),
                       expected=", ".join(PACKAGES))
    return debs


def command_prefix(root: Path) -> str:
    """Put in front of a node command so that its ``docker`` (and ``ctr``) is this daemon's."""
    return (f'export PATH={root}/usr/bin:{root}/usr/sbin:"$PATH" DOCKER_HOST=unix://{SOCKET}; ')


def start_script(root: Path, netns: str) -> str:
    """Shell run in a node: start the daemon unless it answers; print its version and storage driver type.
    ``--bridge none --iptables=false``: the node's own dockerd owns docker0 and the NAT rules of this namespace."""
    prefix = command_prefix(root)
    return f"""{prefix}
if ! docker info >/dev/null 2>&1; then
  mkdir -p {RUN_DIR} {DATA_ROOT}
  printf '%s\\n' '{{"features": {{"containerd-snapshotter": true}}}}' > {RUN_DIR}/daemon.json
  nohup setsid dockerd --config-file {RUN_DIR}/daemon.json --data-root {DATA_ROOT} --exec-root {RUN_DIR}/exec \\
    -H unix://{SOCKET} --pidfile {RUN_DIR}/docker.pid --bridge none --iptables=false --ip6tables=false \\
    --cgroup-parent /{netns}-c8d --insecure-registry {REGISTRY} > {RUN_DIR}/dockerd.log 2>&1 < /dev/null &
  i=0; while [ $i -lt 150 ]; do docker info >/dev/null 2>&1 && break; sleep 0.2; i=$((i+1)); done
fi
if ! v=$(docker info --format '{{{{.ServerVersion}}}} {{{{json .DriverStatus}}}}' 2>&1); then
  echo "the containerd-store dockerd does not answer: $v" >&2; tail -n 15 {RUN_DIR}/dockerd.log >&2; exit 1
fi
echo "$v"
"""


def stop_script() -> str:
    """Shell run in a node: end this daemon (its containerd exits with it); the node's own dockerd is untouched."""
    return f"""
if [ -s {RUN_DIR}/docker.pid ]; then
  pid=$(cat {RUN_DIR}/docker.pid); kill "$pid" 2>/dev/null
  i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -9 "$pid" 2>/dev/null; rm -f {RUN_DIR}/docker.pid
fi
true
"""
