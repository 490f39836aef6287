"""Rehearsal: run a real recipe profile (exl3-v41, dspark-v4, tp3-dspark) on the embedded lab, changing only
what the hardware forces.

    subs = substitutions(load_profile("env/exl3-v41.env"))     # what changes, from what to what, and why
    overrides = rehearsal_overrides(subs)                      # -> load_profile(..., overrides=overrides)

The substituted values come from the lab profile with the same node count (``env/lab.env`` for two nodes,
``env/lab-tp3.env`` for three), so a rehearsal lands on the nodes, addresses, image and scaled sizes the
lab is known to run. Everything not listed in ``GROUPS`` is kept exactly as the recipe has it: paths
(``~/…`` expanded per node), the weight-sync mode, the runtime and its flags, ports, container names,
HCAs and GID indexes, ``EXPECT_*`` (the hardware rows then run against simulators and say SIMULATED),
the pinned revisions, the Engram settings, the readiness rules.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ProfileError, ProfileIssue
from ..evidence import REPO_ROOT
from ..profile import Profile, load_profile

LAB_PROFILES = {2: REPO_ROOT / "env" / "lab.env", 3: REPO_ROOT / "env" / "lab-tp3.env"}

# key groups the lab cannot keep, and why (shown in every rehearsal's evidence and report)
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "nodes": ("the Sparks are the lab's network-namespace nodes, reached with the lab's key and host keys",
              ("HEAD_SSH", "WORKER_SSH", "WORKER2_SSH", "SSH_CONFIG", "SSH_KEY", "KNOWN_HOSTS", "LAB_NODES",
               "LAB_CPU_BIND")),
    "fabric": ("the CX-7 link is the lab's veth (one /24, MTU 9000, interface enp1s0f0np0 on every node)",
               ("HEAD_IP", "WORKER_IP", "WORKER2_IP", "HEAD_CX7_IF", "WORKER_CX7_IF", "WORKER2_CX7_IF",
                "BOOTSTRAP_IF", "HEAD_BOOTSTRAP_IP", "WORKER_BOOTSTRAP_IP", "WORKER2_BOOTSTRAP_IP")),
    "link": ("a veth carries the real pings and iperf3 of a rehearsal, but not a CX-7's speed: TCP/RTT thresholds "
             "and the link speed are the lab's (RDMA and NCCL thresholds stay: their tools are simulated)",
             ("EXPECT_LINK_GBPS", "MIN_TCP_GBPS", "MAX_RTT_MS")),
    "registries": ("no registry or Hub is reachable: the lab's Hub endpoint and runtime image stand in",
                   ("HF_ENDPOINT", "IMAGE", "VLLM_BIN")),
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
SET_BY_REHEARSAL = {"LAB": "1", "REHEARSAL": "1"}


@dataclass(frozen=True)
class Substitution:
    key: str
    recipe: str        # the recipe profile's value
    lab: str           # what the rehearsal runs with
    group: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def lab_profile_for(profile: Profile) -> Profile:
    path = LAB_PROFILES.get(profile.node_count)
    if path is None:
        raise ProfileError([ProfileIssue("WORKER2_SSH", f"no lab profile for {profile.node_count} nodes",
                                         fix="rehearse a two- or three-node profile", path=str(profile.source))])
    return load_profile(path)


def substitutions(profile: Profile) -> list[Substitution]:
    """Every key whose value the rehearsal changes (unchanged keys are not listed)."""
    if profile.is_lab:
        raise ProfileError([ProfileIssue("RECIPE", f"{profile.source} is a lab profile already",
                                         fix="rehearse a recipe profile (env/exl3-v41.env, env/dspark-v4.env, "
                                             "env/tp3-dspark.env or your copy of one); run a lab profile as is",
                                         path=str(profile.source))])
    lab = lab_profile_for(profile)
    out = []
    for group, (why, keys) in GROUPS.items():
        for key in keys:
            recipe_value, lab_value = profile.value(key), lab.value(key)
            if recipe_value != lab_value:
                out.append(Substitution(key, recipe_value, lab_value, group, why))
    for key, value in SET_BY_REHEARSAL.items():
        out.append(Substitution(key, profile.value(key), value, "rehearsal", "set by `run --rehearse`"))
    return out


def rehearsal_overrides(subs: list[Substitution]) -> dict[str, str]:
    return {s.key: s.lab for s in subs}


def load_rehearsal(profile_path: str | Path, overrides: dict[str, str] | None = None
                   ) -> tuple[Profile, dict[str, str], list[Substitution]]:
    """The recipe profile as the rehearsal runs it, the overrides that make it so (the user's ``-p`` keys
    first; a key the rehearsal must substitute cannot be overridden), and the substitutions."""
    recipe = load_profile(profile_path, overrides=overrides)
    subs = substitutions(recipe)
    mapped = rehearsal_overrides(subs)
    clash = sorted(set(overrides or {}) & set(mapped))
    if clash:
        raise ProfileError([ProfileIssue(k, f"-p {k}=… cannot be combined with --rehearse: the rehearsal "
                                            f"substitutes {k} ({next(s.why for s in subs if s.key == k)})",
                                         fix=f"drop -p {k}") for k in clash])
    merged = {**(overrides or {}), **mapped}
    return load_profile(profile_path, overrides=merged), merged, subs
