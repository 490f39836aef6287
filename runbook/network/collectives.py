"""All-reduce across the nodes over the fabric: nccl-tests' ``all_reduce_perf`` under mpirun and the gloo
all-reduce sweep.

nccl-tests runs one rank per node, each with its own node's NCCL env; the sweep is
``runbook/facts/allreduce_sweep.py``, one rank per node.

Check rows: ``net.nccl.busbw``, ``net.nccl.transport``, ``net.nccl.hcas`` (N/A without GPU or RDMA; SIMULATED
in a rehearsal, where OpenMPI's real mpirun starts nccl-tests' simulator of ``runbook.lab.sim`` on every node)
and ``net.allreduce`` (real in a rehearsal too; N/A without a python with torch).
"""
from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass

from ..checks import check, not_applicable
from ..facts import nccl as fn
from . import tools
from ..facts.node_paths import vllm_python
from .context import Verification, Rail, ReadFailure, iface_of, read, split_list, text_of
from .rdma import GidPlan

SWEEP_PORT = 29531
SWEEP_MAX_BYTES = 16 << 20
SIM_NCCL = ("OpenMPI's mpirun (real) started every rank on its own node over ssh; all_reduce_perf is the simulator: "
            "it checked the NCCL_SOCKET_IFNAME, NCCL_IB_HCA and NCCL_IB_GID_INDEX its rank received there; busbw "
            "is the published figure for the HCAs used (manifest.json)")


@dataclass
class NcclRank:
    """One nccl-tests rank, rendered with ITS node's values (recipe A: head enp1s0f1np1/rocep1s0f1,
    worker enp1s0f0np0/rocep1s0f0 -- the head's values on the worker name an interface it does not have)."""
    node: str
    host: str                  # mpirun -H: the node's fabric address
    env: dict[str, str]        # the rank's NCCL environment: facts.nccl.nccl_env, the serving rank's own
    tests_dir: str             # this node's nccl-tests build directory

    @property
    def socket_if(self) -> str:
        return self.env.get("NCCL_SOCKET_IFNAME", "")

    @property
    def hcas(self) -> list[str]:
        return split_list(self.env.get("NCCL_IB_HCA", ""))

    @property
    def gid_index(self) -> int | None:
        gid = self.env.get("NCCL_IB_GID_INDEX")
        return None if gid is None else int(gid)


def nccl_rank(profile, spec, *, gid_index: int | None, tests_dir: str) -> NcclRank:
    """The nccl-tests rank on node ``spec``, with the NCCL environment its serving rank gets
    (:func:`runbook.facts.nccl.nccl_env`; ``gid_index``: the index step 01 resolved for the node)."""
    return NcclRank(node=spec.name, host=str(spec.fabric_ip), env=fn.nccl_env(profile, spec, gid_index),
                    tests_dir=tests_dir)


def nccl_tests_cmd(ranks: list[NcclRank], *, mpi_include: list[str], test: str = "all_reduce_perf",
                   timeout_s: int = 180, as_root: bool = False) -> str:
    """mpirun MPMD, one app context (rank) per node, each with its own NCCL env (``-x`` per variable: the rank's
    environment plus the INFO log the step reads, ``facts.nccl.NCCL_TESTS_DIAG``) and binary path; OpenMPI's TCP
    traffic restricted to ``mpi_include`` (the ranks' socket subnets, CIDR: valid on every node). ``--tag-output``:
    OpenMPI forwards each rank's output in chunks that can end mid-line, with another rank's chunk in between;
    the tag on every chunk lets the step put each rank's lines back together (``facts.nccl.split_mpirun_output``)."""
    apps = []
    for r in ranks:
        env = {**r.env, **fn.NCCL_TESTS_DIAG}
        xs = " ".join(f"-x {shlex.quote(f'{k}={v}')}" for k, v in env.items()) + " -x LD_LIBRARY_PATH"
        binary = shlex.quote(posixpath.join(r.tests_dir, test))
        apps.append(f"-np 1 -H {r.host}:1 {xs} {binary} -b 8M -e 128M -f 2 -g 1")
    include = shlex.quote(",".join(mpi_include))
    root = " --allow-run-as-root" if as_root else ""
    return (f"timeout {timeout_s} mpirun{root} --tag-output --mca plm_rsh_agent 'ssh -o BatchMode=yes' "
            f"--mca btl self,tcp --mca btl_tcp_if_include {include} --mca oob_tcp_if_include {include} "
            + " : ".join(apps) + " 2>&1")


