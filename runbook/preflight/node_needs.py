"""What the later steps need on each node, checked before anything runs: the node's ``python3`` for the
tools the runbook ships there, and (WEIGHT_SYNC=nfs) the kernel NFS packages, the exact sudo rules and whether the
squashed root the worker's container reads as can reach the exports.

Step 02 ships its own standard-library tools (``weights_tools/node_download.py``, ``weights_tools/verify_manifest.py``)
and runs them with the node's ``python3``: no package of the node's Python is used (stock DGX OS has no
``huggingface_hub`` and refuses ``pip install`` outside a venv, PEP 668), only its version matters. The NFS
rows ask sudo about each command step 02 will run as root (``sudo -n -l <command>``, read-only) with the
paths step 02 will use, so a missing sudoers drop-in or NFS package stops the run here and not after the
multi-hour head download.
"""
from __future__ import annotations

import dataclasses
import re

from ..checks import Check, Status, check, not_applicable
from ..errors import RunbookError
from ..weights_tools.layout import weights_layout
from ..facts.node_paths import node_user, on_node, parse_reach, reach_cmd
from ..weights_tools.nfs import NFS_EXPORT_OPTS, render_nfs, sudo_check

#: the shipped node tools use only the standard library of Python 3.8 or later
MIN_PYTHON = (3, 8)
PYTHON_CMD = "python3 -c 'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])' 2>&1"
# each NFS program: which node needs it, where Debian/Ubuntu installs it, and the package that holds it
NFS_PROGRAMS = {"head": (("exportfs", "nfs-kernel-server"), ("rpcinfo", "rpcbind")),
                "worker": (("mount.nfs4", "nfs-common"),)}


def python_check(node) -> Check:
    """The node's ``python3`` runs the shipped tools (version >= :data:`MIN_PYTHON`)."""
    res = node.read(PYTHON_CMD, timeout=20)
    text = (res.stdout or "").strip()
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text.splitlines()[-1] if text else "")
    need = ".".join(map(str, MIN_PYTHON))
    ok = bool(m) and (int(m.group(1)), int(m.group(2))) >= MIN_PYTHON
    return check("node python3", ok, node=node.name,
                 observed=f"python3 {text}" if m else (text or res.stderr.strip() or f"exit {res.exit_code}")[:200],
                 expected=f"python3 >= {need} (runs the runbook's standard-library tools; no packages needed)",
                 fix="sudo apt-get install -y python3 (DGX OS ships it; no pip install is needed)")


def programs_cmd(names) -> str:
    """Where each program is, or ``-`` (sbin included: a non-root PATH often lacks it)."""
    return "; ".join(f"printf '%s ' {n}; PATH=\"$PATH:/usr/sbin:/sbin\" command -v {n} || echo -" for n in names)


def nfs_packages_check(node, role: str) -> Check:
    """The NFS programs step 02 runs on this node are installed (head: server, worker: client)."""
    wanted = NFS_PROGRAMS[role]
    res = node.read(programs_cmd([p for p, _ in wanted]), timeout=20)
    found = dict(line.split(" ", 1) for line in (res.stdout or "").strip().splitlines() if " " in line)
    missing = [(p, pkg) for p, pkg in wanted if found.get(p, "-").strip() in ("-", "")]
    pkgs = sorted({pkg for _, pkg in missing})
    return check("nfs packages", not missing, node=node.name,
                 observed=("missing " + ", ".join(p for p, _ in missing)) if missing
                 else ", ".join(f"{p} {found[p].strip()}" for p, _ in wanted),
                 expected=f"{', '.join(p for p, _ in wanted)} installed (WEIGHT_SYNC=nfs, {role} side)",
                 fix=f"on {node.name}: sudo apt-get install -y {' '.join(pkgs)}" if pkgs else "")


def nfs_shares(profile, head, worker) -> list[tuple[str, str, str]]:
    """(name, export dir on the head, mount point on the worker) of every directory step 02's kernel NFS mode
    shares: the weights and, with ENGRAM=1, the Engram source (``~`` expanded on each node)."""
    layout = weights_layout(profile)
    worker_root = profile.worker_weights_dir or profile.weights_dir
    shares = [("weights", layout.store(on_node(head, profile.weights_dir, key="WEIGHTS_DIR")),
               layout.store(on_node(worker, worker_root, key="WORKER_WEIGHTS_DIR")))]
    if profile.engram and profile.engram_src_dir:
        shares.append(("engram", on_node(head, profile.engram_src_dir, key="ENGRAM_SRC_DIR"),
                       on_node(worker, profile.engram_src_dir, key="ENGRAM_SRC_DIR")))
    return shares


REACH_ROW = "nfs export readable to a squashed root"


