"""Network and rendezvous failures: the ranks rendezvous on an address off the fabric, a firewall drops
the master port, the fabric is down or drops jumbo frames, and the rendezvous timeout itself."""
from __future__ import annotations

import re

from ...facts import firewall, net, sockets
from .. import bundle as B
from .entry import DEGRADED, FATAL, Entry, Hit, rendezvous_failures


_IPV4 = r"\d{1,3}(?:\.\d{1,3}){3}"

_ADDR_PATTERNS = (
    ("mq_connect_ip", re.compile(rf"mq_connect_ip=({_IPV4})")),
    ("master_addr", re.compile(rf"master_addr[=':\s]+({_IPV4})")),
    ("head node address", re.compile(rf"head node address ({_IPV4}):\d+")),
    ("distributed_init_method", re.compile(rf"distributed_init_method=tcp://({_IPV4}):\d+")),
)


def _ping_target(text: str) -> str:
    m = re.search(rf"^PING ({_IPV4})", text, re.MULTILINE)
    return m.group(1) if m else ""


def _first_peer_ip(b: B.Bundle, node: str) -> str:
    return next((n.fabric_ip for n in b.context.nodes if n.name != node and n.fabric_ip), "")


def _sig_rendezvous_mgmt(b: B.Bundle) -> list[Hit]:
    ctx = b.context
    head = ctx.head
    if head is None:
        return []
    failures = rendezvous_failures(b)
    if not failures:
        return []                      # an address off the fabric that works is a choice, not a failure
    seen: dict[str, str] = {}
    for node, text in b.logs():
        for label, rx in _ADDR_PATTERNS:
            for m in rx.finditer(text):
                seen.setdefault(m.group(1), f"{node} log: {label}={m.group(1)}")
    for node in b.nodes:
        if ip := b.env(node).get("VLLM_HOST_IP"):
            if node == head.name:
                seen.setdefault(ip, f"{node} env: VLLM_HOST_IP={ip}")
    off = []
    for ip, where in seen.items():
        iface = b.iface_of(head.name, ip)
        all_loopback = all(n.host_ip.startswith("127.") for n in ctx.nodes)
        if iface is not None and iface != head.fabric_if:
            off.append(f"{where} is on {head.name}'s {iface}, not the fabric {head.fabric_if}")
        elif iface is None and b.interfaces(head.name) and ip not in ctx.fabric_ips:
            off.append(f"{where} is not an address of {head.name}")
        elif iface is None and not b.interfaces(head.name) and ip not in ctx.fabric_ips and \
                not (ip.startswith("127.") and all_loopback):
            off.append(f"{where} is none of the fabric addresses {sorted(ctx.fabric_ips)}")
    if not off:
        return []
    return [Hit(head.name, off + failures)]


RENDEZVOUS_MGMT_ADDRESS = Entry(
    "rendezvous-mgmt-address", "Rendezvous on an address that is not on the fabric", FATAL,
    symptom="start hangs; the head ends with `DistStoreError: ... 1/2 clients joined`; the worker retries "
            "`TCP client failed to connect/validate to host <ip>:<port>`",
    detect="an address the ranks rendezvous on (`mq_connect_ip=`, `master_addr=`, `head node address`, "
           "`distributed_init_method=tcp://`, the head's VLLM_HOST_IP) is held by a head interface other than "
           "its fabric netdev (`ip -j addr`), together with a failed rendezvous (clients-joined timeout, "
           "a worker socket in SYN-SENT to the master port, or a TCP connect timeout)",
    cause="VLLM_HOST_IP / the master address / the first NCCL_SOCKET_IFNAME entry point at the management "
          "network, which the worker cannot reach (or reaches through a path that drops the port)",
    fix="set HEAD_IP/WORKER_IP (and BOOTSTRAP_IF only for an interface every node reaches) to fabric "
        "addresses; restart both ranks",
    proof="ss -tn state syn-sent '( dport = :{master_port} )'   # on the worker; and: ip -br addr on the head",
    signature=_sig_rendezvous_mgmt,
    source="vLLM vllm/v1/executor/multiproc_executor.py:155 @ v0.32.0 (master_addr=, mq_connect_ip= log); torch c10d "
           "TCPStore clients-joined timeout; anchors-2026-12 #1",
    words=(r"management|mgmt|wi-?fi|10 ?gbe?\b|enp7s7|wlp9s9|wrong (ip|address|interface)|lan (ip|address)",
           r"vllm_host_ip|master[_ -]addr|head ip|bootstrap|rendezvous|mq_connect_ip",
           r"hang|never join|clients joined|time[ds]? ?out|syn[-_]sent|can'?t connect|cannot connect",),
    lab="tests/lab/test_diagnose_lab.py::test_rendezvous_on_the_management_address_is_named")


