"""The recipes' post-readiness boot-shape warm-up: the checkout's ``scripts/boot-shape-warmup.sh`` run on the head
once the API answers, so the Triton/TileLang shapes a serve meets compile before traffic does.

    cmd, env = warmup_command(profile, home="/home/spark")   # pure: None when the recipe has no warm-up
    row = run_warmup(cluster, profile, api_key=key)            # PASS, WARN (failed/absent: non-fatal) or N/A

Both seeds run it after readiness and only warn when it fails (seed A ``post_ready_warmup``; seed B's start
script, issue #117: a shape that JITs mid-serve can stall one rank past NCCL's 600 s watchdog). The script's
arguments are the API's base URL on the head and the served model; its knobs are the ones each seed's launcher
hands it: the resolved ``--max-num-seqs``, the DSpark k (seed A), the host path of the rank's persistent Triton
cache (the sampler postcondition), and the bearer key from the environment (never in the command line).
"""
from __future__ import annotations

from ..checks import Check, Status, check, not_applicable
from ..remote import Cluster, expand_home, quote

__all__ = [
    "WARMUP_SCRIPT",
    "WARMUP_TIMEOUT_S",
    "has_warmup",
    "run_warmup",
    "warmup_command",
]

WARMUP_SCRIPT = "scripts/boot-shape-warmup.sh"
WARMUP_REQ_TIMEOUT_S = 240          # both seeds' per-request --max-time (DSV41_/DSPARK_WARMUP_REQ_TIMEOUT)
WARMUP_TIMEOUT_S = 1800             # the whole sweep (seed B's DSPARK_WARMUP_WAIT_SECONDS)
ROW = "boot-shape warm-up after readiness"


def _base_url(profile) -> str:
    host = "127.0.0.1" if profile.api_host in ("0.0.0.0", "::", "") else profile.api_host
    return f"http://{host}:{profile.port}"


def has_warmup(profile) -> bool:
    """The seeds warm up after readiness; the lab's recipe (and stock vLLM without a pinned recipe) does not."""
    return not profile.lab and bool(profile.recipe_repo) and profile.recipe in ("exl3-v41", "dspark-v4")


def warmup_command(profile, home: str) -> tuple[str, dict[str, str], str] | None:
    """(command, key-env names to pass, script path) of the recipe's warm-up on the head, or None when the recipe
    has none (the lab, a profile without a pinned recipe)."""
    if not has_warmup(profile):
        return None
    checkout = expand_home(profile.recipe_dir, home, key="RECIPE_DIR").rstrip("/")
    script = f"{checkout}/{WARMUP_SCRIPT}"
    if profile.recipe == "exl3-v41":
        knobs = {"GLM53_WARMUP_REQ_TIMEOUT": str(WARMUP_REQ_TIMEOUT_S),
                 "GLM53_WARMUP_MAX_CONCURRENCY": str(profile.max_num_seqs),
                 "GLM53_WARMUP_DSPARK_K": str(profile.spec_k),
                 "GLM53_WARMUP_TRITON_CACHE_DIR": f"{expand_home(profile.cache_dir, home)}/triton"}
        key_env = "VLLM_API_KEY"
    else:
        knobs = {"DSPARK_WARMUP_REQ_TIMEOUT": str(WARMUP_REQ_TIMEOUT_S),
                 "DSPARK_WARMUP_MAX_CONCURRENCY": str(profile.max_num_seqs),
                 "DSPARK_WARMUP_TRITON_CACHE_DIR": f"{expand_home(profile.weights_dir, home)}/triton-cache"}
        key_env = "DSPARK_WARMUP_BEARER"
    env = " ".join(quote(f"{k}={v}") for k, v in knobs.items())
    cmd = (f"env {env} timeout {WARMUP_TIMEOUT_S} bash {quote(script)} "
           f"{quote(_base_url(profile))} {quote(profile.served_model_name)} 2>&1 | tail -n 40")
    return cmd, {"key": key_env}, script


def run_warmup(cluster: Cluster, profile, *, api_key: str | None = None) -> Check:
    """Run the warm-up on the head (non-fatal, as both seeds): PASS when it exits 0, WARN when it fails or the
    checkout has no script, N/A when the recipe has none."""
    if not has_warmup(profile):
        return not_applicable(ROW, f"recipe {profile.recipe} runs no post-readiness warm-up", node="head")
    head = cluster.head
    home = head.read("printf %s \"$HOME\"").stdout.strip() or "/root"
    cmd, names, script = warmup_command(profile, home)
    if not head.dry_run and not head.read(f"test -f {quote(script)}").ok:
        return check(ROW, False, node="head", observed=f"{script} is not in the pinned checkout", warn_only=True,
                     expected="the recipe's warm-up run after readiness",
                     fix="the recipe at RECIPE_COMMIT ships no warm-up script; the server runs, but shapes it "
                         "meets first compile mid-serve (seed B issue #117)")
    env = {names["key"]: api_key} if api_key else None
    # `set -o pipefail`: the sweep's exit status, not tail's
    res = head.run(f"set -o pipefail; {cmd}", env=env, timeout=WARMUP_TIMEOUT_S + 60, warn=True)
    if head.dry_run:
        return Check(ROW, node="head", status=Status.NA, observed="dry run: recorded, not run",
                     expected="the recipe's warm-up after readiness")
    tail = " | ".join((res.stdout or "").strip().splitlines()[-3:])[:600]
    return check(ROW, res.ok, node="head", observed=f"exit {res.exit_code}: {tail}", warn_only=True,
                 expected="exit 0 (every warm-up request answered)",
                 fix="non-fatal, as in the recipe: the server serves, but the shapes that failed may JIT mid-serve; "
                     "read the sweep's lines above and run it again once the server is idle",
                 data={"command": cmd, "exit": res.exit_code})
