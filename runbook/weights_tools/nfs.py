"""The kernel NFS share of step 02 as commands: the exports line and mount of one directory (``render_nfs``) and
the one definition of what it runs as root (``SUDO_RULES``), from which the sudoers drop-in the fix prints and the
probe that checks it are both built. Preflight (step 00) checks the same rules before the multi-hour download."""
from __future__ import annotations

import ipaddress
import posixpath
import shlex
from collections.abc import Iterable

from ..checks import Check, check
from ..errors import RunbookError
from ..facts.node_paths import node_user
from ..remote import quote

NFS_EXPORT_OPTS = "ro,sync,no_subtree_check,root_squash"
NFS_MOUNT_OPTS = "vers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600"
EXPORTS_DIR = "/etc/exports.d"


def single_ipv4(value: str, what: str) -> str:
    try:
        ip = ipaddress.IPv4Address(value)
    except ValueError:
        raise RunbookError(f"{what} must be one IPv4 fabric address", observed=repr(value),
                           expected="e.g. 10.0.22.2 (never '*', a hostname or a wide subnet)",
                           fix="set HEAD_IP/WORKER_IP in the profile") from None
    return str(ip)


def _export_path(path: str) -> str:
    """An absolute path as /etc/exports writes it: double-quoted (spaces are allowed)."""
    if not posixpath.isabs(path) or any(c in path for c in '"\\\n'):
        raise RunbookError("the NFS export needs an absolute path without quotes, backslashes or newlines",
                           observed=repr(path), expected="e.g. /home/spark/.cache/dsv41-flash-exl3/model",
                           fix="expand ~ on the node first (node_paths.on_node) or rename the directory")
    return f'"{path}"'


def exports_file(name: str) -> str:
    """The share's own exports file, ``/etc/exports.d/spark-runbook-<name>.exports`` (what the sudo rule allows)."""
    return f"{EXPORTS_DIR}/spark-runbook-{name}.exports"


def export_clients(worker_ips: str | Iterable[str]) -> list[str]:
    """Every worker's fabric address, once each, in rank order (one address: a list of one)."""
    ips = [worker_ips] if isinstance(worker_ips, str) else list(worker_ips)
    if not ips:
        raise RunbookError("the NFS export needs at least one worker address", observed="no worker",
                           fix="name the workers in the profile (WORKER_SSH/WORKER_IP, WORKER2_*, ...)")
    return list(dict.fromkeys(single_ipv4(ip, "WORKER_IP") for ip in ips))


def export_line(export_dir: str, worker_ips: str | Iterable[str]) -> str:
    """The one exports line: ``export_dir`` read-only to every worker's fabric address and nobody else, root
    squashed (``/dir 10.0.0.2(ro,...) 10.0.0.3(ro,...)``: one client entry per worker, as exports(5) lists them).

    >>> export_line("/srv/m", ["192.168.192.4", "192.168.192.3"])
    '"/srv/m" 192.168.192.4(ro,sync,no_subtree_check,root_squash) 192.168.192.3(ro,sync,no_subtree_check,root_squash)'
    """
    return " ".join([_export_path(export_dir), *(f"{ip}({NFS_EXPORT_OPTS})" for ip in export_clients(worker_ips))])