def _sig_firewall(b: B.Bundle) -> list[Hit]:
    ctx = b.context
    if not ctx.master_port or ctx.head is None:
        return []
    hits = []
    rules = firewall.parse_firewall(b.text(ctx.head.name, B.FIREWALL)).blocking(ctx.master_port, ctx.head.fabric_if)
    dropped = []
    for node in b.workers:
        for t in sockets.parse_tcp_connect(b.text(node, B.TCP_MASTER)):
            if not t.dropped:
                continue
            ping_text = b.text(node, f"{B.PING_PREFIX}{ctx.head.name}.txt")
            p = net.parse_ping(ping_text)
            if p.ok and _ping_target(ping_text) == t.host:
                dropped.append(f"{node}: tcp connect {t.host}:{t.port} got no answer in {t.ms} ms while ping "
                               f"{t.host} answers {p.received}/{p.transmitted}: something drops the port")
    if rules or dropped:
        hits.append(Hit(ctx.head.name, [f"{ctx.head.name} firewall: {r}" for r in rules] + dropped
                        + [f for f in rendezvous_failures(b) if "clients joined" in f]))
    return hits


FIREWALL_MASTER_PORT = Entry(
    "firewall-master-port", "A firewall drops the master port", FATAL,
    symptom="start hangs ~10 min, then the same `clients joined` timeout",
    detect="a TCP connect from the worker to the master address:port gets no answer within 5 s while ping to "
           "the same address answers, or the head's nft/iptables/ufw state drops or rejects the port",
    cause="ufw/nftables/iptables on the head drops the rendezvous port on the fabric interface",
    fix="allow the port on the fabric: `sudo ufw allow in on {fabric_if} to any port {master_port} proto tcp` "
        "(or remove the drop rule), then start again",
    proof="timeout 5 bash -c '</dev/tcp/{master_addr}/{master_port}' && echo open   # from the worker",
    signature=_sig_firewall, source="anchors-2026-12 #2; issue 16 item 1; the kernel line is ufw's logging chain "
           "(`-A ufw-after-logging-input -j LOG --log-prefix \"[UFW BLOCK] \"` in the rules ufw writes; read by rule, "
           "no line pinned)",
    lines=(r"\[UFW BLOCK\].*DPT=\d+",),
    # the anchor needs the multi-node context in the same report (a rendezvous, a port of the start, NCCL/torch/Ray/
    # vLLM): a firewall that blocks ssh or a web site is not this entry
    words=(r"^(?=.*(\bmaster[_ ]?(port|addr)|\b29\d{3}\b|rendezvous|clients joined|\bnccl\b|\btorch|\bvllm\b|\bray\b|"
           r"distributed|\branks?\b|tcpstore)).*?(firewall|\bufw\b|iptables|nftables|\bnft\b)",
           r"port|29\d{3}|rendezvous|master",
           r"hang|time[ds]? ?out|block|drop|clients joined|refus",),
    lab="tests/lab/test_diagnose_lab.py::test_firewall_dropping_the_master_port_is_named_within_a_minute")


