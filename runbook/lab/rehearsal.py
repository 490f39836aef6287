"""Rehearsal: run a real recipe profile (exl3-v41, dspark-v4, tp3-dspark) on the embedded lab, changing only
what the hardware forces.

    subs = substitutions(load_profile("env/exl3-v41.env"))     # what changes, from what to what, and why
    overrides = rehearsal_overrides(subs)                      # -> load_profile(..., overrides=overrides)

The substituted values come from the lab profile with the same node count (``env/lab.env`` for two nodes,
``env/lab-tp3.env`` for three), so a rehearsal lands on the nodes, addresses and scaled sizes the lab is
known to run. The image keeps the recipe's repository path and tag: only its registry host becomes the lab
registry's (and a pinned digest the lab image's, :data:`DIGEST_WHY`), the lab image is pushed there under
them (:func:`runbook.lab.control.ensure_rehearsal_image`) and step 04 pulls it for real. Everything not
listed in ``GROUPS`` is kept exactly as the recipe has it: paths
(``~/…`` expanded per node), the weight-sync mode, the runtime and its flags, ports, container names,
HCAs and GID indexes, ``EXPECT_*`` (the hardware rows then run against simulators and say SIMULATED),
the pinned revisions, the Engram settings, the readiness rules.

Each substitution has a class (:data:`GROUP_CLASS`: *hardware*, what the lab cannot have, or *lab*) and a *lab*
one a goal group (:data:`GOAL_OF_KEY`: node addresses, Hub endpoint and model, registry host, recipe repository,
or "none"); :func:`count` is the one count of them. ``LAB`` and ``REHEARSAL`` are the run's mode
(:data:`SET_BY_REHEARSAL`), set on top and recorded as such (:func:`record`), not substitutions.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ProfileError, ProfileIssue
from ..evidence import REPO_ROOT
from ..profile import NODE_NAMES, Profile, load_profile, node_key, node_keys
from ..profile.rules import LAB_RAY_CPU_SITE, LAB_RAY_CPU_WHY
from ..site import HARDWARE, HUB, LAB_CLASS, NO_GOAL, NODE_ADDRESSES, RECIPE_REPOSITORY, REGISTRY_HOST, count
from . import control, hub, oci
from .netlab.spec import MGMT_IF, OPERATOR, PORTS, REGISTRY, node_specs

LAB_PROFILES = {2: REPO_ROOT / "env" / "lab.env", 3: REPO_ROOT / "env" / "lab-tp3.env", 4: REPO_ROOT / "env" / "lab-tp4.env"}

# key groups the lab cannot keep, and why (shown in every rehearsal's evidence and report)
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the lab has as many nodes as the profile names, and binds their CPU ranks itself (Profile.cpu_bind)
    "nodes": ("the Sparks are the lab's network-namespace nodes, reached with the lab's key and host keys",
              (*node_keys("SSH"), "SSH_CONFIG", "SSH_KEY", "KNOWN_HOSTS")),
    "fabric": ("node addresses: the lab's address of the port the recipe names (the lab's nodes have a Spark's two "
               "CX-7 ports, each cable a veth on its own /24, MTU 9000, and the LAN port enP7s7)",
               (*node_keys("IP"), *node_keys("CX7_IF"), "BOOTSTRAP_IF", *node_keys("BOOTSTRAP_IP"))),
    "link": ("a veth carries the real pings and iperf3 of a rehearsal, but not a CX-7's speed: TCP/RTT thresholds "
             "and the link speed are the lab's (RDMA and NCCL thresholds stay: their tools are simulated)",
             ("EXPECT_LINK_GBPS", "MIN_TCP_GBPS", "MAX_RTT_MS")),
    "registries": ("no registry or Hub is reachable: the lab's Hub endpoint stands in for the Hub, and the lab's "
                   "registry for the image's registry host (the recipe's repository path, tag and digest are kept: "
                   "the lab's image is pushed there under them)",
                   ("HF_ENDPOINT", "IMAGE")),
    "engine": ("the recipe's image carries vLLM's GPU build; the lab runs vLLM's CPU build from the lab's venv, "
               "mounted into the container", ("VLLM_BIN",)),
    # RECIPE_DIR is kept: the lab's recipe is checked out where the recipe's goes (`~/recipes/…` in the SSH user's
    # own home on every node), not in a lab path an earlier rehearsal as another user may own
    "recipe": ("the recipe's repository is not reachable here and its patches target vLLM's GPU build: the lab's "
               "recipe carries the same contract (pinned checkout shipped to every node, files mounted where the "
               "recipe mounts them, a fail-closed start script, boot-log markers checked on every rank)",
               ("RECIPE_REPO", "RECIPE_COMMIT")),
    "gpu": ("vLLM's CPU build serves a tiny model: GPU-only quantisation, KV layouts, speculative decoding, "
            "DeepSeek parsers and vision cannot run",
            ("QUANTIZATION", "KV_CACHE_DTYPE", "KV_CACHE_MEMORY_BYTES", "KV_BLOCK_SIZE", "GPU_MEM_UTIL",
             "SPEC_METHOD", "SPEC_TOKENS", "DRAFT_SAMPLE_METHOD", "ENFORCE_EAGER", "MAX_MODEL_LEN", "MAX_NUM_SEQS",
             "MAX_NUM_BATCHED_TOKENS", "LONG_PREFILL_TOKEN_THRESHOLD", "TOKENIZER_MODE", "TOOL_CALL_PARSER",
             "REASONING_PARSER", "CHAT_TEMPLATE", "DEFAULT_THINKING", "TOOL_STRICT_LEVEL", "VISION", "LIMIT_MM",
             "EXPECT_KV_TOKENS", "SHM_SIZE")),
    "sizes": ("the tiny model's sizes: memory budgets, expected download sizes and benchmark lengths are scaled",
              ("WEIGHTS_GIB", "ENGRAM_GIB", "WEIGHT_BUDGET_GIB", "BOOT_MARGIN_GIB", "BENCH_PROMPT_TOKENS",
               "BENCH_DECODE_TOKENS", "BENCH_CONCURRENCY", "BENCH_PREFILL_TOKENS", "BENCH_REPEATS", "SOAK_SECONDS",
               "READY_TIMEOUT", "HANG_SECONDS")),
}
# The run's mode, not a recipe value: `run --rehearse` sets it on top of the recipe profile (each step's notebook
# reads the profile, so the mode reaches it as these two keys). Recorded as the mode in rehearsal.json and on the
# report, not counted as a substitution: no recipe chooses whether it is rehearsed.
SET_BY_REHEARSAL = {"LAB": "1", "REHEARSAL": "1"}
MODE_WHY = ("the run's mode, set by `run --rehearse` on top of the recipe profile (no recipe value: the recipe's "
            "LAB=0 and REHEARSAL=0 say it is not rehearsed by default)")
NON_ROOT_WHY = (GROUPS["nodes"][0] + ", as the lab's non-root operator {user} (its own home, the docker group "
                "and exactly the sudoers drop-in the runbook prescribes)")

# the two classes (HARDWARE, LAB_CLASS) and the goal groups (GOALS, NO_GOAL) are runbook.site's, with the one count
GROUP_CLASS = {"gpu": HARDWARE, "sizes": HARDWARE, "link": HARDWARE, "engine": HARDWARE,
               "nodes": LAB_CLASS, "fabric": LAB_CLASS, "registries": LAB_CLASS, "recipe": LAB_CLASS,
               "model": LAB_CLASS}

GOAL_OF_KEY: dict[str, str] = {
    # where the nodes are and how the runbook reaches them (SSH targets, the files that resolve and authenticate
    # them, the fabric and bootstrap addresses, the head address the API binds)
    **dict.fromkeys((*node_keys("SSH"), "SSH_CONFIG", "SSH_KEY", "KNOWN_HOSTS", "API_HOST", *node_keys("IP"),
                     *node_keys("BOOTSTRAP_IP")), NODE_ADDRESSES),
    **dict.fromkeys(("HF_ENDPOINT", "HF_REVISION", "HF_ENGRAM_REVISION"), HUB),
    "IMAGE": REGISTRY_HOST,              # its registry host; a pinned digest too (DIGEST_WHY: cannot be kept)
    **dict.fromkeys(("RECIPE_REPO", "RECIPE_COMMIT"), RECIPE_REPOSITORY),   # the commit cannot be kept: COMMIT_WHY
}
# the reasons of keys whose group's reason does not say it all
SSH_FILES_WHY = ("how the runbook reaches the site's nodes, so grouped with the node addresses: the recipe profiles "
                 "leave SSH_CONFIG, SSH_KEY and KNOWN_HOSTS empty because they are the site's own (empty = the "
                 "operator's ~/.ssh config, keys and known_hosts); the lab's nodes are reached through the lab's "
                 "ssh_config (its aliases name the nodes' addresses), its key and its nodes' host keys, and the "
                 "operator's own ~/.ssh is left alone")
COMMIT_WHY = ("a commit id is content-addressed: the lab's recipe repository (the same contract, see RECIPE_REPO) "
              "cannot hold the recipe's pinned commit, and the recipe's repository is not reachable here, so the "
              "lab recipe's commit is pinned and checked out on every node in its place; this part of the goal "
              "(the recipe's pinned commit kept) cannot be met on the lab")
KEY_WHY = {"SSH_CONFIG": SSH_FILES_WHY, "SSH_KEY": SSH_FILES_WHY, "KNOWN_HOSTS": SSH_FILES_WHY,
           "RECIPE_COMMIT": COMMIT_WHY}


# The programs a rehearsal runs in place of a Spark's (runbook.lab.sim; all *hardware*: each needs the GPU or the
# CX-7/RDMA device), and the ones around them that run for real (rehearsal.json "tools", the report).
SIMULATED_TOOLS = {
    "nvidia-smi": "no GPU", "ibdev2netdev": "no ConnectX-7", "ibv_devinfo": "no RDMA device",
    "ib_write_bw": "no RDMA device (perftest's real binary is installed and is what the tools row names)",
    "ib_write_lat": "no RDMA device (perftest's real binary is installed and is what the tools row names)",
    "all_reduce_perf": "nccl-tests needs a GPU and NCCL; each rank still checks the per-rank environment it receives",
}
REAL_TOOLS = {
    "mpirun": "OpenMPI (openmpi-bin): the step's MPMD line starts each all_reduce_perf rank on its node over ssh to "
              "its fabric address, with its -x environment; the ranks meet through libmpi (MPI_Allgather over "
              "btl_tcp_if_include)",
    "perftest": "the tools row finds perftest's own ib_write_bw/ib_write_lat (the simulators left off PATH)",
    "ping, iperf3, ethtool, ip, sysctl": "the lab's fabric veth",
    "gloo all-reduce sweep": "torch on every node over the fabric",
}


def tools_record() -> dict[str, dict[str, str]]:
    """What rehearsal.json says about the tools: ``simulated`` (class hardware) and ``real``, each tool -> why."""
    return {"simulated": dict(SIMULATED_TOOLS), "real": dict(REAL_TOOLS)}


@dataclass(frozen=True)
class Substitution:
    key: str
    recipe: str        # the recipe profile's value (of ``part`` only, when set)
    lab: str           # what the rehearsal runs with (of ``part`` only, when set)
    group: str
    why: str
    part: str = ""     # one part of the key's value: "registry host" or "digest" of IMAGE; "" = the whole value
    value: str = ""    # with ``part``: the key's whole value as the rehearsal runs it

    @property
    def kind(self) -> str:
        """``hardware`` or ``lab`` (:data:`GROUP_CLASS`)."""
        return GROUP_CLASS[self.group]

    @property
    def goal(self) -> str:
        """A *lab* substitution's goal group (:data:`GOALS`, or :data:`NO_GOAL`); "" for a *hardware* one."""
        return GOAL_OF_KEY.get(self.key, NO_GOAL) if self.kind == LAB_CLASS else ""

    @property
    def override(self) -> str:
        """The key's value as the rehearsal runs it."""
        return self.value if self.part else self.lab

    def to_dict(self) -> dict[str, str]:
        return {**asdict(self), "kind": self.kind, "goal": self.goal}


