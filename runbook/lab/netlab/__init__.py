"""The embedded lab: two to eight "Sparks" on this one machine.

Each node is a network namespace ``nl-<name>`` whose PID 1 is ``nodeinit.sh`` (own UTS, mount and
PID namespaces; see that file), which becomes the node's sshd. Node names in rank order: head, worker, worker2 ..
worker7. Topology::

    root netns (the "laptop" running the runbook)
      nlbr0 10.77.0.1/24 --+-- nl-m-head    <-> enP7s7 10.77.0.11/24  [nl-head,    hostname spark-head]
                           +-- nl-m-worker  <-> enP7s7 10.77.0.12/24  [nl-worker,  hostname spark-worker]
                           +-- nl-m-worker2 <-> enP7s7 10.77.0.13/24  [nl-worker2, hostname spark-worker2]  (3+ nodes)
                           +-- ... nl-m-worker<k> <-> enP7s7 10.77.0.<11 + k>                                (up to 8)
      guard routes: unreachable 10.77.0.0/16 and each fabric /24 (lab prefixes never follow the default route)

    The fabric: every node has a Spark's two CX-7 ports, enp1s0f0np0 and enp1s0f1np1 (MTU 9000). Three cablings
    (spec.LINKS, spec.SWITCH; the profile's node list chooses, control.lab_topology):
    cable (2 nodes): one veth, the ports every shipped 2-node profile names (exl3-v41, dspark-v4, lab):
        head enp1s0f1np1 169.254.77.1 <-> worker enp1s0f0np0 169.254.77.2
        (head enp1s0f0np0 and worker enp1s0f1np1: no cable, DOWN, no address)
    triangle (3 nodes), seed B's TP3 ring, each cable its own /24:
        head   enp1s0f0np0 169.254.22.1 <-> worker  enp1s0f0np0 169.254.22.2
        head   enp1s0f1np1 169.254.23.1 <-> worker2 enp1s0f1np1 169.254.23.3
        worker enp1s0f1np1 169.254.24.2 <-> worker2 enp1s0f0np0 169.254.24.3
    switch (3 to 8 nodes): the bridge nlsw0 (MTU 9000, no address: the host is not on the fabric) is the switch;
        each node's enp1s0f0np0 169.254.30.<rank + 1>/24 is a veth whose root end nl-s-<node> (MTU 9000) is a
        port of it; enp1s0f1np1 is uncabled.
    The management veth is named like a Spark's LAN port, enP7s7 (seed B's TP3 bootstrap interface): the one
    network all nodes share. ``up`` with another node count or topology on a healthy lab adds or removes nodes and
    re-cables the fabric; the nodes it keeps keep their namespaces, processes and files (on a switch that stays a
    switch their cables stay too: a node joins by plugging its port in).

Nodes have no default route. After sshd answers, ``dockerd`` is started in each node over SSH (as a
runbook would on a real node) and a tiny busybox image ``spark-runbook/lab-runtime:1`` is imported on
the head and shipped to the workers with ``docker save | docker load``. The lab's registry (Debian's
``docker-registry``) listens on the bridge's host address, 10.77.0.1:5077, plain HTTP; every node's dockerd
starts with ``--insecure-registry`` for it (a rehearsal pushes its image there and the nodes pull it).

Each node's /usr, /etc and /var are overlays over this machine's (nodeinit.sh; the node's writes in
``<lab_dir>/nodes/<name>/overlay``), so a node removes or installs Debian packages on its own, and its apt reaches
the Debian archive through the lab's apt proxy on the same host address, 10.77.0.1:3142 (``aptproxy``; a
node-private apt.conf.d file names it). ``down`` removes the overlay layers: each ``up`` starts the nodes from
this machine's files.

Public API: :func:`up`, :func:`down`, :func:`status`, :func:`info`, :class:`LabInfo`, :class:`LabNode`.
Everything here needs root; every subprocess has a timeout; every failure is a :class:`LabError`.

This module holds the public entries and the order ``up`` follows; each part lives in its own module:
``spec`` (names, addresses, LabInfo, the state file), ``host`` (local commands, ssh, process and netns
lookups), ``packages`` (apt), ``files`` (keys, ssh and sshd configs, node dirs), ``network`` (netns, veth,
bridges, routes), ``nodes`` (PID 1 of each node), ``dockerd`` (docker and the runtime image),
``registry`` (the lab's container registry), ``aptproxy`` (the nodes' way to the Debian archive, whose process is
``forward_proxy``), ``health`` (status) and ``teardown`` (down).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

from runbook.errors import LabError

from .aptproxy import start_apt_proxy
from .dockerd import dockerd_script, ensure_image, parse_kv
from .files import lab_paths, write_files, write_hosts
from .health import DOCKERD, NODE, lab_status, other_running_lab, repairs, unreachable_live_nodes
from .host import node_pid1, ssh
from .host import link_exists, run_local
from .network import create_network, recable, switch_port, wait_carrier
from .nodes import cgroup_mounts, kill_node, remove_overlays, start_node, wait_port
from .packages import ensure_packages
from .registry import start_registry
from .spec import (DEFAULT_LAB_DIR, GUARD_ROUTES, IMAGE, MARKER, NODE_NAMES, NODE_PRIVATE, NODEINIT, PORTS, LabInfo,
                   LabNode, Log, default_topology, node_specs, read_state, state_topology, write_state)
from .teardown import lab_present, rm_cgroups, teardown

__all__ = ["LabInfo", "LabNode", "default_lab_dir", "down", "info", "status", "up"]


def _default_log(msg: str) -> None:
    print(f"[lab] {msg}", file=sys.stderr, flush=True)


def _require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise LabError(f"lab {action} needs root (it creates network namespaces, veth links, routes "
                       "and mounts)", observed=f"running as uid {os.geteuid()}", expected="uid 0 (root)",
                       fix=f"run it as root, e.g. `sudo {sys.executable} -m runbook lab {action}`")


@contextlib.contextmanager
def _locked(lab_dir: Path, timeout: float = 180) -> Iterator[None]:
    """One ``up`` or ``down`` at a time per lab dir (flock on ``<lab_dir>/.lock``)."""
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
    """Seconds per phase of ``up`` (``LabInfo.timings``)."""

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


# --------------------------------------------------------------------------------------------------
# public API

def default_lab_dir() -> Path:
    """<repo>/.lab (gitignored)."""
    return DEFAULT_LAB_DIR


def info(lab_dir: Path | None = None) -> LabInfo | None:
    """The LabInfo recorded by the last successful ``up`` (no checks, no changes), or None."""
    state = read_state(Path(lab_dir or DEFAULT_LAB_DIR).resolve())
    return LabInfo.from_dict(state["info"]) if state and "info" in state else None


def status(lab_dir: Path | None = None) -> dict:
    """JSON-able health of the lab: per node netns, sshd PID 1, ssh answer, fabric link, dockerd.

    Works without root too, but then the netns-level fields (fabric link, PID 1 lookup) stay empty.
    """
    return lab_status(Path(lab_dir or DEFAULT_LAB_DIR).resolve())


def up(lab_dir: Path | None = None, nodes: int = 2, topology: str | None = None, *, log: Log | None = None) -> LabInfo:
    """Bring the lab up (idempotent) and return how to reach it: ``nodes`` nodes (2 to 8) wired as ``topology``
    (``cable``, ``triangle`` or ``switch``; None: :func:`spec.default_topology`).

    A healthy running lab with the same node count and topology is returned as is (``reused=True``); a healthy lab
    of another shape gains or loses nodes and is re-cabled under its running nodes (``_recount``). A lab whose nodes lost
    their processes but kept their namespaces and links (a session's processes ended, a PID 1 killed) gets them
    started again in place (``restarted``: node -> what; one log line says so). Anything else that looks like a
    lab (namespaces, links, routes, dead nodes, cgroups) is torn down first.
    """
    log = log or _default_log
    timer = _Timer()
    _require_root("up")
    lab_dir = Path(lab_dir or DEFAULT_LAB_DIR).resolve()
    topology = topology or default_topology(nodes)
    specs = node_specs(nodes, topology)
    with _locked(lab_dir):
        with timer.phase("packages"):
            ensure_packages(log)
        other = other_running_lab(lab_dir)
        if other:
            raise LabError("another lab is running on this machine (the nl-* names are machine-wide)",
                           observed=f"lab from {other}", expected=f"no lab, or the lab of {lab_dir}",
                           fix=f"bring it down first: `python -m runbook lab down --lab-dir {other}`")
        state = read_state(lab_dir)
        if state and state.get("node_count") in range(2, len(NODE_NAMES) + 1) and "info" in state:
            # a guard route this version adds (the switch's /24) is no reason to rebuild a running lab
            run_local(["ip", "-batch", "-"], input="".join(f"route replace unreachable {r}\n" for r in GUARD_ROUTES),
                      timeout=30, what="the lab's guard routes")
            with timer.phase("check"):
                st = lab_status(lab_dir)
            if st["nodes_healthy"]:
                if not st["registry"]["healthy"]:
                    with timer.phase("registry"):
                        start_registry(lab_dir, log)
                if not st["apt_proxy"]["healthy"]:
                    with timer.phase("apt proxy"):
                        start_apt_proxy(lab_dir, log)
                if (state["node_count"], state_topology(state)) != (nodes, topology):   # the kept nodes stay up
                    return _recount(lab_dir, state, st, nodes, topology, timer, log)
                lab = LabInfo.from_dict(state["info"])
                lab.reused = True
                lab.image_ids = {k: v["image_id"] for k, v in st["nodes"].items()}
                lab.timings = timer.total()
                return lab
            unreachable = unreachable_live_nodes(st)
            if unreachable:
                raise LabError("the lab's nodes run but do not answer SSH as pinned; the lab does not rebuild "
                               "itself over live nodes (a server may run there, and a changed host key is yours "
                               "to judge)", observed="; ".join(f"{k}: {v}" for k, v in sorted(unreachable.items())),
                               expected="every running node answers the lab's SSH with its pinned host key",
                               fix="find out why (e.g. `ssh -F " + str(lab_paths(lab_dir)[0]) + " spark-<node> true`); "
                                   "to rebuild the lab on purpose: `python -m runbook lab down`, then run again")
            fix = repairs(st, nodes) if state_topology(state) == topology else None
            if fix:
                return _restart(lab_dir, state, st, fix, timer, log)
            bad = {k: [f for f in ("netns_exists", "sshd_alive", "ssh_ok", "dockerd_alive", "registry_insecure",
                                  "operator", "own_packages")
                       if not v.get(f)]
                   for k, v in st["nodes"].items() if not v["healthy"]}
            log(f"existing lab is not healthy ({bad or 'bridge/routes'}); rebuilding")
        if lab_present() or state:
            with timer.phase("clean"):
                notes = teardown(lab_dir, None)
            if notes:
                log("cleaned stale lab state: " + "; ".join(notes))

        created: list[str] = []
        with timer.phase("files"):
            write_files(lab_dir, specs, topology)
            # bind targets must exist on the shared root fs (the node-private files /etc/passwd and /etc/group do)
            dirs = [t for t in NODE_PRIVATE.values() if t not in ("/etc/passwd", "/etc/group")]
            for mp in ("/mnt/nvme", "/var/lib/docker", *dirs):
                if not Path(mp).exists():
                    Path(mp).mkdir(parents=True)
                    created.append(mp)
            if not NODEINIT.exists():
                raise LabError("nodeinit.sh is missing", observed=str(NODEINIT), fix="reinstall the package")
        state = {"node_count": nodes, "topology": topology, "lab_dir": str(lab_dir), "created_mountpoints": created,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pids": {}}
        write_state(lab_dir, state)
        MARKER.write_text(json.dumps({"lab_dir": str(lab_dir)}) + "\n")

        with timer.phase("network"):
            create_network(specs, topology)
        with timer.phase("registry"):        # on the bridge's host address, which exists from here on
            state["registry_pid"] = start_registry(lab_dir, log)
        with timer.phase("apt proxy"):
            state["apt_proxy_pid"] = start_apt_proxy(lab_dir, log)
        ids = _start_nodes(lab_dir, specs, specs, state, {}, timer, log)
        ssh_config, key, known_hosts = lab_paths(lab_dir)
        lab = LabInfo(lab_dir=lab_dir, ssh_config=ssh_config, key=key, known_hosts=known_hosts, nodes=specs,
                      image_ids=ids)
        if not lab.image_id_identical:
            raise LabError(f"{IMAGE} differs between nodes after docker save/load", observed=str(ids),
                           expected="one image ID on every node", fix="run `down`, delete "
                           f"{lab_dir}/nodes/*/docker, then `up`")
        lab.timings = timer.total()
        state["info"] = lab.to_dict()
        write_state(lab_dir, state)
        return lab


def _start_nodes(lab_dir: Path, specs: list[LabNode], new: list[LabNode], state: dict, ids: dict[str, str],
                 timer: _Timer, log: Log) -> dict[str, str]:
    """Start the ``new`` nodes of the lab ``specs`` (their network is in place): PID 1, carrier on every lab link,
    sshd, first login, dockerd, and the runtime image on every node; node -> image ID."""
    with timer.phase("nodes"):
        cg = cgroup_mounts()
        for n in new:
            state["pids"][n.name] = {"unshare": start_node(lab_dir, n, cg)}
    with timer.phase("carrier"):
        wait_carrier(specs)
    with timer.phase("sshd"):
        deadline = time.monotonic() + 10
        for n in new:
            wait_port(n, lab_dir, deadline)
            state["pids"][n.name]["pid1"] = node_pid1(n.netns)
        write_state(lab_dir, state)
        cfg = lab_paths(lab_dir)[0]
        with ThreadPoolExecutor(max_workers=len(new)) as ex:
            names = list(ex.map(lambda n: ssh(cfg, n.alias, "hostname", timeout=20,
                                              what="first ssh login").stdout.strip(), new))
        for n, got in zip(new, names):
            if got != n.alias:
                raise LabError("lab node answers with the wrong hostname", node=n.alias,
                               observed=got, expected=n.alias, fix="run `down` then `up`")
    with timer.phase("dockerd"):
        with ThreadPoolExecutor(max_workers=len(new)) as ex:
            outs = list(ex.map(lambda n: ssh(cfg, n.alias, dockerd_script(n), timeout=60,
                                             what="starting dockerd in the node").stdout, new))
        ids = {**ids, **{n.name: parse_kv(o).get("image", "") for n, o in zip(new, outs)}}
    with timer.phase("image"):
        return ensure_image(lab_dir, specs, ids, log)


def _restart(lab_dir: Path, state: dict, st: dict, fix: dict[str, str], timer: _Timer, log: Log) -> LabInfo:
    """The lab of ``state`` with the processes ``fix`` names started again in place (``health.repairs``): a node
    whose PID 1 is gone gets a new one in its namespace (sshd, first login, dockerd), a node whose dockerd is gone
    gets dockerd; the registry and the apt proxy too when they are down. Namespaces, links, keys and the nodes' files
    (their overlay layers too: a node's installed packages survive its restart, as a Spark's survive a reboot) stay."""
    specs = node_specs(state["node_count"], state_topology(state))
    dead = [n for n in specs if fix.get(n.name) == NODE]
    no_dockerd = [n for n in specs if fix.get(n.name) == DOCKERD]
    if not st["registry"]["healthy"]:
        with timer.phase("registry"):
            state["registry_pid"] = start_registry(lab_dir, log)
    if not st["apt_proxy"]["healthy"]:
        with timer.phase("apt proxy"):
            state["apt_proxy_pid"] = start_apt_proxy(lab_dir, log)
    with timer.phase("clean"):
        for n in dead:                     # what `ip netns exec` left in the namespace; the node's cgroups
            kill_node(n.netns, n.name)
        rm_cgroups([n.name for n in dead])
    ids = {n.name: st["nodes"][n.name]["image_id"] or "" for n in specs if n.name not in fix}
    if no_dockerd:
        cfg = lab_paths(lab_dir)[0]
        with timer.phase("dockerd"), ThreadPoolExecutor(max_workers=len(no_dockerd)) as ex:
            outs = list(ex.map(lambda n: ssh(cfg, n.alias, dockerd_script(n), timeout=60,
                                             what="starting dockerd in the node").stdout, no_dockerd))
        ids.update({n.name: parse_kv(o).get("image", "") for n, o in zip(no_dockerd, outs)})
    if dead:
        ids = _start_nodes(lab_dir, specs, dead, state, ids, timer, log)
    else:
        with timer.phase("image"):
            ids = ensure_image(lab_dir, specs, ids, log)
    ssh_config, key, known_hosts = lab_paths(lab_dir)
    lab = LabInfo(lab_dir=lab_dir, ssh_config=ssh_config, key=key, known_hosts=known_hosts, nodes=specs,
                  image_ids=ids, restarted={n.name: fix[n.name] for n in dead + no_dockerd})
    if not lab.image_id_identical:
        raise LabError(f"{IMAGE} differs between nodes after the restart", observed=str(ids),
                       expected="one image ID on every node", fix="run `python -m runbook lab down`, then `up`")
    lab.timings = timer.total()
    state["info"] = {**lab.to_dict(), "restarted": {}}      # the next `up` that reuses the lab restarted nothing
    write_state(lab_dir, state)
    log("restarted in place in {:.1f} s (netns, links and files kept): {}".format(
        lab.timings["total"], ", ".join(f"{n.alias} ({'sshd and dockerd were' if fix[n.name] == NODE else 'dockerd was'} "
                                        "gone)" for n in dead + no_dockerd)))
    return lab


def _recount(lab_dir: Path, state: dict, st: dict, nodes: int, topology: str, timer: _Timer, log: Log) -> LabInfo:
    """The healthy lab of ``state`` with ``nodes`` nodes wired as ``topology``: nodes added (their namespace, PID 1,
    sshd, dockerd, image) or removed (their processes, namespace and cgroups), and the fabric re-cabled from one
    cabling to the other (on a switch that stays a switch, only the added nodes are plugged in). The nodes in both
    keep their namespaces, processes, management addresses and files."""
    old, old_topology = state["node_count"], state_topology(state)
    specs, before = node_specs(nodes, topology), node_specs(old, old_topology)
    kept = [n for n in specs if n.name in {b.name for b in before}]
    added = [n for n in specs if n not in kept and n.name not in {b.name for b in before}]
    removed = [b for b in before if b.name not in {n.name for n in specs}]
    what = ", ".join([*(f"adding {n.alias}" for n in added), *(f"removing {n.alias}" for n in removed)])
    log(f"{what or 'keeping the nodes'}; {old_topology} -> {topology} for {nodes} nodes "
        f"({', '.join(n.alias for n in kept)} stay up)")
    with timer.phase("remove"):
        for n in removed:
            kill_node(n.netns, n.name)
            run_local(["ip", "netns", "del", n.netns], timeout=30, what=f"removing {n.netns}")
            remove_overlays(lab_dir, n.name)
            state["pids"].pop(n.name, None)
        rm_cgroups([n.name for n in removed])
        # a deleted namespace's veths (their root ends: management, switch port, empty cages) go a moment later;
        # the node joining again at once (2 -> 5 -> 2 -> 3) must not meet its old names
        gone = [name for n in removed for name in (n.mgmt_veth, switch_port(n.name),
                                                  *(f"nl-u-{n.name}-{k}" for k in range(len(PORTS))))]
        deadline = time.monotonic() + 5
        while any(link_exists(name) for name in gone) and time.monotonic() < deadline:
            time.sleep(0.05)
    with timer.phase("files"):     # every node's files exist from `up`; running nodes keep theirs (bind-mounted)
        write_hosts(lab_dir, specs, topology)
    state["node_count"], state["topology"] = nodes, topology
    state.pop("info", None)                  # until the new cabling is up
    write_state(lab_dir, state)
    with timer.phase("network"):
        recable(kept, added, nodes, topology, old_topology)
    ids = {n.name: st["nodes"][n.name]["image_id"] for n in kept}
    if added:
        ids = _start_nodes(lab_dir, specs, added, state, ids, timer, log)
    else:
        with timer.phase("carrier"):
            wait_carrier(specs)
    ssh_config, key, known_hosts = lab_paths(lab_dir)
    lab = LabInfo(lab_dir=lab_dir, ssh_config=ssh_config, key=key, known_hosts=known_hosts, nodes=specs,
                  image_ids=ids)
    lab.timings = timer.total()
    state["info"] = lab.to_dict()
    write_state(lab_dir, state)
    return lab


def down(lab_dir: Path | None = None, *, log: Log | None = None) -> None:
    """Remove everything ``up`` made (processes, the registry and the apt proxy, netns, links, bridge, routes,
    mounts, cgroups, the nodes' overlay layers).

    Files in the lab dir stay (keys, node dirs with their docker images and /mnt/nvme contents, the registry's
    storage, the apt proxy's cache).
    """
    _require_root("down")
    lab_dir = Path(lab_dir or DEFAULT_LAB_DIR).resolve()
    with _locked(lab_dir):
        notes = teardown(lab_dir, log)
    if log and notes:
        log("; ".join(notes))
