"""The recipe: the start chain every rank runs before ``vllm serve``, from a checkout pinned at one commit,
and the boot-log lines that show it ran (pure; the checkout on the nodes: ``checkout.py``).

    pin = recipe_pin(profile)                              # RECIPE_REPO @ RECIPE_COMMIT in RECIPE_DIR, or None
    rr = rank_recipe(profile, is_head=True, api_key_set=False)   # pure: mounts, steps, markers, entrypoint
    rr.script                                              # the generated entrypoint (seeds) or "" (the lab's start.sh)
    files = checkout_files(profile)                        # what the checkout must hold on every node
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
  only warning on a failing one; here a missing one aborts (the checkout must hold it) and a failing one prints
  ``[<prefix>] WARN: step i/n <patch> failed`` and the chain goes on, as the recipe's does.
* ``dspark-v4`` (seed B, ``docker-compose.dspark.yml`` command @ 01eed1e): the compose entrypoint, generated
  here (the compose inlines it), mounted at ``/opt/spark-runbook/entrypoint.sh``; hotfixes mounted at the
  compose's ``/opt/hotfix-*.py``, ``/opt/dspark-patches`` and ``/opt/dsv4-tp3``. The encoding copy is
  fail-closed here (seed B warns and skips it when the snapshot lacks ``encoding/encoding_dsv4.py``).
* ``lab``: the lab recipe's own ``start.sh`` (``runbook/lab/recipe/``), built into a git repository with a
  fixed author and date so its commit depends only on its files (``checkout.lab_source_repo``); docker mounts
  the checkout at ``/opt/lab-recipe``, the process runtime runs it from the node's checkout.
"""
from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Marker",
    "Mount",
    "RankRecipe",
    "RecipePin",
    "ChainStep",
    "chain_failures",
    "chain_warnings",
    "checkout_files",
    "find_markers",
    "marker_record",
    "rank_recipe",
    "recipe_pin",
]