def record(profile: Profile, substituted: list[dict]) -> dict:
    """rehearsal.json: the recipe profile, the run's mode (:data:`SET_BY_REHEARSAL`, not a substitution), every
    substituted key with its class, goal group and reason, their :func:`count`, and the tools
    (:func:`tools_record`)."""
    return {"profile": str(profile.source),
            "mode": {"keys": {k: env_text(profile.value(k)) for k in SET_BY_REHEARSAL}, "why": MODE_WHY},
            "substituted": substituted, **count(substituted), "tools": tools_record()}


def env_text(value) -> str:
    """A profile value as it is written in an env file (and passed as an override)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":")) if value else ""
    return "" if value is None else str(value)


def lab_profile_for(profile: Profile) -> Profile:
    path = LAB_PROFILES.get(profile.node_count)
    if path is None:
        counts = " or ".join(str(n) for n in sorted(LAB_PROFILES))
        raise ProfileError([ProfileIssue(node_keys("SSH")[profile.node_count - 1],
                                         f"no lab profile for {profile.node_count} nodes",
                                         fix=f"rehearse a profile of {counts} nodes", path=str(profile.source))])
    return load_profile(path)


#: who a rehearsal may log in as on the lab's nodes: root (the default) or the lab's non-root operator
LAB_USERS = ("root", OPERATOR)
#: each node's ssh key -> the node (its lab alias is spark-<node>)
SSH_KEYS = {node_key(name, "SSH"): name for name in NODE_NAMES}


def as_user(target: str, ssh_user: str) -> str:
    """A lab ssh target (an alias of the lab's ssh_config, whose default user is root) for ``ssh_user``: as is
    for root or none, ``user@alias`` otherwise.

    >>> as_user("spark-head", "spark"), as_user("spark-head", "root"), as_user("", "spark")
    ('spark@spark-head', 'spark-head', '')
    """
    if not target or ssh_user in ("", "root"):
        return target
    return f"{ssh_user}@{target.split('@', 1)[-1]}"


def check_ssh_user(ssh_user: str) -> None:
    if ssh_user and ssh_user not in LAB_USERS:
        raise ProfileError([ProfileIssue("HEAD_SSH", f"--ssh-user {ssh_user}: the lab's nodes have the users "
                                         f"{' and '.join(LAB_USERS)} only",
                                         fix=f"--ssh-user {OPERATOR} (the non-root operator with the runbook's "
                                             "sudoers drop-in) or leave it out (root)")])


def substitutions(profile: Profile, *, ssh_user: str = "") -> list[Substitution]:
    """Every key whose value the rehearsal changes (unchanged keys are not listed). ``ssh_user``: log in to
    the lab's nodes as this user (``root`` by default, or :data:`OPERATOR`, the lab's non-root operator)."""
    check_ssh_user(ssh_user)
    if profile.is_lab:
        raise ProfileError([ProfileIssue("RECIPE", f"{profile.source} is a lab profile already",
                                         fix="rehearse a recipe profile (env/exl3-v41.env, env/dspark-v4.env, "
                                             "env/tp3-dspark.env or your copy of one); run a lab profile as is",
                                         path=str(profile.source))])
    lab = lab_profile_for(profile)
    out = []
    for group, (_, keys) in GROUPS.items():
        for key in keys:
            if key == "IMAGE":
                out += image_substitutions(profile)
                continue
            if group == "fabric":            # fabric_substitutions: only addresses, ports kept where the lab has them
                continue
            recipe_value, lab_value = env_text(profile.value(key)), env_text(lab.value(key))
            if key in SSH_KEYS and ssh_user not in ("", "root"):
                lab_value = as_user(lab_value, ssh_user)
                why = NON_ROOT_WHY.format(user=ssh_user)
            else:
                why = KEY_WHY.get(key, GROUPS[group][0])
            if recipe_value != lab_value:
                out.append(Substitution(key, recipe_value, lab_value, group, why))
    out += fabric_substitutions(profile, lab)
    if profile.api_host not in ("127.0.0.1", "0.0.0.0"):
        # an address of the head itself: its fabric address becomes the lab head's, any other (management) one
        # does not exist in the lab, where every address of the node is reached the same way
        on_fabric = profile.api_host in (profile.head_ip, profile.head_bootstrap_ip)
        out.append(Substitution("API_HOST", profile.api_host, lab.head_ip if on_fabric else "0.0.0.0", "nodes",
                                "the API binds an address of the head, which is the lab's head node"))
    if profile.executor == "ray":
        out.append(ray_cpu_substitution())
    return out


#: EXECUTOR=ray on the lab: the key's value is kept; what the lab changes under it is the CPU vLLM's Ray device key
RAY_DEVICE_PART = "the vLLM platform's Ray device key"


def ray_cpu_substitution() -> Substitution:
    """EXECUTOR=ray rehearsed: kept as ``ray``, but the lab's CPU vLLM serves through Ray only with the lab-only
    substitution (:data:`runbook.profile.rules.LAB_RAY_CPU_WHY`), listed here so rehearsal.json and the report
    say so (class *hardware*: the engine group, vLLM's CPU build in place of its GPU build)."""
    return Substitution("EXECUTOR", "GPU (vLLM's CUDA platform sets it)",
                        f"GPU (LAB ONLY: {LAB_RAY_CPU_SITE} sets it on the CPU platform)", "engine",
                        LAB_RAY_CPU_WHY, part=RAY_DEVICE_PART, value="ray")


LAB_PORT_WHY = ("the lab's nodes have one netdev per CX-7 port, {ports} (a Spark's twins enP2p1s0f*np* are not "
                "modelled): the port facing the same peer in the lab's cabling")


def fabric_substitutions(profile: Profile, lab: Profile) -> list[Substitution]:
    """The fabric keys on the lab: each node's ``<NODE>_CX7_IF`` is kept when the lab's nodes have that port (they
    have a Spark's two CX-7 ports, cabled as the recipes cable them: runbook.lab.netlab.spec.LINKS) and its
    ``<NODE>_IP`` becomes the lab's address of that port; ``BOOTSTRAP_IF=enP7s7`` is kept (the lab's LAN port) and
    its addresses become the nodes' LAN addresses. A port the lab lacks falls back to the lab profile's port."""
    specs = {n.name: n for n in node_specs(profile.node_count)}
    why = GROUPS["fabric"][0]
    out = []
    for node in profile.nodes:
        key, spec = node.name.upper(), specs[node.name]
        port = node.fabric_if
        if port not in PORTS:
            lab_port = lab.value(f"{key}_CX7_IF")
            out.append(Substitution(f"{key}_CX7_IF", port, lab_port, "fabric", LAB_PORT_WHY.format(ports=", ".join(PORTS))))
            port = lab_port
        address = dict(spec.ports).get(port, "")
        if address and address != node.fabric_ip:
            out.append(Substitution(f"{key}_IP", node.fabric_ip, address, "fabric", why))
        if profile.bootstrap_if and node.bootstrap_ip != spec.mgmt_ip:
            out.append(Substitution(f"{key}_BOOTSTRAP_IP", node.bootstrap_ip, spec.mgmt_ip, "fabric", why))
    if profile.bootstrap_if and profile.bootstrap_if != MGMT_IF:
        out.append(Substitution("BOOTSTRAP_IF", profile.bootstrap_if, MGMT_IF, "fabric",
                                why + f": the interface every lab node shares is its LAN port {MGMT_IF}"))
    return out


def image_substitutions(profile: Profile, digest: str = "") -> list[Substitution]:
    """IMAGE on the lab: only the registry host becomes the lab registry's (path and tag kept); with ``digest``
    (the lab image's, known once it is built) the recipe's digest too, which is content-addressed: no other
    content can carry it. Nothing for a process runtime (no image is used)."""
    if profile.runtime != "docker" or not profile.image:
        return []
    ref = oci.parse_reference(profile.image)
    moved = ref.replace(host=REGISTRY)
    out = [Substitution("IMAGE", ref.host or "(docker's default registry)", REGISTRY, "registries",
                        GROUPS["registries"][0], part="registry host", value=str(moved))]
    if digest and ref.digest and digest != ref.digest:
        out.append(Substitution("IMAGE", ref.digest, digest, "registries", DIGEST_WHY, part="digest",
                                value=str(moved.replace(digest=digest))))
    return out


DIGEST_WHY = ("a digest is content-addressed and cannot be forged: the lab's image (its busybox runtime as a "
              "two-platform index) pushed under the recipe's repository path and tag has its own digest, which "
              "the rehearsal pins and every node pulls by; this part of the goal (the recipe's digest kept) cannot "
              "be met on the lab")


def rehearsal_overrides(subs: list[Substitution]) -> dict[str, str]:
    """key -> value as the rehearsal runs it (a key substituted in parts takes its last part's whole value)."""
    return {s.key: s.override for s in subs}


MODEL_WHY = ("the checkpoint is the lab's tiny model (and a scaled synthetic Engram source), published on the lab "
             "Hub under the recipe's repository ids; their revisions are the lab Hub's commits")


def model_substitutions(profile: Profile, revision: str, engram_revision: str = "") -> list[Substitution]:
    """HF_REVISION (and HF_ENGRAM_REVISION when ENGRAM=1) pinned to the lab Hub's commits of the stand-ins."""
    out = [Substitution("HF_REVISION", profile.hf_revision, revision, "model", MODEL_WHY)]
    if profile.engram and profile.hf_engram_repo:
        out.append(Substitution("HF_ENGRAM_REVISION", profile.hf_engram_revision, engram_revision, "model", MODEL_WHY))
    return out


def publish_models(profile: Profile, *, echo=print) -> list[Substitution]:
    """Publish the tiny model under HF_MODEL_REPO (and the synthetic Engram source under HF_ENGRAM_REPO when
    ENGRAM=1) on the lab Hub; the revisions to pin instead of the recipe's (:func:`model_substitutions`)."""
    revision = control.ensure_tiny_repo(profile.hf_model_repo, tp=profile.tp, echo=echo)
    engram = (hub.publish_engram_source(control.HUB_ROOT, profile.hf_engram_repo)
              if profile.engram and profile.hf_engram_repo else "")
    return model_substitutions(profile, revision, engram)


def publish_image(profile: Profile) -> list[Substitution]:
    """The IMAGE digest substitution of a digest-pinned recipe image: the lab image's digest (the push itself
    happens once the lab is up: :func:`runbook.lab.control.ensure_lab`)."""
    if profile.runtime != "docker" or "@sha256:" not in profile.image:
        return []
    return [s for s in image_substitutions(profile, control.lab_image().digest) if s.part == "digest"]


def load_rehearsal(profile_path: str | Path, overrides: dict[str, str] | None = None, *, publish: bool = False,
                   echo=print, ssh_user: str = "") -> tuple[Profile, dict[str, str], list[Substitution]]:
    """The recipe profile as the rehearsal runs it, the overrides that make it so (the user's ``-p`` keys
    first; a key the rehearsal must substitute cannot be overridden), and the substitutions. ``publish``
    puts the stand-in checkpoints on the lab Hub and pins their revisions (what a real rehearsal does).
    ``ssh_user``: who logs in to the lab's nodes (:func:`substitutions`)."""
    check_ssh_user(ssh_user)
    recipe = load_profile(profile_path, overrides=overrides)
    subs = substitutions(recipe, ssh_user=ssh_user) + (publish_models(recipe, echo=echo) + publish_image(recipe) if publish else [])
    mapped = {**rehearsal_overrides(subs), **SET_BY_REHEARSAL}
    clash = sorted(set(overrides or {}) & set(mapped))
    if clash:
        why = {**{s.key: s.why for s in subs}, **dict.fromkeys(SET_BY_REHEARSAL, MODE_WHY)}
        raise ProfileError([ProfileIssue(k, f"-p {k}=… cannot be combined with --rehearse: the rehearsal "
                                            f"sets {k} ({why[k]})", fix=f"drop -p {k}") for k in clash])
    merged = {**(overrides or {}), **mapped}
    return load_profile(profile_path, overrides=merged), merged, subs
