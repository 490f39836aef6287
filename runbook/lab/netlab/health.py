"""The lab's health: per node netns, sshd PID 1, an ssh answer, fabric link, dockerd and image, its non-root
operator, its own package state (overlays and apt proxy line), plus the bridge, the guard routes, the lab registry
and the apt proxy (``python -m runbook lab status``)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runbook.errors import LabError

from .aptproxy import apt_proxy_status, node_apt_conf
from .dockerd import REGISTRIES_FORMAT, insecure_registry_known, parse_kv
from .files import lab_paths
from .host import link_exists, netns_exists, node_pid1, pid_alive, proc_comm, run_local, ssh, tail_text
from .network import link_states, switch_port
from .nodes import overlay_upper
from .registry import registry_status
from .spec import (APT_PROXY_CONF, BRIDGE, FABRIC_MTU, GUARD_ROUTES, IMAGE, MARKER, NODE_NAMES, OPERATOR, OPERATOR_UID,
                   OVERLAYS, STATE_FILE, SWITCH, SWITCH_NET, LabNode, node_specs, read_state, state_topology)
from .teardown import lab_present


def packages_cmd() -> str:
    """Shell printing, in a node, the mount of each of spec.OVERLAYS (``mount/usr=<fstype> <options>``, from
    /proc/self/mounts: the last mount there is the one seen) and the sha256 of its apt proxy file (``aptconf=``)."""
    return "".join(f"echo \"mount{t}=$(awk '$2 == \"{t}\" {{m = $3 \" \" $4}} END {{print m}}' /proc/self/mounts)\"; "
                   for t in OVERLAYS) + f"echo aptconf=$(sha256sum < {APT_PROXY_CONF} 2>/dev/null | cut -c1-64); "


def own_packages(kv: dict[str, str], lab_dir: Path, name: str) -> bool:
    """Whether the node's :func:`packages_cmd` answer shows its own package state: each of spec.OVERLAYS an overlay
    whose upper layer is this node's (``nodes.overlay_upper``), and its apt.conf.d file naming the lab's proxy.
    A node of a lab built before the overlays shares this machine's dpkg database: a package removed there would
    be removed here."""
    for tree in OVERLAYS:
        fstype, _, options = kv.get(f"mount{tree}", "").partition(" ")
        if fstype != "overlay" or f"upperdir={overlay_upper(lab_dir, name, tree)}" not in options.split(","):
            return False
    return kv.get("aptconf") == hashlib.sha256(node_apt_conf().encode()).hexdigest()


def _probe_node(cfg: Path | None, n: LabNode, state_node: dict | None) -> dict:
    """One node's health: netns, sshd PID 1, fabric link, an ssh answer with its hostname, dockerd, image."""
    d: dict = {"alias": n.alias, "netns": n.netns, "netns_exists": netns_exists(n.netns),
               "mgmt_ip": n.mgmt_ip, "fabric_ip": n.fabric_ip}
    pid1 = node_pid1(n.netns) if d["netns_exists"] and os.geteuid() == 0 else None
    if pid1 is None and state_node and proc_comm(state_node.get("pid1", 0) or 0) == "sshd":
        pid1 = state_node["pid1"]
    d["sshd_pid"] = pid1
    d["sshd_alive"] = bool(pid1) and pid_alive(pid1) and proc_comm(pid1) == "sshd"
    states = link_states(n.netns) if d["netns_exists"] and os.geteuid() == 0 else {}
    link = states.get(n.fabric_if, {})
    d["fabric_if"] = n.fabric_if
    d["fabric_state"] = link.get("operstate")
    d["fabric_mtu"] = link.get("mtu")
    # every cabled port of this cabling (the triangle's or the twin-cabled pair's): state and MTU
    d["ports"] = {port: {"ip": ip, "state": states.get(port, {}).get("operstate"), "mtu": states.get(port, {}).get("mtu")}
                  for port, ip in n.ports}
    if n.fabric_ip.startswith(SWITCH_NET + "."):     # its switch port (the root end of its cable), MTU 9000 too
        sw = link_states(None).get(switch_port(n.name), {})
        d["switch_port"] = {"name": switch_port(n.name), "state": sw.get("operstate"), "mtu": sw.get("mtu"),
                            "master": sw.get("master")}
    d["ssh_ok"] = False
    d["hostname"] = None
    d["dockerd_alive"] = False
    d["docker_version"] = None
    d["image_id"] = None
    d["registry_insecure"] = False
    d["operator"] = False
    d["own_packages"] = False
    if d["sshd_alive"] and cfg is not None and cfg.exists():
        cmd = (f"hostname; echo operator=$(id -u {OPERATOR} 2>/dev/null); {packages_cmd()}"
               "if v=$(docker version --format '{{.Server.Version}}' 2>/dev/null); then "
               "echo docker=1; echo version=$v; "
               f"echo image=$(docker image inspect --format '{{{{.Id}}}}' {IMAGE} 2>/dev/null); "
               f"echo registries=$(docker info --format '{REGISTRIES_FORMAT}' 2>/dev/null); "
               "else echo docker=0; fi")
        try:
            res = ssh(cfg, n.alias, cmd, timeout=20, check=False)
        except LabError as exc:
            d["ssh_error"] = exc.observed
        else:
            if res.returncode == 0:
                lines = res.stdout.splitlines()
                kv = parse_kv("\n".join(lines[1:]))
                d["ssh_ok"] = True
                d["hostname"] = lines[0].strip() if lines else ""
                d["dockerd_alive"] = kv.get("docker") == "1"
                d["docker_version"] = kv.get("version") or None
                d["image_id"] = kv.get("image") or None
                d["registry_insecure"] = insecure_registry_known(kv.get("registries", ""))
                d["operator"] = kv.get("operator") == str(OPERATOR_UID)     # a lab built before it had no operator
                d["own_packages"] = own_packages(kv, cfg.parent, n.name)
            else:
                d["ssh_error"] = tail_text(res.stderr, 300)
    d["healthy"] = bool(d["netns_exists"] and d["sshd_alive"] and d["ssh_ok"] and d["hostname"] == n.alias
                        and all(p["state"] == "UP" and p["mtu"] == FABRIC_MTU for p in d["ports"].values())
                        and _switch_port_ok(d)
                        and d["dockerd_alive"] and d["image_id"] and d["registry_insecure"]
                        and d["operator"] and d["own_packages"])
    return d


