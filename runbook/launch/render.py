"""Render the per-rank launch of ``vllm serve`` from the profile. Pure: no I/O, no clock.

    facts = {"head": NodeFacts(home="/home/me", gid_index=3), "worker": NodeFacts(...)}
    plan = render(profile, facts, api_key_set=bool(secrets.api_key))
    print(plan.to_text())            # what will run, secrets masked; shown before anything runs
    plan.fingerprint                 # sha256 of every rank's argv + env (secrets excluded)
    plan.ranks[0].start_command      # the shell line the head runs (docker run ... / nohup ... &)

Two runtimes:

* ``docker`` — ``docker run -d`` with the recipe's flags (seed A ``start.sh`` / seed B compose):
  ``--network host --ipc=host --shm-size``, ``--ulimit stack``, ``--oom-score-adj 1000``, volumes for
  the weights, the JIT caches and (seed A) the per-rank packed Engram dir *only where that node has
  the rank's shard* (a fact). ``--gpus all`` only with ``EXPECT_GPU=1``; ``/dev/infiniband``,
  ``IPC_LOCK`` and ``--ulimit memlock=-1`` only with ``EXPECT_RDMA=1`` (RDMA memory registration;
  the lab has neither and its VM may not raise memlock). ``--ipc=host`` holds in the lab too: each lab
  node has its own IPC namespace and /dev/shm.
* ``process`` — ``VLLM_BIN serve ...`` started with ``setsid nohup ... &`` on the node (the lab's
  CPU vLLM). Relative parts of ``VLLM_BIN`` resolve against the repo root (shared by the lab nodes).

Recipe start chain (``recipe.py``): with RECIPE_REPO pinned, every rank runs the recipe's entrypoint,
which applies the overlay/hotfix files mounted from the node's checkout fail-closed and then ``exec``s the
serve argv below unchanged. docker: ``--entrypoint <shell> IMAGE <entrypoint> <serve argv>`` (seed A's
generated inner script at ``/start.sh``, seed B's generated compose chain at
``/opt/spark-runbook/entrypoint.sh``, the lab's ``start.sh`` from the checkout mounted at
``/opt/lab-recipe``); process (lab): ``sh <checkout>/start.sh <serve argv>``. A generated entrypoint is
written next to the rank's state by the start command and enters the fingerprint.

Per-rank environment: ``VLLM_HOST_IP`` = the node's fabric IP, ``NCCL/GLOO(/TP)_SOCKET_IFNAME`` = its
fabric netdev, ``NCCL_IB_HCA`` = its HCAs, ``NCCL_IB_GID_INDEX`` = its GID index (a pinned profile value,
or the index resolved from sysfs by the network step; seed B's ``auto`` leaves it unset), the recipe's
NCCL and vLLM knobs, and for the lab the CPU knobs (``VLLM_CPU_KVCACHE_SPACE``, per-rank
``VLLM_CPU_OMP_THREADS_BIND``). The API key never appears: it is passed as ``VLLM_API_KEY`` from the
runbook's environment at start time (shown as ``***``), and it is not part of the fingerprint.

The worker's argv equals the head's plus ``--headless`` (both seeds pass ``--port`` to the worker too).

``EXECUTOR=ray`` (NVIDIA's DGX Spark vLLM playbook, nvidia/vllm/README.md "Run on two Sparks" steps 4-8, through
vLLM's examples/online_serving/run_cluster.sh; sparkrun src/sparkrun/orchestration/scripts.py
generate_ray_head_script / generate_ray_worker_script / generate_exec_serve_script): every node runs
``ray start --block`` with the rank's environment above (the Ray workers vLLM places there inherit it from the
raylet), in the recipe's container (docker: the container's command; process: a ``setsid`` group), the head with
``--head --node-ip-address <its host_ip> --port 6379``, each worker with ``--address <head>:6379
--node-ip-address <its host_ip>``, each declaring one GPU and a resource named after the node
(``facts/ray.py``); once ``ray status`` shows every node, ``vllm serve ... --distributed-executor-backend ray``
runs on the head alone (``docker exec`` into the head's container), without ``--nnodes``/``--node-rank``/
``--master-addr``/``--headless``: Ray places the ranks.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..facts import ray as ray_facts
from ..facts.nccl import nccl_env
from ..secrets import MASK
from ..facts.ranks import FINGERPRINT_LABEL, STATE_SUBDIR
from ..profile.rules import LAB_RAY_CPU_SITE, LAB_RAY_SITE
from ..remote import expand_home
from .recipe import rank_recipe

__all__ = [
    "FINGERPRINT_LABEL",
    "SECRET_ENV",
    "STATE_SUBDIR",
    "LaunchPlan",
    "NodeFacts",
    "RankLaunch",
    "check_consistency",
    "expand_home",
    "lab_scaled_sizes",
    "render",
    "tp_pad",
]

SECRET_ENV = ("VLLM_API_KEY",)
# vLLM allows every web origin by default (--allowed-origins ['*']): a page in the browser of whoever holds an
# SSH forward to the loopback API could call it and read the answers. None of the runbook's clients is a
# browser, so no origin gets CORS headers (docs/security.md).
ALLOWED_ORIGINS = "[]"

# seed A start.sh: "6 is included so a k=3 step (2 seqs x 3 tokens) is captured"
SEED_A_CAPTURE_SIZES = [1, 2, 3, 4, 6, 8, 12, 18, 24]

# seed A nccl_common + serve_env (seeds-repos.md §A.4), values as start.sh exports them
_EXL3_ENV: dict[str, str] = {
    "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1", "CUDA_LAUNCH_BLOCKING": "0", "DSV41_EXL3_SERIAL_STREAMS": "1",
    "DSV41_ENGRAM_DISABLE": "0", "DSV41_INDEXER_PREFILL_FACTOR": "1", "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "256",
    "DSV41_PREFILL_EMPTY_CACHE_TOKENS": "8192", "DSV41_PREFILL_EMPTY_CACHE_MEMAVAIL_GIB": "2.5",
    "DSV41_PREFILL_END_EMPTY_CACHE": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CACHE_ROOT": "/root/.cache/vllm", "TRITON_CACHE_DIR": "/root/.triton/cache",
    "TILELANG_CACHE_DIR": "/root/.tilelang/cache", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800",
    "TORCH_CUDA_ARCH_LIST": "12.1a", "FLASHINFER_CUDA_ARCH_LIST": "12.1a",
    "FLASHINFER_DISABLE_VERSION_CHECK": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1",
    "DSV41_EXL3_K_MAP": "/opt/dsv41/exl3_k_map.json", "GLM53_DENSE_FP8": "off",
    "DSV41_CACHE_GIB": "0", "DSV41_RESIDENT_SCALES": "0", "DSV41_IO_THREADS": "96", "DSV41_CACHE_WAYS": "4",
    "DSV41_STATS_SECONDS": "60", "DSV41_SOURCE": "/engram-src", "DSV41_DROP_PAGE_CACHE": "1",
    "DSV41_SKIP_MIXED_WARMUP": "0",
    # the EXL3 kernel settings and the GLM53_* switches start.sh passes (serve_env / nccl_common), with the
    # values .env.example @ 503b482 gives them (start.sh sources .env, copied from .env.example): E3 grouped
    # fat-expert kernels on, 16 fused rows per expert; without them the overlay falls back to its legacy path
    "EXL3_FUSED_MOE": "1", "EXL3_MOE_ROW_TILE": "0", "EXL3_TEMP_ROWS_FUSED": "16", "EXL3_FAT_SORTED": "0",
    "EXL3_FAT_BATCHED": "0", "EXL3_FAT_KERNEL": "0", "EXL3_FAT_GROUPED": "1",
    "GLM53_SUPPRESS_STOPS_IN_REASONING": "1", "GLM53_MIXED_PREFILL_CHUNK": "0", "GLM53_INDEXER_WORKSPACE": "stock",
    "GLM53_SPINWAIT_MS": "stock",
}

# seed B docker-compose.dspark.yml environment (seeds-repos.md §B.2/B.3, Vision-Exp era)
_DSPARK_ENV: dict[str, str] = {
    "HF_HOME": "/cache/huggingface", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_XET": "1",
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": "4096", "DSPARK_MAX_INFLIGHT_PREFILLS": "1",
    "VLLM_CACHE_ROOT": "/cache/huggingface/vllm-cache", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "256", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0",
    "VLLM_USE_FLASHINFER_SAMPLER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1800", "VLLM_USE_B12X_MOE": "1",
    "TORCH_CUDA_ARCH_LIST": "12.1a", "FLASHINFER_CUDA_ARCH_LIST": "12.1a", "CUTE_DSL_ARCH": "sm_121a",
    "FLASHINFER_DISABLE_VERSION_CHECK": "1", "FLASHINFER_WORKSPACE_BASE": "/cache/huggingface/flashinfer",
    "TILELANG_CLEANUP_TEMP_FILES": "1", "TILELANG_CACHE_DIR": "/cache/huggingface/tilelang-cache",
    "TRITON_CACHE_DIR": "/cache/huggingface/triton-cache", "DG_JIT_USE_NVRTC": "0",
    "DG_JIT_NVCC_COMPILER": "/usr/local/cuda/bin/nvcc", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    # read by the hotfix chain (compose defaults at 01eed1e) and issue #117's flight recorder
    "ABLATE": "0", "DSPARK_SUPPRESS_STOPS_IN_REASONING": "1", "VLLM_ENABLE_RESPONSES_API_STORE": "0",
    "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_ENABLE_MONITORING": "1",
    "TORCH_FR_DUMP_TEMP_FILE": "/cache/huggingface/nccl-fr/comm_lib_trace_rank_",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/fr_dump_pipe_",
    "B12X_CUTE_COMPILE_CACHE_DIR": "/cache/huggingface/b12x-cute-cache",
    # the rest of the compose's environment at 01eed1e with a non-empty default: the b12x MoE kernel knobs,
    # the ablation and Responses-store settings, and every DSPARK_* hotfix switch (0 = the chain's default path)
    "VLLM_B12X_W4A16_FORCE_BLOCKS_PER_SM": "0", "VLLM_B12X_W4A16_FORCE_BLOCKS_MAX_M": "16",
    "B12X_W4A16_TC_DECODE": "0", "DSV4_ABLATE_LAMBDA": "3.5", "DSV4_ABLATE_LAYERS": "10-42",
    "DSPARK_RESPONSES_STORE_MAX_ENTRIES": "256", "DSPARK_ISSUE43_SCHED_DIAG": "0",
    "ENABLE_VLLM_GB10_PATCH": "0", "GB10_HYBRID_NVFP4_M_THRESHOLD": "128",
    "DSPARK_SKIP_HOTFIX": "0", "DSPARK_SKIP_ISSUE22_HOTFIX": "0", "DSPARK_SKIP_SUPPRESS_STOPS_HOTFIX": "0",
    "DSPARK_SKIP_SPIN_WAIT_HOTFIX": "0", "DSPARK_SKIP_ISSUE117_RECHECK_HOTFIX": "0",
    "DSPARK_ENABLE_ASSISTANT_FINAL_HOTFIX": "0", "DSPARK_ENABLE_ISSUE138_RESPONSES_HISTORY_COMPAT": "0",
    "DSPARK_ENABLE_CODEX_AGENT_MESSAGE_COMPAT": "0", "DSPARK_ENABLE_ISSUE141_SPARSE_MLA_CHUNK": "0",
    "DSPARK_ENABLE_ADAPTIVE_CHUNK": "0", "DSPARK_ENABLE_REPLICATE_MARKOV": "0", "DSPARK_ENABLE_SP_INDEXER": "0",
    "DSPARK_SP_INDEXER_MIN_KEYS": "8192", "DSPARK_ENABLE_DEEPGEMM_SM121_ALIAS": "0",
    "DSPARK_ENABLE_ISSUE136_XGRAMMAR_HOTFIX": "0", "DSPARK_ENABLE_ISSUE191_TOOLCALL_FAILCLOSED": "0",
    "DSPARK_ISSUE191_TOOLCALL_RETRIES": "2", "DSPARK_ISSUE191_TOOLCALL_MODE": "failclosed",
    "DSPARK_ISSUE191_TOOLCALL_THINKOFF_FALLBACK": "1", "DSPARK_ASYNC_SCHEDULING": "1",
    "DSPARK_ENABLE_DSPARK_BLOCK_K": "0", "DSPARK_ENABLE_ROPE_SWA_FIX": "0", "DSPARK_ENABLE_DSPARK_SWA_PREFIX": "0",
    "DSPARK_ENABLE_DSML_RECOVERY": "0", "DSPARK_ENABLE_MXFP4_INDEXER_CACHE": "0",
    "DSPARK_ENABLE_C128A_PREFILL_CACHE": "0", "DSPARK_ENABLE_ISSUE144_EFFORT_ALIGN": "0",
    "DSPARK_ENABLE_ISSUE31_GPU_HOTFIX": "0",
}
# seed B compose: `restart: ${DSPARK_RESTART_POLICY:-unless-stopped}` (dockerd brings the ranks back after a
# reboot; a start then finds them running and exits 3) and `stop_grace_period: ${DSPARK_STOP_GRACE:-10s}`
# (vLLM ignores SIGTERM while loading). Seed A's `docker run` sets no restart policy and --stop-timeout 60.
RESTART_POLICY = {"dspark-v4": "unless-stopped"}
STOP_TIMEOUT = {"exl3-v41": "60", "dspark-v4": "10"}
SEED_B_VLLM_BIN = "/usr/local/bin/vllm"             # the compose's `exec /usr/local/bin/vllm serve`
RECIPE_COMMIT_ENV = "SPARK_RUNBOOK_RECIPE_COMMIT"   # the pinned recipe commit, visible in every rank

# DeepSeek-V4-Flash attention: 64 heads in 8 output groups of 8 (seed B docs/TP3.md). TP must divide the
# groups; the TP3 patch pads groups 8 -> 9 (heads-per-group stays 8) and logs the line below.
DSV4_HEADS = 64
DSV4_GROUPS = 8
TP_PAD_LINE = "DSv4 TP pad: heads {heads} -> {padded} for TP={tp}"

# the lab's CPU vLLM (vllm-cpu-feasibility.md §3, §11)
_LAB_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
}

_DSPARK_THINKING = {
    "off": {"thinking": False}, "low": {"thinking": True, "reasoning_effort": "low"},
    "high": {"thinking": True, "reasoning_effort": "high"}, "max": {"thinking": True, "reasoning_effort": "max"},
}
_DSPARK_REASONING_CONFIG = {"reasoning_parser": "deepseek_v4", "reasoning_start_str": "<think>",
                            "reasoning_end_str": "</think>"}


@dataclass(frozen=True)
class NodeFacts:
    """What render needs to know about one node (read by ``plan.gather_facts``)."""
    home: str = "/root"                 # expands ~ in node-side paths (docker -v needs absolute paths)
    gid_index: int | None = None        # resolved RoCE v2 GID index when the profile says auto
    packed_engram: bool = False         # engram-l1-r{rank}of{TP}.bin exists in ENGRAM_PACKED_DIR
    runtime_mounts: tuple[str, ...] = ()   # lab docker: host dirs bind-mounted read-only (python, venv, repo)


@dataclass
class RankLaunch:
    node: str
    rank: int
    headless: bool
    runtime: str
    serve_argv: list[str]          # the full `vllm serve ...` argv (VLLM_BIN expanded)
    env: dict[str, str]            # environment of the vLLM process (no secret values)
    secret_env: list[str]          # names passed from the runbook's environment at start (values masked)
    docker_argv: list[str] = field(default_factory=list)   # docker run ... (docker runtime)
    container: str = ""
    state_dir: str = ""            # node dir holding pid/fingerprint/log (process) and the start record
    log_path: str = ""             # process runtime log file ("" for docker: `docker logs`)
    fingerprint: str = ""          # the cluster fingerprint (same on every rank)
    entry_argv: list[str] = field(default_factory=list)   # the recipe entrypoint before serve_argv (process)
    entry_script: str = ""         # generated recipe entrypoint (seeds), written to entry_path at start
    entry_path: str = ""           # node path of the generated entrypoint
    recipe_markers: list[str] = field(default_factory=list)   # lines this rank's boot log must show
    executor: str = "mp"           # EXECUTOR: mp | ray
    ray_argv: list[str] = field(default_factory=list)      # ray: this node's `ray start --block ...`
    serve_env: dict[str, str] = field(default_factory=dict)   # ray: what only the head's vllm serve gets (RAY_ADDRESS)

    @property
    def ray_pid_path(self) -> str:
        return ray_facts.pid_path(self.state_dir, self.node)

    @property
    def ray_log_path(self) -> str:
        return ray_facts.log_path(self.state_dir, self.node)

    @property
    def serves(self) -> bool:
        """This node runs ``vllm serve`` (every node under mp; the head alone under ray)."""
        return bool(self.serve_argv)

    def ray_display_argv(self) -> list[str]:
        env = [f"{k}={v}" for k, v in self.env.items()]
        return list(self.docker_argv) if self.runtime == "docker" else ["env", *env, *self.ray_argv]

    def ray_start_command(self) -> str:
        """Shell line that starts this node's Ray (``ray start --block``) and returns at once: docker, the
        container whose command it is; process, its own session and process group, whose pid is kept (stop signals
        that group: every Ray daemon of the node is in it)."""
        if self.runtime == "docker":
            argv = list(self.docker_argv)
            argv = argv[:3] + ["--label", f"{FINGERPRINT_LABEL}={self.fingerprint}"] + argv[3:]
            prepare = f"mkdir -p {shlex.quote(self.state_dir)}"
            if self.entry_script:
                prepare += f" && printf '%s' {shlex.quote(self.entry_script)} > {shlex.quote(self.entry_path)}"
            return (f"{prepare} || exit 1; docker rm -f {shlex.quote(self.container)} >/dev/null 2>&1; "
                    + " ".join(shlex.quote(a) for a in argv))
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in self.env.items())
        d, log, pid = (shlex.quote(x) for x in (self.state_dir, self.ray_log_path, self.ray_pid_path))
        ray = " ".join(shlex.quote(a) for a in [*self.entry_argv, *self.ray_argv])
        return (f"mkdir -p {d} && cd {d} || exit 1; [ -f {log} ] && mv -f {log} {log}.1; "
                f"env {env} setsid nohup {ray} > {log} 2>&1 < /dev/null & echo $! > {pid}; cat {pid}")

    def _in_runtime(self, command: str) -> str:
        """A read-only command where this node's Ray runs: in its container under docker."""
        if self.runtime == "docker":
            return f"docker exec {shlex.quote(self.container)} sh -c {shlex.quote(command)}"
        return command

    def ray_status_command(self) -> str:
        """``ray status`` against the head's GCS, run where this node's Ray runs (read-only)."""
        ray_cli = self.ray_argv[:self.ray_argv.index("start")]
        address = (f"{flag_value(self.ray_argv, '--node-ip-address')}:{flag_value(self.ray_argv, '--port')}"
                   if "--head" in self.ray_argv else flag_value(self.ray_argv, "--address"))
        env = {k: v for k, v in self.env.items() if k == "PYTHONPATH"} if self.runtime == "process" else None
        return self._in_runtime(ray_facts.status_command(ray_cli, address or "", env))

    def ray_logs_command(self, tail_lines: int = 100) -> str:
        """The tails of this node's Ray session logs (raylet, GCS, the Ray workers' stderr), read-only."""
        return self._in_runtime(ray_facts.logs_command(self.node, tail_lines))

    def ray_left_command(self) -> str:
        """What is left of this node's Ray (read-only; empty = nothing): the members of its ``ray start`` process
        group, or the Ray daemons in its container. Zombies (stat Z) hold nothing: they wait for whoever reaps
        orphans on that host."""
        if self.runtime == "docker":
            return self._in_runtime("ps -eo pid=,stat=,args= | grep -E 'raylet|gcs_server' | grep -v grep; true") \
                + " 2>/dev/null; true"
        pid = shlex.quote(self.ray_pid_path)
        return (f"g=$(cat {pid} 2>/dev/null); [ -n \"$g\" ] && ps -eo pid=,pgid=,stat=,args= 2>/dev/null "
                f"| awk -v g=\"$g\" '$2 == g && $3 !~ /^Z/'; true")

    def ray_stop_command(self, grace: int = 30) -> str:
        """Shell line that ends this node's Ray after vLLM: docker, ``ray stop`` inside the container (its own pid
        namespace: only this node's Ray); process, SIGTERM to the ``ray start`` process group, then SIGKILL after
        ``grace`` s. Never a bare ``ray stop`` on a host: it kills every Ray process there by name
        (ray/scripts/scripts.py, docs/four-nodes.md)."""
        if self.runtime == "docker":
            return (f"docker exec {shlex.quote(self.container)} {' '.join(shlex.quote(a) for a in self.ray_argv[:self.ray_argv.index('start')])} "
                    f"stop --grace-period {int(grace)} >/dev/null 2>&1; true")
        pid = shlex.quote(self.ray_pid_path)
        # `kill -SIG -PGID`: dash's kill takes no `--` (sh -c on a node may be dash); a member counts until it is
        # gone or a zombie (which `kill -0` still finds until whoever reaps orphans there gets to it)
        live = "ps -eo pgid=,stat= | awk -v g=$g '$1 == g && $2 !~ /^Z/' | grep -q ."
        return (f"g=$(cat {pid} 2>/dev/null); [ -n \"$g\" ] || exit 0; kill -TERM -$g 2>/dev/null; "
                f"i=0; while {live} && [ $i -lt {int(grace)} ]; do sleep 1; i=$((i+1)); done; "
                f"kill -KILL -$g 2>/dev/null; i=0; while {live} && [ $i -lt 5 ]; do sleep 1; i=$((i+1)); done; true")

    @property
    def pid_path(self) -> str:
        """The pid the watch follows: the rank's vLLM; on a Ray worker (no vLLM of its own), its ``ray start``."""
        if self.executor == "ray" and not self.serve_argv:
            return self.ray_pid_path
        return f"{self.state_dir}/{self.node}.pid"

    @property
    def fp_path(self) -> str:
        return f"{self.state_dir}/{self.node}.fingerprint"

    @property
    def record_path(self) -> str:
        return f"{self.state_dir}/{self.node}.json"

    def display_argv(self) -> list[str]:
        """The argv shown to the user (docker run ... or env ... vllm serve ...)."""
        if self.executor == "ray" and self.runtime == "docker":     # the serve, exec'd in the Ray container
            return ["docker", "exec", "-d", *[x for k, v in self.serve_env.items() for x in ("-e", f"{k}={v}")],
                    *[x for k in self.secret_env for x in ("-e", k)], self.container, *self.serve_argv]
        if self.runtime == "docker":
            return list(self.docker_argv)
        env = ([f"{k}={v}" for k, v in {**self.env, **self.serve_env}.items()]
               + [f"{k}={MASK}" for k in self.secret_env])
        return ["env", *env, *self.entry_argv, *self.serve_argv]

    def start_command(self) -> str:
        """Shell line that starts this rank on its node and returns at once. Secret values are
        supplied by the caller's ``env=`` (exported before this line, masked in the command log)."""
        if self.executor == "ray" and self.runtime == "docker":
            # the head's serve inside its Ray container; the container's environment is the rank's, and the pid
            # and log land in the state dir it mounts
            serve = " ".join(shlex.quote(a) for a in self.serve_argv)
            inner = (f"echo $$ > {shlex.quote(self.pid_path)}; exec {serve} > {shlex.quote(self.log_path)} 2>&1")
            argv = self.display_argv()[:-len(self.serve_argv)]
            return (f"echo {shlex.quote(self.fingerprint)} > {shlex.quote(self.fp_path)} && "
                    + " ".join(shlex.quote(a) for a in argv) + f" sh -c {shlex.quote(inner)}")
        if self.runtime == "docker":
            argv = list(self.docker_argv)
            label = ["--label", f"{FINGERPRINT_LABEL}={self.fingerprint}"]
            argv = argv[:3] + label + argv[3:]          # docker run -d <label> ...
            prepare = f"mkdir -p {shlex.quote(self.state_dir)}"
            if self.entry_script:                      # the generated recipe entrypoint, mounted read-only
                prepare += f" && printf '%s' {shlex.quote(self.entry_script)} > {shlex.quote(self.entry_path)}"
            return (f"{prepare} || exit 1; "
                    f"docker rm -f {shlex.quote(self.container)} >/dev/null 2>&1; "
                    + " ".join(shlex.quote(a) for a in argv))
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in {**self.env, **self.serve_env}.items())
        serve = " ".join(shlex.quote(a) for a in [*self.entry_argv, *self.serve_argv])
        d, log = shlex.quote(self.state_dir), shlex.quote(self.log_path)
        # `;` not `&&` before the background job: `a && b &` would background the whole list and
        # $! would be a subshell, not vLLM. setsid: own session/process group (stop signals the group).
        return (f"mkdir -p {d} && cd {d} || exit 1; [ -f {log} ] && mv -f {log} {log}.1; "
                f"echo {shlex.quote(self.fingerprint)} > {shlex.quote(self.fp_path)}; "
                # secret_env is already exported by the remote layer (read from stdin): vLLM inherits it and
                # it never appears in an argv, not even env's for the instant before it execs
                f"env {env} setsid nohup {serve} > {log} 2>&1 < /dev/null & "
                f"echo $! > {shlex.quote(self.pid_path)}; cat {shlex.quote(self.pid_path)}")

    def to_record(self) -> dict[str, Any]:
        rec = asdict(self)
        rec["display"] = shlex.join(self.display_argv())
        rec["secret_env"] = {k: MASK for k in self.secret_env}
        return rec


