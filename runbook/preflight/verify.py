"""Step 00 — preflight: can this pair of nodes run the recipe at all?

Reads facts on every node in parallel and compares them with the profile. Changes nothing.
"""
from __future__ import annotations

import ipaddress
import re
import time
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable, simulated
from ..errors import RunbookError
from .. import fit
from ..facts import net as fnet
from ..facts import residue, system
from ..facts.system import plan_image
from ..facts.ranks import RankState, rank_state
from ..records import DiskFree, PreflightNode, PreflightRecord
from ..remote import Cluster, Node, node_ssh_argv, quote
from ..site import SPARKS_SITE, Site
from .node_needs import node_needs

GIB = 1024 ** 3


def gather(cluster: Cluster, profile) -> dict[str, dict[str, Any]]:
    """Read every fact preflight needs from every node, in parallel."""
    def disk_paths(node: Node) -> dict[str, str]:
        # each node's own weights dir (WORKER_WEIGHTS_DIR on a worker); `~/…` reaches df as "$HOME"/… (the node's)
        return {name: value for name, value in (("weights", profile.weights_dir_on(node.name)),
                                                ("cache", profile.cache_dir),
                                                ("engram", profile.engram_packed_dir)) if value}

    def read_node(node: Node) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        facts["os"] = system.parse_os(node.read(system.OS_CMD).stdout)
        facts["mem"] = system.parse_meminfo(node.read(system.MEMINFO_CMD).stdout)
        facts["disk"] = {}
        for label, path in disk_paths(node).items():
            res = node.read(system.disk_free_cmd(path))
            facts["disk"][label] = system.parse_disk_free(res.stdout) if res.ok else res.stderr.strip()
        facts["listening"] = system.parse_listening(node.read(system.LISTEN_CMD).stdout)
        docker = node.read(system.DOCKER_CMD)
        facts["docker"] = docker.stdout.strip() if docker.ok else None
        facts["docker_error"] = "" if docker.ok else (docker.stdout + docker.stderr).strip()
        facts["image"] = system.parse_image(node.read(system.image_cmd(profile.image)).stdout) if docker.ok else None
        facts["containers"] = node.read(system.CONTAINERS_CMD).stdout.strip().splitlines() if docker.ok else []
        facts["vllm_procs"] = system.parse_vllm_processes(node.read(system.VLLM_PROCS_CMD).stdout)
        facts["rank"] = rank_state(node, profile)   # the runbook's own rank on this node, if one runs
        facts["fit"] = fit.gather_node(node, profile)
        gpu = node.read(system.GPU_CMD)
        facts["gpu_text"] = gpu.stdout.strip()
        facts["gpus"] = system.parse_gpus(gpu.stdout)
        facts["driver"] = node.read(system.DRIVER_CMD).stdout.strip() or None
        facts["residue"] = _read_residue(node, profile, docker.ok and facts["image"] is not None)
        return facts

    return cluster.each(read_node)


def _read_residue(node: Node, profile, image_present: bool) -> dict[str, str]:
    """What residue_checks reads: nvidia module options, the driver's header, and the nccl.conf the ranks will
    see (inside the image for the docker runtime: a throw-away container with no network; else the host's)."""
    r = {"modprobe": node.read(residue.MODPROBE_CMD, timeout=15).stdout,
         "smi": node.read(residue.NVIDIA_SMI_CMD, timeout=20).stdout if profile.expect_gpu else "",
         "image_env": "", "nccl_conf": "", "nccl_conf_where": "/etc/nccl.conf, ~/.nccl.conf on the host"}
    if profile.runtime == "docker" and image_present:
        r["image_env"] = node.read(residue.image_env_cmd(profile.image), timeout=20).stdout
        r["nccl_conf"] = node.read(residue.image_nccl_conf_cmd(profile.image), timeout=90).stdout
        r["nccl_conf_where"] = f"/etc/nccl.conf in {profile.image}"
    else:
        r["nccl_conf"] = node.read(residue.HOST_NCCL_CONF_CMD, timeout=10).stdout
    if builds_kernels(profile) is True:        # only where a rank compiles kernels at first boot
        r["jit_env"] = node.read(residue.JIT_ENV_CMD, timeout=10).stdout
    return r