def nfs_reach_check(profile, head, worker) -> Check:
    """The export is ``root_squash`` (``weights_tools.nfs.NFS_EXPORT_OPTS``): the worker's container reads the
    share as root, which the head's nfsd maps to nobody, an "other" to every file. So every directory from ``/``
    down to each export needs o+x, the export and what it holds o+r (o+rx for directories), and the umask the
    download runs with must keep it so. DGX OS / Ubuntu make homes 0750: a share under ``~`` then fails the
    container's reads (EACCES) after the head's download. Read-only; before any download."""
    expected = ("every directory from / to the export o+x, the export and its content readable by others "
                "(root_squash: the worker's root reads as nobody)")
    if "root_squash" not in NFS_EXPORT_OPTS.split(","):
        return check(REACH_ROW, True, node=head.name, observed=f"export options {NFS_EXPORT_OPTS}: root is not squashed",
                     expected=expected)
    user = node_user(head).name
    problems: list[tuple[str, str]] = []
    read: list[str] = []
    for name, export, _ in nfs_shares(profile, head, worker):
        res = head.read(reach_cmd(export), timeout=60)
        reach = parse_reach(export, res.stdout)
        if reach is None:
            problems.append((f"{name}: cannot read the modes of {export} ({(res.stderr or res.stdout or '').strip()[:200]})",
                             f"check that {user} can run stat and find on the head"))
            continue
        read.append(export)
        problems += [(f"{name}: {why}", fix) for why, fix in reach.blocking(user)]
    if not problems:
        return check(REACH_ROW, True, node=head.name,
                     observed="others can enter every directory down to " + ", ".join(read) + " and read what is there",
                     expected=expected)
    fixes = list(dict.fromkeys(f for _, f in problems))
    fix = ("on the head: " + "; ".join(fixes) + " -- or put WEIGHTS_DIR (and ENGRAM_SRC_DIR) outside the home, e.g. "
           f"sudo install -d -o {user} -m 755 /srv/models (docs/weights.md: recipe A exports a tree of bind mounts "
           "with no_root_squash instead, and what that costs)")
    row = check(REACH_ROW, False, node=head.name, observed="; ".join(why for why, _ in problems)[:1500],
                expected=expected, fix=fix)
    if profile.rehearsal:      # the lab's userspace server and sshfs stand-in read as root: nothing fails there
        return dataclasses.replace(row, status=Status.WARN, observed="[the lab's NFS stand-ins read as root; on the "
                                   "Sparks' kernel nfsd this FAILs] " + row.observed)
    return row


def nfs_sudo_check(profile, head, worker, *, node) -> Check:
    """The sudo rules for exactly the commands step 02's kernel NFS mode runs on ``node`` (the export on
    the head, the mount on ``worker``; the weights and, with ENGRAM=1, the Engram source), or PASS when
    the SSH user is root."""
    user = node_user(node)
    if user.is_root:
        return check("nfs sudo rules", True, node=node.name, observed="the SSH user is root: no sudo needed",
                     expected="root, or sudo rules for the NFS commands")
    role = "head" if node is head else "worker"
    commands: list[str] = []
    for name, export, mountpoint in nfs_shares(profile, head, worker):
        cmds = render_nfs(export, head.spec.fabric_ip, worker.spec.fabric_ip, mountpoint, name=name,
                          head_sudo=True, worker_sudo=True)
        commands += cmds[role] + cmds[f"undo_{role}"]
    refused = sudo_check(node, commands)
    if refused is not None:
        return dataclasses.replace(refused, name="nfs sudo rules")
    return check("nfs sudo rules", True, node=node.name,
                 observed=f"sudo -n -l allows every NFS command step 02 runs as root on {node.name}",
                 expected=f"{user.name} may run them without a password")


def nfs_checks(cluster, profile) -> list[Check]:
    """WEIGHT_SYNC=nfs: packages and sudo rules on the head and every worker; N/A otherwise."""
    if profile.weight_sync != "nfs":
        return [not_applicable("nfs packages", f"WEIGHT_SYNC={profile.weight_sync}: no kernel NFS", node="cluster",
                               expected="checked with WEIGHT_SYNC=nfs")]
    if profile.is_lab:
        return [not_applicable("nfs packages", "the lab shares over userspace NFS (nfs-ganesha, libnfs): no "
                               "kernel export or mount runs there", node="cluster",
                               expected="checked on the Sparks with WEIGHT_SYNC=nfs")]
    # a rehearsal checks them for real: the lab has the packages, and its SSH user may be the non-root operator
    # with the prescribed drop-in (step 02 then runs the kernel mode up to nfsd, which the lab kernel lacks)
    head = cluster.head
    out = [nfs_packages_check(head, "head")]
    for worker in cluster.workers:
        out.append(nfs_packages_check(worker, "worker"))
    # the head's commands differ per worker only in the export line's address (not a sudo argument)
    for node, worker in [(head, cluster.workers[0]), *((w, w) for w in cluster.workers)]:
        try:
            out.append(nfs_sudo_check(profile, head, worker, node=node))
        except RunbookError as err:
            out.append(check("nfs sudo rules", False, node=node.name, observed=err.what,
                             expected="the NFS paths resolve on the node", fix=err.fix))
    try:
        out.append(nfs_reach_check(profile, head, cluster.workers[0]))
    except RunbookError as err:
        out.append(check(REACH_ROW, False, node=head.name, observed=err.what,
                         expected="the NFS paths resolve on the node", fix=err.fix))
    return out


def node_needs(cluster, profile) -> list[Check]:
    """Every row of this module, in order: python3 per node, then the NFS rows."""
    return [*(python_check(n) for n in cluster), *nfs_checks(cluster, profile)]
