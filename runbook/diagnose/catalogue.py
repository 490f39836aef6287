"""The catalogue of known multi-node failures: each entry is a pure signature over a
:class:`~runbook.diagnose.bundle.Bundle` (rank logs, node facts, timings) with its cause, its fix and
the command that proves it on the node.

A signature returns :class:`Hit` s (node + the evidence lines it matched); an empty list means the
entry does not apply. Signatures never raise on missing texts: a bundle collected before a rank
started, or without RDMA, simply has less to match. Sources: ``shared/reference/anchors-2026-12.md``
(failure modes 1-17) and ``bringup-anchors.md`` §5.
"""
from __future__ import annotations

import datetime as _dt

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Callable

from ..facts.prom import MetricsSnapshot
from ..facts import docker_pull, firewall, hostlog, ibv, net, procs, rdma, sockets, system
from . import bundle as B

FATAL, DEGRADED, WARNING = "fatal", "degraded", "warning"
SEVERITY_ORDER = {FATAL: 0, DEGRADED: 1, WARNING: 2}


@dataclass
class Hit:
    node: str
    evidence: list[str]
    vars: dict[str, str] = field(default_factory=dict)     # fills the proof command's {placeholders}


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    severity: str
    symptom: str          # what the user sees
    detect: str           # how the signature recognises it (for the docs)
    cause: str
    fix: str
    proof: str            # command that proves it on the node; {placeholders} from context and hit
    signature: Callable[[B.Bundle], list[Hit]]
    source: str = ""


# --------------------------------------------------------------------------- shared readers

_IPV4 = r"\d{1,3}(?:\.\d{1,3}){3}"
_ADDR_PATTERNS = (
    ("mq_connect_ip", re.compile(rf"mq_connect_ip=({_IPV4})")),
    ("master_addr", re.compile(rf"master_addr[=':\s]+({_IPV4})")),
    ("head node address", re.compile(rf"head node address ({_IPV4}):\d+")),
    ("distributed_init_method", re.compile(rf"distributed_init_method=tcp://({_IPV4}):\d+")),
)
_CLIENTS_JOINED = re.compile(r"DistStoreError: Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined")
_CLIENT_TIMEOUT = re.compile(r"client socket has (?:timed out after \d+ms while trying to connect to|"
                             r"failed to connect to any network address of) \((\S+?), (\d+)\)")
_STARTUP_DONE = re.compile(r"Application startup complete")
_RANK_NAMES = re.compile(r"python|vllm|VLLM|EngineCore|pt_main_thread|ray::", re.IGNORECASE)


def _lines(text: str, rx: re.Pattern, limit: int = 3) -> list[str]:
    out = []
    for line in text.splitlines():
        if rx.search(line):
            out.append(line.strip()[:300])
            if len(out) >= limit:
                break
    return out


def _rendezvous_failures(b: B.Bundle) -> list[str]:
    """Evidence that the rendezvous did not complete, from every node."""
    ev = []
    for node, text in b.logs():
        ev += [f"{node}: {l}" for l in _lines(text, _CLIENTS_JOINED, 1)]
        ev += [f"{node}: {l}" for l in _lines(text, _CLIENT_TIMEOUT, 1)]
    port = b.context.master_port
    for node in b.nodes:
        for s in sockets.connecting_to(sockets.parse_ss(b.text(node, B.SS)), port) if port else []:
            ev.append(f"{node}: socket {s.describe()} (SYN-SENT: no answer from the master port)")
        for t in sockets.parse_tcp_connect(b.text(node, B.TCP_MASTER)):
            if t.result in ("timeout", "unreachable"):
                ev.append(f"{node}: tcp connect {t.host}:{t.port} -> {t.result} after {t.ms} ms")
    return ev


def _hcas(b: B.Bundle, node: str) -> list[str]:
    """The node's NCCL_IB_HCA members (from the running rank's environment, else the profile)."""
    raw = b.env(node).get("NCCL_IB_HCA", "")
    if not raw:
        info = b.context.node(node)
        return list(info.ib_devs) if info else []
    raw = raw.lstrip("=^")
    return [h.split(":")[0] for h in raw.split(",") if h.strip()]


def _ping_target(text: str) -> str:
    m = re.search(rf"^PING ({_IPV4})", text, re.MULTILINE)
    return m.group(1) if m else ""


# --------------------------------------------------------------------------- signatures


def _sig_rendezvous_mgmt(b: B.Bundle) -> list[Hit]:
    ctx = b.context
    head = ctx.head
    if head is None:
        return []
    failures = _rendezvous_failures(b)
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
                        + [f for f in _rendezvous_failures(b) if "clients joined" in f]))
    return hits


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


def _first_peer_ip(b: B.Bundle, node: str) -> str:
    return next((n.fabric_ip for n in b.context.nodes if n.name != node and n.fabric_ip), "")


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


