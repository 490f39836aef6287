"""The lab's stand-in for step 02's kernel NFS share: the lab kernel has neither nfsd nor an nfs4 client, so the
export is served by nfs-ganesha (a userspace NFS server) on the head and read on the worker with libnfs's
userspace client (nfs-ls / nfs-cat / nfs-cp), then mounted on the worker with sshfs in place of the kernel mount.

    checks, data = share(head, worker, src, dst, head_manifest=m, parity=parity, worker_ips=[...])

Same semantics as the kernel export (``runbook.weights_tools.nfs``): read-only, the workers' fabric addresses only,
root squashed. The weights step reaches it through its site (``step.site.nfs_stand_in``, built by
``runbook.lab.site``), after running the kernel mode up to nfsd (``weights.sharing.kernel_nfs_until_server``).
"""
from __future__ import annotations

import posixpath
import shlex
import time
from collections.abc import Callable
from typing import Any

from ..checks import Check, check, not_applicable
from ..facts import system
from ..facts.node_paths import on_node
from ..weights_tools.nfs import render_nfs, single_ipv4
from .control import lab_root


def _q(value: Any) -> str:
    return shlex.quote(str(value))


def share(head, worker, export_dir: str, mountpoint: str, **kw: Any) -> tuple[list[Check], dict[str, Any]]:
    """:func:`nfs_userspace_share` on the same two lab nodes logged in as root (``control.lab_root``): the lab
    itself runs the server and the mount that stand in for the kernel's, whoever the profile's SSH user is."""
    with lab_root(head) as head_root, lab_root(worker) as worker_root:
        return nfs_userspace_share(head_root, worker_root, export_dir, mountpoint, **kw)


NFS_LAB_DIR = "/tmp/spark-runbook-nfs"
NFS_LAB_PSEUDO = "/weights"
NFS_PORT = 2049


def render_ganesha(export_dir: str, head_ip: str, worker_ips: list[str], *,
                   pseudo: str = NFS_LAB_PSEUDO) -> str:
    """ganesha.conf exporting ``export_dir`` NFSv4-only on ``head_ip``:2049, read-only to
    ``worker_ips`` and nobody else (``Access_Type = None`` for every other client), root squashed."""
    head_ip = single_ipv4(head_ip, "HEAD_IP")
    clients = ", ".join(single_ipv4(ip, "WORKER_IP") for ip in worker_ips)
    return (
        f"NFS_CORE_PARAM {{ Protocols = 4; Bind_addr = {head_ip}; NFS_Port = 2049; "
        "Enable_NLM = false; Enable_RQUOTA = false; }\n"
        "NFSV4 { Graceless = true; RecoveryBackend = fs; }\n"
        "NFS_KRB5 { Active_krb5 = false; }\n"
        f"EXPORT {{ Export_Id = 1; Path = \"{export_dir}\"; Pseudo = \"{pseudo}\"; Access_Type = None; "
        "Squash = Root_Squash; Protocols = 4; Transports = TCP; SecType = sys; FSAL { Name = VFS; }\n"
        f"  CLIENT {{ Clients = {clients}; Access_Type = RO; }} }}\n"
    )


def nfs_url(head_ip: str, path: str = "", *, pseudo: str = NFS_LAB_PSEUDO) -> str:
    return f"nfs://{head_ip}{posixpath.join(pseudo, path) if path else pseudo}?version=4"


def parse_nfs_ls(text: str) -> dict[str, int]:
    """``nfs-ls`` lines (``-rw-r--r--  1 65534 65534  720 config.json``) -> {name: size} of the
    regular files."""
    sizes: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[0].startswith("-") and parts[4].isdigit():
            sizes[parts[5]] = int(parts[4])
    return sizes


def _ganesha_stop(head, state_dir: str) -> None:
    # only the ganesha we started: the pid from our pid file, and only if it is ganesha.nfsd
    head.run(f"p=$(cat {_q(state_dir)}/ganesha.pid 2>/dev/null) && [ -n \"$p\" ] && "
             f"grep -q ganesha /proc/$p/cmdline 2>/dev/null && kill $p; "
             f"for i in $(seq 50); do [ -n \"$p\" ] && [ -d /proc/$p ] || break; sleep 0.1; done; "
             f"rm -f {_q(state_dir)}/ganesha.pid", timeout=30, warn=True)


