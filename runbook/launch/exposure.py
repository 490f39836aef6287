"""What the server exposes: the API key a non-loopback bind needs, and per node what listens beyond loopback
and whether a default-deny firewall keeps it to the peers (step 04 rows ``api exposure`` and ``ports exposed``).

vLLM guards only ``/v1/*`` with the key; ``/health``, ``/metrics``, ``/version``, ``/tokenize`` answer anyone who
reaches the port, and the rendezvous (master) port and the NCCL/Gloo bootstrap ports are plain TCP that any
host on a node's networks can connect to. On the Sparks these belong on the fabric only: the rows say what is
open and, without a default-deny firewall, give the rule that keeps each port to the peers.
"""
from __future__ import annotations

import ipaddress

from ..checks import Check, check
from ..facts.firewall import FIREWALL_CMD, parse_firewall
from ..facts.sockets import Socket, parse_ss
from ..remote import Cluster, Node
from ..secrets import generate_api_key, load_secrets
from ..serve.endpoint import api_address, key_required

LISTEN_CMD = "ss -H -ltnp 2>/dev/null || ss -H -ltn"


def ensure_api_key(profile, *, dry_run: bool = False) -> Check:
    """Row ``api exposure``: an API bound beyond the head's loopback gets a key. Without one in the environment or
    the secrets file, a new key is generated into the secrets file (0600) before the launch renders."""
    where = api_address(profile)
    secrets = load_secrets()
    if not key_required(profile):
        return check("api exposure", True, node="head", observed=f"{where}: only the head reaches it"
                     + ("; VLLM_API_KEY set as well" if secrets.api_key else ""),
                     expected="loopback, or a key for any wider bind")
    if secrets.api_key:
        return check("api exposure", True, node="head", observed=f"{where}; API key required "
                     f"(from {secrets.api_key_source.split(':', 1)[0]})", expected="a key for a bind beyond loopback")
    if dry_run:
        return check("api exposure", False, warn_only=True, node="head", observed=f"{where} and no VLLM_API_KEY",
                     expected="a key for a bind beyond loopback",
                     fix="a real run generates one into the secrets file; or export VLLM_API_KEY")
    _, path = generate_api_key()
    return check("api exposure", True, node="head", observed=f"{where}; no key was set: generated VLLM_API_KEY into "
                 f"{path} (mode 0600; clients send it as 'Authorization: Bearer <key>')",
                 expected="a key for a bind beyond loopback")


def _beyond_loopback(sock: Socket) -> bool:
    try:
        return not ipaddress.ip_address(sock.local_ip.split("%", 1)[0]).is_loopback
    except ValueError:
        return True                     # '*' or '0.0.0.0'-style wildcards


def node_exposure(node: Node, profile, *, peers: list[str], key_set: bool) -> Check:
    """Row ``ports exposed`` for one node (read-only)."""
    listening = [s for s in parse_ss(node.read(LISTEN_CMD, timeout=20).stdout) if s.state == "LISTEN"]
    if not listening:
        return check("ports exposed", False, warn_only=True, node=node.name, observed="`ss -ltn` listed no listening socket",
                     expected="the node's listeners", fix="install iproute2 (ss) on the node")
    open_ = sorted({(s.local_ip, s.local_port, s.process.split("(", 1)[0]) for s in listening if _beyond_loopback(s)},
                   key=lambda t: t[1])
    listed = ", ".join(f"{ip}:{port}" + (f" {proc}" if proc else "") for ip, port, proc in open_) or "nothing"
    api_open = [s for s in listening if s.local_port == profile.port and _beyond_loopback(s)]
    if node.name == "head" and api_open and not key_required(profile):
        return check("ports exposed", False, node=node.name, observed=f"the API port {profile.port} listens on "
                     f"{api_open[0].local_ip}, the profile binds it to {profile.api_host}",
                     expected=f"{profile.api_host}:{profile.port}",
                     fix="a server from an older profile is running: python -m runbook stop, then start again")
    if node.name == "head" and api_open and not key_set:
        return check("ports exposed", False, node=node.name, observed=f"the API listens on {api_open[0].local_ip}:"
                     f"{profile.port} without an API key", expected="a key for a bind beyond loopback",
                     fix="stop the server, set VLLM_API_KEY (or let step 04 generate it), start again")
    fw = parse_firewall(node.read(FIREWALL_CMD, timeout=20).stdout)
    deny = fw.default_deny_input()
    observed = f"listening beyond loopback: {listed}"
    if deny:
        return check("ports exposed", True, node=node.name, observed=f"{observed}; firewall: {deny}",
                     expected="listeners kept to the peers by a default-deny firewall")
    state = ("firewall state unreadable (" + ", ".join(fw.unreadable) + ")" if fw.unreadable
             else "no default-deny firewall: any host on this node's networks reaches them")
    allow = " ".join(f"ip saddr {p} accept;" for p in peers)
    return check("ports exposed", False, warn_only=True, node=node.name, observed=f"{observed}; {state}",
                 expected="listeners kept to the peers by a default-deny firewall",
                 fix=("keep the rendezvous and NCCL ports to the peers, e.g. nft add table inet spark; nft add chain "
                      "inet spark input '{ type filter hook input priority 0; policy drop; ct state established,"
                      f"related accept; iif lo accept; tcp dport 22 accept; {allow} }}'"
                      + (f" (and tcp dport {profile.port} accept for the API's clients)" if key_required(profile)
                         else "")))


def exposure_checks(cluster: Cluster, profile) -> list[Check]:
    """``ports exposed`` for every node once the server runs; a node that cannot be read gets a WARN row."""
    key_set = bool(load_secrets().api_key)
    fabric = {n.name: n.spec.host_ip for n in cluster}
    out = cluster.each(lambda n: node_exposure(n, profile, key_set=key_set,
                                               peers=[ip for name, ip in fabric.items() if name != n.name]))
    return [row if isinstance(row, Check) else
            check("ports exposed", False, warn_only=True, node=name, observed=f"could not read the node: {row}", expected="its listeners",
                  fix="check SSH to the node") for name, row in out.items()]