@dataclass
class LaunchPlan:
    profile_name: str
    recipe: str
    runtime: str
    ranks: list[RankLaunch]
    fingerprint: str
    base_port: int
    served_model_name: str
    max_model_len: int
    expect_log: list[str] = field(default_factory=list)    # lines every rank's boot log must show (TP pad)
    recipe_chain: dict[str, Any] | None = None   # the pinned recipe and each rank's start chain (recipe.py)

    @property
    def head(self) -> RankLaunch:
        return self.ranks[0]

    @property
    def workers(self) -> list[RankLaunch]:
        return self.ranks[1:]

    def rank(self, node: str) -> RankLaunch:
        for r in self.ranks:
            if r.node == node:
                return r
        raise KeyError(node)

    def to_text(self) -> str:
        out = [(f"# {self.profile_name}: recipe {self.recipe}, runtime {self.runtime}, "
                f"fingerprint {self.fingerprint[:16]}")]
        for line in self.expect_log:
            out.append(f"# boot log must show: {line}")
        if self.recipe_chain:
            rc = self.recipe_chain
            out.append(f"# recipe {rc['name']}: {rc['repo']} @ {rc['commit']} in {rc['dir']}")
        if self.ranks and self.ranks[0].executor == "ray":
            out.append(f"# executor ray: Ray on every node (head first), then `ray status` until "
                       f"{len(self.ranks)} nodes and {len(self.ranks)} GPU, then vllm serve on the head alone")
            for r in self.ranks:                                  # start order: the head's GCS first
                out.append(f"\n## ray node {r.rank} on {r.node}{' (head)' if r.rank == 0 else ''}")
                out.append(_pretty(r.ray_display_argv()))
            out.append(f"\n## vllm serve on {self.head.node} (--distributed-executor-backend ray)")
            out.append(_pretty(self.head.display_argv()))
            return "\n".join(out)
        for r in sorted(self.ranks, key=lambda r: -r.rank):      # start order: workers first
            out.append(f"\n## rank {r.rank} on {r.node}{' (headless)' if r.headless else ''}")
            if self.recipe_chain:
                steps = self.recipe_chain["steps"].get(r.node, [])
                out.append(f"# start chain ({len(steps)} steps, fail-closed): {'; '.join(steps)}")
                out.append(f"# this rank's boot log must show: {' | '.join(r.recipe_markers)}")
            out.append(_pretty(r.display_argv()))
        return "\n".join(out)

    def to_record(self) -> dict[str, Any]:
        return {"profile": self.profile_name, "recipe": self.recipe, "runtime": self.runtime,
                "fingerprint": self.fingerprint, "expect_log": list(self.expect_log),
                "recipe_chain": self.recipe_chain,
                "ranks": [r.to_record() for r in self.ranks]}


