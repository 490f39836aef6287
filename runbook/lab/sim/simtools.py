#!/usr/bin/env python3
"""Rehearsal simulators of the hardware-only tools: nvidia-smi, ibdev2netdev, ibv_devinfo, ib_write_bw,
ib_write_lat and nccl-tests' all_reduce_perf.

One file, standard library only (all_reduce_perf under mpirun loads OpenMPI's libmpi with ctypes, as the real
binary links it), installed on every lab node by ``runbook.lab.sim`` (bin/<tool> are
symlinks to this file; the tool is chosen by the name it was called as). Each simulator reads its node's
``node.json`` (written by the installer: this node's simulated DGX Spark -- its HCAs, which netdev each is
cabled to, its interfaces as ``ip -j addr`` reported them at install time, the GPU, the published figures)
and the node's simulated sysfs tree (``<root>/sys/class/infiniband/...``, the GID tables the network step
dumps). It checks the invocation it receives the way the real tool would fail on a DGX Spark -- device
names, GID indexes, interfaces, per-rank environment -- answers with the real tool's error text and a
non-zero exit when it is wrong, and otherwise prints output in the real format with the published figures.

Nothing here moves RDMA data or touches a GPU. What is real: the TCP exchange perftest does before its
test (client -> server address:port over the lab fabric) and everything around all_reduce_perf: OpenMPI's
``mpirun`` (not simulated) starts each rank on its node through its ``plm_rsh_agent`` (ssh over the fabric)
with the per-rank ``-x`` environment, and the ranks meet with MPI_Init/MPI_Allgather over OpenMPI's TCP
(``btl_tcp_if_include``), as nccl-tests' ranks do before NCCL starts.

Unit tests only (they run every "node" on one host): ``RUNBOOK_SIM_NODE`` points a process at another node's
node.json, and ``RUNBOOK_SIM_ADDRESS_MAP`` (``fabric-ip=local-ip,...``) gives each node's addresses a local
stand-in: connects go to the mapped address, and a perftest server listens on its own node's mapped address
instead of perftest's any-address.
"""
from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import socket
import sys
import time

NODE_ENV = "RUNBOOK_SIM_NODE"
ADDRESS_MAP_ENV = "RUNBOOK_SIM_ADDRESS_MAP"
TOOLS = ("nvidia-smi", "ibdev2netdev", "ibv_devinfo", "ib_write_bw", "ib_write_lat", "all_reduce_perf")
DASHES = "-" * 87


# --------------------------------------------------------------------------- node


def load_node() -> dict:
    path = os.environ.get(NODE_ENV) or os.path.join(
        os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "node.json")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def hca_info(node: dict, name: str) -> dict | None:
    return next((h for h in node["hcas"] if h["name"] == name), None)


def _port_dir(node: dict, hca: str, port: int = 1) -> str:
    return os.path.join(node["sysfs"], "class", "infiniband", hca, "ports", str(port))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def gid_entry(node: dict, hca: str, index: int) -> tuple[str, str, str]:
    """(gid, type, ndev) of one slot in the simulated sysfs; '' when the slot is absent/unused."""
    base = _port_dir(node, hca)
    return (_read(os.path.join(base, "gids", str(index))),
            _read(os.path.join(base, "gid_attrs", "types", str(index))),
            _read(os.path.join(base, "gid_attrs", "ndevs", str(index))))


def gid_ipv4(gid: str) -> str | None:
    if not gid or set(gid.replace(":", "")) <= {"0"}:
        return None
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def usable_gid(node: dict, hca: str, index: int) -> str | None:
    """The IPv4 of slot ``index`` when it is a populated RoCE v2 IPv4-mapped GID, else None."""
    gid, typ, _ = gid_entry(node, hca, index)
    return gid_ipv4(gid) if typ.strip().lower() == "roce v2" else None


def default_gid_index(node: dict, hca: str) -> int | None:
    """What perftest/NCCL pick without an explicit index: the first RoCE v2 IPv4 GID."""
    gids = os.path.join(_port_dir(node, hca), "gids")
    try:
        slots = sorted(int(n) for n in os.listdir(gids) if n.isdigit())
    except OSError:
        return None
    return next((i for i in slots if usable_gid(node, hca, i)), None)


def port_active(node: dict, hca: str) -> bool:
    return "ACTIVE" in _read(os.path.join(_port_dir(node, hca), "state")).upper()


