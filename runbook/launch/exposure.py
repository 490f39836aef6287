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
from ..api.endpoint import api_address, key_required

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


WILDCARDS = ("0.0.0.0", "*", "::", "")
SSH_PORT = 22


def _beyond_loopback(sock: Socket) -> bool:
    try:
        return not ipaddress.ip_address(sock.local_ip.split("%", 1)[0]).is_loopback
    except ValueError:
        return True                     # '*' and other wildcard spellings


def _listing(socks: list[Socket]) -> str:
    """'22 sshd, 29501 VLLM::Worker_TP' or, for many ephemeral ports, '15 ports 34565-44133 (VLLM::Worker_TP, …)'."""
    ports = sorted({(s.local_port, s.process.split("(", 1)[0]) for s in socks})
    if len(ports) <= 4:
        return ", ".join(f"{port} {proc}".strip() for port, proc in ports)
    procs = ", ".join(sorted({proc for _, proc in ports if proc}))
    return f"{len(ports)} ports {ports[0][0]}-{ports[-1][0]}" + (f" ({procs})" if procs else "")


def node_exposure(node: Node, profile, *, peers: list[str], key_set: bool) -> Check:
    """Row ``ports exposed`` for one node (read-only). A listener on the node's fabric address reaches only the
    fabric's peers; one on every address (or another address) reaches whatever network the node is on."""
    listening = [s for s in parse_ss(node.read(LISTEN_CMD, timeout=20).stdout) if s.state == "LISTEN"]
    if not listening:
        return check("ports exposed", False, warn_only=True, node=node.name,
                     observed="`ss -ltn` listed no listening socket", expected="the node's listeners",
                     fix="install iproute2 (ss) on the node")
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
    own = {node.spec.fabric_ip, node.spec.bootstrap_ip} - {""}
    wide = [s for s in listening if _beyond_loopback(s) and s.local_ip not in own]
    fabric = [s for s in listening if s.local_ip in own]
    parts = []
    by_address: dict[str, list[Socket]] = {}
    for s in wide:
        by_address.setdefault("every address" if s.local_ip in WILDCARDS else s.local_ip, []).append(s)
    parts += [f"on {where}: {_listing(socks)}" for where, socks in sorted(by_address.items())]
    if fabric:
        parts.append(f"on the fabric address only: {_listing(fabric)}")
    observed = "; ".join(parts) or "nothing beyond loopback"
    fw = parse_firewall(node.read(FIREWALL_CMD, timeout=20).stdout)
    deny = fw.default_deny_input()
    if deny:
        return check("ports exposed", True, node=node.name, observed=f"{observed}; firewall: {deny}",
                     expected="beyond the fabric only SSH, unless a default-deny firewall keeps the rest to the peers")
    beyond_ssh = [s for s in wide if s.local_port != SSH_PORT]
    if not beyond_ssh:
        return check("ports exposed", True, node=node.name, observed=f"{observed}; no firewall needed: only SSH is "
                     "reachable beyond the fabric", expected="beyond the fabric only SSH")
    state = (", ".join(fw.unreadable) + ": not installed or not readable" if fw.unreadable
             else "no default-deny firewall")
    allow = " ".join(f"ip saddr {p} accept;" for p in peers)
    ports = ", ".join(str(p) for p in sorted({s.local_port for s in beyond_ssh})[:6])
    return check("ports exposed", False, warn_only=True, node=node.name,
                 observed=f"{observed}; {state}: any host on this node's networks reaches port(s) {ports}",
                 expected="beyond the fabric only SSH, unless a default-deny firewall keeps the rest to the peers",
                 fix=("keep them to the peers, e.g. nft add table inet spark; nft add chain inet spark input "
                      "'{ type filter hook input priority 0; policy drop; ct state established,related accept; "
                      f"iif lo accept; tcp dport 22 accept; {allow} }}'"
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
