"""Collective facts: the NCCL environment every rank gets (:func:`nccl_env`, the serving ranks' and step 01's
nccl-tests' alike), nccl-tests output, NCCL INIT/NET log lines, and the gloo all-reduce sweep JSON printed by
``runbook/facts/allreduce_sweep.py``. Parsers are pure."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from ..profile import rank_gid_index

# --------------------------------------------------------------------------- mpirun --tag-output

_MPI_TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")


@dataclass
class MpirunOutput:
    ranks: dict[int, list[str]] = field(default_factory=dict)   # each rank's own lines (stdout and stderr)
    own: list[str] = field(default_factory=list)                # untagged lines: mpirun's (ORTE's, ssh's) own
    lines: list[str] = field(default_factory=list)              # every whole line, in the order it completed
    tagged: bool = False

    @property
    def text(self) -> str:
        return "".join(l + "\n" for l in self.lines)


def split_mpirun_output(text: str) -> MpirunOutput:
    """Each rank's whole lines out of ``mpirun --tag-output``'s combined output. OpenMPI (4.1) forwards a rank's
    output in the chunks it reads from the rank's pty, and a read can end mid-line (under load it does); a chunk of
    another rank then lands inside that line. --tag-output starts every chunk with ``[job,rank]<stream>:`` and puts
    the tag after every newline inside a chunk, so a cut line still says whose it is::

        [1,0]<stdout>:spark-head:42:42 [0] NCCL INFO NET/IB : Us[1,1]<stdout>:spark-worker:7:7 [0] NCCL INFO Using network IB
        [1,0]<stdout>:ing [0]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:169.254.77.1<0>

    A tag's text up to its first newline continues that rank's stream; text after that newline carries no tag, so
    it is mpirun's own (``own``). Text with no tag at all (mpirun failed before any rank ran, or an archive from
    before --tag-output) comes back line for line."""
    out = MpirunOutput()
    parts = _MPI_TAG.split(text or "")
    out.tagged = len(parts) > 1
    partial: dict = {}

    def feed(key, chunk: str) -> None:
        *done, partial[key] = (partial.get(key, "") + chunk).split("\n")
        for line in done:
            emit(key, line)

    def emit(key, line: str) -> None:
        out.lines.append(line)
        (out.own if key is None else out.ranks.setdefault(key[0], [])).append(line)

    feed(None, parts[0])
    for k in range(1, len(parts), 3):
        mine, newline, rest = parts[k + 2].partition("\n")
        feed((int(parts[k]), parts[k + 1]), mine + newline)
        feed(None, rest)
    for key, rest in partial.items():         # a last line without its newline
        if rest:
            emit(key, rest)
    return out


# --------------------------------------------------------------------------- the ranks' NCCL environment

# seed A nccl_common (start.sh @ 503b482, seeds-repos.md §A.4): its NCCL part, values as start.sh exports them
# ("shrink NCCL pinned buffers on UMA (4.7 GiB -> ~0.14 GiB)")
SEED_A_NCCL: dict[str, str] = {
    "NCCL_IB_DISABLE": "0", "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_NET": "IB", "NCCL_NET_PLUGIN": "none",
    "NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0", "NCCL_IB_MERGE_NICS": "0", "NCCL_CROSS_NIC": "0",
    "NCCL_IGNORE_CPU_AFFINITY": "1", "NCCL_DEBUG": "WARN", "NCCL_BUFFSIZE": "1048576",
    "NCCL_LL128_BUFFSIZE": "262144", "NCCL_PROTO": "^LL128", "NCCL_MAX_NCHANNELS": "8",
}
# seed B docker-compose.dspark.yml environment @ 01eed1e (seeds-repos.md §B.3): its NCCL part
SEED_B_NCCL: dict[str, str] = {
    "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ROCE_VERSION_NUM": "2",
    "NCCL_CROSS_NIC": "1", "NCCL_CUMEM_ENABLE": "0", "NCCL_IGNORE_CPU_AFFINITY": "1", "NCCL_DEBUG": "WARN",
    "NCCL_NVLS_ENABLE": "0",
}
RECIPE_NCCL: dict[str, dict[str, str]] = {"exl3-v41": SEED_A_NCCL, "dspark-v4": SEED_B_NCCL}
# a mesh without a switch (seed B TP3's triangle, docs/TP3.md; seeds-repos.md §B.11; a switchless ring likewise):
# every pair of nodes has its own cable on its own /24, so a node's HCAs sit on different subnets. NCCL must not
# merge the ports and must pair GIDs per /24 (the default /16 would take 10.0.22 and 10.0.23 for one subnet). On a
# switch every rank is on one /24 behind its port(s): the recipe's own settings apply unchanged.
MESH_NCCL: dict[str, str] = {
    "NCCL_IB_MERGE_NICS": "0", "NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_SUBNET_PREFIX_LEN": "24",
}
# what step 01's nccl-tests add over the ranks' environment: the INFO log it reads the transport and HCAs from
MESH_TOPOLOGIES = ("triangle", "ring")
NCCL_TESTS_DIAG: dict[str, str] = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def nccl_env(profile, spec, gid_index: int | None = None) -> dict[str, str]:
    """The NCCL environment of the rank on node ``spec`` (a ``NodeSpec``): the recipe's NCCL settings, the mesh
    routing on a triangle or ring (not on a switch), and this node's own values -- ``NCCL_SOCKET_IFNAME``
    (BOOTSTRAP_IF when set, else its fabric netdev), ``NCCL_IB_HCA`` (its ``<NODE>_CX7_IB``, with EXPECT_RDMA) and
    ``NCCL_IB_GID_INDEX`` (:func:`runbook.profile.rank_gid_index`: pinned, or ``gid_index`` resolved by step 01,
    unset under seed B's auto). The one source of both the serving ranks' NCCL variables (launch render) and step
    01's nccl-tests line (``network/collectives.py``): what 01 proves is what the ranks run."""
    p = profile
    env = dict(RECIPE_NCCL.get(p.recipe, {}))
    if p.recipe in RECIPE_NCCL and p.topology in MESH_TOPOLOGIES:
        env.update(MESH_NCCL)
    env["NCCL_SOCKET_IFNAME"] = spec.socket_if
    if p.expect_rdma and spec.ib_devs:
        env["NCCL_IB_HCA"] = ",".join(spec.ib_devs)
        gid = rank_gid_index(p, spec.gid, gid_index)
        if gid is not None:
            env["NCCL_IB_GID_INDEX"] = str(gid)
    return env


def nccl_envs(profile, gid_indexes: Mapping[str, int | None] | None = None) -> dict[str, dict[str, str]]:
    """:func:`nccl_env` of every node, in rank order (``gid_indexes``: node name -> the index step 01 resolved)."""
    return {spec.name: nccl_env(profile, spec, (gid_indexes or {}).get(spec.name)) for spec in profile.nodes}


# --------------------------------------------------------------------------- nccl-tests


@dataclass
class NcclTestRow:
    size: int
    count: int
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    oop_wrong: str = "0"
    ip_wrong: str = "0"


@dataclass
class NcclTest:
    test: str = ""                       # "all_reduce_perf" when recognisable
    rows: list[NcclTestRow] = field(default_factory=list)
    avg_busbw_gbs: float | None = None   # "# Avg bus bandwidth    : 23.74"
    out_of_bounds: int | None = None
    ranks: int = 0
    error: str = ""

    @property
    def max_busbw_gbs(self) -> float | None:
        vals = [max(r.oop_busbw, r.ip_busbw) for r in self.rows]
        return max(vals) if vals else None

    @property
    def wrong(self) -> bool:
        return any(w not in ("0", "N/A") for r in self.rows for w in (r.oop_wrong, r.ip_wrong))


def parse_nccl_tests(text: str) -> NcclTest:
    """Parse ``all_reduce_perf`` / ``all_gather_perf`` output (nccl-tests 2.x). Sample::

        # nThread 1 nGpus 1 minBytes 8388608 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
        #
        # Using devices
        #  Rank  0 Group  0 Pid   4242 on spark-head device  0 [000f:01:00] NVIDIA GB10
        #  Rank  1 Group  0 Pid   3131 on spark-worker device  0 [000f:01:00] NVIDIA GB10
        #
        #                                                              out-of-place                       in-place
        #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
        #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
             8388608       2097152     float     sum      -1    705.2   11.90   11.90      0    702.8   11.94   11.94      0
        # Out of bounds values : 0 OK
        # Avg bus bandwidth    : 18.8543

    Older all_gather_perf builds omit the ``redop``/``root`` columns, so rows are read from the
    right: the last eight fields are time/algbw/busbw/#wrong for out-of-place then in-place. Output of
    ``mpirun --tag-output`` is read as its ranks' whole lines (:func:`split_mpirun_output`).
    """
    text = split_mpirun_output(text).text
    out = NcclTest()
    m = re.search(r"\b(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv)_perf\b", text)
    if m:
        out.test = m.group(0)
    out.ranks = len(re.findall(r"^#\s+Rank\s+\d+\s", text, re.MULTILINE))
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        toks = line.split()
        if len(toks) < 10 or not toks[0].isdigit() or not toks[1].isdigit():
            continue
        try:
            t = toks[-8:]
            out.rows.append(NcclTestRow(size=int(toks[0]), count=int(toks[1]),
                                        oop_time_us=float(t[0]), oop_algbw=float(t[1]),
                                        oop_busbw=float(t[2]), oop_wrong=t[3],
                                        ip_time_us=float(t[4]), ip_algbw=float(t[5]),
                                        ip_busbw=float(t[6]), ip_wrong=t[7]))
        except ValueError:
            continue
    m = re.search(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)", text)
    if m:
        out.avg_busbw_gbs = float(m.group(1))
    m = re.search(r"#\s*Out of bounds values\s*:\s*(\d+)", text)
    if m:
        out.out_of_bounds = int(m.group(1))
    if not out.rows:
        m = re.search(r"^.*(NCCL error|Test NCCL failure|unhandled system error|ORTE|mpirun).*$", text, re.MULTILINE)
        out.error = m.group(0).strip() if m else "no result rows in nccl-tests output"
    return out


# --------------------------------------------------------------------------- NCCL INFO log


@dataclass
class NcclNet:
    transport: str = ""                         # "IB" | "Socket" | "" (not seen)
    hcas: list[str] = field(default_factory=list)   # ["rocep1s0f0:1/RoCE", ...]
    oob_if: str = ""                            # "enp1s0f0np0"
    socket_ifs: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)    # distinct "NET/IB/0", "NET/IB/1/GDRDMA", ...
    version: str = ""
    gdr: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def hca_names(self) -> list[str]:
        return [h.split(":")[0] for h in self.hcas]