def builds_kernels(profile) -> bool | str:
    """True when the profile's ranks may compile CUDA kernels at first boot (FlashInfer's JIT and the
    recipes' TileLang/DeepGEMM/Triton), else why not."""
    if profile.lab:
        return "lab: the CPU vLLM build compiles no CUDA kernels"
    if not profile.expect_gpu:
        return "no GPU on this profile: no CUDA kernel is compiled"
    return True


def clock_offsets(cluster: Cluster) -> dict[str, tuple[float, float]]:
    """Offset of each node's clock from the local clock (Cristian: node time minus the
    midpoint of the round trip) and the uncertainty (half the round trip), in seconds."""
    def probe(node: Node) -> tuple[float, float]:
        best = None
        for _ in range(3):
            sent = time.time()
            res = node.read(system.CLOCK_CMD, timeout=10)
            received = time.time()
            remote = float(res.stdout.strip())
            rtt = received - sent
            sample = (remote - (sent + received) / 2, rtt / 2)
            if best is None or sample[1] < best[1]:
                best = sample
        return best
    return cluster.each(probe)


def _why_unreadable(node: Node, error: Exception) -> str:
    """The fix for a node whose probes failed. A probe that timed out is most often a df or a stat under a network
    mount whose server is gone (NFS, sshfs: every stat below it blocks): /proc/mounts, which never blocks, names the
    network mounts, and each is stat'ed under a hard limit to name the one that does not answer."""
    fix = getattr(error, "fix", "") or ""
    if "timed out" not in str(error):
        return fix or "run the command of the commands log on the node by hand and read its error"
    try:
        mounts = system.parse_network_mounts(node.read(system.MOUNTS_CMD, timeout=10).stdout)
        dead = system.parse_unanswered_mounts(
            node.read(system.unanswered_mounts_cmd(mounts), timeout=10 + 6 * len(mounts)).stdout, mounts) \
            if mounts else []
    except RunbookError:
        return fix or "a probe hung on the node: find the blocked process (ps -eo pid,stat,wchan,args | grep ' D')"
    if dead:
        return ("a network mount does not answer, and every probe under it blocks: " +
                "; ".join(f"{m.fstype} {m.source} on {m.mountpoint}" for m in dead) +
                f" -- bring its server back, or unmount it: sudo umount -l {quote(dead[0].mountpoint)}; then re-run 00")
    return fix or ("a probe hung on the node with every network mount answering: find the blocked process "
                   "(ps -eo pid,stat,wchan,args | grep ' D') and re-run 00")


def run_checks(cluster: Cluster, profile, *, site: Site = SPARKS_SITE) -> tuple[CheckList, dict[str, Any]]:
    """All preflight checks. Returns the checks and the facts (for the sidecar). ``site``: its simulators are
    installed before any GPU/RDMA fact is read (a rehearsal's simulated Spark), and their rows say so."""
    checks = CheckList()
    reach = cluster.each(lambda node: node.read("hostname", timeout=15).stdout.strip())
    for name, value in reach.items():
        checks.add(check("ssh reachable", not isinstance(value, Exception), node=name,
                         observed=str(value).splitlines()[0] if isinstance(value, Exception) else f"hostname {value}",
                         expected="key-only SSH with a verified host key",
                         fix=getattr(value, "fix", "") or "see the error above", cause="node"))
    alive = [n for n in cluster if not isinstance(reach[n.name], Exception)]
    if len(alive) < len(cluster.nodes):
        return checks, {"reach": {k: str(v) for k, v in reach.items()}}
    checks.add(site.install_simulators(cluster, profile))     # none on the Sparks

    facts = gather(cluster, profile)
    data: dict[str, Any] = {"nodes": {}}
    for name, value in facts.items():
        if isinstance(value, Exception):
            checks.add(check("facts readable", False, node=name, observed=str(value).splitlines()[0],
                             expected="all preflight probes answer",
                             fix=_why_unreadable(next(n for n in cluster.nodes if n.name == name), value)))
    good = {k: v for k, v in facts.items() if not isinstance(v, Exception)}

    checks.add(fabric_ssh_checks(cluster, profile))
    checks.add(parity_checks(good, simulators=site.simulated))
    for name, f in good.items():
        data["nodes"][name] = _node_summary(f)
        checks.add(_docker(name, f, profile))
        checks.add(_disk(name, f, profile))
        checks.add(_memory(name, f, profile))
        checks.add(_ports(name, f, profile))
        checks.add(_stale(name, f, profile))
        checks.add(gpu_check(name, f, profile, site=site))
        checks.add(residue_checks(name, f, profile, site=site))
    checks.add(_image_identity(good, profile))
    checks.add(node_needs(cluster, profile))     # python3 for the shipped tools; NFS packages and sudo rules
    checks.add(_fit(good, facts, profile, data))
    offsets = clock_offsets(cluster)
    checks.add(_clock(offsets, profile))
    data["clock_offsets_s"] = {k: (list(v) if not isinstance(v, Exception) else str(v))
                               for k, v in offsets.items()}
    return checks, data


