"""NCCL and RDMA failures: a RoCE GID index wrong on one NIC, NCCL fallen back to sockets, a socket
interface the node lacks, a low RoCE MTU, PyTorch's NCCL watchdog, and NCCL settings that do nothing."""
from __future__ import annotations

import re

from ...facts import ibv, rdma
from .. import bundle as B
from .entry import DEGRADED, FATAL, WARNING, Entry, Hit, lines_matching, plan_env


def _hcas(b: B.Bundle, node: str) -> list[str]:
    """The node's NCCL_IB_HCA members (from the running rank's environment, else the profile)."""
    raw = b.env(node).get("NCCL_IB_HCA", "")
    if not raw:
        info = b.context.node(node)
        return list(info.ib_devs) if info else []
    raw = raw.lstrip("=^")
    return [h.split(":")[0] for h in raw.split(",") if h.strip()]


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
            qp = [l for _, t in b.logs() for l in lines_matching(t, re.compile(r"ibv_modify_qp|unhandled system error"), 2)]
            hits.append(Hit(node, ev + qp, {"hca": hcas[0]}))
    return hits


GID_INDEX_PER_NIC = Entry(
    "gid-index-per-nic", "RoCE GID index wrong on one NIC", FATAL,
    symptom="NCCL init dies ~60 s in (`unhandled system error`, `ibv_modify_qp` errno 61) or hangs",
    detect="the GID index in effect (NCCL_IB_GID_INDEX of the rank, else the profile's pin) is not a RoCE v2 "
           "IPv4-mapped GID on every HCA of NCCL_IB_HCA (sysfs GID table), or no single index is",
    cause="the IPv4 RoCE v2 GID sits at different indices per NIC (3 on one port, 5 on the other), so one "
          "global NCCL_IB_GID_INDEX hands one NIC a link-local GID and its queue pair never connects",
    fix="set *_GID=auto (resolved per node and checked per HCA), or pin an index valid on every HCA of that node",
    proof="grep -H . /sys/class/infiniband/{hca}/ports/1/gid_attrs/types/* /sys/class/infiniband/{hca}/ports/1/gids/*",
    signature=_sig_gid_per_nic, source="anchors-2026-12 #3; bringup-anchors §5.5; symptom: NVIDIA/nccl "
           "src/transport/net_ib.cc:2543 @ v2.28.9-1, :1909 @ v2.21.5-1, :818 @ v2.7.8-1 (completion status 12, retry "
           "exceeded); reports NVIDIA/nccl#1814 (status=12, the numeric form), "
           "NVIDIA/nccl#426 (the maintainer: error 12 right away means the NICs cannot talk RoCE; fixed by the GID "
           "index)",
    lab="none: no RoCE device in the lab (fixture follows the sysfs format)",
    lines=(r"ibv_modify_qp failed with (error )?61",
           r"ibv_modify_qp.*No data available",),
    # symptom (never high): a work completion with IBV_WC_RETRY_EXC_ERR (12) as NCCL prints it (src/transport/net_ib.cc
    # :2543 @ v2.28.9-1 `status=IBV_WC_RETRY_EXC_ERR(12)`, :818 @ v2.7.8-1 `Got completion with error 12`): the
    # peer never acknowledged the queue pair's packets; right after connect that is most often a GID (RoCE v1/v2,
    # link-local) the path cannot route, less often the MTU or the switch's lossless settings
    # (v2.21.5-1 src/transport/net_ib.cc:1909 prints the status as a number: `with status=12 opcode=...`)
    symptoms=(r"NET/IB ?: Got completion (?:from peer \S+ )?with (?:error 12\b|status=(?:IBV_WC_RETRY_EXC_ERR\()?12\b)",),
    words=(r"gid[_ ]?index|\bgid\b|gids",
           r"unhandled system error|ibv_modify_qp|errno 61|link-local|fe80|::ffff",
           r"nccl|roce|rdma|hca|nic",))