def iface_networks(node: dict, netdev: str) -> list[ipaddress.IPv4Interface]:
    return [ipaddress.ip_interface(a) for a in node["interfaces"].get(netdev, {}).get("ipv4", [])]


def node_ipv4s(node: dict) -> set[str]:
    return {str(ipaddress.ip_interface(a).ip) for i in node["interfaces"].values() for a in i.get("ipv4", [])}


def routable(node: dict, hca: str, peer_ip: str) -> bool:
    """RoCE v2 resolves the peer's GID through the HCA's netdev: its IPv4 must be on that netdev's subnet."""
    h = hca_info(node, hca) or {}
    return any(ipaddress.ip_address(peer_ip) in n.network for n in iface_networks(node, h.get("netdev", "")))


def _address_map() -> dict[str, str]:
    return dict(p.split("=", 1) for p in os.environ.get(ADDRESS_MAP_ENV, "").split(",") if "=" in p)


def connect_address(ip: str) -> str:
    return _address_map().get(ip, ip)


def listen_address(node: dict) -> str:
    mapping = _address_map()
    return next((mapping[ip] for ip in sorted(node_ipv4s(node)) if ip in mapping), "0.0.0.0")


def gid_bytes(ipv4: str | None) -> str:
    """perftest's GID print: 16 decimal bytes, two digits, colon-separated."""
    raw = ipaddress.IPv6Address(f"::ffff:{ipv4}").packed if ipv4 else bytes(16)
    return ":".join(f"{b:02d}" for b in raw)


# --------------------------------------------------------------------------- nvidia-smi


def nvidia_smi(argv: list[str]) -> int:
    node = load_node()
    gpu = node["gpu"]
    if argv in (["-L"], ["--list-gpus"]):
        print(f"GPU 0: {gpu['name']} (UUID: {gpu['uuid']})")
        return 0
    query = fmt = None
    rest = list(argv)
    while rest:
        a = rest.pop(0)
        if a.startswith("--query-gpu="):
            query = a.split("=", 1)[1]
        elif a == "--query-gpu" and rest:
            query = rest.pop(0)
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format" and rest:
            fmt = rest.pop(0)
        else:
            query = None
            break
    if query is not None and fmt is not None and not rest:
        values = {"name": gpu["name"], "driver_version": gpu["driver"], "uuid": gpu["uuid"], "index": "0",
                  "pci.bus_id": gpu["bus_id"], "compute_cap": gpu["compute_cap"],
                  "memory.total": "[N/A]", "memory.used": "[N/A]", "memory.free": "[N/A]"}   # UMA: no VRAM
        fields = [f.strip() for f in query.split(",") if f.strip()]
        for f in fields:
            if f not in values:
                print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
                return 2
        opts = {o.strip() for o in fmt.split(",")}
        if "csv" not in opts:
            print(f'"{fmt}" is not a valid format.', file=sys.stderr)
            return 2
        if "noheader" not in opts:
            print(", ".join(fields))
        print(", ".join(values[f] for f in fields))
        return 0
    if not argv:
        print(f"{time.strftime('%a %b %d %H:%M:%S %Y')}")
        print("+-----------------------------------------------------------------------------------------+")
        print(f"| NVIDIA-SMI {gpu['driver']:<19}Driver Version: {gpu['driver']:<15}CUDA Version: {gpu['cuda']:<9}|")
        print("+-----------------------------------------+------------------------+----------------------+")
        print(f"|   0  {gpu['name']:<35}|   {gpu['bus_id']:<21}|                  N/A |")
        print("+-----------------------------------------+------------------------+----------------------+")
        return 0
    print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- ibdev2netdev / ibv_devinfo