def _pretty(argv: list[str]) -> str:
    """One flag per line (``--flag value``), shell-quoted, for reading."""
    lines: list[str] = []
    cur: list[str] = []
    for a in argv:
        if a.startswith("-") and cur and not (len(cur) == 1 and cur[0] == "-e"):
            lines.append(" ".join(shlex.quote(x) for x in cur))
            cur = []
        cur.append(a)
    if cur:
        lines.append(" ".join(shlex.quote(x) for x in cur))
    return " \\\n    ".join(lines)


def vllm_bin_parts(profile) -> list[str]:
    """VLLM_BIN split; relative parts with a slash resolve against the repo root."""
    out = []
    for part in shlex.split(profile.vllm_bin):
        if "/" in part and not part.startswith(("/", "~", "-")):
            part = str(profile.resolve_path(part))
        out.append(part)
    return out


LAB_OBJECT_STORE_BYTES = 100 * 1024 * 1024     # Ray's floor is 75 MiB; the lab's nodes share one /dev/shm


def lab_ray_site(profile) -> str:
    """The lab's Ray site dir (``<repo>/.lab/ray-site``), run by the python of VLLM_BIN."""
    return str(profile.resolve_path(LAB_RAY_SITE))


def ray_bin_parts(profile) -> list[str]:
    """The Ray CLI in the runtime: ``ray`` from the image (the playbook's NGC image and sparkrun's carry it); the
    lab: the venv's python running the Ray site's ``ray`` script."""
    if profile.lab:
        return [vllm_bin_parts(profile)[0], f"{lab_ray_site(profile)}/bin/ray"]
    return ["ray"]