def nccl_ranks(ctx: Verification, gid: GidPlan) -> tuple[list[NcclRank], list[str]]:
    """Each node's rank (a loop over the nodes, however many) and the subnets of the ranks' socket interfaces
    (for OpenMPI's if_include)."""
    ranks, nets = [], []
    for node in ctx.nodes:
        # the index the rank itself gets (unset under seed B's auto): 01 proves what runs
        rank = nccl_rank(ctx.profile, node.spec, gid_index=gid.per_node.get(node.name),
                         tests_dir=ctx.nccl_dirs.get(node.name) or "nccl-tests/build")
        ranks.append(rank)
        nets += [str(n) for n in iface_of(ctx.facts[node.name], rank.socket_if).ipv4_networks]
    return ranks, list(dict.fromkeys(nets)) or list(dict.fromkeys(r.socket_if for r in ranks))


def rank_logs(text: str, nodes) -> dict[str, str]:
    """Each node's rank's own output, whole lines (NCCL's log and nccl-tests' lines), from mpirun's tagged
    output: rank k is the k-th app context, the k-th node. '' for a rank that printed nothing."""
    ranks = fn.split_mpirun_output(text).ranks
    return {node.name: "\n".join(ranks.get(k, [])) for k, node in enumerate(nodes)}


def rank_failures(ranks: list[NcclRank], logs: dict[str, str]) -> list[str]:
    """What each failing rank's own NCCL log says, with the setting of that rank it points at: an
    ``NCCL_SOCKET_IFNAME`` naming no interface of the node, an ``NCCL_IB_HCA`` without a RoCE path to a peer
    (QP RTR timeout, errno 110), an ``NCCL_IB_GID_INDEX`` the HCA cannot use, or the rank's first ``NCCL WARN``
    line. Ranks whose log shows no failure are not listed."""
    out = []
    for r in ranks:
        log = logs.get(r.node, "")
        warns = [l.split("NCCL WARN", 1)[1].strip() for l in log.splitlines() if "NCCL WARN" in l]
        if not warns:
            continue
        if any("no socket interface found" in w for w in warns):
            out.append(f"{r.node}: NCCL_SOCKET_IFNAME={r.socket_if} names no interface of {r.node} "
                       "(NCCL: Bootstrap : no socket interface found)")
        elif any("ibv_modify_qp failed with 110" in w for w in warns):       # a peer its HCAs have no subnet to
            out.append(f"{r.node}: NCCL_IB_HCA={','.join(r.hcas)} gives {r.node} no RoCE path to a peer (QP RTR "
                       f"timed out): list both CX ports in {r.node.upper()}_CX7_IB (see net.path.*): "
                       f"{next(w for w in warns if 'ibv_modify_qp' in w)}")
        elif any("ibv_modify_qp failed" in w for w in warns):
            out.append(f"{r.node}: NCCL_IB_GID_INDEX={'unset' if r.gid_index is None else r.gid_index} on "
                       f"{','.join(r.hcas)}: {next(w for w in warns if 'ibv_modify_qp' in w)}")
        else:
            out.append(f"{r.node}: {warns[0]}")
    return out