def parse_nccl_log(text: str) -> NcclNet:
    """Parse ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET`` lines. Samples::

        spark-head:4242:4242 [0] NCCL INFO Bootstrap : Using enp1s0f0np0:192.168.100.1<0>
        spark-head:4242:4242 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.100.1<0>
        spark-head:4242:4242 [0] NCCL INFO Using network IB
        spark-head:4242:4260 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0

    TCP fallback prints ``NET/Socket : Using [0]enp1s0f0np0:169.254.77.1<0>`` and
    ``Using network Socket``. Output of ``mpirun --tag-output`` is read as its ranks' whole lines.
    """
    text = split_mpirun_output(text).text
    out = NcclNet()
    m = re.search(r"NCCL version (\S+)", text)
    if m:
        out.version = m.group(1)
    m = re.search(r"NET/IB : Using (.*?)(?:;\s*OOB (\S+?):|\s*$)", text, re.MULTILINE)
    if m:
        out.hcas = re.findall(r"\[\d+\](\S+?:\d+/\w+)", m.group(1))
        if m.group(2):
            out.oob_if = m.group(2)
    m = re.search(r"NET/Socket : Using (.*)$", text, re.MULTILINE)
    if m:
        out.socket_ifs = re.findall(r"\[\d+\](\S+?):", m.group(1))
    nets = re.findall(r"Using network (\w+)", text)
    if nets:
        out.transport = nets[-1]
    elif out.hcas:
        out.transport = "IB"
    elif out.socket_ifs:
        out.transport = "Socket"
    out.via = sorted(set(re.findall(r"via (NET/[\w/]+)", text)))
    out.gdr = any("GDRDMA" in v for v in out.via)
    if out.via and not nets:
        out.transport = "IB" if any(v.startswith("NET/IB") for v in out.via) else "Socket"
    out.errors = [l.strip() for l in text.splitlines()
                  if re.search(r"NCCL WARN|unhandled system error|ibv_\w+ failed", l)][:10]
    return out