def _ray_env(profile) -> dict[str, str]:
    """What Ray's daemons need beyond the rank's environment: no memory monitor (the playbook's and sparkrun's
    RAY_memory_monitor_refresh_ms=0: it kills workers of a node whose memory a model fills on purpose). The lab: its
    Ray site and the lab-only substitution dir on PYTHONPATH (the head's serve arms it through vllm_cli.py, and Ray's
    runtime-env hook puts the dir first for every actor: runbook/lab/ray_cpu_site/spark_runbook_lab_ray_cpu.py)."""
    env = {"RAY_memory_monitor_refresh_ms": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    if profile.lab:     # the lab's Ray, and (LAB ONLY) the CPU vLLM's Ray device key: profile.rules.LAB_RAY_CPU_WHY
        env["PYTHONPATH"] = f"{lab_ray_site(profile)}:{profile.resolve_path(LAB_RAY_CPU_SITE)}"
    return env


def _ray_start_argv(profile, spec, ray_bin: list[str]) -> list[str]:
    """``ray start --block`` for one node: the head's GCS on its host_ip:6379, each worker joining it with its own
    --node-ip-address (Ray's own guess goes through a default route a fabric does not have), one GPU each, and a
    resource named after the node so ``ray status`` names who joined (facts/ray.py)."""
    p = profile
    a = [*ray_bin, "start", "--block"]
    if spec.is_head:
        a += ["--head", "--node-ip-address", spec.host_ip, "--port", str(ray_facts.RAY_PORT),
              "--include-dashboard", "false"]     # worker: `ray start` refuses the flag (Ray 2.60 scripts.py:1204)
    else:
        a += ["--address", f"{p.nodes[0].host_ip}:{ray_facts.RAY_PORT}", "--node-ip-address", spec.host_ip]
    # one GPU per Spark; the lab's CPU nodes declare one too, so the wait is the same rule (N nodes, N GPU)
    a += ["--num-gpus", "1", "--resources", json.dumps({ray_facts.NODE_RESOURCE.format(node=spec.name): 1}),
          "--temp-dir", ray_facts.temp_dir(spec.name), "--disable-usage-stats"]
    if p.lab:       # one CPU rank per lab node, and a small object store on the one /dev/shm the nodes share
        a += ["--num-cpus", "1", "--object-store-memory", str(LAB_OBJECT_STORE_BYTES)]
    return a


def _serve_flags(profile, *, rank: int, headless: bool, api_key_set: bool,
                 master_port: int) -> list[str]:
    """The `vllm serve` arguments after the positional model, in the recipe's order. Under EXECUTOR=ray the
    head's only: no --nnodes/--node-rank/--master-addr/--master-port/--headless (Ray places the ranks)."""
    p = profile
    ray = p.executor == "ray"
    rendezvous = [] if ray else ["--nnodes", str(p.nnodes), "--node-rank", str(rank),
                                 "--master-addr", p.master_addr, "--master-port", str(master_port)]
    tp_flags = ["--tensor-parallel-size", str(p.tp),
                *(["--pipeline-parallel-size", str(p.pp)] if p.pp > 1 else []),   # PP=1: vLLM's default, not passed
                *rendezvous]
    spec = p.speculative_config
    spec_json = json.dumps(spec, separators=(",", ":")) if spec else ""
    limit_mm = json.dumps(p.limit_mm, separators=(",", ":")) if p.limit_mm else ""
    f: list[str] = []
    if p.recipe == "dspark-v4":
        # seed B compose command (B.2), Vision-Exp era
        if p.hf_revision:
            f += ["--revision", p.hf_revision]
        f += ["--served-model-name", p.served_model_name, "--host", p.api_host, "--port", str(p.port),
              "--allowed-origins", ALLOWED_ORIGINS, "--trust-remote-code"]
        if p.quantization:
            f += ["--quantization", p.quantization]
        f += ["--tensor-parallel-size", str(p.tp), "--pipeline-parallel-size", str(p.pp)]
        if p.kv_cache_dtype:
            f += ["--kv-cache-dtype", p.kv_cache_dtype]
        if p.kv_block_size:
            f += ["--block-size", str(p.kv_block_size)]
        f += ["--max-model-len", str(p.max_model_len), "--max-num-seqs", str(p.max_num_seqs),
              "--max-num-batched-tokens", str(p.max_num_batched_tokens)]
        if p.long_prefill_token_threshold:
            f += ["--long-prefill-token-threshold", str(p.long_prefill_token_threshold)]
        if not p.enforce_eager:
            f += ["--max-cudagraph-capture-size", str(p.cudagraph_capture_size)]
        else:
            f += ["--enforce-eager"]
        f += ["--gpu-memory-utilization", _num(p.gpu_mem_util)]
        if p.kv_cache_memory_bytes:
            f += ["--kv-cache-memory-bytes", str(p.kv_cache_memory_bytes)]
        f += ["--enable-prefix-caching", "--enable-prompt-tokens-details", "--async-scheduling",
              "--enable-chunked-prefill"]
        if spec_json:
            f += ["--speculative-config", spec_json]
        f += ["--tokenizer-mode", p.tokenizer_mode, "--distributed-executor-backend", p.executor,
              "--moe-backend", "flashinfer_b12x"]
        if p.tool_call_parser:
            f += ["--tool-call-parser", p.tool_call_parser, "--enable-auto-tool-choice"]
        if p.reasoning_parser:
            f += ["--reasoning-parser", p.reasoning_parser,
                  "--reasoning-config", json.dumps({**_DSPARK_REASONING_CONFIG,
                                                    "reasoning_parser": p.reasoning_parser},
                                                   separators=(",", ":"))]
        if p.default_thinking:
            f += ["--default-chat-template-kwargs",
                  json.dumps(_DSPARK_THINKING[p.default_thinking], separators=(",", ":"))]
        if p.chat_template:
            f += ["--chat-template", p.chat_template]
        if p.tool_strict_level:
            f += ["--tool-strict-level", p.tool_strict_level]
        f += ["--generation-config", "vllm", "--enable-flashinfer-autotune"]
        if p.vision:
            if limit_mm:
                f += ["--limit-mm-per-prompt", limit_mm]
        else:
            f += ["--language-model-only"]
        f += rendezvous
        if headless:
            f += ["--headless"]
        f += p.extra_args_list
        return f

    # seed A start.sh inner script (A.3); the lab uses the same shape
    f += ["--served-model-name", p.served_model_name, "--host", p.api_host, "--port", str(p.port),
          "--allowed-origins", ALLOWED_ORIGINS, *tp_flags,
          "--distributed-executor-backend", p.executor, "--tokenizer-mode", p.tokenizer_mode]
    if p.tool_call_parser:
        f += ["--tool-call-parser", p.tool_call_parser]
    if p.reasoning_parser:
        f += ["--reasoning-parser", p.reasoning_parser]
    if p.tool_call_parser:
        f += ["--enable-auto-tool-choice"]
    if p.recipe == "exl3-v41" and not p.lab:
        f += ["--enable-prefix-caching", "--enable-prompt-tokens-details", "--no-enable-flashinfer-autotune"]
    elif p.lab:
        # as on the recipes: prefix caching on, and cached_tokens reported so the benchmark can
        # prove that none of its prompts hit the cache
        f += ["--enable-prefix-caching", "--enable-prompt-tokens-details"]
    if p.recipe == "exl3-v41":
        if p.engram:
            f += ["--hf-overrides", json.dumps({"engram_table_dir": "/engram-src"}, separators=(",", ":"))]
    if headless:
        f += ["--headless"]
    if p.enforce_eager:
        f += ["--enforce-eager"]
    if p.quantization:
        f += ["--quantization", p.quantization]
    f += ["--max-model-len", str(p.max_model_len), "--gpu-memory-utilization", _num(p.gpu_mem_util),
          "--max-num-seqs", str(p.max_num_seqs), "--max-num-batched-tokens", str(p.max_num_batched_tokens)]
    if p.long_prefill_token_threshold:
        f += ["--long-prefill-token-threshold", str(p.long_prefill_token_threshold)]
    if p.kv_cache_dtype:
        f += ["--kv-cache-dtype", p.kv_cache_dtype]
    if p.kv_cache_memory_bytes:
        f += ["--kv-cache-memory-bytes", str(p.kv_cache_memory_bytes)]
    if p.kv_block_size:
        f += ["--block-size", str(p.kv_block_size)]
    if spec_json:
        f += ["--speculative-config", spec_json]
    if p.chat_template:
        f += ["--chat-template", p.chat_template]
    if p.tool_strict_level:
        f += ["--tool-strict-level", p.tool_strict_level]
    if p.default_thinking:
        f += ["--default-chat-template-kwargs",
              json.dumps(_DSPARK_THINKING[p.default_thinking], separators=(",", ":"))]
    if p.vision:
        f += ["--mm-encoder-tp-mode", "data"]
        if limit_mm:
            f += ["--limit-mm-per-prompt", limit_mm]
        f += ["--skip-mm-profiling"]
    else:
        f += ["--language-model-only"]
    user_capture = any(a.startswith(("--cudagraph-capture-sizes", "--max-cudagraph-capture-size"))
                       for a in p.extra_args_list)
    if not p.enforce_eager and not user_capture:
        if p.recipe == "exl3-v41":
            f += ["--cudagraph-capture-sizes", *[str(s) for s in SEED_A_CAPTURE_SIZES]]
        else:
            f += ["--max-cudagraph-capture-size", str(p.cudagraph_capture_size)]
    f += p.extra_args_list
    return f


def _num(x: float) -> str:
    """0.8 -> '0.80'? No: the seeds write 0.80 / 0.88; keep two decimals when that is exact."""
    s = f"{x:.2f}"
    return s if float(s) == x else repr(x)


def _rank_env(profile, spec, facts: NodeFacts, *, rank: int, headless: bool, master_port: int) -> dict[str, str]:
    p = profile
    env: dict[str, str] = {}
    if p.recipe == "exl3-v41":
        env.update(_EXL3_ENV)
        env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(p.ready_timeout)
        if p.engram and facts.packed_engram:
            env["DSV41_PACKED_DIR"] = "/engram-packed"
    elif p.recipe == "dspark-v4":
        env.update(_DSPARK_ENV)
        env.update({"DSPARK_MODEL": p.model_dir, "DSPARK_REVISION": p.hf_revision,
                    "NODE_RANK": str(rank), "HEADLESS": "1" if headless else "",
                    "MASTER_ADDR": p.master_addr, "MASTER_PORT": str(master_port),
                    "MTP_NUM_TOKENS": str(p.spec_k), "TP_SIZE": str(p.tp), "NNODES": str(p.nnodes)})
        if p.draft_sample_method:
            env["DRAFT_SAMPLE_METHOD"] = p.draft_sample_method
        if p.default_thinking:
            env["DEFAULT_THINKING"] = p.default_thinking
        if p.limit_mm:
            env["LIMIT_MM_PER_PROMPT"] = json.dumps(p.limit_mm, separators=(",", ":"))
    else:
        env.update(_LAB_ENV)
        if p.engram:        # the lab recipe's stand-in for seed A's file-backed Engram reads these (engram_standin.py)
            env["DSV41_SOURCE"] = expand_home(p.engram_src_dir, facts.home)
            if facts.packed_engram and p.engram_packed_dir:
                env["DSV41_PACKED_DIR"] = expand_home(p.engram_packed_dir, facts.home)
    # fabric, per rank (BOOTSTRAP_IF, when set, carries VLLM_HOST_IP and the socket traffic; seed B TP3)
    env["VLLM_HOST_IP"] = spec.host_ip
    # every NCCL variable from the one function step 01's nccl-tests use too: what 01 proves is what runs
    env.update(nccl_env(p, spec, facts.gid_index))
    env["GLOO_SOCKET_IFNAME"] = spec.socket_if
    if p.recipe != "exl3-v41":          # seed A sets no TP_SOCKET_IFNAME (A.4)
        env["TP_SOCKET_IFNAME"] = spec.socket_if
    if p.recipe_repo:
        env[RECIPE_COMMIT_ENV] = p.recipe_commit
    if p.lab:                # the lab's CPU vLLM (also under a rehearsed recipe)
        if not p.kv_cache_memory_bytes:
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"      # GiB; the env var would override the flag
        # LAB_CPU_BIND, or derived from the CPUs the lab's nodes share with this host (3 ranks on 2 cores: 0,1,1)
        env["VLLM_CPU_OMP_THREADS_BIND"] = p.cpu_bind(rank, cpus=len(os.sched_getaffinity(0)))
    return env


def _docker_argv(profile, spec, facts: NodeFacts, *, rank: int, env: Mapping[str, str],
                 secret_env: list[str], serve_argv: list[str], vllm_bin: list[str], rr=None,
                 entry_path: str = "", state_dir: str = "") -> list[str]:
    p = profile
    home = facts.home
    name = p.container_on(spec.name)
    a = ["docker", "run", "-d", "--name", name]
    if p.expect_gpu and not p.lab:       # a rehearsal keeps EXPECT_GPU for its simulated rows; no GPU to pass
        a += ["--gpus", "all"]
    # --ipc=host in the lab too: each lab node has its own IPC namespace and /dev/shm (nodeinit.sh),
    # so vLLM's same-node probe sees two machines there as on Sparks.
    a += ["--network", "host", "--ipc=host"]
    a += ["--shm-size", p.shm_size]
    if p.recipe in RESTART_POLICY and not p.lab:
        a += ["--restart", RESTART_POLICY[p.recipe]]
    if p.recipe in STOP_TIMEOUT:
        a += ["--stop-timeout", STOP_TIMEOUT[p.recipe]]
    a += ["--oom-score-adj", "1000", "--cap-add", "SYS_PTRACE"]
    if p.expect_rdma and not p.lab:      # the lab has no RDMA device (and cannot raise memlock)
        a += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1"]
    a += ["--ulimit", "stack=67108864"]
    # volumes
    weights = expand_home(p.weights_dir_on(spec.name), home)
    cache = expand_home(p.cache_dir, home)
    vols: list[str] = []
    if p.recipe == "dspark-v4" or not p.model_dir.startswith("/"):
        vols.append(f"{weights}:/cache/huggingface")
    else:
        vols.append(f"{weights}:{p.model_dir}:ro")
    if p.recipe == "exl3-v41":
        if p.engram:
            vols.append(f"{cache}/engram-src:/engram-src:ro")
            if p.engram_source_shared_on(spec.name):     # the slim dir's shards are symlinks into the share
                shared = expand_home(p.engram_src_dir, home)
                vols.append(f"{shared}:{shared}:ro")
            if facts.packed_engram and p.engram_packed_dir:
                vols.append(f"{expand_home(p.engram_packed_dir, home)}:/engram-packed:ro")
        vols += [f"{cache}:/root/.cache/vllm", f"{cache}/triton:/root/.triton/cache",
                 f"{cache}/tilelang:/root/.tilelang/cache"]
    elif p.recipe == "dspark-v4":
        vols.append(f"{cache}/tmp:/tmp")
    else:
        vols.append(f"{cache}/vllm:/root/.cache/vllm")
        if p.engram:        # at the same paths: the lab recipe's Engram stand-in reads them there
            vols.append(f"{expand_home(p.engram_src_dir, home)}:{expand_home(p.engram_src_dir, home)}:ro")
            if facts.packed_engram and p.engram_packed_dir:
                packed = expand_home(p.engram_packed_dir, home)
                vols.append(f"{packed}:{packed}:ro")
    for m in facts.runtime_mounts:
        vols.append(f"{m}:{m}:ro")
    if state_dir:                            # ray: the head's serve writes its pid and log there (docker exec)
        vols.append(f"{state_dir}:{state_dir}")
    if rr is not None:                       # the recipe's files, from this node's checkout, where it mounts them
        checkout = expand_home(p.recipe_dir, home).rstrip("/")
        vols += [f"{checkout}/{m.source}".rstrip("/") + f":{m.target}:ro" for m in rr.mounts]
        if rr.generated:
            vols.append(f"{entry_path}:{rr.entry}:ro")
    for v in vols:
        a += ["-v", v]
    for k, v in env.items():
        a += ["-e", f"{k}={v}"]
    for k in secret_env:
        a += ["-e", k]                       # value from the docker client's environment
    if rr is not None:
        a += ["--entrypoint", rr.shell, p.image, *rr.shell_args, rr.entry, *serve_argv]
    else:
        a += ["--entrypoint", vllm_bin[0], p.image, *vllm_bin[1:], *serve_argv[len(vllm_bin):]]
    return a


def render(profile, facts: Mapping[str, NodeFacts] | None = None, *, api_key_set: bool = False,
           node_overrides: Mapping[str, Mapping[str, Any]] | None = None) -> LaunchPlan:
    """Build every rank's launch from the profile and node facts. Pure.

    ``node_overrides`` is a test hook: ``{"worker": {"master_port": 29599}}`` renders that rank with a
    different value, honestly visible in the plan (and caught by :func:`check_consistency`).
    """
    p = profile
    facts = dict(facts or {})
    node_overrides = dict(node_overrides or {})
    vllm_bin = vllm_bin_parts(p) if p.runtime == "process" else ["vllm"]
    if p.runtime == "docker" and p.lab:
        vllm_bin = vllm_bin_parts(p)          # the lab's image has no vllm: the host venv is mounted in
    elif p.runtime == "docker" and p.recipe == "dspark-v4":
        vllm_bin = [SEED_B_VLLM_BIN]
    recipes: dict[str, Any] = {}
    ranks: list[RankLaunch] = []
    for spec in p.nodes:
        nf = facts.get(spec.name, NodeFacts())
        ov = dict(node_overrides.get(spec.name, {}))
        unknown = set(ov) - {"master_port"}
        if unknown:
            raise ValueError(f"node_overrides supports master_port only, got {sorted(unknown)}")
        master_port = int(ov.get("master_port", p.master_port))
        ray = p.executor == "ray"
        headless = not spec.is_head and not ray
        secret_env = ["VLLM_API_KEY"] if (api_key_set and spec.is_head) else []
        env = _rank_env(p, spec, nf, rank=spec.rank, headless=headless, master_port=master_port)
        serve = [*vllm_bin, "serve", p.model_dir,
                 *_serve_flags(p, rank=spec.rank, headless=headless, api_key_set=api_key_set,
                               master_port=master_port)] if spec.is_head or not ray else []
        state_dir = f"{expand_home(p.cache_dir, nf.home)}/{STATE_SUBDIR}"
        r = RankLaunch(node=spec.name, rank=spec.rank, headless=headless, runtime=p.runtime,
                       serve_argv=serve, env=env, secret_env=secret_env, state_dir=state_dir,
                       container=p.container_on(spec.name) if p.runtime == "docker" else "",
                       log_path=("" if p.runtime == "docker" and not ray else
                                 ray_facts.log_path(state_dir, spec.name) if ray and not serve else
                                 f"{state_dir}/{spec.name}.log"))
        if ray:
            ray_bin = ray_bin_parts(p)
            r.executor, r.ray_argv = "ray", _ray_start_argv(p, spec, ray_bin)
            r.env.update(_ray_env(p))
            if spec.is_head:
                r.serve_env = {"RAY_ADDRESS": f"{p.nodes[0].host_ip}:{ray_facts.RAY_PORT}"}
        rr = rank_recipe(p, is_head=spec.is_head, api_key_set=bool(secret_env))
        if rr is not None:
            recipes[spec.name] = rr
            r.recipe_markers = [m.text for m in rr.markers]
            if rr.generated:
                r.entry_script, r.entry_path = rr.script, f"{state_dir}/{spec.name}.entrypoint.sh"
            if p.runtime == "process":
                r.entry_argv = [rr.shell, f"{expand_home(p.recipe_dir, nf.home).rstrip('/')}/{rr.entry}"]
        if p.runtime == "docker" and ray:     # the node's container runs its Ray; the serve is exec'd into the head's
            r.docker_argv = _docker_argv(p, spec, nf, rank=spec.rank, env=env, secret_env=[],
                                         serve_argv=r.ray_argv, vllm_bin=ray_bin, rr=rr, entry_path=r.entry_path,
                                         state_dir=state_dir)
        elif p.runtime == "docker":
            r.docker_argv = _docker_argv(p, spec, nf, rank=spec.rank, env=env, secret_env=secret_env,
                                         serve_argv=serve, vllm_bin=vllm_bin, rr=rr, entry_path=r.entry_path)
        ranks.append(r)
    fp = fingerprint(ranks)
    for r in ranks:
        r.fingerprint = fp
    pad = tp_pad(p)
    return LaunchPlan(profile_name=p.name, recipe=p.recipe, runtime=p.runtime, ranks=ranks, fingerprint=fp,
                      base_port=p.port, served_model_name=p.served_model_name, max_model_len=p.max_model_len,
                      expect_log=[pad["line"]] if pad else [], recipe_chain=_recipe_record(recipes))


def _recipe_record(recipes: dict[str, Any]) -> dict[str, Any] | None:
    """The plan's view of the recipe: the pin, and per rank its start chain and boot-log markers."""
    if not recipes:
        return None
    first = next(iter(recipes.values())).to_record()
    return {"name": first["name"], "repo": first["repo"], "commit": first["commit"], "dir": first["dir"],
            "entry": first["entry"], "generated": first["generated"],
            "mounts": {n: rr.to_record()["mounts"] for n, rr in recipes.items()},
            "steps": {n: [s.name for s in rr.steps] for n, rr in recipes.items()},
            "markers": {n: [m.text for m in rr.markers] for n, rr in recipes.items()},
            "marker_sources": {n: {m.text: m.source for m in rr.markers} for n, rr in recipes.items()}}


def tp_pad(profile) -> dict[str, Any] | None:
    """The DeepSeek-V4 attention head pad the recipe's TP needs, or None when TP divides the groups.

    dspark-v4 at TP=3: groups 8 -> 9 (heads-per-group 8), heads 64 -> 72; the seed's entrypoint applies
    ``patches/tp3/apply_tp3_patch.py`` when TP_SIZE=3 and the boot log must show
    ``DSv4 TP pad: heads 64 -> 72 for TP=3`` (without it stock vLLM refuses ``64 % 3`` or silently keeps
    ``8 // 3`` groups per rank). Other recipes: None (their models are not padded)."""
    return head_pad(profile.recipe, profile.tp)


def head_pad(recipe: str, tp: int) -> dict[str, Any] | None:
    """:func:`tp_pad` for a recipe name and a TP size (the arithmetic, for any TP)."""
    if recipe != "dspark-v4" or DSV4_GROUPS % tp == 0:
        return None
    groups = -(-DSV4_GROUPS // tp) * tp
    per_group = DSV4_HEADS // DSV4_GROUPS
    padded = groups * per_group
    return {"tp": tp, "heads": DSV4_HEADS, "padded": padded, "groups": DSV4_GROUPS, "padded_groups": groups,
            "line": TP_PAD_LINE.format(heads=DSV4_HEADS, padded=padded, tp=tp)}


def fingerprint(ranks: list[RankLaunch]) -> str:
    """sha256 over every rank's runtime, argv and environment; secret values never enter it
    (only whether a secret is passed)."""
    payload = [{"node": r.node, "runtime": r.runtime, "argv": r.docker_argv or [*r.entry_argv, *r.serve_argv],
                "env": sorted(r.env.items()), "secrets": sorted(r.secret_env),
                "entry_script": hashlib.sha256(r.entry_script.encode()).hexdigest(),
                # ray only (the mp fingerprints stay what they were): its start and the serve's own environment
                **({"ray": r.ray_argv, "serve": r.serve_argv, "serve_env": sorted(r.serve_env.items())}
                   if r.executor == "ray" else {})} for r in ranks]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def flag_value(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def check_consistency(plan: LaunchPlan) -> list[str]:
    """Flags every rank must agree on (rendezvous and shape). Returns human-readable problems;
    a disagreement would hang the rendezvous, so start refuses before running anything."""
    problems = []
    head = plan.head
    if head.executor == "ray":      # one rendezvous: every worker's Ray joins the head's GCS
        want = f"{flag_value(head.ray_argv, '--node-ip-address')}:{flag_value(head.ray_argv, '--port')}"
        for r in plan.workers:
            got = flag_value(r.ray_argv, "--address")
            if got != want:
                problems.append(f"{r.node} ray --address {got} but head GCS {want}")
        return problems
    for flag in ("--master-addr", "--master-port", "--nnodes", "--tensor-parallel-size", "--pipeline-parallel-size",
                 "--max-model-len"):
        want = flag_value(head.serve_argv, flag)
        for r in plan.workers:
            got = flag_value(r.serve_argv, flag)
            if got != want:
                problems.append(f"{r.node} {flag} {got} but head {flag} {want}")
    ranks = sorted(int(flag_value(r.serve_argv, "--node-rank") or -1) for r in plan.ranks)
    if ranks != list(range(len(plan.ranks))):
        problems.append(f"node ranks {ranks} are not 0..{len(plan.ranks) - 1}")
    return problems


def lab_scaled_sizes(profile) -> list[tuple[str, int]]:
    """Request sizes of the capacity table: 32k/200k/500k/1M tokens; in the lab scaled so that 1M
    maps to MAX_MODEL_LEN (the tiny model's 4096-token context)."""
    sizes = [("32k", 32 * 1024), ("200k", 200_000), ("500k", 500_000), ("1M", 1_048_576)]
    if profile.lab:
        scale = profile.max_model_len / 1_048_576
        return [(f"{label} (x{scale:.4g} = {max(1, round(n * scale))})", max(1, round(n * scale)))
                for label, n in sizes]
    return sizes