def nccl_checks(ctx: Verification, gid: GidPlan) -> None:
    """nccl-tests' all_reduce_perf across all nodes: bus bandwidth, NET/IB on every rank, each rank's HCAs."""
    if not ctx.expect_gpu:
        ctx.add(not_applicable("net.nccl", "not applicable on this profile (EXPECT_GPU=0)", node="cluster"))
        return
    if not ctx.expect_rdma:
        ctx.add(not_applicable("net.nccl", "not applicable on this profile (EXPECT_RDMA=0: no NET/IB to test)", node="cluster"))
        return
    head = ctx.nodes[0]
    ranks, include = nccl_ranks(ctx, gid)
    cmd = nccl_tests_cmd(ranks, mpi_include=include, as_root=_is_root(head))
    r = read(head, cmd, 240)
    text = text_of(r)
    ev = [ctx.save("nccl_all_reduce_perf.txt", text)]
    res = fn.parse_nccl_tests(text)
    logs = rank_logs(text, ctx.nodes)
    per_rank = {name: fn.parse_nccl_log(log) for name, log in logs.items()}
    min_bus = ctx.profile.min_nccl_busbw_gbs
    if res.avg_busbw_gbs is None:
        failures = rank_failures(ranks, logs)
        ctx.add_hw(check("net.nccl.busbw", False, node="cluster",
                         observed="; ".join([f"nccl-tests: {res.error}", *failures]), expected=f">= {min_bus} GB/s",
                         fix=("fix the named rank's setting (<NODE>_CX7_IF / BOOTSTRAP_IF for NCCL_SOCKET_IFNAME, "
                              "<NODE>_CX7_IB for NCCL_IB_HCA, <NODE>_GID for NCCL_IB_GID_INDEX) and run 01 again"
                              if failures else
                              "see net.tools for nccl-tests on every node; the log's NCCL WARN / Test NCCL failure "
                              "lines name the rank"),
                         evidence=ev, data={"rank_failures": failures}), SIM_NCCL)
    else:
        ctx.add_hw(check("net.nccl.busbw", res.avg_busbw_gbs >= min_bus and not res.wrong, node="cluster",
                         observed=f"avg busbw {res.avg_busbw_gbs} GB/s (max {res.max_busbw_gbs}), #wrong {'>0' if res.wrong else '0'}",
                         expected=f">= {min_bus} GB/s (MIN_NCCL_BUSBW_GBS), no wrong results",
                         fix="use both twins in NCCL_IB_HCA, MTU 9000, the release NCCL build", evidence=ev,
                         data={"avg_busbw_gbs": res.avg_busbw_gbs, "rows": [vars(x) for x in res.rows]}), SIM_NCCL)
    seen = {n: (log.transport or "not seen") for n, log in per_rank.items()}
    ctx.add_hw(check("net.nccl.transport", all(t == "IB" for t in seen.values()), node="cluster",
                     observed="; ".join(f"{n}: {t} ({', '.join(per_rank[n].via) or 'no channels'})" for n, t in seen.items()),
                     expected="NET/IB on every rank (not NET/Socket; GDRDMA is not supported on Spark)",
                     fix="NCCL fell back to TCP: pass /dev/infiniband, IPC_LOCK and memlock=-1 to the container; NCCL_IB_DISABLE must be 0; "
                         "NET/IB : No device found means NCCL_IB_HCA names no ACTIVE HCA of that node",
                     evidence=ev), SIM_NCCL)
    for rank in ranks:
        log = per_rank[rank.node]
        used = set(log.hca_names)
        missing = [h for h in rank.hcas if h not in used]
        ctx.add_hw(check("net.nccl.hcas", bool(used) and not missing, node=rank.node,
                         observed=f"NET/IB using {', '.join(log.hcas) or 'none'} (NCCL_IB_HCA={','.join(rank.hcas)})",
                         expected=f"all of {', '.join(rank.hcas)} (this node's {rank.node.upper()}_CX7_IB)",
                         fix=f"set {rank.node.upper()}_CX7_IB to the ACTIVE HCAs of {rank.node} (ibdev2netdev; both twins of the "
                             "cabled port for full bandwidth)", evidence=ev), SIM_NCCL)


def _is_root(node) -> bool:
    try:
        return tools.node_user(node).is_root
    except Exception:  # noqa: BLE001 - unknown user: render without the flag; mpirun then says why
        return False