def _sig_gid_per_nic(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        ports = rdma.parse_gid_dump(b.text(node, B.GIDS))
        hcas = [h for h in _hcas(b, node) if h in ports]
        if len(hcas) < 1:
            continue
        env_gid = b.env(node).get("NCCL_IB_GID_INDEX", "")
        info = b.context.node(node)
        pin = env_gid if env_gid.isdigit() else (info.gid if info and str(info.gid).isdigit() else "")
        usable = {h: sorted(i for i, e in ports[h].entries.items() if e.roce_v2 and e.ipv4) for h in hcas}
        ev = []
        if pin:
            bad = [h for h in hcas if int(pin) not in usable[h]]
            if bad:
                ev += [f"{node}: NCCL_IB_GID_INDEX={pin} on {h} is {ports[h].describe([int(pin)])}; its RoCE v2 "
                       f"IPv4 GID is at {usable[h] or 'no index'}" for h in bad]
        elif len(hcas) > 1 and not set.intersection(*(set(v) for v in usable.values())):
            ev.append(f"{node}: no GID index is RoCE v2 IPv4 on every HCA: "
                      + "; ".join(f"{h} at {usable[h] or 'none'}" for h in hcas))
        if ev:
            qp = [l for _, t in b.logs() for l in _lines(t, re.compile(r"ibv_modify_qp|unhandled system error"), 2)]
            hits.append(Hit(node, ev + qp, {"hca": hcas[0]}))
    return hits


def _sig_ib_no_device(b: B.Bundle) -> list[Hit]:
    hits = []
    for node, text in b.logs():
        ev = _lines(text, re.compile(r"NET/IB : No device found"), 1)
        if ev or (b.context.expect_rdma and re.search(r"NET/Socket : Using", text)):
            ev += _lines(text, re.compile(r"NET/Socket : Using|Using network Socket"), 1)
            avail = [p.hca for p in rdma.parse_ibdev2netdev(b.text(node, B.IBDEV2NETDEV))]
            ev.append(f"{node}: NCCL_IB_HCA={b.env(node).get('NCCL_IB_HCA', '(not set)')}; "
                      f"HCAs on the node: {', '.join(avail) or '(ibdev2netdev not collected)'}")
            hits.append(Hit(node, ev))
    return hits


def _sig_socket_ifname(b: B.Bundle) -> list[Hit]:
    rx = re.compile(r"Unable to find address for: \S+|no socket interface found|ncclInvalidUsage|"
                    r"Gloo connectFullMesh failed|NCCL_SOCKET_IFNAME set to an interface that")
    hits = []
    for node, text in b.logs():
        ev = _lines(text, rx, 2)
        if ev:
            env = b.env(node)
            names = {k: env[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME") if k in env}
            have = sorted(b.interfaces(node))
            if names:
                ev.append(f"{node}: " + ", ".join(f"{k}={v}" for k, v in names.items()))
            if have:
                ev.append(f"{node}: interfaces on the node: {', '.join(have)}")
            hits.append(Hit(node, ev))
    return hits


_NODE_SPECIFIC = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "VLLM_HOST_IP",
                  "NCCL_IB_GID_INDEX", "UCX_NET_DEVICES", "NCCL_IB_SUBNET_AWARE_ROUTING")
_OVERWRITE = re.compile(r"Overwriting environment variable (\w+) from '([^']*)' to '([^']*)'")


def _sig_env_overwritten(b: B.Bundle) -> list[Hit]:
    hits = []
    for node, text in b.logs():
        ev = []
        for m in _OVERWRITE.finditer(text):
            if m.group(1) in _NODE_SPECIFIC:
                ev.append(f"{node}: {m.group(1)} overwritten from '{m.group(2)}' to '{m.group(3)}'")
        if ev:
            hits.append(Hit(node, sorted(set(ev))))
    return hits


def _sig_roce_mtu(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        ports = ibv.parse_ibv_devinfo(b.text(node, B.IBV_DEVINFO))
        want = set(_hcas(b, node))
        low = [p for p in ports if p.active and p.link_layer == "Ethernet" and p.active_mtu and p.active_mtu < 4096
               and (not want or p.hca in want)]
        if low:
            ev = [f"{node}: {p.hca} port {p.port} active_mtu {p.active_mtu} (max {p.max_mtu})" for p in low]
            info = b.context.node(node)
            iface = b.interfaces(node).get(info.fabric_if) if info else None
            if iface is not None:
                ev.append(f"{node}: netdev {iface.name} MTU {iface.mtu}")
            hits.append(Hit(node, ev, {"hca": low[0].hca}))
    return hits


def _is_rank_process(p: procs.Proc) -> bool:
    return bool(re.search(r"vllm|VLLM::|EngineCore", p.cmd)) and "grep" not in p.cmd


def _sig_worker_dead(b: B.Bundle) -> list[Hit]:
    head = b.head
    head_log = b.text(head, B.RANK_LOG)
    head_waiting = bool(head_log) and not _STARTUP_DONE.search(head_log)
    head_failed = bool(_CLIENTS_JOINED.search(head_log))
    if not (head_waiting or head_failed):
        return []
    hits = []
    for node in b.workers:
        log = b.text(node, B.RANK_LOG)
        ev = []
        no_log = not log.strip() or re.search(r"^tail: cannot open .*No such file", log, re.MULTILINE)
        ps_known = b.has(node, B.PROCESSES)
        alive = any(_is_rank_process(p) for p in procs.parse_ps(b.text(node, B.PROCESSES)))
        if no_log:
            ev.append(f"{node}: no rank log (the rank never started, or wrote nothing)")
        if ps_known and not alive:
            ev.append(f"{node}: no vLLM process running")
        if not ev or (ps_known and alive):
            continue
        tail = [l.strip()[:300] for l in log.strip().splitlines()[-4:]] if not no_log else []
        errs = _lines(log, re.compile(r"Python\.h: No such file|Traceback|Error|error:"), 3)
        ev += [f"{node} log: {l}" for l in errs or tail]
        if head_waiting:
            ev.append(f"{head}: log shows no 'Application startup complete' (the head waits for the worker)")
        hits.append(Hit(node, ev + [f"{head}: {l}" for l in _lines(head_log, _CLIENTS_JOINED, 1)]))
    return hits


_SHELL_SPLIT = re.compile(r"env: [‘'][^’']+[’']: No such file or directory|"
                          r"bash: (?:-c: )?line \d+: .*(?:command not found|unexpected EOF while looking for matching|"
                          r"syntax error)|sh: \d+: \S+: not found|unexpected EOF while looking for matching")


def _plan_env(plan: str) -> dict[str, dict[str, str]]:
    """node -> KEY=VALUE assignments of its ``env ...`` line in a rendered launch plan."""
    out: dict[str, dict[str, str]] = {}
    node = None
    for line in plan.splitlines():
        m = re.match(r"^## rank \d+ on (\S+)", line)
        if m:
            node = m.group(1)
            continue
        if node and line.startswith("env "):
            try:
                words = shlex.split(line.rstrip("\\ "))
            except ValueError:
                continue
            out[node] = dict(w.split("=", 1) for w in words[1:] if re.match(r"^[A-Z_][A-Z0-9_]*=", w))
            node = None
    return out


def _sig_env_split(b: B.Bundle) -> list[Hit]:
    hits = []
    plan = _plan_env(b.text(B.LOCAL, B.LOCAL_LAUNCH_PLAN))
    for node in b.nodes:
        ev = [f"{node}: {l}" for l in _lines(b.text(node, B.RANK_LOG), _SHELL_SPLIT, 2)]
        env_text = b.text(node, B.ENV)
        if node in plan and env_text and "no readable process" not in env_text:
            env = b.env(node)
            key_vars = [k for k in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if k in plan[node]]
            missing = [k for k in key_vars if k not in env]
            wrong = [k for k in key_vars if k in env and env[k] != plan[node][k]]
            if missing or wrong:
                ev.append(f"{node}: the running rank's environment lacks {', '.join(missing) or '-'}"
                          f"{'; differs on ' + ', '.join(f'{k}={env[k]} (plan {plan[node][k]})' for k in wrong) if wrong else ''}"
                          f" from the rendered launch plan")
        if ev:
            hits.append(Hit(node, ev))
    for line in b.text(B.LOCAL, B.LOCAL_COMMANDS).splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        out = "\n".join(str(rec.get(k, "")) for k in ("stderr", "stdout", "stderr_tail", "stdout_tail"))
        found = _lines(out, _SHELL_SPLIT, 2)
        if found:
            node = str(rec.get("node", "?"))
            hits.append(Hit(node, [f"{node} start command: {l}" for l in found]))
    return hits


_ENGINE_DEATH = re.compile(r"EngineDeadError|EngineCore encountered a fatal error|Engine core proc \S+ died unexpectedly|"
                           r"engine core exited unexpectedly|"
                           r"[Ii]llegal instruction|SIGILL|core dumped|Fatal Python error|"
                           r"EngineCore.*(?:died|exited unexpectedly)")


def _sig_ready_then_dead(b: B.Bundle) -> list[Hit]:
    text = b.text(b.head, B.RANK_LOG)
    lines = text.splitlines()
    ready = next((i for i, l in enumerate(lines) if _STARTUP_DONE.search(l)), None)
    if ready is None:
        return []
    after = lines[ready + 1:]
    deaths = [l.strip()[:300] for l in after if _ENGINE_DEATH.search(l)][:3]
    if not deaths:
        return []
    last_req = [l.strip()[:200] for l in after if re.search(r'"POST /v1/(chat/)?completions', l)][-1:]
    return [Hit(b.head, [f"{b.head}: READY ('Application startup complete'), then:"] + deaths
                + [f"{b.head}: last request before: {r}" for r in last_req])]


def _sig_wrong_model(b: B.Bundle) -> list[Hit]:
    text = b.text(B.LOCAL, B.LOCAL_MODELS)
    want = b.context.served_model_name
    if not text.strip() or not want:
        return []
    try:
        ids = [m.get("id") for m in json.loads(text).get("data", [])]
    except (json.JSONDecodeError, AttributeError):
        return []
    if want in ids:
        return []
    return [Hit(B.LOCAL, [f"/v1/models on port {b.context.port} lists {ids or 'no model'}; the profile serves '{want}'"])]


_DWAIT = re.compile(r"folio_wait|nfs|rpc_wait|wait_on_page|io_schedule|sunrpc")


def _sig_dstate(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        rows = procs.parse_ps(b.text(node, B.D_THREADS)) + procs.parse_ps(b.text(node, B.PROCESSES))
        # only rank processes: kernel threads (jbd2, kworker) pass through D state all the time
        stuck = {(p.pid, p.tid): p for p in rows if p.uninterruptible and _RANK_NAMES.search(p.cmd)}
        hung = [h for h in hostlog.hung_tasks(b.text(node, B.DMESG)) if _RANK_NAMES.search(h.name)]
        if not stuck and not hung:
            continue
        ev = [f"{node}: pid {p.pid}{f' tid {p.tid}' if p.tid else ''} state {p.stat} waiting in "
              f"{p.wchan or '?'}: {p.cmd[:80]}" for p in list(stuck.values())[:5]]
        ev += [f"{node}: {h.line}" for h in hung[:3]]
        mount = b.text(node, B.WEIGHTS_MOUNT)
        nfs = re.search(r"\bnfs4?\b", mount)
        if not (nfs or any(_DWAIT.search(p.wchan) for p in stuck.values()) or hung):
            continue
        if nfs:
            ev.append(f"{node}: weights on NFS: {mount.strip().splitlines()[-1][:200]}")
        ev += [f for f in _rendezvous_failures(b) if "clients joined" in f]
        hits.append(Hit(node, ev))
    return hits


def _sig_watchdog(b: B.Bundle) -> list[Hit]:
    hits = []
    for node, text in b.logs():
        ev = _lines(text, re.compile(r"Watchdog caught collective operation timeout"), 2)
        if ev:
            hits.append(Hit(node, [f"{node}: {l}" for l in ev]))
    return hits


_GDR_LEVELS = {"0", "1", "2", "3", "4", "LOC", "PIX", "PXB", "PHB", "SYS", "NVL", "PXN"}


def _sig_inert_nccl(b: B.Bundle) -> list[Hit]:
    hits = []
    plan = _plan_env(b.text(B.LOCAL, B.LOCAL_LAUNCH_PLAN))
    for node in sorted(set(b.nodes) | set(plan)):
        env = {**plan.get(node, {}), **b.env(node)}
        ev = []
        if "NCCL_TIMEOUT" in env:
            ev.append(f"{node}: NCCL_TIMEOUT={env['NCCL_TIMEOUT']} has no effect: the 600 s limit is PyTorch's "
                      f"ProcessGroupNCCL watchdog, not NCCL")
        gdr = env.get("NCCL_NET_GDR_LEVEL")
        if gdr is not None and gdr.upper() not in _GDR_LEVELS:
            ev.append(f"{node}: NCCL_NET_GDR_LEVEL={gdr} is out of range (0-4 or LOC/PIX/PXB/PHB/SYS); "
                      f"GPUDirect RDMA is not supported on Spark anyway")
        if ev:
            hits.append(Hit(node, ev))
    return hits


def _pull_sig(kind: str) -> Callable[[B.Bundle], list[Hit]]:
    def sig(b: B.Bundle) -> list[Hit]:
        hits = []
        for node, name, text in b.named(B.DOCKER_PULL.split(".")[0]):
            err = docker_pull.classify_pull(text)
            if err and err.kind == kind:
                hits.append(Hit(node, [f"{node} {name}: {err.line}"]))
        for node, text in b.logs():
            if "Unable to find image" in text:
                err = docker_pull.classify_pull(text)
                if err and err.kind == kind:
                    hits.append(Hit(node, [f"{node} docker run: {err.line}"]))
        return hits
    return sig


_DMESG_T = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")


RECENT_S = 3600.0


def _rank_started(b: B.Bundle, node: str) -> float | None:
    """When the node's rank was last started (its start record), as epoch seconds."""
    try:
        return float(json.loads(b.text(node, B.START_RECORD) or "{}").get("started_at"))
    except (TypeError, ValueError):
        return None


def _before(line: str, started: float | None) -> bool:
    """A ``dmesg -T`` line stamped more than a minute before the rank's start: an older event (the kernel
    ring buffer is the host's, shared by every namespace and every earlier run)."""
    m = _DMESG_T.match(line.strip())
    if started is None or not m:
        return False
    try:
        stamp = _dt.datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y").timestamp()
    except ValueError:
        return False
    return stamp < started - 60


def _sig_oom(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        text = b.text(node, B.DMESG) + "\n" + b.text(node, B.JOURNAL)
        started = _rank_started(b, node)
        if started is None and b.timings.get("collected_at"):
            started = b.timings["collected_at"] - RECENT_S     # no rank runs: only what happened lately
        kills = [k for k in hostlog.oom_kills(text) if not k.dry_run and not _before(k.line, started)]
        gpu = hostlog.gpu_oom_lines(text)
        if not kills and not gpu:
            continue
        ev = [f"{node}: {k.by} killed {k.name} (pid {k.pid}){' - a rank' if _RANK_NAMES.search(k.name) else ''}: "
              f"{k.line[:200]}" for k in kills[:4]]
        ev += [f"{node}: {l[:200]}" for l in gpu[:2]]
        hits.append(Hit(node, ev))
    return hits


MEM_FLOOR_BYTES = 2 << 30         # below this MemAvailable the kernel / earlyoom start killing
MEM_FLOOR_FRACTION = 0.025


def _sig_mem_floor(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        mem = system.parse_meminfo(b.text(node, B.MEMINFO))
        avail, total = mem.get("MemAvailable"), mem.get("MemTotal")
        if avail is None or not total:
            continue
        floor = max(MEM_FLOOR_BYTES, int(total * MEM_FLOOR_FRACTION))
        if avail < floor:
            hits.append(Hit(node, [f"{node}: MemAvailable {avail / 2**30:.1f} GiB of {total / 2**30:.1f} GiB "
                                   f"(floor {floor / 2**30:.1f} GiB)"]))
    return hits


WEDGE_MIN_INTERVAL_S = 10.0


def _sig_wedge(b: B.Bundle) -> list[Hit]:
    health = b.text(B.LOCAL, B.LOCAL_HEALTH).strip()
    m1, m2 = b.text(B.LOCAL, B.LOCAL_METRICS_1), b.text(B.LOCAL, B.LOCAL_METRICS_2)
    interval = b.timings.get("metrics_interval_s", 0.0)
    if not (health.startswith("200") and m1 and m2 and interval >= WEDGE_MIN_INTERVAL_S):
        return []
    s1, s2 = MetricsSnapshot.from_text(0.0, m1), MetricsSnapshot.from_text(interval, m2)
    busy = [(s.total("vllm:num_requests_running") or 0) + (s.total("vllm:num_requests_waiting") or 0) for s in (s1, s2)]
    g1, g2 = s1.total("vllm:generation_tokens_total"), s2.total("vllm:generation_tokens_total")
    if g1 is None or g2 is None or min(busy) <= 0 or g2 > g1:
        return []
    return [Hit(B.LOCAL, [f"/health {health}; requests running+waiting {busy[0]:g} then {busy[1]:g}; "
                          f"generation tokens {g1:g} -> {g2:g} over {interval:.0f} s"])]


def _sig_mdns(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        names = hostlog.hostname_conflicts(b.text(node, B.JOURNAL) + "\n" + b.text(node, B.DMESG))
        if names:
            top = max((hostlog.conflict_suffix(n) or 0) for n in names)
            hits.append(Hit(node, [f"{node}: avahi renamed the host {len(names)} time(s), last '{names[-1]}' "
                                   f"(suffix up to -{top})"]))
    return hits


#: (kernel release regex, why it is bad); checked when the profile expects RDMA
KNOWN_BAD_KERNELS: tuple[tuple[str, str], ...] = (
    (r"^7\.0\.0-1019\b", "7.0.0-1019 boots with CmaTotal: 0, so ibv_reg_mr fails with ENOMEM"),
    (r"^7\.0\.", "7.0 kernels fail RDMA memory registration during FlashInfer autotune "
                 "(one fleet pins 6.17.0-1032-nvidia)"),
)


def _sig_kernel(b: B.Bundle) -> list[Hit]:
    hits = []
    kernels = {}
    for node in b.nodes:
        text = b.text(node, B.OS)
        if not text:
            continue
        kernels[node] = system.parse_os(text).kernel
    for node, k in kernels.items():
        for rx, why in KNOWN_BAD_KERNELS:
            if b.context.expect_rdma and re.search(rx, k):
                hits.append(Hit(node, [f"{node}: kernel {k}: {why}"]))
                break
    if len(set(kernels.values())) > 1:
        hits.append(Hit("cluster", ["kernels differ: " + ", ".join(f"{n} {k}" for n, k in kernels.items())]))
    return hits


_HOME_PATH = re.compile(r"(?:No such file or directory|FileNotFoundError|does not exist)[^\n]*?'?(/(?:home/[^/\s'\"]+|root))(/[^\s'\"]*)")


def _sig_home_differs(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        home = b.text(node, B.HOME).strip().splitlines()
        if not home:
            continue
        home = home[-1].rstrip("/")
        ev = []
        for m in _HOME_PATH.finditer(b.text(node, B.RANK_LOG)):
            if m.group(1) != home:
                ev.append(f"{node}: {m.group(1)}{m.group(2)} is missing; this node's home is {home}")
        if ev:
            hits.append(Hit(node, sorted(set(ev))[:3]))
    return hits


def _sig_rendezvous_timeout(b: B.Bundle) -> list[Hit]:
    ev = [e for e in _rendezvous_failures(b) if "clients joined" in e or "client socket" in e]
    return [Hit("cluster", ev)] if ev else []


# --------------------------------------------------------------------------- the catalogue

ENTRIES: tuple[Entry, ...] = (
    Entry("rendezvous-mgmt-address", "Rendezvous on an address that is not on the fabric", FATAL,
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
          signature=_sig_rendezvous_mgmt, source="anchors-2026-12 #1"),
    Entry("firewall-master-port", "A firewall drops the master port", FATAL,
          symptom="start hangs ~10 min, then the same `clients joined` timeout",
          detect="a TCP connect from the worker to the master address:port gets no answer within 5 s while ping to "
                 "the same address answers, or the head's nft/iptables/ufw state drops or rejects the port",
          cause="ufw/nftables/iptables on the head drops the rendezvous port on the fabric interface",
          fix="allow the port on the fabric: `sudo ufw allow in on {fabric_if} to any port {master_port} proto tcp` "
              "(or remove the drop rule), then start again",
          proof="timeout 5 bash -c '</dev/tcp/{master_addr}/{master_port}' && echo open   # from the worker",
          signature=_sig_firewall, source="anchors-2026-12 #2; issue 16 item 1"),
    Entry("fabric-unreachable", "Fabric link down or peer unreachable", FATAL,
          symptom="requests time out or the start hangs; nothing mentions the network",
          detect="ping over the fabric interface to a peer's fabric address gets no reply, or the fabric netdev is "
                 "not UP in `ip -j addr`",
          cause="the fabric link is down (cable, port, netplan) or the address moved",
          fix="bring the link up (`ip link`, cable, `netplan apply`), check both ends have their fabric addresses, "
              "then restart both ranks together",
          proof="ping -c 3 -I {fabric_if} {peer_ip}; ip -br link show {fabric_if}",
          signature=_sig_fabric_unreachable, source="issue 16 item 4"),
    Entry("fabric-mtu-blackhole", "Jumbo frames do not pass the fabric", DEGRADED,
          symptom="small requests work, large transfers stall or crawl",
          detect="a DF-set ping of FABRIC_MTU-28 bytes fails while a small ping to the same peer passes",
          cause="one end (or a switch) has a smaller MTU than the profile's FABRIC_MTU",
          fix="set the same MTU on both ends (netplan `mtu:`), or lower FABRIC_MTU to what the path carries",
          proof="ping -M do -s $(({fabric_mtu}-28)) -c 3 -I {fabric_if} {peer_ip}",
          signature=_sig_fabric_mtu, source="bringup-anchors §1.2"),
    Entry("gid-index-per-nic", "RoCE GID index wrong on one NIC", FATAL,
          symptom="NCCL init dies ~60 s in (`unhandled system error`, `ibv_modify_qp` errno 61) or hangs",
          detect="the GID index in effect (NCCL_IB_GID_INDEX of the rank, else the profile's pin) is not a RoCE v2 "
                 "IPv4-mapped GID on every HCA of NCCL_IB_HCA (sysfs GID table), or no single index is",
          cause="the IPv4 RoCE v2 GID sits at different indices per NIC (3 on one port, 5 on the other), so one "
                "global NCCL_IB_GID_INDEX hands one NIC a link-local GID and its queue pair never connects",
          fix="set *_GID=auto (resolved per node and checked per HCA), or pin an index valid on every HCA of that node",
          proof="grep -H . /sys/class/infiniband/{hca}/ports/1/gid_attrs/types/* /sys/class/infiniband/{hca}/ports/1/gids/*",
          signature=_sig_gid_per_nic, source="anchors-2026-12 #3; bringup-anchors §5.5"),
    Entry("nccl-ib-no-device", "NCCL fell back to TCP sockets", DEGRADED,
          symptom="the server runs but collectives are several times slower than the link",
          detect="`NET/IB : No device found.` in a rank log (or `NET/Socket : Using` while the profile expects RDMA)",
          cause="NCCL_IB_HCA names no device that exists on that node (typo, or names from the other node); NCCL "
                "does not fail, it silently uses sockets",
          fix="set NCCL_IB_HCA per node to names `ibdev2netdev` prints there (HEAD_CX7_IB / WORKER_CX7_IB)",
          proof="ibdev2netdev; grep -E 'NET/IB|NET/Socket|Using network' <rank log>",
          signature=_sig_ib_no_device, source="anchors-2026-12 #4"),
    Entry("socket-ifname-invalid", "Socket interface name does not exist on the node", FATAL,
          symptom="rank dies at init (`ncclInvalidUsage`, `Unable to find address for: <if>`)",
          detect="`Unable to find address for:`, `no socket interface found`, `ncclInvalidUsage` or "
                 "`Gloo connectFullMesh failed` in a rank log",
          cause="NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME names an interface that node does not have",
          fix="set *_CX7_IF (or BOOTSTRAP_IF) to the node's real netdev; never `lo`",
          proof="ip -br addr; tr '\\0' '\\n' < /proc/<rank pid>/environ | grep SOCKET_IFNAME",
          signature=_sig_socket_ifname, source="anchors-2026-12 #4; bringup-anchors §5.4"),
    Entry("env-overwritten-by-head", "Node-specific settings pushed from the head", FATAL,
          symptom="the worker uses the head's HCA names or addresses; NCCL falls back or fails",
          detect="`Overwriting environment variable NCCL_IB_HCA from '<a>' to '<b>'` (or another node-specific "
                 "variable) in a rank log",
          cause="HCA names / interfaces were resolved on the head and copied to the worker (names can be `mlx5_*` "
                "on one node and `rocep*` on the other)",
          fix="resolve NCCL_IB_HCA, *_SOCKET_IFNAME and VLLM_HOST_IP per node and pass them in each rank's own "
              "environment; do not forward the head's",
          proof="grep 'Overwriting environment variable' <worker rank log>; ibdev2netdev   # on each node",
          signature=_sig_env_overwritten, source="anchors-2026-12 #5"),
    Entry("roce-active-mtu-low", "RoCE active MTU below 4096", DEGRADED,
          symptom="prefill ~40 % below the reference while decode looks normal",
          detect="`ibv_devinfo` shows `active_mtu` < 4096 on an active Ethernet port of NCCL_IB_HCA",
          cause="the netdev MTU is 1500 (or mismatched between the ends), so RoCE negotiates 1024-byte packets",
          fix="set the fabric netdev MTU to 9000 (or at least 4200) on both ends and re-apply netplan; re-check "
              "active_mtu on both",
          proof="ibv_devinfo -d {hca} | grep -E 'state|active_mtu'",
          signature=_sig_roce_mtu, source="anchors-2026-12 #6"),
    Entry("worker-not-running", "Worker died or never started while the head waits", FATAL,
          symptom="the head waits (up to vLLM's rendezvous timeout) for a worker that is not there",
          detect="the head's log has no `Application startup complete` (or a clients-joined timeout) and a worker "
                 "has no rank log or no vLLM process; the worker's last error lines are shown",
          cause="the worker's start failed (e.g. a venv copied without `Python.h`, a missing path) or it was never "
                "launched",
          fix="fix the worker's error shown here, start the worker first and check it is alive and logging before "
              "starting the head (the launcher does this); stop the head meanwhile",
          proof="pgrep -af vllm; tail -n 50 <worker rank log>   # on the worker",
          signature=_sig_worker_dead, source="anchors-2026-12 #7; issue 16 item 1"),
    Entry("env-split-by-quoting", "Environment split by nested shell quoting", FATAL,
          symptom="the worker never launched, or launched without its NCCL/VLLM variables",
          detect="shell errors from the start command (`env: 'x': No such file or directory`, `command not found`, "
                 "`unexpected EOF while looking for matching`), or the running rank's environment lacks "
                 "VLLM_HOST_IP / *_SOCKET_IFNAME the rendered launch plan sets",
          cause="the start command went through ssh plus another `bash -c` layer and lost a quoting level, so "
                "assignments became separate words",
          fix="pass the environment as one quoted word per assignment (or write it to a file on the node and "
              "source it); compare the rank's /proc/<pid>/environ with the launch plan",
          proof="tr '\\0' '\\n' < /proc/<rank pid>/environ | grep -E 'VLLM_HOST_IP|SOCKET_IFNAME|NCCL_IB'",
          signature=_sig_env_split, source="anchors-2026-12 #7"),
    Entry("ready-then-dead", "READY, then EngineCore died on a request", FATAL,
          symptom="`/health` was 200, then the first long prompt kills the server",
          detect="the head's log shows `Application startup complete` and, after it, an EngineCore death "
                 "(`EngineDeadError`, `died unexpectedly`, `Illegal instruction`, `core dumped`)",
          cause="a prefill kernel fails on long inputs (e.g. `illegal instruction` under CUDA-graph capture); "
                "short smoke prompts never reach it",
          fix="reproduce with one prompt of >= 3k tokens; try --enforce-eager or a lower "
              "--max-num-batched-tokens to locate the kernel; report with this bundle",
          proof="grep -nE 'Application startup complete|EngineDeadError|died unexpectedly|Illegal instruction' <head rank log>",
          signature=_sig_ready_then_dead, source="anchors-2026-12 #8"),
    Entry("wrong-model-on-port", "The port answers for a different model", FATAL,
          symptom="requests fail with `model ... does not exist` or hit an old server",
          detect="`/v1/models` on the API port does not list SERVED_MODEL_NAME",
          cause="another server (an older run, another user) holds the port",
          fix="stop the other server (`ss -ltnp 'sport = :{port}'` names it) or change PORT",
          proof="curl -s http://{master_addr}:{port}/v1/models",
          signature=_sig_wrong_model, source="anchors-2026-12 #10"),
    Entry("rank-in-d-state", "Rank stuck in uninterruptible I/O (NFS)", FATAL,
          symptom="a rank cannot be killed; after an out-of-step restart: `1/2 clients joined`",
          detect="rank threads in state D waiting in `folio_wait_bit_common` / `nfs_*` / `rpc_wait_*`, or kernel "
                 "`blocked for more than N seconds`, with the weights on NFS",
          cause="NFS-served weights under heavy I/O; restarting one rank while the other is stuck leaves them "
                "out of step",
          fix="wait for the I/O or reboot the stuck node; always restart both ranks together; prefer node-local "
              "weights (WEIGHT_SYNC=rsync)",
          proof="ps -eLo pid,tid,stat,wchan:32,comm | awk '$3 ~ /^D/'; findmnt -T <weights dir>",
          signature=_sig_dstate, source="anchors-2026-12 #11"),
    Entry("nccl-watchdog-timeout", "PyTorch's 600 s ProcessGroupNCCL watchdog fired", FATAL,
          symptom="`Watchdog caught collective operation timeout ... Timeout(ms)=600000` after a long stall",
          detect="the watchdog line in a rank log",
          cause="a collective did not complete in PyTorch's timeout: a peer rank stopped (frozen, dead, D state) "
                "or the fabric went down; NCCL_TIMEOUT does not govern this",
          fix="find the rank that stopped (other findings: fabric, D state, OOM); the execute-model timeout is "
              "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, not NCCL_TIMEOUT",
          proof="grep -n 'Watchdog caught collective operation timeout' <rank logs>",
          signature=_sig_watchdog, source="anchors-2026-12 #16"),
    Entry("inert-nccl-settings", "NCCL settings that do nothing", WARNING,
          symptom="a timeout or GPUDirect setting was changed and nothing changed",
          detect="NCCL_TIMEOUT set, or NCCL_NET_GDR_LEVEL outside 0-4/LOC/PIX/PXB/PHB/SYS, in a rank's environment "
                 "or the launch plan",
          cause="NCCL_TIMEOUT is not read by this path (the 600 s is PyTorch's watchdog); GDR levels above 4 are "
                "out of range and GPUDirect RDMA is not supported on Spark",
          fix="drop them from the profile / EXTRA env; use VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS for the execute timeout",
          proof="tr '\\0' '\\n' < /proc/<rank pid>/environ | grep -E 'NCCL_TIMEOUT|NCCL_NET_GDR_LEVEL'",
          signature=_sig_inert_nccl, source="anchors-2026-12 #16"),
    Entry("docker-pull-eof", "docker pull: connection dropped (unexpected EOF)", WARNING,
          symptom="`docker pull` fails with `unexpected EOF`",
          detect="`unexpected EOF` / connection reset in docker pull output",
          cause="the download was cut mid-layer (network, proxy, registry)",
          fix="retry the pull: it resumes from the layers already fetched",
          proof="docker pull {image}",
          signature=_pull_sig("unexpected-eof"), source="anchors-2026-12 #15"),
    Entry("docker-pull-manifest-unknown", "docker pull: tag or digest does not exist", FATAL,
          symptom="`docker pull` fails with `manifest unknown`",
          detect="`manifest unknown` / `manifest for ... not found` in docker pull output",
          cause="the IMAGE tag or digest does not exist in that registry (typo, deleted tag); retrying never helps",
          fix="fix IMAGE in the profile (check the registry's tag list); stop retrying",
          proof="docker manifest inspect {image}",
          signature=_pull_sig("manifest-unknown"), source="anchors-2026-12 #15"),
    Entry("docker-pull-dns", "docker pull: registry host name does not resolve", FATAL,
          symptom="`docker pull` fails with `no such host`",
          detect="`no such host` / `Temporary failure in name resolution` in docker pull output",
          cause="DNS on the node (resolver, /etc/resolv.conf, offline node), not the registry",
          fix="fix name resolution on that node (`resolvectl status`), or pull on a connected node and "
              "`docker save | ssh node docker load`",
          proof="getent hosts <registry host>   # on the node",
          signature=_pull_sig("dns"), source="anchors-2026-12 #15"),
    Entry("oom-killed", "Host memory pressure killed a process", FATAL,
          symptom="a rank vanishes without a Python error; the other waits",
          detect="kernel `Out of memory: Killed process`, earlyoom `sending SIGTERM/SIGKILL to process`, "
                 "systemd-oomd kills, or `NVRM ... NV_ERR_NO_MEMORY` in dmesg / the journal",
          cause="the unified memory pool ran out (weights + KV + graph capture + page cache); GPU allocations are "
                "invisible to cgroups",
          fix="lower GPU_MEM_UTIL / KV_CACHE_MEMORY_BYTES or MAX_NUM_SEQS, drop caches before start, keep "
              "earlyoom from targeting the ranks; change one thing at a time",
          proof="dmesg -T | grep -iE 'out of memory|oom-kill|NV_ERR_NO_MEMORY'; journalctl -u earlyoom -n 50",
          signature=_sig_oom, source="anchors-2026-12 seed B; bringup-anchors §5.16"),
    Entry("mem-available-low", "MemAvailable below the floor", WARNING,
          symptom="the node is sluggish; ssh banners time out; kills are next",
          detect=f"MemAvailable below max({MEM_FLOOR_BYTES >> 30} GiB, {MEM_FLOOR_FRACTION:.1%} of MemTotal) in /proc/meminfo",
          cause="weights, KV cache and page cache leave no headroom",
          fix="lower GPU_MEM_UTIL or KV size; `sync; echo 1 | sudo tee /proc/sys/vm/drop_caches` before start",
          proof="grep -E 'MemTotal|MemAvailable' /proc/meminfo",
          signature=_sig_mem_floor, source="anchors-2026-12 seed B; bringup-anchors §5.17"),
    Entry("serving-wedge", "Serving wedge: /health 200 but no tokens", FATAL,
          symptom="clients hang; /health still says 200",
          detect="two /metrics scrapes at least 10 s apart: requests running or waiting > 0 in both and "
                 "`vllm:generation_tokens_total` did not move, while /health is 200",
          cause="a rank stopped inside a collective (frozen process, fabric down, NCCL hang) while the API "
                "process stays up",
          fix="check the fabric and each rank (other findings); restart both ranks together",
          proof="curl -s http://{master_addr}:{port}/metrics | grep -E 'num_requests_(running|waiting)|generation_tokens_total'",
          signature=_sig_wedge, source="anchors-2026-12 #9; vLLM #40969"),
    Entry("mdns-hostname-storm", "mDNS host-name conflict storm", WARNING,
          symptom="`<host>.local` stops resolving; ssh by name fails",
          detect="avahi `Host name conflict, retrying with <host>-N` in the journal",
          cause="avahi sees its own announcements (twin interfaces, network flaps) and keeps renaming the host",
          fix="use IP addresses (or /etc/hosts) in the profile; restrict avahi to the management interface "
              "(`allow-interfaces=`) or disable it",
          proof="journalctl -u avahi-daemon -n 50 | grep -i conflict",
          signature=_sig_mdns, source="anchors-2026-12 #12"),
    Entry("kernel-known-bad", "Kernel known to break RDMA, or kernels differ", WARNING,
          symptom="RDMA registration fails during autotune, or throughput differs between nodes",
          detect="`uname -r` matches a known-bad release (7.0.x, 7.0.0-1019) with RDMA expected, or the nodes run "
                 "different kernels",
          cause="kernel regressions in RDMA memory registration; mixed kernels mean mixed drivers",
          fix="boot the pinned kernel (6.17.0-1032-nvidia) on every node",
          proof="uname -r   # on every node",
          signature=_sig_kernel, source="anchors-2026-12 #14"),
    Entry("home-dir-differs", "A path from the head's home does not exist on the worker", FATAL,
          symptom="the worker fails with `No such file or directory: '/home/<head user>/...'`",
          detect="a missing path under a home directory that is not the worker's `$HOME`",
          cause="cache or model paths were resolved on the head and sent to the worker, whose user/home differ",
          fix="use `~/...` paths in the profile (expanded per node) or the same user on every node",
          proof="echo $HOME   # on the worker",
          signature=_sig_home_differs, source="anchors-2026-12 #13"),
    Entry("rendezvous-timeout", "Rendezvous did not complete", FATAL,
          symptom="`DistStoreError: Timed out after N seconds waiting for clients. 1/2 clients joined.`",
          detect="the clients-joined timeout or a worker's `client socket has timed out ... trying to connect to` "
                 "in a rank log",
          cause="one rank never reached the master port; the findings above name why (address, firewall, dead "
                "worker, out-of-step restart); when none does, the worker started too late or at another port",
          fix="start both ranks together with the same MASTER_PORT; if no other finding matched, check "
              "`ss -tanp` on both nodes while the head waits",
          proof="ss -tanp '( sport = :{master_port} or dport = :{master_port} )'   # on both nodes",
          signature=_sig_rendezvous_timeout, source="anchors-2026-12 #1, #2, #11"),
)

BY_ID = {e.id: e for e in ENTRIES}
assert len(BY_ID) == len(ENTRIES), "duplicate catalogue ids"