def nfs_userspace_share(head, worker, export_dir: str, mountpoint: str, *,
                        head_manifest: dict[str, Any] | None, worker_ips: list[str] | None = None,
                        state_dir: str = NFS_LAB_DIR, ready_s: float = 20.0, name: str = "weights",
                        tree: str = "", probe: str = "config.json",
                        parity: Callable[..., Check]) -> tuple[list[Check], dict[str, Any]]:
    """The NFS mode where only userspace NFS can run (the lab): serve ``export_dir`` from the head
    with nfs-ganesha, prove from the worker that every file reads back byte-identical over NFS
    (parity against the head manifest), that the export is read-only and that it is closed to any
    address but the workers'; then stop the server. The kernel mount is rendered and reported N/A.
    ``tree``: where the manifest's files sit inside the export (hub cache: ``snapshots/<rev>``); ``parity``: the
    weights step's rule (head manifest, manifest over NFS, node=) -> its ``weights.parity`` row. Returns the rows
    and the share's data."""
    export_dir, mountpoint = on_node(head, export_dir), on_node(worker, mountpoint)
    cmds = render_nfs(export_dir, head.spec.fabric_ip, worker.spec.fabric_ip, mountpoint, name=name, probe=probe,
                      export_to=worker_ips or [worker.spec.fabric_ip])
    head_ip = head.spec.fabric_ip
    conf = render_ganesha(export_dir, head_ip, worker_ips or [worker.spec.fabric_ip])
    checks: list[Check] = []
    data: dict[str, Any] = {"commands": cmds, "executed": False,    # the kernel commands: never here
                            "server": "nfs-ganesha (userspace)", "ganesha_conf": conf, "url": nfs_url(head_ip)}
    missing = [tool for node, tool in ((head, "ganesha.nfsd"), (worker, "nfs-cat"), (worker, "nfs-ls"))
               if not node.read(f"command -v {tool}").ok]
    if missing:
        checks.append(check("weights.nfs.server", False, node="cluster",
                                   observed=f"missing on the nodes: {', '.join(missing)}",
                                   expected="nfs-ganesha on the head, libnfs-utils on the worker",
                                   fix="apt-get install nfs-ganesha nfs-ganesha-vfs libnfs-utils (make lab-deps)"))
        return checks, data
    _ganesha_stop(head, state_dir)
    listening = system.parse_listening(head.read(system.LISTEN_CMD).stdout)
    if NFS_PORT in listening:
        checks.append(check("weights.nfs.server", False, node=head.name,
                                   observed=f"port {NFS_PORT} is already taken: {listening[NFS_PORT] or 'a process'}",
                                   expected="2049 free on the head for the export",
                                   fix="stop the NFS server that holds it (ss -ltnp | grep 2049)"))
        return checks, data
    head.run(f"mkdir -p {_q(state_dir)} /var/lib/nfs/ganesha /run/ganesha && "
             f"printf %s {_q(conf)} > {_q(state_dir)}/ganesha.conf && : > {_q(state_dir)}/ganesha.log",
             timeout=30)
    started = head.run(f"setsid nohup ganesha.nfsd -f {_q(state_dir)}/ganesha.conf -L {_q(state_dir)}/ganesha.log "
                       f"-p {_q(state_dir)}/ganesha.pid -N NIV_EVENT </dev/null >/dev/null 2>&1 &", timeout=30)
    if started.dry_run:
        checks.append(not_applicable("weights.nfs.server", "dry run: the server's commands were recorded, "
                                            "nothing was started", node=head.name))
        return checks, data
    try:
        t0 = time.monotonic()
        up = False                    # 2049 was free a moment ago: whoever listens now is our server
        while not up and time.monotonic() - t0 < ready_s:
            up = NFS_PORT in system.parse_listening(head.read(system.LISTEN_CMD).stdout)
            if not up:
                time.sleep(0.3)
        up_s = time.monotonic() - t0
        data["server_ready_s"] = round(up_s, 2)
        if not up:
            log = head.read(f"tail -n 20 {_q(state_dir)}/ganesha.log").stdout
            checks.append(check("weights.nfs.server", False, node=head.name,
                                       observed=f"nothing listens on {head_ip}:2049 after {ready_s:.0f} s; "
                                                f"log tail: {log.strip()[-600:]}",
                                       expected="ganesha.nfsd serving NFSv4 on the fabric address",
                                       fix=f"read {state_dir}/ganesha.log on the head"))
            return checks, data
        checks.append(check("weights.nfs.server", True, node=head.name,
                                   observed=f"nfs-ganesha (userspace NFS server) serves {export_dir} as "
                                            f"{head_ip}:{NFS_LAB_PSEUDO} (NFSv4) after {up_s:.1f} s",
                                   expected="export ro to WORKER_IP only, root_squash (kernel nfsd cannot "
                                            "run in the lab: the userspace server stands in)",
                                   data={"conf": conf}))
        # parity over NFS: sizes from the listing, sha256 of every file as it reads through the server
        files = [posixpath.join(tree, f["path"]) for f in (head_manifest or {}).get("files", [])]
        listing = worker.read(f"timeout 60 nfs-ls {_q(nfs_url(head_ip))}", timeout=90)
        sizes = parse_nfs_ls(listing.stdout)
        hashes: dict[str, str] = {}
        for path in files:
            res = worker.read(f"set -o pipefail; timeout 3600 nfs-cat {_q(nfs_url(head_ip, path))} | sha256sum",
                              timeout=3700)
            if res.ok and res.stdout.split():
                hashes[path] = res.stdout.split()[0]
        for path in (p for p in files if "/" in p):           # nfs-ls lists one level: list nested dirs too
            sub = parse_nfs_ls(worker.read(f"timeout 60 nfs-ls {_q(nfs_url(head_ip, posixpath.dirname(path)))}",
                                           timeout=90).stdout)
            if posixpath.basename(path) in sub:
                sizes[path] = sub[posixpath.basename(path)]
        over_nfs = {"revision": (head_manifest or {}).get("revision"),
                    "files": [{"path": posixpath.relpath(p, tree or "."), "size": sizes[p], "sha256": hashes[p]}
                              for p in files if p in sizes and p in hashes]}
        checks.append(parity(head_manifest, over_nfs, node=f"{worker.name} over NFS"))
        data["bytes_read"] = sum(f["size"] for f in over_nfs["files"])
        # read-only: a write from the worker must be refused by the server
        write = worker.read(f"p=$(mktemp) && echo probe > $p && timeout 60 nfs-cp $p "
                            f"{_q(nfs_url(head_ip, '.runbook-write-probe'))}; rc=$?; rm -f $p; exit $rc",
                            timeout=90)
        leaked = head.read(f"test -e {_q(posixpath.join(export_dir, '.runbook-write-probe'))}").ok
        checks.append(check("weights.nfs.read_only", not write.ok and not leaked, node=worker.name,
                                   observed=(write.stderr or write.stdout).strip()[-200:] or f"exit {write.exit_code}",
                                   expected="a write from the worker refused (NFS4ERR_ROFS), nothing created",
                                   fix="export read-only (Access_Type = RO / exportfs ro)"))
        if leaked:
            head.run(f"rm -f {_q(posixpath.join(export_dir, '.runbook-write-probe'))}", timeout=30, warn=True)
        # closed to everyone else: the head's own fabric address is not a client of the export
        other = head.read(f"timeout 30 nfs-ls {_q(nfs_url(head_ip))}", timeout=60)
        checks.append(check("weights.nfs.restricted", not other.ok, node=head.name,
                                   observed=(f"a client at {head_ip} (not a worker) was refused: "
                                             f"{(other.stderr or other.stdout).strip()[-160:]}") if not other.ok
                                            else f"a client at {head_ip} (not a worker) could list the export",
                                   expected="only the workers' fabric addresses may read the export",
                                   fix="list only WORKER_IP in the export's clients (never '*' or a subnet)"))
    finally:
        _ganesha_stop(head, state_dir)
    checks.append(not_applicable(
        "weights.nfs.mount", "the lab kernel has no NFS client (mount.nfs4: No such device): the worker's "
        "kernel mount is rendered, not run (weights.nfs.lab_mount stands in for it)", node=worker.name,
        expected="mount nfs4.2 ro nconnect=8 rsize/wsize 1 MiB hard"))
    if not any(c.failed for c in checks):
        checks.append(sshfs_stand_in(head, worker, export_dir, mountpoint, probe=probe))
    return checks, data