# -- individual checks ---------------------------------------------------------------------------
def fabric_ssh_checks(cluster: Cluster, profile) -> list[Check]:
    """key-only ssh from every node to every other's ``<NODE>_IP``, where the source can reach that address: from the
    head (the runbook's rsync and mpirun start there), or from a node with an address on its subnet. On a fabric of
    point-to-point cables (seed B's TP3 ring) a worker is not on the cable between the head and the other worker:
    that direction is N/A, not a failure (no route exists, and the runbook does not use it)."""
    out = []
    pairs = [(a, b) for a in cluster for b in cluster if a is not b and b.spec.fabric_ip]
    nets = {}
    members = list(cluster)
    for node in (members if len(members) > 2 else []):     # two nodes: one cable joins them
        if not node.spec.is_head:
            addrs = fnet.parse_ip_addr(node.read(fnet.IP_ADDR_CMD, timeout=20).stdout).values()
            nets[node.name] = [net for itf in addrs for net in itf.ipv4_networks]
    for src, dst in pairs:
        if src.name in nets and not any(ipaddress.ip_address(dst.spec.fabric_ip) in n for n in nets[src.name]):
            out.append(not_applicable(f"ssh {src.name}→{dst.name} over fabric",
                                      f"{dst.spec.fabric_ip} ({dst.name.upper()}_IP) is on a cable {src.name} is not on "
                                      "(point-to-point fabric); the runbook's node-to-node ssh starts on the head",
                                      node=src.name))
            continue
        argv = node_ssh_argv(profile, src, dst.spec.fabric_ip) + ["hostname"]
        res = src.read(quote(*argv), timeout=20)
        out.append(check(f"ssh {src.name}→{dst.name} over fabric", res.ok, node=src.name,
                         observed=f"hostname {res.stdout.strip()}" if res.ok
                         else (res.stderr.strip() or f"exit {res.exit_code}"),
                         expected=f"key-only ssh to {dst.spec.fabric_ip} answers",
                         fix=f"install {src.name}'s public key on {dst.name} and add {dst.spec.fabric_ip} "
                             f"to {src.name}'s known_hosts (ssh-copy-id; ssh-keyscan)"))
    return out


def parity_checks(facts: dict[str, dict[str, Any]], simulators: bool = False) -> list[Check]:
    """OS, kernel, architecture and driver identical on every node (``simulators``: the driver's version is a
    simulator's, a rehearsal's)."""
    if len(facts) < 2:
        return []
    out = []
    for label, getter in (("OS parity", lambda f: f["os"].pretty_name),
                          ("kernel parity", lambda f: f["os"].kernel),
                          ("architecture parity", lambda f: f["os"].machine),
                          ("driver parity", lambda f: f["driver"] or "none")):
        values = {name: getter(f) for name, f in facts.items()}
        same = len(set(values.values())) == 1
        row = check(label, same, node="cluster", observed=", ".join(f"{k}={v}" for k, v in values.items()),
                    expected="identical on every node",
                    fix="install the same OS image / kernel / driver on every node")
        # a rehearsal's driver version comes from the simulated nvidia-smi: never a plain PASS
        out.append(simulated(row, "driver version from the rehearsal's nvidia-smi simulator")
                   if simulators and label == "driver parity" else row)
    return out