def render_nfs(export_dir: str, head_ip: str, worker_ip: str, mountpoint: str, *,
               name: str = "weights", head_sudo: bool = False, worker_sudo: bool = False,
               probe: str = "config.json", volume: str = "spark-weights",
               export_to: Iterable[str] | None = None) -> dict[str, list[str]]:
    """The exact commands of the kernel NFS mode for one directory: export ``export_dir`` (absolute,
    on the head) read-only to every worker's fabric address (``export_to``, rank order; default: ``worker_ip``
    alone) and nobody else (root_squash) in its own ``/etc/exports.d/spark-runbook-<name>.exports`` (every
    worker's share writes the same line, so no worker's share drops another's access), and mount it on the
    worker ``worker_ip`` at ``mountpoint``
    (absolute) NFSv4.2 with nconnect=8, 1 MiB rsize/wsize, hard. No ``fsid=0``: the server builds the
    NFSv4 pseudo root from every export, so the model and the Engram source can be exported side by
    side and the client mounts ``<head_ip>:<export_dir>``. ``*_sudo``: prefix what needs root with
    ``sudo -n`` (the SSH user is not root there); every such command is a single whitelistable program.
    ``probe``: a file (relative to the export) the worker must see through the mount."""
    head_ip = single_ipv4(head_ip, "HEAD_IP")
    worker_ip = single_ipv4(worker_ip, "WORKER_IP")
    clients = export_clients(export_to if export_to is not None else [worker_ip])
    if worker_ip not in clients:
        raise RunbookError(f"the NFS export does not list the worker that mounts it ({worker_ip})",
                           observed=", ".join(clients), fix="pass every worker's fabric address")
    if not posixpath.isabs(mountpoint):
        raise RunbookError("the NFS mount point must be absolute", observed=repr(mountpoint),
                           fix="expand ~ on the worker first (node_paths.on_node)")
    sh, sw = ("sudo -n " if head_sudo else ""), ("sudo -n " if worker_sudo else "")
    exports = exports_file(name)
    line = export_line(export_dir, clients)
    mnt = quote(mountpoint)
    return {
        "head": [
            f"{sh}mkdir -p {EXPORTS_DIR}",
            f"printf '%s\\n' {quote(line)} | {sh}tee {exports} >/dev/null",
            f"{sh}exportfs -ra",
            f"{sh}exportfs -v | grep -F {quote(export_dir)}",
            f"rpcinfo -t {head_ip} nfs 4",
        ],
        "worker": [
            f"mkdir -p {mnt} 2>/dev/null || {sw}mkdir -p {mnt}",
            f"mountpoint -q {mnt} || {sw}mount -t nfs4 -o {NFS_MOUNT_OPTS} {quote(head_ip + ':' + export_dir)} {mnt}",
            f"test -f {quote(posixpath.join(mountpoint, probe))}",
        ],
        "worker_docker_volume": [
            f"docker volume rm -f {volume}",
            (f"docker volume create --driver local --opt type=nfs "
             f"--opt o=addr={head_ip},{NFS_MOUNT_OPTS.replace('vers=', 'nfsvers=')} "
             f"--opt {quote('device=:' + export_dir)} {volume}"),
        ],
        "undo_head": [f"{sh}rm -f {exports}", f"{sh}exportfs -ra"],
        "undo_worker": [f"{sw}umount {mnt}"],
    }


# The one definition of what the kernel NFS mode runs as root: (program, argument pattern in sudoers
# syntax; "" = any arguments). The sudoers drop-in the fix prescribes is built from it, the probe asks
# sudo about each rendered command against it (`sudo -n -l <command>`), and a unit test proves that every
# command render_nfs prefixes with `sudo -n` matches one of these rules.
SUDO_RULES: tuple[tuple[str, str], ...] = (
    ("/usr/bin/mkdir", ""),
    ("/usr/bin/tee", f"{EXPORTS_DIR}/spark-runbook-*.exports"),
    ("/usr/sbin/exportfs", ""),
    ("/usr/bin/mount", ""),
    ("/usr/bin/umount", ""),
    ("/usr/bin/rm", f"-f {EXPORTS_DIR}/spark-runbook-*.exports"),
)
SUDOERS_PROGRAMS = ", ".join(f"{prog} {args}".strip() for prog, args in SUDO_RULES)
SUDOERS_FILE = "/etc/sudoers.d/spark-runbook"