def sweep_cmd(python: str, *, rank: int, world_size: int, master: str, iface: str,
              port: int = SWEEP_PORT, max_bytes: int = SWEEP_MAX_BYTES, timeout_s: int = 120) -> str:
    script = fn.SWEEP_SCRIPT.read_text()
    args = (f"--rank {rank} --world-size {world_size} --master-addr {shlex.quote(master)} --master-port {port} "
            f"--iface {shlex.quote(iface)} --max-bytes {min(int(max_bytes), 64 << 20)} --timeout 60")
    return f"timeout {timeout_s} {python} - {args} <<'RUNBOOK_SWEEP_EOF'\n{script}\nRUNBOOK_SWEEP_EOF"


def sweep_record(res) -> str:
    """The raw file of one rank's sweep, always one JSON document: the script's JSON line (or an error object
    when it printed none), plus ``exit_code`` and, when there were any, ``stderr`` (torch's warnings, a
    traceback) and the other ``stdout`` lines as fields. (The stderr used to follow the JSON as plain text,
    so the ``.json`` file did not parse.)"""
    sw = fn.parse_allreduce_sweep(res.stdout)
    doc = dict(sw.raw) if sw.raw else {"tool": "allreduce_sweep", "error": sw.error}
    doc["exit_code"] = res.exit_code
    other = [l for l in (res.stdout or "").splitlines() if l.strip() and not l.strip().startswith("{")]
    if other:
        doc["stdout"] = "\n".join(other)
    if (res.stderr or "").strip():
        doc["stderr"] = res.stderr
    return json.dumps(doc, indent=2) + "\n"


def sweep_checks(ctx: Verification, rails: list[Rail], python: str | None, max_bytes: int, min_busbw: float) -> None:
    """A gloo all-reduce sweep (1 KiB .. max_bytes) over rail 0, one rank per node, its results verified."""
    python = python or vllm_python(ctx.profile)
    if not python:
        ctx.add(not_applicable("net.allreduce", "not applicable on this profile (no python with torch: VLLM_BIN names no python path; pass sweep_python)",
                               node="cluster"))
        return
    rail = rails[0]
    ranks = {n.name: k for k, n in enumerate(ctx.nodes)}
    if all(n.name in rail.ends for n in ctx.nodes):
        master = rail.ends[ctx.nodes[0].name].ip
        ifaces = {n.name: rail.ends[n.name].iface for n in ctx.nodes}
    else:       # no rail joins every node (per-subnet rails): the all-reduce runs where vLLM's Gloo does
        master = ctx.profile.master_addr
        ifaces = {n.name: n.spec.socket_if or split_list(n.spec.fabric_if)[0] for n in ctx.nodes}

    def run(node):
        cmd = sweep_cmd(python, rank=ranks[node.name], world_size=len(ctx.nodes), master=master,
                        iface=ifaces[node.name], max_bytes=max_bytes)
        return read(node, cmd, 150)

    outs = ctx.cluster.each(run)
    for node in ctx.nodes:
        r = outs[node.name]
        r = r if not isinstance(r, Exception) else ReadFailure(255, "", str(r))
        ev = [ctx.save(f"allreduce_sweep_{node.name}.json", sweep_record(r))]
        sw = fn.parse_allreduce_sweep(r.stdout)
        if sw.error or not sw.points:
            ctx.add(check("net.allreduce", False, node=node.name, observed=f"sweep failed: {sw.error or 'no results'}",
                          expected="gloo all-reduce 1 KiB..16 MiB completes", evidence=ev,
                          fix=f"check {python} has torch, port {SWEEP_PORT} is free, and GLOO_SOCKET_IFNAME={ifaces[node.name]} reaches {master}"))
            continue
        peak = sw.peak_busbw_gbs or 0.0
        last = sw.points[-1]
        ok = bool(sw.correct) and peak >= min_busbw
        ctx.add(check("net.allreduce", ok, node=node.name,
                      observed=f"gloo busbw {last.busbw_gbs * 8:.2f} Gb/s at {last.bytes >> 10} KiB, peak {peak * 8:.2f} Gb/s, correct={sw.correct}",
                      expected="results correct" + (f", peak busbw >= {min_busbw} GB/s" if min_busbw else ""),
                      fix="wrong all-reduce results or low bandwidth over the fabric: check the IF, MTU and firewall",
                      evidence=ev, data={"kind": "allreduce", "points": [vars(p) for p in sw.points], "backend": sw.backend}))