def docker_fix(error: str, node: str) -> str:
    """The fix of a ``docker engine`` FAIL from what ``docker version`` said: a socket the SSH user may not open is
    the docker group, not a missing daemon."""
    if "permission denied" in error.lower() and "docker.sock" in error:
        return (f"on {node}: sudo usermod -aG docker <the SSH user>, then log in again (every docker command of "
                "the runbook runs as the SSH user, through the docker group)")
    return "install docker and start dockerd (lab: make lab-up starts it in each node)"


def _docker(name: str, f: dict[str, Any], profile) -> list[Check]:
    out = [check("docker engine", f["docker"] is not None, node=name,
                 observed=f"server {f['docker']}" if f["docker"] else f["docker_error"][:200],
                 expected="docker daemon answering the SSH user",
                 fix=docker_fix(f["docker_error"], name))]
    if f["docker"] is not None and f["image"] is not None:
        out.append(check("runtime image present", True, node=name, observed=f["image"].image_id[:19],
                         expected=profile.image))
    return out


def _image_identity(facts: dict[str, dict[str, Any]], profile) -> list[Check]:
    images = {name: f["image"] for name, f in facts.items() if f.get("image")}
    missing = sorted(name for name, f in facts.items() if f["docker"] is not None and not f.get("image"))
    if missing and profile.runtime != "docker":
        return []          # the process runtime needs no image; one present is still compared below
    if missing:
        # missing is not a failure by itself: 04_launch pulls or ships it; preflight says which, or why not
        plan = plan_image(profile, {name: f.get("image") for name, f in facts.items()})
        return [check("runtime image obtainable", plan.action != "fail", node=",".join(missing),
                      observed=f"absent on {', '.join(missing)}; 04_launch will {plan.action}: {plan.reason}",
                      expected=f"{profile.image} present, or pullable / shippable by 04_launch",
                      fix=f"docker pull {profile.image} on the head (or docker load a saved image there), "
                          "then rerun", warn_only=plan.action == "pull-head")]
    if len(images) < 2:
        return []
    ids = {name: img.image_id for name, img in images.items()}
    layers = {name: tuple(img.layers) for name, img in images.items()}
    same = len(set(layers.values())) == 1
    return [check("runtime image identical", same, node="cluster",
                  observed=", ".join(f"{k}={v[:19]}" for k, v in ids.items()) +
                  ("" if same else " (layer digests differ)"),
                  expected="same layer digests on every node",
                  fix="ship the head's image to the worker (docker save | docker load) or pull the "
                      "same pinned digest on both",
                  data={"image_ids": ids})]


def _disk(name: str, f: dict[str, Any], profile) -> list[Check]:
    needs = {"weights": profile.weights_gib, "engram": profile.engram_gib if profile.engram else 0,
             "cache": 0}
    out = []
    for label, info in f["disk"].items():
        need_gib = float(needs.get(label) or 0)
        if isinstance(info, str):
            out.append(check(f"disk free at {label} path", False, node=name, observed=info,
                             expected="a readable filesystem", fix="create the directory's parent"))
            continue
        free_gib = info.avail_bytes / GIB
        out.append(check(f"disk free at {label} path", free_gib >= need_gib, node=name,
                         observed=f"{free_gib:.2f} GiB free on {info.mount} (at {info.existing_path})",
                         expected=f">= {need_gib:.2f} GiB",
                         fix=f"free {need_gib - free_gib:.1f} GiB on {info.mount} or point the path elsewhere",
                         data={"free_bytes": info.avail_bytes, "need_gib": need_gib}))
    return out