def _switch_port_ok(d: dict) -> bool:
    """A node on the switch has its switch port on the switch, UP, at the fabric MTU (no switch: True)."""
    sw = d.get("switch_port")
    return sw is None or (sw["state"] == "UP" and sw["mtu"] == FABRIC_MTU and sw["master"] == SWITCH)


def lab_status(lab_dir: Path) -> dict:
    """The lab's health (what ``status`` returns): every node probed, the bridge, the guard routes."""
    state = read_state(lab_dir)
    count = (state or {}).get("node_count") or sum(1 for name in NODE_NAMES if netns_exists(f"nl-{name}")) or 2
    topology = state_topology({"node_count": count, **(state or {})})
    specs = node_specs(count, topology)
    cfg = lab_paths(lab_dir)[0]
    with ThreadPoolExecutor(max_workers=len(specs)) as ex:
        probes = list(ex.map(lambda n: _probe_node(cfg, n, (state or {}).get("pids", {}).get(n.name)), specs))
    routes = run_local(["ip", "-j", "route", "show", "type", "unreachable"], timeout=10, check=False)
    guards: list[str] = []
    with contextlib.suppress(ValueError):
        guards = [r["dst"] for r in json.loads(routes.stdout or "[]")]
    ids = {p["image_id"] for p in probes}
    out = {
        "lab_dir": str(lab_dir),
        "state_file": (lab_dir / STATE_FILE).exists(),
        "node_count": count,
        "topology": topology,
        "bridge_up": link_exists(BRIDGE) and Path(f"/sys/class/net/{BRIDGE}/operstate").read_text().strip() == "up",
        "guard_routes": {g: g in guards for g in GUARD_ROUTES},
        "nodes": {p_n.name: p for p_n, p in zip(specs, probes)},
        "image": IMAGE,
        "image_id_identical": len(ids) == 1 and None not in ids,
        "running": any(p["netns_exists"] for p in probes),
        "as_root": os.geteuid() == 0,   # without root: no fabric link / PID 1 lookup, and no ssh key
    }
    # the nodes decide whether `up` may reuse the lab; the registry and the apt proxy are started again on their own
    # when they are down
    out["nodes_healthy"] = (out["state_file"] and out["bridge_up"] and all(out["guard_routes"].values())
                            and all(p["healthy"] for p in probes) and out["image_id_identical"])
    out["registry"] = registry_status(lab_dir)
    out["apt_proxy"] = apt_proxy_status(lab_dir)
    out["healthy"] = out["nodes_healthy"] and out["registry"]["healthy"] and out["apt_proxy"]["healthy"]
    return out


