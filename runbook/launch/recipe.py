"""The recipe: a pinned checkout on every node and the start chain every rank runs before ``vllm serve``.

    pin = recipe_pin(profile)                              # RECIPE_REPO @ RECIPE_COMMIT in RECIPE_DIR, or None
    rr = rank_recipe(profile, is_head=True, api_key_set=False)   # pure: mounts, steps, markers, entrypoint
    rr.script                                              # the generated entrypoint (seeds) or "" (the lab's start.sh)
    checks, data = ensure_checkout(cluster, profile)       # head: clone + checkout; workers: rsync over the fabric
    found = find_markers(rr.markers, log_text)             # marker -> the boot-log line that shows it

The contract, one shape for every recipe: the checkout sits at RECIPE_DIR on every node at the pinned
commit (a read-only fact: ``git rev-parse HEAD``, or ``.recipe-commit`` for a tree placed by hand); the
recipe's overlay/hotfix files are mounted from it where the recipe mounts them; the entrypoint checks each
step's targets and applies the steps FAIL-CLOSED (a missing target or a failing step prints one
``[<prefix>] FATAL: ...`` line and exits 1 before vLLM starts), then ``exec``s the serve argv it was given
unchanged (same pid). Each recipe declares the boot-log lines its chain prints; the launch step checks
them in every rank's log.

* ``exl3-v41`` (seed A, ``start.sh`` write_inner_scripts @ 503b482): the inner script, generated here per
  rank, mounted at ``/start.sh``, run as ``--entrypoint bash IMAGE /start.sh <argv>``. Seed A copies the
  runtime ``exl3.py`` into vLLM and runs its twelve ``/opt/dsv41/patch_*.py`` -- skipping a missing one and
  only warning on a failing one; here both abort.
* ``dspark-v4`` (seed B, ``docker-compose.dspark.yml`` command @ 01eed1e): the compose entrypoint, generated
  here (the compose inlines it), mounted at ``/opt/spark-runbook/entrypoint.sh``; hotfixes mounted at the
  compose's ``/opt/hotfix-*.py``, ``/opt/dspark-patches`` and ``/opt/dsv4-tp3``. The encoding copy is
  fail-closed here (seed B warns and skips it when the snapshot lacks ``encoding/encoding_dsv4.py``).
* ``lab``: the lab recipe's own ``start.sh`` (``runbook/lab/recipe/``), built into a git repository with a
  fixed author and date so its commit depends only on its files; docker mounts the checkout at
  ``/opt/lab-recipe``, the process runtime runs it from the node's checkout.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable
from ..remote import Cluster, Node, expand_home, node_ssh_argv, quote, tail

__all__ = [
    "CheckoutFact",
    "Marker",
    "Mount",
    "RankRecipe",
    "RecipePin",
    "Step",
    "chain_failures",
    "checkout_files",
    "checkout_probe_cmd",
    "ensure_checkout",
    "find_markers",
    "lab_source_commit",
    "lab_source_repo",
    "marker_record",
    "parse_checkout",
    "rank_recipe",
    "recipe_pin",
]

LAB_SOURCE = Path(__file__).resolve().parents[1] / "lab" / "recipe"
LAB_MOUNT = "/opt/lab-recipe"
CHAIN_DONE = "start chain complete: {n} steps applied"
FATAL_RX = re.compile(r"\] FATAL: ")

# seed A (start.sh @ 503b482): the files launch_cluster mounts under /opt/dsv41/ and the patch loop order
SEED_A_PATCHES = (
    "patch_suppress_stops_in_reasoning.py", "patch_scheduler_decode_floor.py", "patch_xgrammar_termination.py",
    "patch_spinwait.py", "patch_responses_content_types.py", "patch_exl3_packed_names.py", "patch_exl3_lm_head.py",
    "patch_engram_secondary.py", "patch_engram_file.py", "patch_h2d_stage.py", "patch_sm120_block64.py",
    "patch_memory_log.py",
)
SEED_A_DATA = (("files/exl3_k_map.json", "/opt/dsv41/exl3_k_map.json"),
               ("overlay/engram_file_backend.py", "/opt/dsv41/engram_file_backend.py"),
               ("overlay/engram_layout.py", "/opt/dsv41/engram_layout.py"))
SEED_A_OVERLAY_LINE = "installed runtime EXL3 overlay"

# seed B (docker-compose.dspark.yml command @ 01eed1e, default switches): the python3.12 dist-packages path
# the compose hard-codes, and its v0.27 backports (skipped only with DSPARK_SKIP_HOTFIX=1)
SEED_B_VLLM = "/usr/local/lib/python3.12/dist-packages/vllm"
SEED_B_BACKPORTS = ("hotfix-dsv4-mtp-buffer-50312.sh", "hotfix-dsv4-skip-topk-49486.sh",
                    "hotfix-dsv4-dense-prefill-indexer-48407.sh", "hotfix-dsv4-skip-empty-c128-48957.sh",
                    "hotfix-dsv4-flashmla-workspace-50298.sh", "hotfix-dsv4-grammar-advance.sh")
SEED_B_NCCL_PASSTHROUGH = ("NCCL_IB_MERGE_NICS", "NCCL_IB_SUBNET_AWARE_ROUTING", "NCCL_IB_SUBNET_PREFIX_LEN",
                           "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_DMABUF_ENABLE", "NCCL_GIN_ENABLE",
                           "NCCL_IB_GID_INDEX")
# seed B's reasoning-effort mapping edit of vllm/tokenizers/deepseek_v4.py ("low" no longer mapped to "high")
_EFFORT_OLD = ('elif reasoning_effort in ("max", "xhigh"):\n                reasoning_effort = "max"\n'
               '            else:\n                reasoning_effort = "high"')
_EFFORT_NEW = ('elif reasoning_effort in ("max", "xhigh"):\n                reasoning_effort = "max"\n'
               '            elif reasoning_effort == "high":\n                reasoning_effort = "high"\n'
               '            else:\n                reasoning_effort = "low"')


# ------------------------------------------------------------------------------------------------
# the recipe, per rank (pure)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RecipePin:
    repo: str
    commit: str
    dir: str          # RECIPE_DIR as written (may start with ~: expanded per node)


@dataclass(frozen=True)
class Mount:
    source: str       # path inside the checkout ("" = the checkout itself)
    target: str       # path in the container


@dataclass(frozen=True)
class Step:
    name: str
    requires: tuple[str, ...]     # container paths that must exist before `run` ("$SITE/..." expands)
    run: str                      # shell; a non-zero exit aborts the chain
    seed: str = ""                # what the seed does here (shown in the plan and docs)


@dataclass(frozen=True)
class Marker:
    text: str         # a boot-log line must contain this
    source: str       # what prints it


@dataclass
class RankRecipe:
    name: str
    pin: RecipePin
    shell: str                    # interpreter of the entrypoint in the container / on the node
    entry: str                    # entrypoint path: in the container (docker) or in the checkout (lab process)
    generated: bool               # the runbook writes the entrypoint (seeds) vs the checkout ships it (lab)
    prefix: str                   # log prefix of the chain's lines
    mounts: list[Mount] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    preamble: list[str] = field(default_factory=list)
    script: str = ""              # the generated entrypoint ("" for the lab)

    @property
    def shell_args(self) -> list[str]:
        """Interpreter options before the script (seed B's compose runs ``bash -lc``)."""
        return ["-l"] if self.name == "dspark-v4" else []

    def to_record(self) -> dict[str, Any]:
        return {"name": self.name, "repo": self.pin.repo, "commit": self.pin.commit, "dir": self.pin.dir,
                "entry": self.entry, "generated": self.generated,
                "mounts": [f"{m.source or '.'} -> {m.target}" for m in self.mounts],
                "steps": [s.name for s in self.steps], "markers": [m.text for m in self.markers],
                "script_sha256": hashlib.sha256(self.script.encode()).hexdigest() if self.script else ""}


def recipe_pin(profile) -> RecipePin | None:
    if not profile.recipe_repo:
        return None
    return RecipePin(profile.recipe_repo, profile.recipe_commit, profile.recipe_dir)


def _seed_a(profile, pin: RecipePin, *, is_head: bool) -> RankRecipe:
    role = "head" if is_head else "worker"
    mounts = []
    if profile.chat_template:
        mounts.append(Mount("files/chat_template.jinja", profile.chat_template))
    mounts += [Mount(f"overlay/{n}", f"/opt/dsv41/{n}") for n in SEED_A_PATCHES[:5]]
    mounts += [Mount("overlay/exl3.py", "/opt/dsv41/exl3.py"), Mount(*SEED_A_DATA[0])]
    mounts += [Mount(f"overlay/{n}", f"/opt/dsv41/{n}") for n in SEED_A_PATCHES[5:9]]
    mounts += [Mount(*SEED_A_DATA[1]), Mount(*SEED_A_DATA[2])]
    mounts += [Mount(f"overlay/{n}", f"/opt/dsv41/{n}") for n in SEED_A_PATCHES[9:]]
    site = '"$SITE"'
    steps = [
        Step("vLLM install", (), "SITE=\"$(python3 -c 'import vllm, pathlib; "
             "print(pathlib.Path(vllm.__file__).resolve().parent)')\" && [ -d \"$SITE\" ] && export "
             f"GLM53_DETOKENIZER_PY={site}/v1/engine/detokenizer.py GLM53_SCHEDULER_PY={site}/v1/core/sched/"
             f"scheduler.py GLM53_SPINWAIT_TARGET={site}/distributed/device_communicators/shm_broadcast.py "
             f"GLM53_XGRAMMAR_BACKEND_PY={site}/v1/structured_output/backend_xgrammar.py "
             f"GLM53_XGRAMMAR_MANAGER_PY={site}/v1/structured_output/__init__.py",
             "SITE from `import vllm`; GLM53_* patch targets exported"),
        Step("runtime EXL3 overlay", ("/opt/dsv41/exl3.py", "$SITE/model_executor/layers/quantization"),
             f"cp /opt/dsv41/exl3.py {site}/model_executor/layers/quantization/exl3.py && "
             f"say {shlex.quote(SEED_A_OVERLAY_LINE)}",
             "cp only `if [ -f /opt/dsv41/exl3.py ]` (skipped when absent)"),
        Step("model and Engram mounts",
             (f"{profile.model_dir}/config.json", *(("/engram-src",) if profile.engram else ())), "true",
             "FATAL when MODEL_DIR/config.json or ENGRAM_MOUNT is missing (the same)"),
        Step("recipe data files", tuple(t for _, t in SEED_A_DATA) +
             ((profile.chat_template,) if profile.chat_template else ()), "true",
             "mounted, not checked (exl3_k_map.json, engram_file_backend.py, engram_layout.py, chat template)"),
    ]
    steps += [Step(n[:-3], (f"/opt/dsv41/{n}",), f"python3 /opt/dsv41/{n}",
                   "`if [ -f ]` then `python3 p || say WARN` (missing skipped, failure ignored)")
              for n in SEED_A_PATCHES]
    n = len(steps)
    return RankRecipe(
        name="exl3-v41", pin=pin, shell="bash", entry="/start.sh", generated=True, prefix=f"dsv41-exl3-{role}",
        mounts=mounts, steps=steps,
        markers=[Marker(SEED_A_OVERLAY_LINE, "seed A inner script (cp of the runtime exl3.py)"),
                 Marker(CHAIN_DONE.format(n=n), "the start chain, after its last step")],
        preamble=['say "MemAvailable=$(awk \'/^MemAvailable:/ { printf "%.1f", $2 / 1048576 }\' /proc/meminfo) '
                  'GiB engram: cache=${DSV41_CACHE_GIB:-?}GiB resident_scales=${DSV41_RESIDENT_SCALES:-default} '
                  'io_threads=${DSV41_IO_THREADS:-default}"'])


def _seed_b(profile, pin: RecipePin, *, keyed: bool) -> RankRecipe:
    hub = "/cache/huggingface/hub/models--" + profile.model_dir.replace("/", "--")
    encoding = f"{hub}/snapshots/{profile.hf_revision}/encoding/encoding_dsv4.py"
    tok = f"{SEED_B_VLLM}/tokenizers"
    opt = lambda n: f"/opt/{n}"                                   # noqa: E731 - compose: ./patches/<n>:/opt/<n>:ro
    pat = lambda n: f"/opt/dspark-patches/{n}"                    # noqa: E731 - compose: ./patches:/opt/dspark-patches
    py_files = ("hotfix-encoding-dsv4-issue21.py", "hotfix-dsv4-issue55-tool-truncation.py",
                "hotfix-dsv4-vision-exp.py", "hotfix-vllm-empty-encoder-output.py",
                "hotfix-dsv4-issue27-partial-prefill-concurrency.py", "hotfix-dsv4-issue43-decode-fairness-and-diag.py",
                "hotfix-dsv4-issue26-hybrid-swa-min.py", "hotfix-dsv4-issue133-triton-specialization.py",
                "hotfix-dsv4-runtime-ablation.py", "hotfix-dsv4-suppress-stops-in-reasoning.py")
    mounts = [Mount(f"patches/{n}", opt(n)) for n in py_files]
    mounts += [Mount("patches", "/opt/dspark-patches"), Mount("patches/tp3", "/opt/dsv4-tp3")]
    effort = ("python3 - <<'PY'\nfrom pathlib import Path\n"
              f"p = Path({tok + '/deepseek_v4.py'!r}); s = p.read_text()\n"
              f"old = {_EFFORT_OLD!r}\nnew = {_EFFORT_NEW!r}\n"
              "updated = s.replace(old, new); assert new in updated, 'reasoning-effort mapping not found'\n"
              "p.write_text(updated)\nPY")

    def py(name: str, file: str, seed: str = "`|| exit 1`") -> Step:
        return Step(name, (file,), f"python3 {file}", seed)

    def sh(name: str, file: str, seed: str = "FATAL when missing, `|| exit 1`") -> Step:
        return Step(name, (file,), f"bash {file}", seed)

    steps = [
        Step("encoding copy", (encoding, tok), f"cp {encoding} {tok}/deepseek_v4_encoding.py",
             "WARN and skip (with the two steps below) when the snapshot has no encoding_dsv4.py"),
        Step("reasoning-effort mapping", (f"{tok}/deepseek_v4.py",), effort, "inline python, `|| exit 1`"),
        py("issue21 encoder hotfix", opt(py_files[0])),
        py("issue55 tool-call truncation", opt(py_files[1])),
        sh("issue22 nvfp4_ds_mla fast path", pat("hotfix-nvfp4-ds-mla-issue22.sh")),
        sh("issue79 GB10 spin-wait", pat("hotfix-gb10-spin-wait.sh")),
        Step("issue117 SHM ring", (pat("hotfix-vllm-issue117-shm-ring-buffer.py"),),
             f"python3 {pat('hotfix-vllm-issue117-shm-ring-buffer.py')} && "
             f"python3 {pat('hotfix-vllm-issue117-shm-ring-buffer.py')} --status", "apply, then --status"),
        *[sh(f"v0.27 backport {n[len('hotfix-dsv4-'):-3]}", pat(n)) for n in SEED_B_BACKPORTS],
    ]
    if keyed:
        f = pat("hotfix-vllm-redact-api-key-log.sh")
        steps.append(Step("API-key log redaction", (f,), f"bash {f} && bash {f} --status",
                          "only when a key is set; apply, then --status"))
    steps += [py("Vision-Exp hotfix", opt(py_files[2])),
              py("issue109 empty encoder output", opt(py_files[3])),
              py("issue27 partial-prefill concurrency", opt(py_files[4])),
              py("issue43 decode fairness", opt(py_files[5])),
              py("issue26 hybrid SWA min", opt(py_files[6])),
              py("issue133 Triton specialization", opt(py_files[7])),
              py("runtime ablation (ABLATE=0)", opt(py_files[8])),
              py("suppress stops in reasoning", opt(py_files[9]))]
    markers = []
    if profile.tp == 3:
        steps.append(Step("TP=3 head pad", ("/opt/dsv4-tp3/apply_tp3_patch.py",),
                          "python3 /opt/dsv4-tp3/apply_tp3_patch.py", "only at TP_SIZE=3; FATAL when missing"))
        markers.append(Marker("DSv4 TP pad: heads 64 -> 72 for TP=3", "patches/tp3/apply_tp3_patch.py (every rank)"))
    n = len(steps)
    markers.append(Marker(CHAIN_DONE.format(n=n), "the start chain, after its last step"))
    preamble = ['export PATH="/usr/local/cuda/bin:/usr/local/bin:${PATH:-}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"',
                'export CUDA_PATH="${CUDA_PATH:-$CUDA_HOME}" CUDAToolkit_ROOT="${CUDAToolkit_ROOT:-$CUDA_HOME}" '
                'LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"',
                # an empty NCCL variable masks /etc/nccl.conf, and an empty GID index parses as 0 (fe80)
                f"for v in {' '.join(SEED_B_NCCL_PASSTHROUGH)}; do "
                'if [ -z "${!v:-}" ]; then unset "$v"; fi; done',
                'if [ -n "${TORCH_FR_DUMP_TEMP_FILE:-}" ]; then mkdir -p "$(dirname "$TORCH_FR_DUMP_TEMP_FILE")" || '
                'say "warn: cannot create the flight-recorder dump dir (boot continues)"; fi',
                'if [ "${ABLATE:-0}" = 0 ]; then unset DSV4_ABLATE_FILE; fi',
                'if [ "${VLLM_ENABLE_RESPONSES_API_STORE:-0}" != 1 ]; then '
                'export VLLM_ENABLE_RESPONSES_API_STORE=0; fi']
    return RankRecipe(name="dspark-v4", pin=pin, shell="bash", entry="/opt/spark-runbook/entrypoint.sh",
                      generated=True, prefix="dspark-v4", mounts=mounts, steps=steps, markers=markers,
                      preamble=preamble)


def _lab(profile, pin: RecipePin, *, is_head: bool) -> RankRecipe:
    steps = [Step("patch target", ("overlay/spark_lab_patch.py", "overlay/sitecustomize.py"),
                  "spark_lab_patch.check_target()", "vllm.entrypoints.launchers.app.build_app must exist"),
             Step("overlay", (), "PYTHONPATH=overlay:...", "sitecustomize arms the build_app patch")]
    markers = [Marker(CHAIN_DONE.format(n=len(steps)), "start.sh, after its last step"),
               Marker("overlay active: lab-recipe-v1", "overlay/sitecustomize.py (every Python process)")]
    if is_head:
        markers.append(Marker("patched vllm.entrypoints.launchers.app.build_app",
                              "overlay/spark_lab_patch.py (where the API server is built)"))
    entry = f"{LAB_MOUNT}/start.sh" if profile.runtime == "docker" else "start.sh"
    mounts = [Mount("", LAB_MOUNT)] if profile.runtime == "docker" else []
    return RankRecipe(name="lab", pin=pin, shell="sh" if profile.runtime == "process" else "/bin/sh", entry=entry,
                      generated=False, prefix="lab-recipe", mounts=mounts, steps=steps, markers=markers)


def rank_recipe(profile, *, is_head: bool, api_key_set: bool = False) -> RankRecipe | None:
    """The start chain of one rank (None when the profile pins no recipe: stock ``vllm serve``)."""
    pin = recipe_pin(profile)
    if pin is None:
        return None
    if profile.lab:             # the lab, and a rehearsal of a recipe on it: the lab's chain, same contract
        return _lab(profile, pin, is_head=is_head)
    if profile.recipe == "exl3-v41":
        rr = _seed_a(profile, pin, is_head=is_head)
    elif profile.recipe == "dspark-v4":
        rr = _seed_b(profile, pin, keyed=api_key_set and is_head)
    else:
        return _lab(profile, pin, is_head=is_head)
    rr.script = entrypoint_script(rr)
    return rr


def _sh_path(path: str) -> str:
    if path.startswith("$SITE/"):
        return '"$SITE"/' + shlex.quote(path[len("$SITE/"):])
    return shlex.quote(path)


def entrypoint_script(rr: RankRecipe) -> str:
    """The generated entrypoint (bash): every step's targets checked, every step fail-closed, then
    ``exec "$@"`` -- the serve argv exactly as rendered."""
    n = len(rr.steps)
    out = ["#!/bin/bash",
           f"# Generated by spark-runbook (runbook/launch/recipe.py) for {rr.name} {rr.pin.repo} @ {rr.pin.commit}.",
           "# The recipe's start chain, fail-closed: a missing target or a failing step prints one FATAL line",
           "# and exits 1 before vLLM starts. Usage: <this script> <vllm> serve <model> [flags]",
           "set -uo pipefail",
           f'say() {{ echo "[{rr.prefix}] $*"; }}',
           f'fatal() {{ echo "[{rr.prefix}] FATAL: $*" >&2; exit 1; }}',
           'need() { [ -e "$1" ] || fatal "$2: missing $1"; }',
           '[ "$#" -ge 2 ] || fatal "no vLLM argv given (usage: $0 <vllm> serve <model> [flags])"',
           f'say "recipe {rr.name} @ {rr.pin.commit[:12]}: {n} steps"',
           *rr.preamble]
    for i, s in enumerate(rr.steps, 1):
        label = f"step {i}/{n} {s.name}"
        out.append(f"# {label}")
        out += [f"need {_sh_path(r)} {shlex.quote(label)}" for r in s.requires]
        out.append(f"{{\n{s.run}\n}} || fatal {shlex.quote(label + ' failed')}\" (exit $?)\"")
        out.append(f"say {shlex.quote('applied ' + label)}")
    out += [f'say "{CHAIN_DONE.format(n=n)} (pid $$)"', 'say "exec: $*"', 'exec "$@"', ""]
    return "\n".join(out)


def checkout_files(profile) -> list[str]:
    """Every file/dir of the checkout some rank mounts or runs (checked on every node before launch)."""
    out: list[str] = []
    for is_head in (True, False):
        rr = rank_recipe(profile, is_head=is_head, api_key_set=True)
        if rr is None:
            return []
        if rr.name == "lab":
            out += ["start.sh", *rr.steps[0].requires]
            continue
        by_target = {m.target: m.source for m in rr.mounts}
        for s in rr.steps:
            for req in s.requires:
                for target, source in by_target.items():
                    if req == target or req.startswith(target.rstrip("/") + "/"):
                        out.append((source + req[len(target):]).lstrip("/"))
        out += [m.source for m in rr.mounts if m.source]
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------------------------------------
# boot-log markers (pure)
# ------------------------------------------------------------------------------------------------

def find_markers(markers: list[Marker] | list[str], log_text: str) -> dict[str, str | None]:
    """Marker text -> the first log line containing it (stripped), or None."""
    texts = [m.text if isinstance(m, Marker) else m for m in markers]
    found: dict[str, str | None] = {t: None for t in texts}
    for line in (log_text or "").splitlines():
        for t in texts:
            if found[t] is None and t in line:
                found[t] = line.strip()[:400]
    return found


def chain_failures(log_text: str) -> list[str]:
    """The start chain's FATAL lines in a rank's log."""
    return [line.strip()[:400] for line in (log_text or "").splitlines() if FATAL_RX.search(line)]


def marker_record(pin: RecipePin, expected: dict[str, list[str]], logs: dict[str, str]) -> dict[str, Any]:
    """The 04 sidecar's ``recipe`` entry: {"repo", "commit", "markers": {node: [found lines]}}."""
    return {"repo": pin.repo, "commit": pin.commit,
            "markers": {node: [line for line in find_markers(expected.get(node, []), logs.get(node, "")).values()
                               if line] for node in expected}}


# ------------------------------------------------------------------------------------------------
# the checkout on every node
# ------------------------------------------------------------------------------------------------

@dataclass
class CheckoutFact:
    state: str = "missing"        # missing | git | git-without-binary | marker | other
    commit: str = ""
    dirty: int = 0                # tracked files changed (git only)
    entries: int = 0              # files in a directory that is no checkout
    missing: list[str] = field(default_factory=list)   # required files absent

    def at(self, commit: str) -> bool:
        return self.state in ("git", "git-without-binary", "marker") and self.commit == commit

    def good(self, commit: str) -> bool:
        return self.at(commit) and not self.dirty and not self.missing

    def describe(self) -> str:
        if self.state == "missing":
            return "absent"
        if self.state == "other":
            return f"a directory with {self.entries} entries that is no recipe checkout"
        what = {"git": "git checkout", "git-without-binary": "git checkout (git not installed: .git/HEAD read)",
                "marker": "tree with .recipe-commit"}[self.state]
        extra = (f", {self.dirty} tracked file(s) modified" if self.dirty else "") + \
            (f", missing {', '.join(self.missing[:4])}" if self.missing else "")
        return f"{what} at {self.commit[:12] or '?'}{extra}"


def checkout_probe_cmd(path: str, files: list[str]) -> str:
    """Read-only: what sits at ``path`` (absolute) and which required files are absent."""
    d = shlex.quote(path)
    checks = " ".join(shlex.quote(f) for f in files)
    return (f"d={d}; if [ ! -e \"$d\" ]; then echo 'state missing'; "
            f"elif [ -e \"$d/.git\" ]; then "
            f"if command -v git >/dev/null 2>&1; then echo 'state git'; "
            f"echo \"commit $(git -C \"$d\" rev-parse HEAD 2>/dev/null)\"; "
            f"echo \"dirty $(git --no-optional-locks -C \"$d\" status --porcelain --untracked-files=no 2>/dev/null "
            f"| wc -l)\"; "
            f"else echo 'state git-without-binary'; echo \"commit $(head -n1 \"$d/.git/HEAD\" 2>/dev/null)\"; fi; "
            f"elif [ -f \"$d/.recipe-commit\" ]; then echo 'state marker'; "
            f"echo \"commit $(head -n1 \"$d/.recipe-commit\" | tr -d ' \\t\\r')\"; "
            f"else echo 'state other'; echo \"entries $(ls -A \"$d\" 2>/dev/null | wc -l)\"; fi; "
            + (f"if [ -d \"$d\" ]; then for f in {checks}; do [ -e \"$d/$f\" ] || echo \"missing $f\"; done; fi"
               if files else "true"))


def parse_checkout(text: str) -> CheckoutFact:
    f = CheckoutFact()
    for line in (text or "").splitlines():
        key, _, value = line.strip().partition(" ")
        value = value.strip()
        if key == "state":
            f.state = value
        elif key == "commit":
            f.commit = value if re.fullmatch(r"[0-9a-f]{40}", value) else ""
        elif key == "dirty" and value.isdigit():
            f.dirty = int(value)
        elif key == "entries" and value.isdigit():
            f.entries = int(value)
        elif key == "missing" and value:
            f.missing.append(value)
    if f.state == "missing":
        f.missing = []
    return f


def _home(node: Node) -> str:
    return node.read("printf %s \"$HOME\"").stdout.strip() or "/root"


def _by_hand(pin: RecipePin, head_dir: str) -> str:
    name = pin.repo.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "recipe"
    return (f"place it by hand: on a machine that reaches {pin.repo}: git clone {pin.repo} {name} && "
            f"git -C {name} checkout {pin.commit}; then rsync -a {name}/ <head>:{head_dir}/ (keep .git; for a "
            f"tree without .git write the commit into {head_dir}/.recipe-commit) and run again")


def _fetch_on_head(head: Node, profile, pin: RecipePin, path: str, fact: CheckoutFact) -> tuple[bool, str, str]:
    """Bring the head's checkout to the pinned commit. Returns (ok, what was done or observed, fix)."""
    repo = pin.repo
    if profile.lab:        # the lab's recipe (a rehearsal substitutes it for the recipe's repository)
        try:
            repo = str(lab_source_repo(profile))
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            return False, f"lab recipe repository: {exc}", "fix RECIPE_COMMIT / the lab recipe files as named"
    d, c = shlex.quote(path), shlex.quote(pin.commit)
    if fact.state == "missing":
        cmd = (f"mkdir -p {shlex.quote(os.path.dirname(path) or '/')} && git clone --quiet {shlex.quote(repo)} {d} "
               f"&& git -C {d} checkout --quiet --detach {c}")
        action = "cloned"
    elif fact.state == "git" and fact.dirty:
        return (False, f"{path}: {fact.describe()}",
                f"the runbook never discards local changes: commit or stash them in {path} (git -C {path} status), "
                f"or move the directory away and run again")
    elif fact.state == "git":
        cmd = (f"git -C {d} cat-file -e {c}^{{commit}} 2>/dev/null || git -C {d} fetch --quiet origin "
               f"|| git -C {d} fetch --quiet origin {c}; git -C {d} checkout --quiet --detach {c}")
        action = f"checked out (was {fact.commit[:12]})"
    elif fact.state == "git-without-binary":
        return False, f"{path}: git is not installed on the head", "install git on the head (apt-get install git)"
    elif fact.state == "marker":
        return (False, f"{path}: {fact.describe()} (placed by hand, not the pinned {pin.commit[:12]})",
                f"replace the tree at {path} with the pinned commit; " + _by_hand(pin, path))
    else:
        return (False, f"{path}: {fact.describe()}",
                f"move it away or set RECIPE_DIR to another path; the runbook does not overwrite it")
    try:
        head.run(cmd, timeout=900)
    except Exception as exc:  # noqa: BLE001 - reported as a failed check naming the command
        observed = getattr(exc, "observed", "") or str(exc)
        return (False, f"`{cmd}` failed on the head: {tail(observed, 8)}",
                f"check the head reaches {pin.repo} (git clone over the network) and that "
                f"{pin.commit} exists there; or " + _by_hand(pin, path))
    return True, action, ""


def _ship(cluster: Cluster, profile, target: Node, src: str, dst: str) -> tuple[bool, str]:
    """rsync the head's checkout to a worker over the fabric (the workers need no internet)."""
    argv = node_ssh_argv(profile, target, target.spec.fabric_ip)
    ssh, dest = " ".join(quote(a) for a in argv[:-1]), argv[-1]
    try:
        target.run(f"mkdir -p {quote(dst)}", timeout=60)
        cluster.head.run(f"rsync -a --delete -e {quote(ssh)} {quote(src.rstrip('/') + '/')} "
                         f"{quote(dest + ':' + dst.rstrip('/') + '/')}", timeout=1800)
    except Exception as exc:  # noqa: BLE001
        return False, tail(getattr(exc, "observed", "") or str(exc), 8)
    return True, f"shipped from the head over {target.spec.fabric_ip}"


def ensure_checkout(cluster: Cluster, profile, *, ship: bool = True) -> tuple[CheckList, dict[str, Any]]:
    """The recipe checkout at the pinned commit on every node: the head clones/checks out, the workers get
    the head's tree over the fabric (rsync, resumable); then every node is verified (read-only probe).
    ``ship=False`` only verifies (a reused server). Dry run: the actions are recorded, not run."""
    checks = CheckList()
    pin = recipe_pin(profile)
    if pin is None:
        checks.add(not_applicable("recipe checkout at the pinned commit", "no RECIPE_REPO: stock vllm serve",
                                  node="cluster"))
        return checks, {}
    files = checkout_files(profile)
    homes = cluster.each(_home)
    for name, h in homes.items():
        if isinstance(h, Exception):
            raise h
    paths = {n.name: expand_home(pin.dir, homes[n.name]) for n in cluster}   # type: ignore[arg-type]

    def probe(node: Node) -> CheckoutFact:
        return parse_checkout(node.read(checkout_probe_cmd(paths[node.name], files), timeout=60).stdout)

    def probe_all() -> dict[str, CheckoutFact]:
        got = cluster.each(probe)
        for v in got.values():
            if isinstance(v, Exception):
                raise v
        return got  # type: ignore[return-value]

    before = probe_all()
    actions = {n: "none" for n in paths}
    failed: dict[str, tuple[str, str]] = {}
    head = cluster.head
    hf = before[head.name]
    if ship and (not hf.at(pin.commit) or hf.dirty):
        ok, what, fix = _fetch_on_head(head, profile, pin, paths[head.name], hf)
        actions[head.name] = what if ok else "failed"
        if not ok:
            failed[head.name] = (what, fix)
    if ship and head.name not in failed:
        for w in cluster.workers:
            f = before[w.name]
            if f.good(pin.commit) and not actions[head.name].startswith(("cloned", "checked out")):
                continue
            if f.state == "other" and f.entries:
                failed[w.name] = (f"{paths[w.name]}: {f.describe()}",
                                  f"move it away or set RECIPE_DIR elsewhere: the copy from the head would "
                                  f"replace its contents (rsync --delete)")
                continue
            ok, what = _ship(cluster, profile, w, paths[head.name], paths[w.name])
            actions[w.name] = what if ok else "failed"
            if not ok:
                failed[w.name] = (f"rsync from the head failed: {what}",
                                  "check ssh head -> worker over the fabric (step 00) and free disk; run again "
                                  "(the copy resumes)")
    after = probe_all() if ship and not head.dry_run else before
    for node in cluster:
        f = after[node.name]
        path = paths[node.name]
        data = {"path": path, "state": f.state, "commit": f.commit, "dirty": f.dirty, "missing": f.missing,
                "action": actions[node.name]}
        if node.name in failed:
            observed, fix = failed[node.name]
            checks.add(check("recipe checkout at the pinned commit", False, node=node.name, observed=observed,
                             expected=f"{pin.repo} @ {pin.commit[:12]} at {path}", fix=fix, data=data))
            continue
        if head.dry_run and ship and not f.good(pin.commit):
            checks.add(not_applicable("recipe checkout at the pinned commit",
                                      f"dry run: {path} is {f.describe()}; would fetch/ship it", node=node.name))
            continue
        ok = f.good(pin.commit)
        status_noop = ok and actions[node.name] == "none"
        fix = (f"git -C {path} status (local changes?) / the recipe lacks a file the chain mounts: "
               f"is RECIPE_COMMIT the commit this runbook's chain was written for?" if f.at(pin.commit)
               else "run the launch again (it fetches and ships the checkout), or " + _by_hand(pin, path))
        c = check("recipe checkout at the pinned commit", ok, node=node.name,
                  observed=f"{path}: {f.describe()}" + ("" if actions[node.name] == "none"
                                                        else f" ({actions[node.name]})"),
                  expected=f"{pin.repo} @ {pin.commit[:12]}, clean, every mounted file present",
                  fix=fix, data=data)
        if status_noop:
            c.status = Status.NOOP
        checks.add(c)
    record = {"repo": pin.repo, "commit": pin.commit, "dir": pin.dir,
              "nodes": {n: {"path": paths[n], "state": after[n].state, "commit": after[n].commit,
                            "action": actions[n]} for n in paths}}
    return checks, record


# ------------------------------------------------------------------------------------------------
# the lab recipe's "upstream": a git repository built from runbook/lab/recipe/ (lab only)
# ------------------------------------------------------------------------------------------------

_GIT_ENV = {"GIT_AUTHOR_NAME": "spark-runbook lab", "GIT_AUTHOR_EMAIL": "lab@spark-runbook.invalid",
            "GIT_COMMITTER_NAME": "spark-runbook lab", "GIT_COMMITTER_EMAIL": "lab@spark-runbook.invalid",
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def _git(*args: str, cwd: Path | None = None, timeout: float = 60) -> str:
    env = {**os.environ, **_GIT_ENV}
    res = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {res.stderr.strip()[-400:]}")
    return res.stdout.strip()


def _lab_files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc")


def _build_lab_repo(src: Path, work: Path) -> str:
    """A git repository of ``src`` at ``work`` with one commit by a fixed author at a fixed date: its id
    depends only on the files (and which are executable). Returns the commit."""
    _git("init", "--quiet", "--template=", str(work))
    for p in _lab_files(src):
        dest = work / p.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dest)
    _git("add", "--all", cwd=work)
    for p in _lab_files(src):
        rel = str(p.relative_to(src))
        _git("update-index", f"--chmod={'+' if rel.endswith('.sh') else '-'}x", rel, cwd=work)
    _git("-c", "commit.gpgSign=false", "commit", "--quiet", "--no-verify", "-m", "spark-runbook lab recipe",
         cwd=work)
    return _git("rev-parse", "HEAD", cwd=work)


def lab_source_commit(src: Path = LAB_SOURCE) -> str:
    """The commit the lab recipe's files make (what env/lab.env pins)."""
    with tempfile.TemporaryDirectory(prefix="lab-recipe-") as tmp:
        return _build_lab_repo(src, Path(tmp) / "work")


def lab_source_repo(profile, src: Path = LAB_SOURCE) -> Path:
    """The lab's stand-in for the recipe's upstream: a bare repository at RECIPE_REPO (a local path) built
    from ``runbook/lab/recipe/``, which the lab head clones like a real head clones from GitHub. Refuses
    when the files no longer make RECIPE_COMMIT (someone edited the lab recipe: update the pin)."""
    dest = profile.resolve_path(profile.recipe_repo)
    if dest.is_dir():
        try:
            if _git("--git-dir", str(dest), "cat-file", "-t", profile.recipe_commit) == "commit":
                return dest
        except RuntimeError:
            pass
    with tempfile.TemporaryDirectory(prefix="lab-recipe-") as tmp:
        work = Path(tmp) / "work"
        commit = _build_lab_repo(src, work)
        if commit != profile.recipe_commit:
            raise RuntimeError(f"the lab recipe files ({src}) make commit {commit}, but RECIPE_COMMIT="
                               f"{profile.recipe_commit}: set RECIPE_COMMIT={commit} in "
                               f"{profile.source or 'the profile'}")
        staged = Path(tmp) / "bare.git"
        _git("clone", "--quiet", "--bare", str(work), str(staged))
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(str(staged), str(dest))
    return dest