def sudoers_line(user: str) -> str:
    """The one line of the drop-in: ``user`` may run :data:`SUDO_RULES` as root without a password, nothing
    else (the lab installs exactly this line for its non-root operator)."""
    if not user or not all(c.isalnum() or c in "._-" for c in user) or user[0] in "-.":
        raise RunbookError("a sudoers user name is letters, digits, '.', '_' and '-' only", observed=repr(user),
                           expected="e.g. spark", fix="use the node's login name (id -un on the node)")
    return f"{user} ALL=(root) NOPASSWD: {SUDOERS_PROGRAMS}"


def sudoers_fix(user: str, node: str) -> str:
    """The exact commands that install the drop-in allowing :data:`SUDO_RULES` for ``user``."""
    return (f"on {node}: echo '{sudoers_line(user)}' | sudo tee {SUDOERS_FILE} "
            f"&& sudo chmod 0440 {SUDOERS_FILE} && sudo visudo -cf {SUDOERS_FILE}; or set HEAD_SSH/WORKER_SSH "
            "to root@…")


def sudo_argvs(commands: Iterable[str]) -> list[list[str]]:
    """The argv of every ``sudo -n <program> …`` inside ``commands`` (up to the next shell operator or
    redirection), in order, without repeats."""
    out: list[list[str]] = []
    for command in commands:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        tokens = list(lex)
        for i in range(len(tokens) - 1):
            if tokens[i] == "sudo" and tokens[i + 1] == "-n":
                argv = []
                for tok in tokens[i + 2:]:
                    if set(tok) <= set("();<>|&"):
                        break
                    argv.append(tok)
                if argv and argv[-1].isdigit():       # `2>/dev/null`: the fd number before the operator
                    argv.pop()
                if argv and argv not in out:
                    out.append(argv)
    return out


def sudo_probe_cmd(argv: list[str]) -> str:
    """Read-only: may the SSH user run exactly this command as root without a password? (``sudo -l``
    with a command exits 0 and prints its full path when the sudoers rules allow it.)"""
    return "sudo -n -l " + " ".join(quote(a) for a in argv)


def sudo_check(node, commands: list[str]) -> Check | None:
    """Before anything changes: when ``commands`` use ``sudo -n``, prove sudo allows each of them without
    a password (:func:`sudo_probe_cmd` per command: what the drop-in of :func:`sudoers_fix` allows, not
    ``sudo -n true``, which it does not). Returns a FAIL naming the first refused command and the drop-in,
    or None when sudo is not needed or allows all of them. A dry run asks about every command even past a
    refusal, so the offline review shows each probe a run makes."""
    argvs = sudo_argvs(commands)
    refused: Check | None = None
    for argv in argvs:
        res = node.read(sudo_probe_cmd(argv), timeout=20)
        if res.ok or refused is not None:
            continue
        user = node_user(node).name
        said = ((res.stderr or "") + (res.stdout or "")).strip().splitlines()
        refused = check("weights.nfs.sudo", False, node=node.name,
                        observed=(f"`{sudo_probe_cmd(argv)}` as {user}: exit {res.exit_code} "
                                  f"{said[-1] if said else ''}").strip(),
                        expected=f"{user} may run the {len(argvs)} NFS commands with sudo without a password "
                                 "(or SSH as root)",
                        fix=sudoers_fix(user, node.name))
        if not node.dry_run:        # a dry run records every probe, a real run stops at the first refusal
            break
    return refused
    for argv in argvs:
        res = node.read(sudo_probe_cmd(argv), timeout=20)
        if res.ok:
            continue
        user = node_user(node).name
        said = ((res.stderr or "") + (res.stdout or "")).strip().splitlines()
        return check("weights.nfs.sudo", False, node=node.name,
                     observed=(f"`{sudo_probe_cmd(argv)}` as {user}: exit {res.exit_code} "
                               f"{said[-1] if said else ''}").strip(),
                     expected=f"{user} may run the {len(argvs)} NFS commands with sudo without a password "
                              "(or SSH as root)",
                     fix=sudoers_fix(user, node.name))
    return None


