"""The lab's files in its dir, per node: ssh keys, host keys, ssh_config and known_hosts on this machine,
and each node's sshd_config, /etc/hosts, hostname, private home and /etc/ssh/ssh_config, and its non-root
operator (users, groups, home, key and sudoers drop-in)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from runbook.errors import LabError
from runbook.weights_tools.nfs import SUDOERS_FILE, sudoers_line

from .host import run_local
from .nodes import home_shares
from .spec import (FABRIC_NETS, MGMT_PREFIX, NODE_NAMES, OPERATOR, OPERATOR_UID, LabNode, all_addresses,
                   default_topology, node_specs, peer_address)


def lab_paths(lab_dir: Path) -> tuple[Path, Path, Path]:
    """(ssh_config, key, known_hosts) of the lab in ``lab_dir``."""
    return lab_dir / "ssh_config", lab_dir / "id_ed25519", lab_dir / "known_hosts"


def passwd_with(host: str, user: str, uid: int, home: str) -> str:
    """The host's ``/etc/passwd`` text with ``user`` (uid = gid) added, any line of that name or uid replaced.
    Its password field is ``*`` (no password, not locked: sshd's key login and PAM's account check both pass,
    and there is no shadow entry to look up)."""
    keep = [line for line in host.splitlines() if line and line.split(":")[0] != user
            and (len(line.split(":")) < 3 or line.split(":")[2] != str(uid))]
    return "\n".join([*keep, f"{user}:*:{uid}:{uid}:Spark Runbook lab operator:{home}:/bin/bash"]) + "\n"


def group_with(host: str, user: str, gid: int, member_of: tuple[str, ...] = ("docker",)) -> str:
    """The host's ``/etc/group`` text with ``user``'s own group (gid) and ``user`` a member of ``member_of``
    (a group the host lacks is added with the next free gid above 100)."""
    lines = [line.split(":") for line in host.splitlines() if line and line.split(":")[0] != user]
    used = {int(f[2]) for f in lines if len(f) >= 3 and f[2].isdigit()} | {gid}
    for name in member_of:
        row = next((f for f in lines if f[0] == name), None)
        if row is None:
            row = [name, "x", str(min(g for g in range(101, 1000) if g not in used)), ""]
            used.add(int(row[2]))
            lines.append(row)
        while len(row) < 4:
            row.append("")
        members = [m for m in row[3].split(",") if m]
        row[3] = ",".join(members + ([user] if user not in members else []))
    lines.append([user, "x", str(gid), ""])
    return "\n".join(":".join(f) for f in lines) + "\n"


def write_operator(lab_dir: Path, node_dir: Path, lab_key: Path) -> None:
    """The lab's non-root operator on one node (node-private files nodeinit.sh binds over the host's):
    ``/etc/passwd`` and ``/etc/group`` with it (docker group: the node's dockerd socket), ``/home/<it>`` with the
    lab key and its own key authorised and its own key for node-to-node ssh, ``/etc/sudoers.d`` holding only the
    runbook's drop-in (its own rendering, checked with ``visudo -c -f``), and empty ``/etc/exports.d`` and
    ``/var/lib/nfs`` for the kernel NFS export steps."""
    op_key = lab_dir / "operator_ed25519"
    _keygen(op_key, f"{OPERATOR}@spark-runbook-lab")
    etc = node_dir / "etc"
    (etc / "passwd").write_text(passwd_with(Path("/etc/passwd").read_text(), OPERATOR, OPERATOR_UID,
                                            f"/home/{OPERATOR}"))
    (etc / "group").write_text(group_with(Path("/etc/group").read_text(), OPERATOR, OPERATOR_UID))
    for f in ("passwd", "group"):
        (etc / f).chmod(0o644)
    sudoers = etc / "sudoers.d"
    shutil.rmtree(sudoers, ignore_errors=True)          # exactly the drop-in, nothing left from before
    sudoers.mkdir(mode=0o755)
    drop_in = sudoers / Path(SUDOERS_FILE).name
    drop_in.write_text(sudoers_line(OPERATOR) + "\n")
    drop_in.chmod(0o440)
    visudo = shutil.which("visudo", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if visudo is None:
        raise LabError("visudo is missing: the lab cannot check its operator's sudoers drop-in",
                       fix="apt-get install sudo (make lab-deps)")
    run_local([visudo, "-c", "-f", str(drop_in)], timeout=20, what="visudo -c -f the operator's drop-in",
              fix=f"the runbook's rendering of {SUDOERS_FILE} is not valid sudoers syntax")
    for sub in ("exports.d",):
        (etc / sub).mkdir(exist_ok=True)
    (node_dir / "nfs").mkdir(exist_ok=True)
    home = node_dir / "users" / OPERATOR
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (node_dir / "users").chmod(0o755)
    (home / ".ssh" / "authorized_keys").write_text(lab_key.with_suffix(".pub").read_text()
                                                   + op_key.with_suffix(".pub").read_text())
    shutil.copyfile(op_key, home / ".ssh" / "id_ed25519")
    shutil.copyfile(op_key.with_suffix(".pub"), home / ".ssh" / "id_ed25519.pub")
    (home / ".bashrc").write_text("# ~/.bashrc of the lab's non-root operator (runbook.lab.netlab)\n")
    # the lab's stand-in for the recipe's GitHub repository is a root-owned local repository, which git refuses to
    # another user ("dubious ownership"; git 2.39 reads safe.directory only from the global or system config):
    # the operator trusts it as a head trusts github.com
    (home / ".gitconfig").write_text("# lab operator (runbook.lab.netlab): the lab recipe's local upstream is root's\n"
                                     "[safe]\n\tdirectory = *\n")
    for path in [home, *home.rglob("*")]:
        os.lchown(path, OPERATOR_UID, OPERATOR_UID)
    home.chmod(0o700)
    (home / ".ssh").chmod(0o700)
    for f in ("authorized_keys", "id_ed25519"):
        (home / ".ssh" / f).chmod(0o600)


def _keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_suffix(".pub").exists():
        return
    for p in (path, path.with_suffix(".pub")):
        p.unlink(missing_ok=True)
    run_local(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], timeout=30,
              what=f"ssh-keygen {path.name}")


def _ssh_common(key: Path, known_hosts: Path) -> list[str]:
    return ["  User root", "  Port 22", f"  IdentityFile {key}", "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {known_hosts}", "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes", "  BatchMode yes", "  PasswordAuthentication no",
            "  ConnectTimeout 5", "  ServerAliveInterval 10", "  LogLevel ERROR"]


def write_hosts(lab_dir: Path, specs: list[LabNode], topology: str | None = None) -> None:
    """Each node's /etc/hosts for the ``len(specs)``-node ``topology``: a peer's name is its address on the cable
    from this node (on the triangle, worker2 is 169.254.24.3 from the worker and 169.254.23.3 from the head; on the
    switch every peer's one switch address). Written in place: the running nodes have the file bind-mounted."""
    topology = topology or default_topology(len(specs))
    for n in specs:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{peer_address(len(specs), n.name, p.name, topology) or p.fabric_ip}\t{p.alias}" for p in specs if p is not n]
        lines += [f"{n.fabric_ip}\t{n.alias}"]
        path = lab_dir / "nodes" / n.name / "etc" / "hosts"
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


def write_files(lab_dir: Path, specs: list[LabNode], topology: str | None = None) -> None:
    """Keys, configs and node dirs of all the lab's nodes (spec.NODE_NAMES: a 2-node lab can take worker2 ..
    worker7 in without new files or pins), and the /etc/hosts of the ``len(specs)``-node ``topology``."""
    ssh_config, key, known_hosts = lab_paths(lab_dir)
    _keygen(key, "spark-runbook-lab")
    key.chmod(0o600)
    (lab_dir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    every = node_specs(len(NODE_NAMES))

    kh_lines = []
    # root's node-private home; when the lab venvs' Python lives under the host's /root (bound in read-only,
    # nodes.home_shares), other users may pass through it (0711: no listing) so the non-root operator runs them too
    root_home_mode = 0o711 if home_shares(lab_dir) else 0o700
    for n in every:
        nd = lab_dir / "nodes" / n.name
        for sub in ("nvme", "docker", "sbin", "etc", "home"):
            (nd / sub).mkdir(parents=True, exist_ok=True)
        (nd / "home").chmod(root_home_mode)
        hk = nd / "ssh_host_ed25519_key"
        _keygen(hk, n.alias)
        hk.chmod(0o600)
        pub = " ".join(hk.with_suffix(".pub").read_text().split()[:2])
        kh_lines.append(f"{','.join([n.alias, n.mgmt_ip, *all_addresses(n.name)])} {pub}")
        (nd / "etc" / "hostname").write_text(n.alias + "\n")
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
            "Subsystem sftp internal-sftp",
            # the operator: only its own ~/.ssh/authorized_keys (which holds the lab key and its own)
            f"Match User {OPERATOR}", "  AuthorizedKeysFile .ssh/authorized_keys", "",
        ]))
        write_operator(lab_dir, nd, key)
    known_hosts.write_text("\n".join(kh_lines) + "\n")
    # Inside the nodes /etc/ssh/ssh_config is node-private (bind mount): plain `ssh spark-worker`,
    # `ssh 169.254.77.2`, rsync -e ssh and sshfs work node to node over the fabric (names resolve to the
    # peer's address on the cable from this node through its /etc/hosts), with host keys pinned. The host's
    # file is untouched.
    try:
        system_cfg = Path("/etc/ssh/ssh_config").read_text()
    except OSError:
        system_cfg = ""
    hosts_pattern = " ".join([*(n.alias for n in every), *(f"{net}.*" for net in FABRIC_NETS), f"{MGMT_PREFIX}.*"])
    # root logs in node to node as root with the lab key; any other user (the operator) as itself with its own
    # ~/.ssh key (the lab key is root's only)
    node_cfg = ["# generated by runbook.lab.netlab: node-private /etc/ssh/ssh_config of the lab nodes",
                f"Match localuser root host {hosts_pattern.replace(' ', ',')}", "  User root", f"  IdentityFile {key}",
                f"Host {hosts_pattern}",
                *[line for line in _ssh_common(key, known_hosts) if not line.strip().startswith(("User ", "IdentityFile "))],
                "", "# --- the host's /etc/ssh/ssh_config follows ---", system_cfg]
    # The node's own ~/.bashrc (its home is node-private): the host's file may run slow shell setup (here
    # `pyenv init`, ~1 s) on every ssh command; nodes get sshd's plain root PATH.
    bashrc = ("# ~/.bashrc of a lab node (runbook.lab.netlab; the node's home is private to it).\n"
              "# The host's ~/.bashrc is not used inside the nodes: its shell setup made every ssh command\n"
              "# about 1 s slower. PATH is sshd's default for root, as on a freshly installed node.\n")
    for n in every:
        (lab_dir / "nodes" / n.name / "etc" / "ssh_config").write_text("\n".join(node_cfg))
        (lab_dir / "nodes" / n.name / "home" / ".bashrc").write_text(bashrc)

    common = _ssh_common(key, known_hosts)
    lines = ["# generated by runbook.lab.netlab; aliases of the lab nodes (management path) and the",
             "# fabric IPs (reachable only from inside a node). Host keys are pinned in known_hosts.", ""]
    for n in every:
        lines += [f"Host {n.alias}", f"  HostName {n.mgmt_ip}", *common, ""]
    ips = " ".join([n.mgmt_ip for n in every] + [ip for n in every for ip in all_addresses(n.name)])
    lines += [f"Host {ips}", *common, ""]
    ssh_config.write_text("\n".join(lines))
    write_hosts(lab_dir, specs, topology)
