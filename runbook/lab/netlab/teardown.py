"""Tear a lab down: end its registry, apt proxy and node processes, then remove its namespaces, links, bridges, guard
routes, cgroups, mounts, the nodes' overlay layers and state file, whatever run made them."""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from runbook.errors import LabError

from .host import link_exists, netns_exists, run_local, tail_text
from .aptproxy import stop_apt_proxy
from .nodes import kill_node, remove_overlays
from .registry import stop_registry
from .spec import (BRIDGE, FABRIC_BRIDGE, GUARD_ROUTES, MARKER, NODE_NAMES, PORTS, STATE_FILE, SWITCH, Log,
                   read_state)


def rm_cgroups(names: list[str]) -> int:
    """Remove the cgroup dirs ``nl-<name>`` (dockerd of a node made them) under every controller."""
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


def teardown(lab_dir: Path, log: Log | None) -> list[str]:
    """Remove every trace of a lab (of any lab dir: the nl-* names are machine-wide; the registry, the apt proxy and
    the nodes' overlay layers of this one); notes on what was done. The registry's storage and the proxy's cache
    stay (pushed images and fetched packages survive a rebuild); the nodes' package changes do not: the next `up`
    starts every node from this machine's /usr, /etc and /var."""
    notes: list[str] = [n for n in [stop_registry(lab_dir), stop_apt_proxy(lab_dir)] if n]
    for name in NODE_NAMES:
        ns = f"nl-{name}"
        if netns_exists(ns):
            notes += kill_node(ns, name)
    notes += [n for n in (remove_overlays(lab_dir, name) for name in NODE_NAMES) if n]
    removed: list[str] = []
    ns_cmds = [f"netns del nl-{name}" for name in NODE_NAMES if netns_exists(f"nl-{name}")]
    if ns_cmds:   # deleting a netns also deletes its veths (and so their root-netns peers)
        res = run_local(["ip", "-force", "-batch", "-"], input="\n".join(ns_cmds) + "\n", timeout=30, check=False)
        removed += [c.split()[-1] for c in ns_cmds]
        if res.returncode != 0:
            notes.append(f"ip reported: {tail_text(res.stderr, 300)}")
    # nl-u-*: the root ends of the veths that stand for uncabled ports (network._link_cmds); nl-f-*: an older lab's
    empty_cages = [f"nl-u-{n}-{k}" for n in NODE_NAMES for k in range(len(PORTS))]
    # nl-s-*: the switch ports (network.switch_port)
    switch_ports = [f"nl-s-{n}" for n in NODE_NAMES]
    all_links = ([BRIDGE, FABRIC_BRIDGE, SWITCH] + [f"nl-m-{n}" for n in NODE_NAMES] + [f"nl-f-{n}" for n in NODE_NAMES]
                 + empty_cages + switch_ports)
    peers = [f"nl-m-{n}" for n in NODE_NAMES] + [f"nl-f-{n}" for n in NODE_NAMES] + empty_cages + switch_ports
    deadline = time.monotonic() + 2          # the root-netns veth peers vanish shortly after netns del
    while ns_cmds and any(link_exists(l) for l in peers) and time.monotonic() < deadline:
        time.sleep(0.05)
    links = [l for l in all_links if link_exists(l)]
    routes = run_local(["ip", "-j", "route", "show", "type", "unreachable"], timeout=10, check=False)
    guards = []
    with contextlib.suppress(ValueError):
        guards = [r["dst"] for r in json.loads(routes.stdout or "[]") if r.get("dst") in GUARD_ROUTES]
    cmds = [f"link del {l}" for l in links] + [f"route del unreachable {g}" for g in guards]
    if cmds:
        res = run_local(["ip", "-force", "-batch", "-"], input="\n".join(cmds) + "\n", timeout=30, check=False)
        removed += links + [f"route unreachable {g}" for g in guards]
        if res.returncode != 0:
            notes.append(f"ip reported: {tail_text(res.stderr, 300)}")
    if removed:
        notes.append("removed " + ", ".join(removed))
    n = rm_cgroups(list(NODE_NAMES))
    if n:
        notes.append(f"removed {n} cgroup dir(s) nl-*")
    # host mounts under the lab dir (none are made by a healthy lab; clean up anything left)
    for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
        mnt = line.split()[1]
        if mnt.startswith(str(lab_dir) + "/") or mnt.startswith("/run/netns/nl-"):
            run_local(["umount", "-l", mnt], timeout=15, check=False)
            notes.append(f"unmounted {mnt}")
    state = read_state(lab_dir) or {}
    for d in state.get("created_mountpoints", []):
        with contextlib.suppress(OSError):
            os.rmdir(d)
    (lab_dir / STATE_FILE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        if json.loads(MARKER.read_text()).get("lab_dir") == str(lab_dir):
            MARKER.unlink()
    leftover = [ns for ns in (f"nl-{x}" for x in NODE_NAMES) if netns_exists(ns)] + \
               [l for l in all_links if link_exists(l)]
    if leftover:
        raise LabError("lab teardown left things behind", observed=", ".join(leftover), expected="nothing",
                       fix="check `ip netns list` / `ip -br link`, then remove them by hand")
    return notes


def lab_present() -> bool:
    """Whether anything of a lab (a node netns, a bridge) exists on this machine."""
    return (any(netns_exists(f"nl-{n}") for n in NODE_NAMES) or link_exists(BRIDGE)
            or link_exists(FABRIC_BRIDGE) or link_exists(SWITCH))