def _sig_ib_no_device(b: B.Bundle) -> list[Hit]:
    hits = []
    for node, text in b.logs():
        ev = lines_matching(text, re.compile(r"NET/IB : No device found"), 1)
        if ev or (b.context.expect_rdma and re.search(r"NET/Socket : Using", text)):
            ev += lines_matching(text, re.compile(r"NET/Socket : Using|Using network Socket"), 1)
            avail = [p.hca for p in rdma.parse_ibdev2netdev(b.text(node, B.IBDEV2NETDEV))]
            ev.append(f"{node}: NCCL_IB_HCA={b.env(node).get('NCCL_IB_HCA', '(not set)')}; "
                      f"HCAs on the node: {', '.join(avail) or '(ibdev2netdev not collected)'}")
            hits.append(Hit(node, ev))
    return hits


NCCL_IB_NO_DEVICE = Entry(
    "nccl-ib-no-device", "NCCL fell back to TCP sockets", DEGRADED,
    symptom="the server runs but collectives are several times slower than the link",
    detect="`NET/IB : No device found.` in a rank log (or `NET/Socket : Using` while the profile expects RDMA)",
    cause="NCCL_IB_HCA names no device that exists on that node (typo, or names from the other node); NCCL "
          "does not fail, it silently uses sockets",
    fix="set NCCL_IB_HCA per node to names `ibdev2netdev` prints there (HEAD_CX7_IB / WORKER_CX7_IB)",
    proof="ibdev2netdev; grep -E 'NET/IB|NET/Socket|Using network' <rank log>",
    signature=_sig_ib_no_device, source="anchors-2026-12 #4",
    lab="none: no RoCE device in the lab (fixture follows NCCL's log format)",
    lines=(r"NET/IB : No device found",),
    words=(r"net/socket|using network socket|sockets? (instead|transport)|over tcp|f[ae]ll(s|en)? back|no device found|ib_disable|/dev/infiniband",
           r"nccl|all_?reduce|busbw|nccl-tests",
           r"slow|half|\d+ ?gb/s|low (bandwidth|busbw)|instead of (rdma|roce|ib)",))


def _sig_socket_ifname(b: B.Bundle) -> list[Hit]:
    # NCCL src/misc/socket.cc:819 @ v2.28.9-1: ncclSocketInit gets an address no interface filled (family neither
    # AF_INET nor AF_INET6) when NCCL_SOCKET_IFNAME matched nothing; src/bootstrap.cc:114: "no socket interface found"
    # (not NCCL's bare ncclInvalidUsage: every invalid-usage check prints it, e.g. init.cc:904's duplicate GPU, so it
    # named this entry at high confidence for causes that are not an interface: issue 36's sixth round)
    rx = re.compile(r"Unable to find address for: \S+|no socket interface found|"
                    r"Gloo connectFullMesh failed|NCCL_SOCKET_IFNAME set to an interface that|"
                    r"with family -?\d+ is neither AF_INET\(\d+\) nor AF_INET6")
    hits = []
    for node, text in b.logs():
        ev = lines_matching(text, rx, 2)
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


SOCKET_IFNAME_INVALID = Entry(
    "socket-ifname-invalid", "Socket interface name does not exist on the node", FATAL,
    symptom="rank dies at init (`ncclInvalidUsage`, `Unable to find address for: <if>`)",
    detect="`Unable to find address for:`, `no socket interface found`, `ncclInvalidUsage`, NCCL's `connecting to "
           "address with family N is neither AF_INET nor AF_INET6` (an address no interface filled) or "
           "`Gloo connectFullMesh failed` in a rank log",
    cause="NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME names an interface that node does not have",
    fix="set *_CX7_IF (or BOOTSTRAP_IF) to the node's real netdev; never `lo`",
    proof="ip -br addr; tr '\\0' '\\n' < /proc/<rank pid>/environ | grep SOCKET_IFNAME",
    signature=_sig_socket_ifname, source="anchors-2026-12 #4; bringup-anchors §5.4; NVIDIA/nccl src/misc/socket.cc:819, "
           "src/bootstrap.cc:114 @ v2.28.9-1",
    lab="capture_netns socket_ifname (gloo with a missing interface)",
    words=(r"socket_ifname|ifname|interface name",
           r"not found|does(n'?t| not) exist|wrong|invalid|unable to find address|loopback|127\.0\.0\.1|\blo\b|connectfullmesh",
           r"gloo|nccl|rank|worker|init",))