LAB_MOUNT = "/opt/lab-recipe"
CHAIN_DONE = "start chain complete: {n} steps applied"
FATAL_RX = re.compile(r"\] FATAL: ")
WARN_TEXT = "WARN:"
WARN_RX = re.compile(r"\] WARN: step \d+/\d+ ")

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
class ChainStep:
    name: str
    requires: tuple[str, ...]     # container paths that must exist before `run` ("$SITE/..." expands)
    run: str                      # shell; a non-zero exit aborts the chain (unless warn_only)
    seed: str = ""                # what the seed does here (shown in the plan and docs)
    warn_only: bool = False       # the recipe tolerates a failure: one WARN line, the chain goes on


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
    steps: list[ChainStep] = field(default_factory=list)
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
        ChainStep("vLLM install", (), "SITE=\"$(python3 -c 'import vllm, pathlib; "
             "print(pathlib.Path(vllm.__file__).resolve().parent)')\" && [ -d \"$SITE\" ] && export "
             f"GLM53_DETOKENIZER_PY={site}/v1/engine/detokenizer.py GLM53_SCHEDULER_PY={site}/v1/core/sched/"
             f"scheduler.py GLM53_SPINWAIT_TARGET={site}/distributed/device_communicators/shm_broadcast.py "
             f"GLM53_XGRAMMAR_BACKEND_PY={site}/v1/structured_output/backend_xgrammar.py "
             f"GLM53_XGRAMMAR_MANAGER_PY={site}/v1/structured_output/__init__.py",
             "SITE from `import vllm`; GLM53_* patch targets exported"),
        ChainStep("runtime EXL3 overlay", ("/opt/dsv41/exl3.py", "$SITE/model_executor/layers/quantization"),
             f"cp /opt/dsv41/exl3.py {site}/model_executor/layers/quantization/exl3.py && "
             f"say {shlex.quote(SEED_A_OVERLAY_LINE)}",
             "cp only `if [ -f /opt/dsv41/exl3.py ]` (skipped when absent)"),
        ChainStep("model and Engram mounts",
             (f"{profile.model_dir}/config.json", *(("/engram-src",) if profile.engram else ())), "true",
             "FATAL when MODEL_DIR/config.json or ENGRAM_MOUNT is missing (the same)"),
        ChainStep("recipe data files", tuple(t for _, t in SEED_A_DATA) +
             ((profile.chat_template,) if profile.chat_template else ()), "true",
             "mounted, not checked (exl3_k_map.json, engram_file_backend.py, engram_layout.py, chat template)"),
    ]
    # seed A's loop only warns on a failing patch (no failure is known to break serving): so does this chain,
    # and step 04 turns the WARN line into a WARN row naming the patch; a missing file still fails closed
    steps += [ChainStep(n[:-3], (f"/opt/dsv41/{n}",), f"python3 /opt/dsv41/{n}",
                   "`if [ -f ]` then `python3 p || say WARN` (missing skipped, failure only warned)", warn_only=True)
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

    def py(name: str, file: str, seed: str = "`|| exit 1`") -> ChainStep:
        return ChainStep(name, (file,), f"python3 {file}", seed)

    def sh(name: str, file: str, seed: str = "FATAL when missing, `|| exit 1`") -> ChainStep:
        return ChainStep(name, (file,), f"bash {file}", seed)

    steps = [
        ChainStep("encoding copy", (encoding, tok),
             f"cp {shlex.quote(encoding)} {shlex.quote(tok + '/deepseek_v4_encoding.py')}",
             "WARN and skip (with the two steps below) when the snapshot has no encoding_dsv4.py"),
        ChainStep("reasoning-effort mapping", (f"{tok}/deepseek_v4.py",), effort, "inline python, `|| exit 1`"),
        py("issue21 encoder hotfix", opt(py_files[0])),
        py("issue55 tool-call truncation", opt(py_files[1])),
        sh("issue22 nvfp4_ds_mla fast path", pat("hotfix-nvfp4-ds-mla-issue22.sh")),
        sh("issue79 GB10 spin-wait", pat("hotfix-gb10-spin-wait.sh")),
        ChainStep("issue117 SHM ring", (pat("hotfix-vllm-issue117-shm-ring-buffer.py"),),
             f"python3 {pat('hotfix-vllm-issue117-shm-ring-buffer.py')} && "
             f"python3 {pat('hotfix-vllm-issue117-shm-ring-buffer.py')} --status", "apply, then --status"),
        *[sh(f"v0.27 backport {n[len('hotfix-dsv4-'):-3]}", pat(n)) for n in SEED_B_BACKPORTS],
    ]
    if keyed:
        f = pat("hotfix-vllm-redact-api-key-log.sh")
        steps.append(ChainStep("API-key log redaction", (f,), f"bash {f} && bash {f} --status",
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
        steps.append(ChainStep("TP=3 head pad", ("/opt/dsv4-tp3/apply_tp3_patch.py",),
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
    steps = [ChainStep("patch target", ("overlay/spark_lab_patch.py", "overlay/sitecustomize.py"),
                  "spark_lab_patch.check_target()", "vllm.entrypoints.launchers.app.build_app must exist"),
             ChainStep("overlay", (), "PYTHONPATH=overlay:...", "sitecustomize arms the build_app patch")]
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


def _one_line(text: str) -> str:
    """Text for a comment line: a line break in a value would end the comment and run the rest."""
    return "".join(c if c.isprintable() else "?" for c in text)


def entrypoint_script(rr: RankRecipe) -> str:
    """The generated entrypoint (bash): every step's targets checked, every step fail-closed, then
    ``exec "$@"`` -- the serve argv exactly as rendered."""
    n = len(rr.steps)
    out = ["#!/bin/bash",
           f"# Generated by spark-runbook (runbook/launch/recipe.py) for {_one_line(rr.name)} "
           f"{_one_line(rr.pin.repo)} @ {_one_line(rr.pin.commit)}.",
           "# The recipe's start chain, fail-closed: a missing target or a failing step prints one FATAL line",
           "# and exits 1 before vLLM starts. Usage: <this script> <vllm> serve <model> [flags]",
           "set -uo pipefail",
           f'say() {{ echo "[{rr.prefix}] $*"; }}',
           f'fatal() {{ echo "[{rr.prefix}] FATAL: $*" >&2; exit 1; }}',
           'need() { [ -e "$1" ] || fatal "$2: missing $1"; }',
           '[ "$#" -ge 2 ] || fatal "no vLLM argv given (usage: $0 <vllm> serve <model> [flags])"',
           "say " + shlex.quote(f"recipe {rr.name} @ {rr.pin.commit[:12]}: {n} steps"),
           *rr.preamble]
    for i, s in enumerate(rr.steps, 1):
        label = f"step {i}/{n} {s.name}"
        out.append(f"# {label}")
        out += [f"need {_sh_path(r)} {shlex.quote(label)}" for r in s.requires]
        if s.warn_only:
            out.append(f"if {{\n{s.run}\n}}; then say {shlex.quote('applied ' + label)}; else "
                       f"say \"{WARN_TEXT} {label} failed (exit $?); the boot continues as the recipe's does\"; fi")
            continue
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


def chain_warnings(log_text: str) -> list[str]:
    """The start chain's WARN lines (a tolerated step that failed) in a rank's log."""
    return [line.strip()[:400] for line in (log_text or "").splitlines() if WARN_RX.search(line)]


def chain_failures(log_text: str) -> list[str]:
    """The start chain's FATAL lines in a rank's log."""
    return [line.strip()[:400] for line in (log_text or "").splitlines() if FATAL_RX.search(line)]


def marker_record(pin: RecipePin, expected: dict[str, list[str]], logs: dict[str, str]) -> dict[str, Any]:
    """The 04 sidecar's ``recipe`` entry: {"repo", "commit", "markers": {node: [found lines]}}."""
    return {"repo": pin.repo, "commit": pin.commit,
            "markers": {node: [line for line in find_markers(expected.get(node, []), logs.get(node, "")).values()
                               if line] for node in expected}}