def _memory(name: str, f: dict[str, Any], profile) -> Check:
    avail = f["mem"].get("MemAvailable", 0) / GIB
    need = float(profile.weight_budget_gib) + float(profile.boot_margin_gib)
    own = _own_server(f["rank"])
    if own:     # the memory is held by the server step 04 will reuse or refuse
        return Check("memory available", node=name, status=Status.NOOP,
                     observed=f"MemAvailable {avail:.1f} GiB while {own} runs",
                     expected=f">= {need:.1f} GiB before a launch; {_REUSE}",
                     data={"mem_available_bytes": f["mem"].get("MemAvailable", 0), "need_gib": need})
    return check("memory available", avail >= need, node=name, observed=f"MemAvailable {avail:.1f} GiB",
                 expected=f">= {need:.1f} GiB (weights {profile.weight_budget_gib} + margin {profile.boot_margin_gib})",
                 fix="stop other workloads (docker ps; free -g) or drop the page cache before launch",
                 data={"mem_available_bytes": f["mem"].get("MemAvailable", 0), "need_gib": need})


def _fit(good: dict[str, dict[str, Any]], facts: dict[str, Any], profile, data: dict[str, Any]) -> list[Check]:
    """The fit planner on the facts just read (``runbook.fit``); its plan is kept for ``runbook plan --facts``."""
    running = [name for name, f in good.items() if _own_server(f["rank"])]
    if running:
        return [Check("fit: plan", node="cluster", status=Status.NOOP,
                      observed=f"not re-planned: the runbook's server runs on {', '.join(running)} and holds the memory",
                      expected=f"a plan before a launch; {_REUSE}")]
    plan = fit.fit_plan(profile, facts)
    data["fit"] = plan.to_dict()
    return plan.to_checks()


def _own_server(st: RankState) -> str:
    """How a rank the runbook itself started is described in the rows below ('' when none runs)."""
    if not st.running:
        return ""
    run_id = (st.record or {}).get("run_id") or "an earlier run"
    return (f"the runbook's own {st.runtime} rank (fingerprint {st.fingerprint[:12] or '?'}, started by "
            f"{run_id})")


_REUSE = ("04_launch reuses it when the profile renders the same fingerprint, and refuses otherwise "
          "(then: python -m runbook stop --profile <profile>, or run 04 with action='restart')")


def _ports(name: str, f: dict[str, Any], profile) -> list[Check]:
    out = []
    own = _own_server(f["rank"])
    for label, port in (("API port", profile.port), ("master port", profile.master_port)):
        owner = f["listening"].get(int(port))
        if owner is not None and own:
            out.append(Check(f"{label} {port} free", node=name, status=Status.NOOP,
                             observed=f"held by {own}", expected=f"free, or held by the runbook's server: {_REUSE}"))
            continue
        out.append(check(f"{label} {port} free", owner is None, node=name,
                         observed=f"in use by {owner or 'a process'}" if owner is not None else "free",
                         expected="free",
                         fix=f"python -m runbook stop --profile {profile.source or '<profile>'} (stops every rank of an "
                             f"earlier run, orphaned EngineCore/Worker processes included); if what listens on {port} "
                             "is not vLLM, stop it (ss -ltnp names it) -- changing the port would leave orphans "
                             "holding memory"))
    return out


