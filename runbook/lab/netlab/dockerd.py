"""Docker inside the nodes: dockerd started over ssh as on a real node, and the lab's busybox runtime
image imported on the head and shipped to the workers with ``docker save | docker load``."""
from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

from runbook.errors import LabError

from .files import lab_paths
from .host import run_local, ssh, tail_text
from .spec import IMAGE, REGISTRY, LabNode, Log

#: what the node's dockerd prints for its registries (``docker info``): the lab registry must be insecure there
REGISTRIES_FORMAT = "{{json .RegistryConfig.IndexConfigs}}"


def dockerd_script(n: LabNode) -> str:
    """Shell run in a node over ssh: start its dockerd if it does not answer; print its version and image ID.

    dockerd learns the lab registry (plain HTTP) as insecure from its command line: a flag a running dockerd
    cannot take, so it is given when the lab is built (``health`` finds a dockerd without it unhealthy, and
    ``up`` then rebuilds the lab)."""
    # The node's dockerd is the one its pid file names (another dockerd may run in the node: docker_c8d's). One
    # that no longer answers but still runs is shutting down (a stop takes seconds under load): wait for it to go,
    # then start one, instead of waiting for an answer that will not come.
    return f"""
ours_alive() {{ p=$(cat /run/docker.pid 2>/dev/null) && [ -n "$p" ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = dockerd ]; }}
if ! docker info >/dev/null 2>&1; then
  started=0; i=0
  while [ $i -lt 200 ]; do
    docker info >/dev/null 2>&1 && break
    if [ $started = 0 ] && ! ours_alive; then
      rm -f /run/docker.pid /run/docker.sock
      nohup setsid dockerd --cgroup-parent /{n.netns} --insecure-registry {REGISTRY} > /run/dockerd.log 2>&1 < /dev/null &
      started=1
    fi
    sleep 0.2; i=$((i+1))
  done
fi
if ! v=$(docker info --format '{{{{.ServerVersion}}}}' 2>&1); then
  echo "dockerd does not answer: $v" >&2; tail -n 15 /run/dockerd.log >&2; exit 1
fi
echo "version=$v"
echo "image=$(docker image inspect --format '{{{{.Id}}}}' {IMAGE} 2>/dev/null)"
"""


def parse_kv(text: str) -> dict[str, str]:
    """``key=value`` lines -> dict (what :func:`dockerd_script` and the health probe print)."""
    out = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def insecure_registry_known(text: str, registry: str = REGISTRY) -> bool:
    """Whether ``docker info``'s registry configs (:data:`REGISTRIES_FORMAT`, JSON) hold ``registry`` as insecure::

        {"10.77.0.1:5077":{"Name":"10.77.0.1:5077","Mirrors":[],"Secure":false,"Official":false},"docker.io":{…}}
    """
    try:
        configs = json.loads(text or "{}")
    except ValueError:
        return False
    entry = configs.get(registry) if isinstance(configs, dict) else None
    return isinstance(entry, dict) and entry.get("Secure") is False


def runtime_rootfs_tar() -> bytes:
    """A deterministic busybox-static rootfs for `docker import`."""
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise LabError("busybox-static is missing", observed="/bin/busybox not found",
                       fix="apt-get install -y busybox-static")
    applets = run_local([str(busybox), "--list"], timeout=10).stdout.split()
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


def _image_id(cfg: Path, n: LabNode) -> str:
    res = ssh(cfg, n.alias, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}", timeout=30, check=False)
    return res.stdout.strip() if res.returncode == 0 else ""


def ensure_image(lab_dir: Path, specs: list[LabNode], ids: dict[str, str], log: Log) -> dict[str, str]:
    """Import the runtime image on the head and ship it to every worker that lacks it; node -> image ID."""
    cfg = lab_paths(lab_dir)[0]
    head = specs[0]
    if not ids.get(head.name):
        log(f"importing {IMAGE} on {head.alias} (busybox-static rootfs)")
        ssh(cfg, head.alias, f"docker import --change 'CMD [\"/bin/sh\"]' - {IMAGE}",
            input=runtime_rootfs_tar(), text=False, timeout=120, what=f"docker import {IMAGE}")
        ids[head.name] = _image_id(cfg, head)
    for w in specs[1:]:
        if ids.get(w.name) == ids[head.name]:
            continue
        log(f"shipping {IMAGE} {head.alias} -> {w.alias} (docker save | docker load)")
        save = subprocess.Popen(["ssh", "-F", str(cfg), head.alias, f"docker save {IMAGE}"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            ssh(cfg, w.alias, "docker load", stdin=save.stdout, timeout=120, what=f"docker load on {w.alias}")
        finally:
            save.stdout.close()
            try:
                save.wait(timeout=30)
            except subprocess.TimeoutExpired:
                save.kill()
                save.wait(timeout=5)
        if save.returncode != 0:
            raise LabError(f"docker save {IMAGE} failed", node=head.alias,
                           observed=f"rc={save.returncode}: {tail_text(save.stderr.read().decode(errors='replace'))}")
        ids[w.name] = _image_id(cfg, w)
    return ids