NO_IP_INTERFACE_IN_CONTAINER = Entry(
    "no-ip-interface-in-container", "NCCL finds no usable IP interface (a container without host networking)",
    FATAL,
    symptom="`ncclGetUniqueId` / NCCL init fails at once with `unhandled system error`; with NCCL_DEBUG=WARN: "
            "`Socket creation failed : Address family not supported by protocol`",
    detect="NCCL's `WARN Socket creation failed : Address family not supported by protocol` (before 2.5: the "
           "socket of an address no interface filled, family 0) in a rank log",
    cause="NCCL found no usable IP interface for its bootstrap socket: the process runs in a container without "
          "`--network host` (only loopback, or an interface NCCL skips), so the address it opens a socket on has "
          "no family",
    fix="start the rank containers with `--network host` (the Spark recipes do; NCCL and Ray need the nodes' own "
        "addresses), or give the container an interface with an IPv4 address and name it in NCCL_SOCKET_IFNAME; "
        "`ip -br addr` inside the container must show it",
    proof="docker inspect -f '{{{{.HostConfig.NetworkMode}}}}' <rank container>; docker exec <rank container> ip -br addr",
    signature=None,
    source="NVIDIA/nccl src/include/socket.h:311 (NCCL 2.2/2.3, `Socket creation failed : %s` after socket() of "
           "the found address; the held-out report NVIDIA/nccl-tests#14 is the only report, its maintainer: NCCL "
           "prints it 'when it finds no usable IP interface', fixed with --net host); current NCCL says `no socket "
           "interface found` (src/bootstrap.cc:114 @ v2.28.9-1, socket-ifname-invalid's signature)",
    lines=(r"\bWARN Socket creation failed ?: Address family not supported by protocol",),
    words=(r"no (usable |valid )?(ip |network )?interface|--net(work)?[ =](host|none)|host network\w*|"
           r"network[ _-]?mode",
           r"nccl|gloo|bootstrap|unhandled system error",
           r"docker|container|\bpod\b|kubernetes|k8s"),
    lab="none: the lab's rank containers use host networking (a container on a bridge with only loopback would "
        "produce it under NCCL)")


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


ROCE_ACTIVE_MTU_LOW = Entry(
    "roce-active-mtu-low", "RoCE active MTU below 4096", DEGRADED,
    symptom="prefill ~40 % below the reference while decode looks normal",
    detect="`ibv_devinfo` shows `active_mtu` < 4096 on an active Ethernet port of NCCL_IB_HCA",
    cause="the netdev MTU is 1500 (or mismatched between the ends), so RoCE negotiates 1024-byte packets",
    fix="set the fabric netdev MTU to 9000 (or at least 4200) on both ends and re-apply netplan; re-check "
        "active_mtu on both",
    proof="ibv_devinfo -d {hca} | grep -E 'state|active_mtu'",
    signature=_sig_roce_mtu, source="anchors-2026-12 #6",
    lab="none: no RoCE device in the lab (fixture follows ibv_devinfo's format)",
    lines=(r"active_mtu:\s+(256|512|1024|2048) ",),
    words=(r"active_mtu|roce (mtu|packets?)|1024[- ]byte",
           r"prefill|slow|40 ?%|bandwidth|ibv_devinfo",))


def _sig_watchdog(b: B.Bundle) -> list[Hit]:
    hits = []
    for node, text in b.logs():
        ev = lines_matching(text, re.compile(r"Watchdog caught collective operation timeout"), 2)
        if ev:
            hits.append(Hit(node, [f"{node}: {l}" for l in ev]))
    return hits