def _stale(name: str, f: dict[str, Any], profile) -> Check:
    st: RankState = f["rank"]
    own = _own_server(st)
    ours = {profile.container_head, profile.container_worker} - {""}
    containers = [line for line in f["containers"] if line.split("\t", 1)[0] in ours]
    procs = f["vllm_procs"]
    if own:
        # our running rank's container and processes are not stale; anything else still is
        containers = []
        if st.runtime == "process":
            mine = {p.split(" ", 1)[0] for p in st.processes}
            procs = [p for p in procs if p.split(" ", 1)[0] not in mine]
        else:
            procs = []
    # a stopped container of the profile's own name is not a rank: the launch removes it before it starts one, as
    # the recipes' scripts do (left e.g. when the lab was reshaped for a three-node rehearsal)
    leftovers = [c for c in containers if not c.split("\t")[1:2] or not c.split("\t")[1].startswith("Up")]
    containers = [c for c in containers if c not in leftovers]
    stale = containers + procs
    if leftovers and not stale and not own:
        return Check("no stale vLLM ranks", node=name, status=Status.NOOP,
                     observed="stopped container(s) of this profile: " + "; ".join(leftovers)[:250],
                     expected="no running vLLM from an earlier run; the launch removes this profile's stopped "
                              "containers before it starts")
    if own and not stale:
        return Check("no stale vLLM ranks", node=name, status=Status.NOOP, observed=f"{own} is running",
                     expected=f"no vLLM from an earlier run, or the runbook's server: {_REUSE}")
    return check("no stale vLLM ranks", not stale, node=name,
                 observed="; ".join(stale)[:300] if stale else "none",
                 expected="no vLLM container or process from an earlier run",
                 fix="stop them with the command of the profile that started them: python -m runbook stop --profile "
                     f"{profile.source} if this profile did, a rehearsal's with python -m runbook stop --rehearse "
                     "--profile <its recipe profile> (`run` sets a shipped recipe's rehearsal aside by itself); "
                     "else docker rm -f the container / kill the processes")


def gpu_check(name: str, f: dict[str, Any], profile, *, site: Site = SPARKS_SITE) -> Check:
    if not profile.expect_gpu:
        return not_applicable("GPU present", f"profile expects no GPU; nvidia-smi says: {f['gpu_text'][:80]}",
                              node=name, expected="none (EXPECT_GPU=0)")
    gpus = f["gpus"]
    ok = any("GB10" in g for g in gpus)
    row = check("GPU present", ok, node=name, observed=", ".join(gpus) or f["gpu_text"][:120],
                expected="NVIDIA GB10", fix="check the driver: nvidia-smi must list the GB10")
    if site.simulated:
        return simulated(row, f"nvidia-smi is the rehearsal's simulator ({site.simulator_bin}): the lab has no GPU; "
                              f"it prints the GB10 of a DGX Spark in nvidia-smi's format (driver {f['driver']})")
    return row


#: nvidia module options seen on stock installs (display set-up, power management): not residue
_STOCK_NVIDIA_OPTIONS = re.compile(r"^(modeset|fbdev|NVreg_PreserveVideoMemoryAllocations|NVreg_TemporaryFilePath|"
                                   r"NVreg_DynamicPowerManagement|NVreg_EnableGpuFirmware|NVreg_UsePageAttributeTable|"
                                   r"NVreg_OpenRmEnableUnsupportedGpus|NVreg_EnableS0ixPowerManagement)=")