#: what ``up`` starts again in place of a rebuild (``repairs``): the node (its PID 1 -- sshd -- and so dockerd), or
#: only its dockerd
NODE, DOCKERD = "node", "dockerd"


def repairs(status: dict, node_count: int) -> dict[str, str] | None:
    """What to start again so the lab of ``status`` is healthy without a rebuild: node -> :data:`NODE` (its PID 1 is
    gone, so is all it ran) or :data:`DOCKERD` (sshd answers, dockerd does not). None when a restart cannot heal it
    (another node count, no state file, a missing namespace, bridge, guard route or cable, a node that answers
    wrongly) and ``up`` rebuilds it; {} when the nodes are healthy.

    The namespaces and links outlive the node's processes: a session whose processes are ended (a harness that
    ends what a session started, an OOM kill of PID 1) leaves every ``nl-*`` netns with nothing running in it."""
    if (status.get("node_count") != node_count or not status.get("state_file") or not status.get("bridge_up")
            or not all(status.get("guard_routes", {}).values())):
        return None
    out: dict[str, str] = {}
    for name, n in status["nodes"].items():
        if n["healthy"]:
            continue
        cabled = (n["netns_exists"] and all(p["state"] == "UP" and p["mtu"] == FABRIC_MTU for p in n["ports"].values())
                  and _switch_port_ok(n))
        if not cabled:
            return None
        if not n["sshd_alive"]:
            out[name] = NODE
        elif (n["ssh_ok"] and n["hostname"] == n["alias"] and n["operator"] and n.get("own_packages")
              and not n["dockerd_alive"]):
            out[name] = DOCKERD
        else:
            return None
    return out


def unreachable_live_nodes(status: dict) -> dict[str, str]:
    """Nodes whose sshd runs but does not answer the lab's SSH (name -> the ssh error).

    Such a node is not stale: it may hold a running server, and a changed host key is for a person to judge.
    ``up`` refuses to rebuild the lab over it instead of tearing it down and pinning new keys on its own."""
    return {name: str(node.get("ssh_error") or "no answer") for name, node in (status.get("nodes") or {}).items()
            if node.get("sshd_alive") and not node.get("ssh_ok")}


def other_running_lab(lab_dir: Path, marker: Path = MARKER) -> str | None:
    """The folder of another lab that owns the machine-wide nl-* names and still runs, if any.

    A marker naming a folder that no longer exists blocks nothing: that lab cannot be reached or taken down by
    its folder (a removed checkout; a machine image that carried /run over from another checkout's run), and
    ``up`` cleans its leftover namespaces and links like any stale lab's.
    """
    try:
        other = json.loads(marker.read_text()).get("lab_dir")
    except (OSError, ValueError, AttributeError):
        return None
    if not other or other == str(lab_dir) or not Path(other).is_dir():
        return None
    return other if lab_present() and any_node_alive(Path(other)) else None


def any_node_alive(lab_dir: Path) -> bool:
    """Whether the lab of ``lab_dir`` still has a live node. A lab whose node processes are gone
    (a crashed run, or a machine handed on after its processes were ended) is stale: its leftover
    namespaces and links are cleaned by the next ``up``, whichever folder it came from."""
    try:
        return any(n.get("sshd_alive") for n in lab_status(lab_dir)["nodes"].values())
    except Exception:  # noqa: BLE001 - unreadable state: be safe and treat it as alive
        return True