NCCL_WATCHDOG_TIMEOUT = Entry(
    "nccl-watchdog-timeout", "PyTorch's 600 s ProcessGroupNCCL watchdog fired", FATAL,
    symptom="`Watchdog caught collective operation timeout ... Timeout(ms)=600000` after a long stall",
    detect="the watchdog line in a rank log",
    cause="a collective did not complete in PyTorch's timeout: a peer rank stopped (frozen, dead, D state) "
          "or the fabric went down; NCCL_TIMEOUT does not govern this",
    fix="find the rank that stopped (other findings: fabric, D state, OOM); the execute-model timeout is "
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, not NCCL_TIMEOUT",
    proof="grep -n 'Watchdog caught collective operation timeout' <rank logs>",
    signature=_sig_watchdog, source="anchors-2026-12 #16",
    lab="none: the lab's CPU vLLM uses gloo, not NCCL (fixture follows PyTorch's line)",
    lines=(r"Watchdog caught collective operation timeout",),
    words=(r"watchdog",
           r"600 ?(s|sec|seconds)\b|600000|collective|timeout|timed out",),
    # a watchdog timeout is a symptom with many causes (a stopped peer, the fabric, a hang in the engine's own
    # all-reduce fixed in a later release: heldout-9's fz9-wdog-01, vllm-project/vllm#3071): never "high" on its own;
    # the entry that shows the cause ranks above it
    downstream=True, inferred=True)


_GDR_LEVELS = {"0", "1", "2", "3", "4", "LOC", "PIX", "PXB", "PHB", "SYS", "NVL", "PXN"}


def _sig_inert_nccl(b: B.Bundle) -> list[Hit]:
    hits = []
    plan = plan_env(b.text(B.LOCAL, B.LOCAL_LAUNCH_PLAN))
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


INERT_NCCL_SETTINGS = Entry(
    "inert-nccl-settings", "NCCL settings that do nothing", WARNING,
    symptom="a timeout or GPUDirect setting was changed and nothing changed",
    detect="NCCL_TIMEOUT set, or NCCL_NET_GDR_LEVEL outside 0-4/LOC/PIX/PXB/PHB/SYS, in a rank's environment "
           "or the launch plan",
    cause="NCCL_TIMEOUT is not read by this path (the 600 s is PyTorch's watchdog); GDR levels above 4 are "
          "out of range and GPUDirect RDMA is not supported on Spark",
    fix="drop them from the profile / EXTRA env; use VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS for the execute timeout",
    proof="tr '\\0' '\\n' < /proc/<rank pid>/environ | grep -E 'NCCL_TIMEOUT|NCCL_NET_GDR_LEVEL'",
    signature=_sig_inert_nccl, source="anchors-2026-12 #16",
    lab="any lab profile with NCCL_TIMEOUT in EXTRA env (read from the launch plan)",
    words=(r"nccl_timeout|nccl_net_gdr_level|gdr[_ ]level ?=? ?5|gpudirect",
           r"(no|has no|without) effect|does nothing|nothing changed|ignored|still (600|times? out)|not (honou?red|read)",))


IB_QP_PAIRING_TIMEOUT = Entry(
    "ib-qp-pairing-timeout", "NCCL paired RoCE ports that share no cable (ibv_modify_qp errno 110)", FATAL,
    symptom="NCCL init dies with `unhandled system error` and `ibv_modify_qp failed with 110 Connection timed out`, "
            "while ping and nccl-tests over each cable work",
    detect="`ibv_modify_qp failed with 110` / `ibv_modify_qp ... Connection timed out` in a rank log",
    cause="NCCL pairs HCAs by their index across ranks: with same-port cabling in a three-node triangle "
          "(p0-p0, p1-p1), or an NCCL_IB_HCA list naming a port on another link, it pairs two ports that are not "
          "on one cable",
    fix="cable each link port 0 to port 1 (a crossed ring), set NCCL_IB_HCA per node to the ports of the cluster "
        "link only, and NCCL_IB_SUBNET_AWARE_ROUTING=1 on rings",
    proof="ibdev2netdev; ip -br addr   # on every node: which port carries which link",
    signature=None,
    source="luxingcom/aicad-nccl-optimization#1; eugr/spark-vllm-docker#252; getainode/ainode#89; "
           "bringup-anchors §5.7",
    lines=(r"ibv_modify_qp failed with (error )?110", r"ibv_modify_qp.*Connection timed out",
           r"non-zero status: 110.*ibv_modify_qp"),
    words=(r"ibv_modify_qp|modify_qp|errno 110|\b110\b",
           r"triangle|\bring\b|three[- ]node|3[- ]node|\b3 ?(x|×) ?(dgx )?spark|cabl\w*|\bp[01]\b|port ?[01]|same port",
           r"nccl|roce|rdma|hca"),
    lab="none: the lab has no RDMA device")