def residue_checks(name: str, f: dict[str, Any], profile, *, site: Site = SPARKS_SITE) -> list[Check]:
    """Kernel, driver and image residue from the field reports (docs/diagnose.md): the kernel's CMA pool, a
    leftover nccl.conf, the image's CUDA against the driver, nvidia modprobe overrides. N/A where the profile
    does not use what they break (no RDMA, no GPU, no image)."""
    r = f.get("residue") or {}
    out: list[Check] = []
    cma = residue.cma_total_kb(f["mem"])
    cma_text = f"CmaTotal {cma} kB" if cma is not None else "CmaTotal not reported by this kernel"
    if not profile.expect_rdma or profile.lab:
        why = "no RDMA on this profile" if not profile.expect_rdma else "lab hardware: no RDMA device registers memory here"
        out.append(not_applicable("kernel CMA pool", f"{why} ({cma_text})", node=name,
                                  expected="CmaTotal > 0 kB where RDMA registers memory"))
    else:
        out.append(check("kernel CMA pool", bool(cma), node=name, observed=cma_text,
                         expected="CmaTotal > 0 kB (131072 kB on DGX OS)",
                         fix="boot a kernel with a CMA pool (7.0.0-1019-nvidia reports CmaTotal 0 and every "
                             "ibv_reg_mr fails with ENOMEM; 6.17.0-1031-nvidia does not), or add cma= to the "
                             "kernel command line"))
    conf = residue.parse_nccl_conf(r.get("nccl_conf", ""))
    bad = residue.risky_nccl_settings(conf)
    where = r.get("nccl_conf_where", "nccl.conf")
    out.append(check("no NCCL residue in nccl.conf", not bad, node=name,
                     observed=(f"{', '.join(bad)} in {where}" if bad else
                               f"{where}: {len(conf)} setting(s), none that freezes warm-up" if conf else
                               f"{where}: absent"),
                     expected="no NCCL_IB_USE_INLINE=1 or NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS=1",
                     fix="set NCCL_IB_USE_INLINE=0 and NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS=0 in the profile's "
                         "EXTRA env (the environment wins over the file), or rebuild the image without "
                         "/etc/nccl.conf", data={"nccl_conf": conf}))
    if not profile.expect_gpu:
        out.append(not_applicable("driver supports the image's CUDA", "no GPU on this profile", node=name,
                                  expected="the driver's CUDA >= the image's"))
    elif profile.runtime != "docker" or not r.get("image_env"):
        out.append(not_applicable("driver supports the image's CUDA",
                                  "no image on this node to compare (process runtime, or the image is not "
                                  "pulled yet)", node=name, expected="the driver's CUDA >= the image's"))
    else:
        drv = residue.parse_nvidia_smi_header(r.get("smi", ""))
        img = residue.parse_image_cuda(r["image_env"])
        ok = residue.driver_supports(drv.cuda, img)
        row = check("driver supports the image's CUDA", bool(ok), node=name, warn_only=ok is None,
                    observed=f"driver {drv.driver or '?'} supports CUDA {drv.cuda or 'unread'}; "
                             f"{profile.image} has CUDA {img or 'unread'}",
                    expected="the driver's CUDA >= the image's (else CUDA error 222 / 'driver version is "
                             "insufficient' at the first kernel)",
                    fix="use an image built for this driver's CUDA, or update the driver on every node to the "
                        "same version", data={"driver": drv.driver, "driver_cuda": drv.cuda, "image_cuda": img})
        out.append(simulated(row, "the driver's header comes from the rehearsal's nvidia-smi")
                   if site.simulated else row)
    out.append(jit_jobs_check(name, r, profile))
    opts = residue.parse_modprobe_nvidia(r.get("modprobe", ""))
    odd = [o for o in opts if "override" in o.file.lower() or
           (o.line and not all(_STOCK_NVIDIA_OPTIONS.match(w) for w in o.line.split()[2:]))]
    if not profile.expect_gpu:
        out.append(not_applicable("no nvidia modprobe overrides", "no GPU on this profile", node=name,
                                  expected="no nvidia module options beyond the stock ones"))
    else:
        out.append(check("no nvidia modprobe overrides", not odd, node=name, warn_only=True,
                         observed="; ".join(f"{o.file}: {o.line or '(file)'}" for o in odd) or
                                  f"{len(opts)} stock nvidia option line(s)",
                         expected="no nvidia module options beyond the stock ones",
                         fix="read each: a zz-nvidia-drm-override.conf capped CUDA at ~62 GB in one report; remove "
                             "what you did not put there, then sudo update-initramfs -u and reboot",
                         data={"options": [vars(o) for o in opts]}))
    return out