def _sig_fabric_unreachable(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        info = b.context.node(node)
        ev = []
        if info and info.fabric_if:
            iface = b.interfaces(node).get(info.fabric_if)
            if iface is not None and not iface.up:
                ev.append(f"{node}: {info.fabric_if} is {iface.state} (flags {','.join(iface.flags)})")
        for name, text in sorted(b.texts.get(node, {}).items()):
            if not name.startswith(B.PING_PREFIX) or name.startswith(B.PING_MTU_PREFIX):
                continue
            p = net.parse_ping(text)
            if p.transmitted and p.received == 0 or (not p.transmitted and p.error):
                peer = name[len(B.PING_PREFIX):-len(".txt")]
                info_peer = b.context.node(peer)
                target = _ping_target(text) or (info_peer.fabric_ip if info_peer else "?")
                ev.append(f"{node} -> {peer} ({target}): "
                          f"{p.received}/{p.transmitted} replies{'; ' + p.error if p.error else ''}")
        if ev:
            hits.append(Hit(node, ev, {"peer_ip": _first_peer_ip(b, node)}))
    return hits


FABRIC_UNREACHABLE = Entry(
    "fabric-unreachable", "Fabric link down or peer unreachable", FATAL,
    symptom="requests time out or the start hangs; nothing mentions the network",
    detect="ping over the fabric interface to a peer's fabric address gets no reply, or the fabric netdev is "
           "not UP in `ip -j addr`",
    cause="the fabric link is down (cable, port, netplan) or the address moved",
    fix="bring the link up (`ip link`, cable, `netplan apply`), check both ends have their fabric addresses, "
        "then restart both ranks together",
    proof="ping -c 3 -I {fabric_if} {peer_ip}; ip -br link show {fabric_if}",
    signature=_sig_fabric_unreachable, source="issue 16 item 4",
    lines=(r"Destination Host Unreachable",
           r" 100% packet loss",),
    words=(r"link (is |goes |went )?down|no link|ping (fails|failed|doesn'?t work|gets no reply)|unreachable|no carrier|unplugged|loose cable",
           r"fabric|qsfp|cx-?7|connectx|200 ?g|direct[- ]connect|interconnect|cluster (link|network|interface)",),
    lab="tests/lab/test_watchdog_lab.py::test_fabric_link_down_is_caught_with_the_link_named_and_recovers")


def _sig_fabric_mtu(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        for name, text in sorted(b.texts.get(node, {}).items()):
            if not name.startswith(B.PING_MTU_PREFIX):
                continue
            p = net.parse_ping(text)
            if p.transmitted == 0 and not p.error:
                continue
            small = net.parse_ping(b.text(node, B.PING_PREFIX + name[len(B.PING_MTU_PREFIX):]))
            if not p.ok and small.ok:
                hits.append(Hit(node, [f"{node}: DF ping of {b.context.fabric_mtu - 28} bytes to "
                                       f"{_ping_target(text) or '?'}: {p.received}/{p.transmitted}"
                                       f"{'; ' + p.error if p.error else ''}; small pings pass"]))
    return hits


FABRIC_MTU_BLACKHOLE = Entry(
    "fabric-mtu-blackhole", "Jumbo frames do not pass the fabric", DEGRADED,
    symptom="small requests work, large transfers stall or crawl",
    detect="a DF-set ping of FABRIC_MTU-28 bytes fails while a small ping to the same peer passes",
    cause="one end (or a switch) has a smaller MTU than the profile's FABRIC_MTU",
    fix="set the same MTU on both ends (netplan `mtu:`), or lower FABRIC_MTU to what the path carries",
    proof="ping -M do -s $(({fabric_mtu}-28)) -c 3 -I {fabric_if} {peer_ip}",
    signature=_sig_fabric_mtu, source="bringup-anchors §1.2",
    lines=(r"message too long, mtu ?= ?\d+",
           r"Frag needed and DF set",),
    words=(r"\bmtu\b|jumbo|9000",
           r"large|big|stall|fragment|small (requests|pings?|packets?) (work|pass|go through)",),
    lab="capture_netns fabric_mtu (a veth at MTU 1500 against 9000)")


def _sig_rendezvous_timeout(b: B.Bundle) -> list[Hit]:
    ev = [e for e in rendezvous_failures(b) if "clients joined" in e or "client socket" in e]
    return [Hit("cluster", ev)] if ev else []


RENDEZVOUS_TIMEOUT = Entry(
    "rendezvous-timeout", "Rendezvous did not complete", FATAL,
    symptom="`DistStoreError: Timed out after N seconds waiting for clients. 1/2 clients joined.`",
    detect="the clients-joined timeout or a worker's `client socket has timed out ... trying to connect to` "
           "in a rank log",
    cause="one rank never reached the master port; the findings above name why (address, firewall, dead "
          "worker, out-of-step restart); when none does, the worker started too late or at another port",
    fix="start both ranks together with the same MASTER_PORT; if no other finding matched, check "
        "`ss -tanp` on both nodes while the head waits",
    proof="ss -tanp '( sport = :{master_port} or dport = :{master_port} )'   # on both nodes",
    signature=_sig_rendezvous_timeout, source="anchors-2026-12 #1, #2, #11",
    lines=(r"waiting for clients\. \d+/\d+ clients joined",
           r"client socket has timed out after \d+ms while trying to connect to",),
    words=(r"clients joined|rendezvous|tcpstore|diststoreerror",
           r"time[ds]? ?out|hang|never|waiting",),
    downstream=True,
    lab="capture_netns firewall_drop (torch's TCPStore behind an nftables drop)")