def sshfs_stand_in(head, worker, export_dir: str, mountpoint: str, *, probe: str = "config.json") -> Check:
    """What the worker's kernel NFS mount gives on Sparks, where it cannot run (the lab): the head's export,
    read-only at the same mountpoint, here over the fabric with sshfs (FUSE). What reads it next (03's packer,
    04's ranks) then sees the head's files, not an empty directory of its own. Idempotent: an sshfs mount of
    the same source stays; one of another source at the mountpoint is unmounted first."""
    source = f"{head.spec.fabric_ip}:{export_dir}"
    mounted = f"{source} {mountpoint} fuse.sshfs "
    # an sshfs of another source at this mountpoint (the head's address on another lab shape: the cable's before
    # the switch) goes first, lazily: its server may be gone, and then the mkdir below would block on it
    stale = (f"awk -v mp={_q(mountpoint)} -v src={_q(source)} '$2 == mp && $3 == \"fuse.sshfs\" && $1 != src "
             f"{{ found = 1 }} END {{ exit !found }}' /proc/mounts && umount -l {_q(mountpoint)}; ")
    res = worker.run(stale + f"mkdir -p {_q(mountpoint)} && {{ grep -qF {_q(mounted)} /proc/mounts || "
                     f"timeout 60 sshfs -o ro,allow_other,reconnect,ServerAliveInterval=15 {_q(source)} {_q(mountpoint)}; }} && "
                     f"test -e {_q(posixpath.join(mountpoint, probe))}", timeout=90, warn=True)
    return check("weights.nfs.lab_mount", res.ok, node=worker.name,
                 observed=(f"{source} mounted read-only at {mountpoint} with sshfs over the fabric; {probe} readable"
                           if res.ok else f"exit {res.exit_code}: {(res.stderr or res.stdout).strip()[-300:]}"),
                 expected="the head's export at the worker's mountpoint (stand-in for the kernel NFS mount, "
                          "which the lab kernel lacks)",
                 fix="make lab-deps (sshfs); check `ssh <head fabric IP>` works from the worker")