def jit_jobs_check(name: str, r: dict[str, str], profile) -> Check:
    """The parallel kernel compiles a rank's first-boot JIT would run (field report 6: 22 parallel FlashInfer
    builds wedged four nodes). The rank's environment is the image's (docker) or the SSH session's (process),
    then the rendered one, which sets none of the build-job keys (test_launch_render checks that)."""
    row = "JIT build jobs capped"
    why = builds_kernels(profile)
    expected = (f"at most {residue.JIT_JOBS_LIMIT} parallel compiles per rank (MAX_JOBS x FLASHINFER_NVCC_THREADS), "
                "or kernels prebuilt in the image")
    if why is not True:
        return not_applicable(row, str(why), node=name, expected=expected)
    if profile.runtime == "docker" and not r.get("image_env"):
        return not_applicable(row, f"{profile.image} is not on this node yet (04 pulls or ships it): its "
                              "environment is read at the next preflight", node=name, expected=expected)
    env_label = f"ENV of {profile.image}" if profile.runtime == "docker" else f"{name}'s SSH environment"
    env = residue.parse_env_lines(r.get("image_env", "") if profile.runtime == "docker" else r.get("jit_env", ""))
    jobs = residue.jit_jobs([(env_label, env)], residue.parse_nproc(r.get("jit_env", "")))
    ok = jobs.parallel is not None and jobs.parallel <= residue.JIT_JOBS_LIMIT
    where = (f"an image layer `FROM {profile.image}` + `ENV MAX_JOBS=2` (IMAGE pinned to it)"
             if profile.runtime == "docker" else
             f"MAX_JOBS=2 in the SSH user's environment on {name} (/etc/environment, or ~/.ssh/environment with "
             "PermitUserEnvironment)")
    return check(row, ok, node=name, warn_only=True,
                 observed=(f"{jobs.parallel if jobs.parallel is not None else '?'} parallel compiles per rank: "
                           f"{jobs.source}" + (f" x FLASHINFER_NVCC_THREADS={jobs.threads}" if jobs.threads > 1 else "")),
                 expected=expected,
                 fix=(f"cap the first-boot build: {where} -- FlashInfer's JIT runs `ninja -j $MAX_JOBS` (ninja's "
                      "default is CPUs + 2: 22 on a GB10, the build that wedged four nodes in the field); or use an "
                      "image with the kernels prebuilt, or a warm node-local JIT cache (CACHE_DIR) from an earlier "
                      "boot of the same image"),
                 data={"parallel": jobs.parallel, "max_jobs_set": jobs.capped, "source": jobs.source})


def _clock(offsets: dict[str, Any], profile) -> Check:
    good = {k: v for k, v in offsets.items() if not isinstance(v, Exception)}
    if len(good) < 2:
        return check("clock offset", False, node="cluster", observed=str(offsets), expected="readable clocks")
    values = [v[0] for v in good.values()]
    spread_ms = (max(values) - min(values)) * 1000
    uncertainty_ms = max(v[1] for v in good.values()) * 1000
    limit = float(profile.max_clock_offset_ms)
    return check("clock offset between nodes", spread_ms - uncertainty_ms <= limit, node="cluster",
                 observed=f"{spread_ms:.1f} ms (± {uncertainty_ms:.1f} ms)", expected=f"<= {limit:.0f} ms",
                 fix="enable NTP/chrony on every node (timedatectl set-ntp true)",
                 data={"spread_ms": spread_ms, "uncertainty_ms": uncertainty_ms})


def preflight_record(data: dict[str, Any]) -> PreflightRecord:
    """Step 00's record (``runbook.records.PreflightRecord``) from the facts ``run_checks`` returned."""
    nodes = {}
    for name, n in (data.get("nodes") or {}).items():
        nodes[name] = PreflightNode(hostname=n.get("hostname") or "", kernel=n.get("kernel") or "",
                                    docker=n.get("docker"), image_id=n.get("image_id") or "",
                                    mem_available=n.get("mem_available"), mem_total=n.get("mem_total"),
                                    disk_free={label: DiskFree(**d) for label, d in (n.get("disk_free") or {}).items()})
    return PreflightRecord(nodes=nodes, capacity=((data.get("fit") or {}).get("facts") or {}))


def _node_summary(f: dict[str, Any]) -> dict[str, Any]:
    return {"os": f["os"].pretty_name, "kernel": f["os"].kernel, "machine": f["os"].machine,
            "hostname": f["os"].hostname, "mem_available": f["mem"].get("MemAvailable"),
            "mem_total": f["mem"].get("MemTotal"),
            "docker": f["docker"], "image_id": f["image"].image_id if f["image"] else None,
            "image_layers": f["image"].layers if f["image"] else None,
            "gpus": f["gpus"], "driver": f["driver"], "listening": sorted(f["listening"]),
            # each probed path's filesystem (an unreadable one is left out: its row says why)
            "disk_free": {label: {"mount": d.mount, "free_bytes": d.avail_bytes} for label, d in f["disk"].items()
                          if isinstance(d, system.DiskFree)}}