def ibdev2netdev(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help") or any(a not in ("-v", "--verbose", "-h", "--help") for a in argv):
        print("ibdev2netdev <options>\n\n -h, --help        print help message\n -v, --verbose     print more info")
        return 0 if argv and argv[0] in ("-h", "--help") else 1
    node = load_node()
    verbose = bool(argv)
    for h in node["hcas"]:
        up = "Up" if h["up"] else "Down"
        if verbose:
            state = "ACTIVE" if port_active(node, h["name"]) else "DOWN"
            print(f"{h['pci']} {h['name']} (MT4129 - {h['board_id']}) fw {h['fw']} port {h['port']} ({state}) "
                  f"==> {h['netdev']} ({up})")
        else:
            print(f"{h['name']} port {h['port']} ==> {h['netdev']} ({up})")
    return 0


_MTU_CODE = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


def ibv_devinfo(argv: list[str]) -> int:
    node = load_node()
    want = None
    rest = list(argv)
    while rest:
        a = rest.pop(0)
        if a in ("-d", "--ib-dev") and rest:
            want = rest.pop(0)
        elif a.startswith("--ib-dev="):
            want = a.split("=", 1)[1]
        elif a in ("-v", "--verbose", "-l", "--list"):
            continue
        elif a in ("-i", "--ib-port") and rest:
            rest.pop(0)
        else:
            print(f"ibv_devinfo: invalid option -- '{a.lstrip('-')}'", file=sys.stderr)
            return 255
    hcas = node["hcas"]
    if want is not None:
        hcas = [h for h in hcas if h["name"] == want]
        if not hcas:
            print(f"IB device '{want}' wasn't found", file=sys.stderr)
            return 255
    for h in hcas:
        active = port_active(node, h["name"])
        mtu = h["active_mtu"]
        print(f"hca_id:\t{h['name']}\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t{h['fw']}\n"
              f"\tnode_guid:\t\t\t{h['node_guid']}\n\tsys_image_guid:\t\t\t{h['node_guid']}\n"
              f"\tvendor_id:\t\t\t0x02c9\n\tvendor_part_id:\t\t\t4129\n\thw_ver:\t\t\t\t0x0\n"
              f"\tboard_id:\t\t\t{h['board_id']}\n\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n"
              f"\t\t\tstate:\t\t\t{'PORT_ACTIVE (4)' if active else 'PORT_DOWN (1)'}\n"
              f"\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t{mtu} ({_MTU_CODE.get(mtu, 0)})\n"
              f"\t\t\tsm_lid:\t\t\t0\n\t\t\tport_lid:\t\t0\n\t\t\tport_lmc:\t\t0x00\n"
              f"\t\t\tlink_layer:\t\tEthernet\n")
    return 0


# --------------------------------------------------------------------------- perftest

PERFTEST_SHORT = {"-d": "ib_dev", "-i": "ib_port", "-p": "port", "-q": "qp", "-s": "size", "-D": "duration",
                  "-x": "gid_index", "-n": "iters", "-m": "mtu"}
PERFTEST_LONG = {"--ib-dev": "ib_dev", "--ib-port": "ib_port", "--port": "port", "--qp": "qp", "--size": "size",
                 "--duration": "duration", "--gid-index": "gid_index", "--iters": "iters", "--mtu": "mtu"}
PERFTEST_FLAGS = {"-F": "cpu_freq", "--CPU-freq": "cpu_freq", "--report_gbits": "gbits",
                  "--run_infinitely": "infinite", "-R": "rdma_cm", "--rdma_cm": "rdma_cm"}


class Usage(Exception):
    pass


def parse_perftest(tool: str, argv: list[str]) -> dict:
    opts: dict = {"ib_port": "1", "port": "18515", "qp": "1", "size": "65536" if tool == "ib_write_bw" else "2",
                  "iters": "5000" if tool == "ib_write_lat" else "5000", "server": ""}
    rest = list(argv)
    while rest:
        a = rest.pop(0)
        if a in PERFTEST_SHORT or a in PERFTEST_LONG:
            if not rest:
                raise Usage(f"{tool}: option requires an argument -- '{a.lstrip('-')}'")
            opts[PERFTEST_SHORT.get(a) or PERFTEST_LONG[a]] = rest.pop(0)
        elif "=" in a and a.split("=", 1)[0] in PERFTEST_LONG:
            k, v = a.split("=", 1)
            opts[PERFTEST_LONG[k]] = v
        elif a in PERFTEST_FLAGS:
            opts[PERFTEST_FLAGS[a]] = True
        elif a.startswith("-"):
            raise Usage(f"{tool}: unrecognized option '{a}'")
        elif not opts["server"]:
            opts["server"] = a
        else:
            raise Usage(f"{tool}: unexpected argument '{a}'")
    for k in ("ib_port", "port", "qp", "size", "iters", "gid_index", "duration"):
        if k in opts and not str(opts[k]).isdigit():
            raise Usage(f" Invalid value for {k}: {opts[k]}")
    return opts


def _perftest_header(tool: str, hca: str, o: dict, mtu: int, gid_index: int) -> str:
    bw = tool == "ib_write_bw"
    lines = [DASHES,
             f"                    {'RDMA_Write BW Test' if bw else 'RDMA_Write Latency Test'}",
             f" Dual-port       : OFF\t\tDevice         : {hca}",
             f" Number of qps   : {o['qp']}\t\tTransport type : IB",
             " Connection type : RC\t\tUsing SRQ      : OFF",
             f" PCIe relax order: {'ON' if bw else 'OFF'}\t\tLock-free      : OFF",
             " ibv_wr* API     : ON\t\tUsing DDP      : OFF"]
    lines += [" TX depth        : 128", " CQ Moderation   : 1", " CQE Poll Batch  : 16"] if bw else [" TX depth        : 1"]
    lines += [f" Mtu             : {mtu}[B]", " Link type       : Ethernet", f" GID index       : {gid_index}",
              f" Max inline data : {0 if bw else 220}[B]", " rdma_cm QPs\t : OFF", " Data ex. method : Ethernet", DASHES]
    return "\n".join(lines)


def _perftest_fail(lines: list[str], code: int = 1) -> int:
    for line in lines:
        print(line, file=sys.stderr)
    return code


def _exchange_server(port: int, mine: dict, timeout: float, bind: str = "0.0.0.0") -> dict | str:
    try:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((bind, port))
        srv.listen(1)
    except OSError as exc:
        return f" Couldn't listen to port {port} ({exc.strerror})"
    srv.settimeout(timeout)
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        return " Server timed out waiting for a client"
    finally:
        srv.close()
    with conn:
        conn.settimeout(10)
        peer = json.loads(conn.makefile().readline() or "{}")
        conn.sendall((json.dumps(mine) + "\n").encode())
    return peer


def _exchange_client(server: str, port: int, mine: dict) -> dict | str:
    try:
        with socket.create_connection((connect_address(server), port), timeout=5) as conn:
            conn.settimeout(10)
            conn.sendall((json.dumps(mine) + "\n").encode())
            return json.loads(conn.makefile().readline() or "{}")
    except (OSError, ValueError):
        return f" Couldn't connect to {server}:{port}"


def perftest(tool: str, argv: list[str]) -> int:
    try:
        o = parse_perftest(tool, argv)
    except Usage as exc:
        return _perftest_fail([str(exc), " Invalid Command or flag.", " Please check command line and run again."])
    node = load_node()
    hca = o.get("ib_dev") or (node["hcas"][0]["name"] if node["hcas"] else "")
    info = hca_info(node, hca)
    if info is None:
        return _perftest_fail([f" IB device {hca} not found", " Unable to find the Infiniband/RoCE device"])
    if o["ib_port"] != "1":
        return _perftest_fail([f" Invalid IB port {o['ib_port']} for device {hca} (phys_port_cnt 1)",
                               " Couldn't get context for the device"])
    if not port_active(node, hca):
        return _perftest_fail([" Port number 1 state is Down", " Couldn't set the link layer"])
    gid_index = int(o["gid_index"]) if "gid_index" in o else default_gid_index(node, hca)
    my_ip = usable_gid(node, hca, gid_index) if gid_index is not None else None
    mine = {"tool": tool, "hca": hca, "gid_index": gid_index, "ipv4": my_ip, "mtu": info["active_mtu"],
            "gbps": node["figures"]["rdma_gbps"].get(hca), "qp": o["qp"], "size": o["size"]}
    port = int(o["port"])
    server = o["server"]
    if server:
        peer = _exchange_client(server, port, mine)
        if isinstance(peer, str):
            return _perftest_fail([peer, "Unable to open file descriptor for socket connection "
                                         "Unable to init the socket connection"])
    else:
        peer = _exchange_server(port, mine, timeout=60, bind=listen_address(node))
        if isinstance(peer, str):
            return _perftest_fail([peer])
    if peer.get("tool") != tool:
        return _perftest_fail([f" The remote side runs {peer.get('tool')}, not {tool}",
                               " Unable to Connect the HCA's through the link"])
    mtu = min(info["active_mtu"], int(peer.get("mtu") or info["active_mtu"]))
    print(_perftest_header(tool, hca, o, mtu, gid_index if gid_index is not None else 0))
    rnd = random.Random(f"{hca}{port}{server}")
    for _ in range(int(o["qp"])):
        print(f" local address: LID 0000 QPN 0x{rnd.randrange(0x100, 0x1ff):04x} PSN 0x{rnd.randrange(1 << 24):06x} "
              f"RKey 0x1fed00 VAddr 0x00ffff{rnd.randrange(1 << 24):06x}00")
        print(f" GID: {gid_bytes(my_ip)}")
    for _ in range(int(o["qp"])):
        print(f" remote address: LID 0000 QPN 0x{rnd.randrange(0x100, 0x1ff):04x} PSN 0x{rnd.randrange(1 << 24):06x} "
              f"RKey 0x1fed00 VAddr 0x00ffff{rnd.randrange(1 << 24):06x}00")
        print(f" GID: {gid_bytes(peer.get('ipv4'))}")
    print(DASHES)
    # RoCE v2 needs a populated RoCE v2 IPv4 GID on both ends and a peer GID on this HCA's subnet
    if my_ip is None or not peer.get("ipv4") or not routable(node, hca, peer["ipv4"]):
        sys.stdout.flush()
        return _perftest_fail([" Failed to modify QP 0x%04x to RTR" % rnd.randrange(0x100, 0x1ff),
                               " Unable to Connect the HCA's through the link"])
    if not server:
        return 0                      # the passive side reports nothing further
    if tool == "ib_write_bw":
        gbps = min(g for g in (mine["gbps"], peer.get("gbps")) if g is not None)
        size = int(o["size"])
        rate = gbps * 1e9 / 8 / size
        iters = int(round(rate * int(o.get("duration") or 5))) if "duration" in o else int(o["iters"])
        print(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
        print(f" {size:<10} {iters:<16} {0.0 if 'duration' in o else gbps:<18.2f} {gbps:<.2f}     \t\t   "
              f"{rate / 1e6:.6f}")
    else:
        lat = node["figures"]["lat_us"]
        print(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]"
              "   99% percentile[usec]   99.9% percentile[usec] ")
        print(f" {int(o['size']):<7} {int(o['iters']):<14} {lat['t_min']:<14.2f} {lat['t_max']:<12.2f} "
              f"{lat['t_typical']:.2f}     \t{lat['t_avg']:.2f}    \t{lat['t_stdev']:.2f}   \t\t{lat['p99']:.2f}"
              f"    \t\t{lat['p999']:.2f}   ")
    print(DASHES)
    return 0


# --------------------------------------------------------------------------- MPI (OpenMPI's libmpi)

MPI_REPORT_BYTES = 1024          # one rank's report in the allgather, JSON padded with NULs


def load_libmpi():
    """OpenMPI's ``libmpi.so.40`` (what nccl-tests built with ``MPI=1`` links), loaded globally: OpenMPI's
    plugins resolve libmpi's symbols from the global namespace. None when it is not installed."""
    import ctypes
    import ctypes.util
    for name in ("libmpi.so.40", ctypes.util.find_library("mpi")):
        if not name:
            continue
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
    return None


def mpi_allgather(lib, report: dict, size: int) -> list:
    """MPI_Init, MPI_Allgather of every rank's report (as nccl-tests gathers its ranks' host hashes and
    devices before NCCL starts), MPI_Finalize. Returns one report per rank (None for an unreadable one);
    raises OSError when an MPI call fails (OpenMPI has printed why)."""
    import ctypes
    lib.MPI_Init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.MPI_Allgather.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    # OpenMPI's handles are the addresses of its predefined objects (mpi.h: &ompi_mpi_comm_world, &ompi_mpi_byte)
    world = ctypes.addressof(ctypes.c_char.in_dll(lib, "ompi_mpi_comm_world"))
    byte = ctypes.addressof(ctypes.c_char.in_dll(lib, "ompi_mpi_byte"))
    if lib.MPI_Init(None, None) != 0:
        raise OSError("MPI_Init failed")
    raw = json.dumps(report).encode()[:MPI_REPORT_BYTES]
    send = ctypes.create_string_buffer(raw, MPI_REPORT_BYTES)
    recv = ctypes.create_string_buffer(MPI_REPORT_BYTES * size)
    rc = lib.MPI_Allgather(send, MPI_REPORT_BYTES, byte, recv, MPI_REPORT_BYTES, byte, world)
    lib.MPI_Finalize()
    if rc != 0:
        raise OSError(f"MPI_Allgather failed ({rc})")
    out = []
    for k in range(size):
        chunk = recv.raw[k * MPI_REPORT_BYTES:(k + 1) * MPI_REPORT_BYTES].rstrip(b"\0")
        try:
            out.append(json.loads(chunk))
        except ValueError:
            out.append(None)
    return out


# --------------------------------------------------------------------------- all_reduce_perf


def _select(spec: str, names: list[str]) -> list[str]:
    """NCCL's device/interface list grammar: '^' excludes, '=' exact, else prefix; ':port' ignored."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    items = [s.split(":")[0] for s in spec.lstrip("=").split(",") if s]

    def hit(n: str) -> bool:
        return any(n == i if exact else n.startswith(i) for i in items)
    return [n for n in names if hit(n) != exclude]


def _parse_size(v: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KkMmGg]?)", v)
    if not m:
        raise ValueError(v)
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()])


def unreachable(ranks: list[dict]) -> list[tuple[int, int]]:
    """The rank pairs that cannot connect over what each is given: NCCL connects every rank to every other (rings
    and trees over all ranks). Two IB ranks need a subnet their devices' netdevs share (a RoCE QP to a GID off the
    netdev's subnet never leaves INIT->RTR: ibv_modify_qp 110, the TP=3 worker given only its head-facing port);
    otherwise the peer's OOB address must be on a subnet of this rank's socket interfaces."""
    lost = []
    for a in ranks:
        for b in ranks:
            if a["rank"] >= b["rank"]:
                continue
            if a["transport"] == "IB" and b["transport"] == "IB":
                ok = bool(set(a.get("nets", [])) & set(b.get("nets", [])))
            else:
                ok = all(any(ipaddress.ip_address(y["oob"]) in ipaddress.ip_network(n) for n in x.get("socket_nets", []))
                         for x, y in ((a, b), (b, a)) if y.get("oob"))
            if not ok:
                lost.append((a["rank"], b["rank"]))
    return lost


def _path_error(lost: list[tuple[int, int]], ranks: list[dict], rank: int, node: dict, ib_devs: list[str],
                gid_env: str | None, tag: str, host: str, out: list[str]) -> str:
    """NCCL's failure when some rank pair has no path (:func:`unreachable`), '' when none: the ranks of such a pair
    time out connecting (IB: ibv_modify_qp 110 in INIT->RTR; sockets: no route), every other rank sees its peer go."""
    mine = [pair for pair in lost if rank in pair]
    if not lost:
        return ""
    if not mine:
        return (f"{host}: Test NCCL failure common.cu:1279 'remote process exited or there was a network error / "
                f"NET/IB : peer rank failed during init'")
    peer = next(r for r in mine[0] if r != rank)
    them = ranks[peer]
    if ib_devs and ranks[rank]["transport"] == "IB" and them["transport"] == "IB":
        d = ib_devs[0]
        idx = int(gid_env) if gid_env and gid_env.isdigit() else default_gid_index(node, d)
        gid = gid_entry(node, d, idx)[0] if idx is not None else ""
        shown = str(ipaddress.IPv6Address(gid)) if gid else "::"
        msg = (f"Call to ibv_modify_qp failed with 110 Connection timed out, on dev {d}:1, curr state INIT, "
               f"next state RTR, local GID index {idx}, local GID {shown}")
        out.append(f"{tag} NCCL INFO NET/IB : no device of rank {rank} shares a subnet with rank {peer} "
                   f"({them['host']}): {', '.join(ranks[rank]['nets'])} vs {', '.join(them['nets']) or 'none'}")
        out.append(f"{tag} NCCL WARN {msg}")
        return (f"{host}: Test NCCL failure common.cu:1279 'unhandled system error (run with NCCL_DEBUG=INFO for "
                f"details) / {msg}'")
    msg = f"socketStartConnect: Connect to {them['oob']}<43125> failed : No route to host"
    out.append(f"{tag} NCCL WARN {msg}")
    return (f"{host}: Test NCCL failure common.cu:1279 'remote process exited or there was a network error / "
            f"{msg}'")


def all_reduce_perf(argv: list[str]) -> int:
    # flushed at every line, as NCCL's logger is (one block written at exit came cut far more). On mpirun's pty
    # print() still writes a line and its newline apart, and mpirun forwards what it reads, so a rank's line can
    # come in pieces with another rank's between them (as any line can, cut by a read): step 01 tags them
    # (mpirun --tag-output) and joins them back (facts.nccl.split_mpirun_output)
    sys.stdout.reconfigure(line_buffering=True)
    node = load_node()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    host = node.get("hostname") or socket.gethostname()
    pid = os.getpid()
    args = {"b": "33554432", "e": "33554432", "f": "1", "g": "1", "w": "5", "n": "20"}
    long_names = {"--minbytes": "b", "--maxbytes": "e", "--stepfactor": "f", "--ngpus": "g", "--warmup_iters": "w",
                  "--iters": "n"}
    rest = list(argv)
    try:
        while rest:
            a = rest.pop(0)
            key = a[1:] if len(a) == 2 and a[1:] in args else long_names.get(a)
            if key is None or not rest:
                raise ValueError(a)
            args[key] = rest.pop(0)
        minb, maxb, factor, ngpus = _parse_size(args["b"]), _parse_size(args["e"]), int(args["f"]), int(args["g"])
    except ValueError as exc:
        print(f"invalid option / value: {exc}")
        return 1
    out: list[str] = []
    tag = f"{host}:{pid}:{pid} [0]"
    error = ""
    n_ib = 0
    transport = ""
    if ngpus > 1:
        error = f"{host}: Test CUDA failure common.cu:892 'invalid device ordinal'"
    ifaces = [n for n, i in node["interfaces"].items() if n != "lo" and i.get("ipv4")]
    sock_env = os.environ.get("NCCL_SOCKET_IFNAME")
    chosen: list[str] = []
    oob = oob_ip = gid_env = ""
    if not error:
        if sock_env is not None:
            out.append(f"{tag} NCCL INFO NCCL_SOCKET_IFNAME set by environment to {sock_env}")
            chosen = _select(sock_env, ifaces)
        else:
            chosen = [n for n in ifaces if not n.startswith(("docker", "lo"))]
        if not chosen:
            out.append(f"{tag} NCCL WARN Bootstrap : no socket interface found")
            error = (f"{host}: Test NCCL failure common.cu:1279 'invalid usage (run with NCCL_DEBUG=WARN for details) "
                     f"/ Bootstrap : no socket interface found'")
        else:
            oob = chosen[0]
            oob_ip = str(ipaddress.ip_interface(node["interfaces"][oob]["ipv4"][0]).ip)
            out.append(f"{tag} NCCL INFO Bootstrap : Using {oob}:{oob_ip}<0>")
            out.append(f"{tag} NCCL INFO cudaDriverVersion {node['gpu']['cuda_driver']}")
            if rank == 0:
                out.append(f"NCCL version {node['figures']['nccl_version']}")
    ib_devs: list[str] = []
    if not error:
        active = [h["name"] for h in node["hcas"] if port_active(node, h["name"])]
        if os.environ.get("NCCL_IB_DISABLE", "0") != "1":
            hca_env = os.environ.get("NCCL_IB_HCA")
            if hca_env is not None:
                out.append(f"{tag} NCCL INFO NCCL_IB_HCA set to {hca_env}")
                ib_devs = _select(hca_env, active)
            else:
                ib_devs = active
        gid_env = os.environ.get("NCCL_IB_GID_INDEX")
        if not ib_devs:
            out.append(f"{tag} NCCL INFO NET/IB : No device found.")
            out.append(f"{tag} NCCL INFO NET/Socket : Using [0]{oob}:{oob_ip}<0>")
            out.append(f"{tag} NCCL INFO Using network Socket")
            transport = "Socket"
        else:
            out.append(f"{tag} NCCL INFO NET/IB : Using " + " ".join(f"[{k}]{d}:1/RoCE" for k, d in enumerate(ib_devs))
                       + f" [RO]; OOB {oob}:{oob_ip}<0>")
            out.append(f"{tag} NCCL INFO Using network IB")
            transport, n_ib = "IB", len(ib_devs)
            for d in ib_devs:
                idx = int(gid_env) if gid_env and gid_env.isdigit() else default_gid_index(node, d)
                gid, _, _ = gid_entry(node, d, idx) if idx is not None else ("", "", "")
                if idx is None or usable_gid(node, d, idx) is None:
                    zero = not gid or set(gid.replace(":", "")) <= {"0"}
                    errno_text = "61 No data available" if zero else "110 Connection timed out"
                    shown = "::" if zero else str(ipaddress.IPv6Address(gid))
                    msg = (f"Call to ibv_modify_qp failed with {errno_text}, on dev {d}:1, curr state INIT, "
                           f"next state RTR, local GID index {idx}, local GID {shown}")
                    out.append(f"{tag} NCCL WARN {msg}")
                    error = (f"{host}: Test NCCL failure common.cu:1279 'unhandled system error (run with "
                             f"NCCL_DEBUG=INFO for details) / {msg}'")
                    break
    # what a peer must share with this rank to connect: the subnets of its IB devices' netdevs (a RoCE QP reaches
    # a peer's GID only on the HCA netdev's own subnet), else the OOB address its sockets connect to
    nets = sorted({str(n.network) for d in ib_devs for n in iface_networks(node, (hca_info(node, d) or {}).get("netdev", ""))})
    socket_nets = sorted({str(n.network) for i in chosen for n in iface_networks(node, i)})
    report = {"rank": rank, "host": host, "pid": pid, "ok": not error, "n_ib": n_ib, "transport": transport,
              "nets": nets, "oob": oob_ip if transport else "", "socket_nets": socket_nets}
    if size > 1:                # started by OpenMPI's mpirun: the ranks meet through real MPI
        lib = load_libmpi()
        if lib is None:
            print(f"{sys.argv[0]}: error while loading shared libraries: libmpi.so.40: cannot open shared object "
                  "file: No such file or directory (install openmpi-bin)", file=sys.stderr)
            return 127
        try:
            ranks = mpi_allgather(lib, report, size)
        except OSError as exc:
            print(f"{host}: MPI failure: {exc}")
            return 1
    else:
        ranks = [report]
    if not error and len(ranks) == size and all(r and r["ok"] for r in ranks):
        error = _path_error(unreachable(ranks), ranks, rank, node, ib_devs, gid_env, tag, host, out)
    if rank == 0:
        print(f"# nThread 1 nGpus {ngpus} minBytes {minb} maxBytes {maxb} step: {factor}(factor) warmup iters: "
              f"{args['w']} iters: {args['n']} agg iters: 1 validation: 1 graph: 0\n#\n# Using devices")
        for r in ranks:
            if r:
                print(f"#  Rank {r['rank']:>2} Group  0 Pid {r['pid']:>6} on {r['host']:>10} device  0 "
                      f"[{node['gpu']['nccl_bus']}] {node['gpu']['name']}")
        print("#")
    for line in out:
        print(line)
    if error:
        print(error)
        print(f" .. {host} pid {pid}: Test failure common.cu:1103")
        if "peer rank failed during init" in error:
            time.sleep(1.0)     # it learns of the failure only after a rank of the pair gave up (as in NCCL)
        return 1
    if len(ranks) != size or not all(r and r["ok"] for r in ranks):
        print(f"{host}: Test NCCL failure common.cu:1279 'remote process exited or there was a network error / "
              f"NET/IB : peer rank failed during init'")
        print(f" .. {host} pid {pid}: Test failure common.cu:1103")
        return 1
    if transport == "IB":
        for k in range(n_ib):
            print(f"{host}:{pid}:{pid + 18} [0] NCCL INFO Channel {k:02d}/0 : {rank}[0] -> {(rank + 1) % size}[0] "
                  f"[send] via NET/IB/{k}")
    if rank != 0:
        return 0
    fig = node["figures"]["nccl_busbw_gbs"]
    used = min(r["n_ib"] for r in ranks)
    busbw = fig["socket"] if any(r["transport"] != "IB" for r in ranks) else fig[str(min(used, 2))]
    print("#                                                              out-of-place                       in-place          ")
    print("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong")
    print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ")
    algbw = busbw * size / (2 * (size - 1)) if size > 1 else busbw
    total, count = 0.0, 0
    b = minb
    while b <= maxb:
        t_us = b / (algbw * 1e9) * 1e6
        print(f"{b:>12d}  {b // 4:>12d}     float     sum      -1  {t_us:>7.1f}  {algbw:>6.2f}  {busbw:>6.2f}      0  "
              f"{t_us:>7.1f}  {algbw:>6.2f}  {busbw:>6.2f}      0")
        total += busbw * 2
        count += 2
        if factor <= 1:
            break
        b *= factor
    print("# Out of bounds values : 0 OK")
    print(f"# Avg bus bandwidth    : {total / max(count, 1):.4f} ")
    print("#")
    return 0


# --------------------------------------------------------------------------- entry


def main() -> int:
    tool = os.path.basename(sys.argv[0])
    argv = sys.argv[1:]
    if tool not in TOOLS and argv and argv[0] in TOOLS:       # python simtools.py <tool> ...
        tool, argv = argv[0], argv[1:]
    if tool == "nvidia-smi":
        return nvidia_smi(argv)
    if tool == "ibdev2netdev":
        return ibdev2netdev(argv)
    if tool == "ibv_devinfo":
        return ibv_devinfo(argv)
    if tool in ("ib_write_bw", "ib_write_lat"):
        return perftest(tool, argv)
    if tool == "all_reduce_perf":
        return all_reduce_perf(argv)
    print(f"simtools: unknown tool {tool!r} (one of {', '.join(TOOLS)})", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