# --------------------------------------------------------------------------- gloo sweep

SWEEP_SCRIPT = Path(__file__).with_name("allreduce_sweep.py")


@dataclass
class SweepPoint:
    bytes: int
    iters: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float


@dataclass
class Sweep:
    rank: int | None = None
    world_size: int | None = None
    backend: str = ""
    iface: str = ""
    correct: bool | None = None
    points: list[SweepPoint] = field(default_factory=list)
    error: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def peak_busbw_gbs(self) -> float | None:
        return max((p.busbw_gbs for p in self.points), default=None)


def parse_allreduce_sweep(text: str) -> Sweep:
    """Parse the JSON line printed by ``allreduce_sweep.py`` (the last line starting with ``{``), or the raw file
    step 01 archives from it (one JSON document, ``network.collectives.sweep_record``).
    Sample::

        {"tool": "allreduce_sweep", "backend": "gloo", "rank": 0, "world_size": 2,
         "iface": "enp1s0f0np0", "correct": true, "torch": "2.9.0+cpu",
         "results": [{"bytes": 1024, "iters": 20, "time_us": 210.5, "algbw_gbs": 0.00486,
                      "busbw_gbs": 0.00486}, ...]}

    ``algbw = bytes / time``, ``busbw = algbw * 2 (n-1) / n`` (nccl-tests convention), GB/s = 1e9 B/s.
    On failure the script prints ``{"tool": "allreduce_sweep", "error": "..."}``.
    """
    out = Sweep()
    data = None
    try:        # the raw file step 01 archives is one (indented) JSON document with the script's line's fields
        whole = json.loads(text or "")
        data = whole if isinstance(whole, dict) else None
    except json.JSONDecodeError:
        pass
    for line in ([] if data is not None else reversed((text or "").splitlines())):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if not isinstance(data, dict):
        tail = (text or "").strip().splitlines()[-1:] or ["<empty>"]
        out.error = f"no sweep JSON in output (last line: {tail[0][:200]})"
        return out
    out.raw = data
    out.error = str(data.get("error", "") or "")
    out.rank, out.world_size = data.get("rank"), data.get("world_size")
    out.backend, out.iface = str(data.get("backend", "")), str(data.get("iface", ""))
    out.correct = data.get("correct")
    for r in data.get("results", []) or []:
        try:
            out.points.append(SweepPoint(bytes=int(r["bytes"]), iters=int(r["iters"]),
                                         time_us=float(r["time_us"]), algbw_gbs=float(r["algbw_gbs"]),
                                         busbw_gbs=float(r["busbw_gbs"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out
