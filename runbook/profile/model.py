"""The profile model: one pydantic field per key (attribute = lower-case key; the field order is the order
of :data:`KEYS`, of the form and of the docs), and the values derived from them (node list, master address,
capture size, speculative config, per-node paths and containers), computed here and nowhere else.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ..secrets import mask_tokens
from .nodes import NODE_NAMES, NodeSpec, configured_count, node_key, node_keys, node_specs, topology
from .types import (Bool, BindAddress, Command, Commit, CpuBind, DefaultThinking, DraftSampleMethod, EngramRevision, Executor,
                    ExtraArgs, Float, Gid, HcaList, HfRepo, HfRevision, IfName, Image, Int, IntList, IPv4,
                    KvCacheDtype, LimitMM, LocalPath, ModelDir, NodePath, RecipeName, RecipeRepo, Runtime, RuntimePath,
                    ServedModelName, ShmSize, SpecMethod, SshTarget, Str, ToolStrictLevel, Url, WeightSync, WeightTransport, Word)

#: the checkout: relative profile and local paths resolve against it
REPO_ROOT = Path(__file__).resolve().parents[2]

_SEED_A = "seed A validate_numeric_config"


def _who(name: str, rank: int) -> str:
    return f"the {name} (rank {rank})" if rank < 2 else f"{name} (rank {rank})"


def _per_node(ns: dict, suffix: str, type_: Any, default: Any, describe) -> None:
    """Declare ``<node>_<suffix>`` for every node of :data:`~.nodes.NODE_NAMES` in rank order into the class
    namespace ``ns`` (a class body's ``locals()``, which is that namespace): one type and one description shape
    for every node, so the head, the worker and worker2 ... worker7 have the same keys."""
    for rank, name in enumerate(NODE_NAMES):
        attr = node_key(name, suffix).lower()
        ns["__annotations__"][attr] = type_
        text = describe(_who(name, rank), rank)
        ns[attr] = Field(default_factory=list, description=text) if default is list else \
            Field(default, description=text)


class Profile(BaseModel):
    """A validated profile. Build it with :func:`load_profile`; attributes are lower-case keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    # --- identity and nodes
    profile_name: Str() = Field("", description="name shown in reports (default: file stem)")
    recipe: RecipeName = Field("lab", description="which recipe the steps follow")
    _per_node(locals(), "SSH", SshTarget, "",
              lambda who, r: f"ssh target of {who}" + (f"; empty = {r} nodes (set without gaps)" if r >= 2 else ""))
    ssh_config: LocalPath = Field("", description="ssh config file for aliases (local path)")
    ssh_key: LocalPath = Field("", description="private key (local path); empty = agent/default keys")
    known_hosts: LocalPath = Field("", description="known_hosts file (local path); empty = ~/.ssh/known_hosts")
    ssh_accept_new_host_keys: Bool = Field(False, description="accept unknown host keys (lab only)")
    allow_ssh_config_commands: Bool = Field(False, description="accept an SSH_CONFIG whose directives run commands "
                                            "on this machine (ProxyCommand, LocalCommand, Match exec, "
                                            "KnownHostsCommand); listed by validate for review")
    ssh_connect_timeout: Int(1, 600) = Field(15, description="ssh connect timeout, s")
    command_timeout: Int(1, 86400) = Field(120, description="default timeout per remote command, s")
    lab: Bool = Field(False, description="bring up the embedded lab before running")
    rehearsal: Bool = Field(False, description="rehearse this recipe profile on the lab (set by `run --rehearse`: "
                                               "its substitutions are listed in rehearsal.json; hardware-only rows "
                                               "say SIMULATED)")
    lab_cpu_bind: CpuBind = Field("", description="lab CPU vLLM: VLLM_CPU_OMP_THREADS_BIND per rank, "
                                  "comma-separated (e.g. 0,1,1); empty = the head alone on CPU 0, the "
                                  "other ranks in turn on the host's other CPUs")

    # --- fabric
    _per_node(locals(), "IP", IPv4, "", lambda who, r: f"fabric IPv4 of {who} (its VLLM_HOST_IP"
              + ("; the master address)" if r == 0 else ")"))
    _per_node(locals(), "CX7_IF", IfName, "", lambda who, r: f"fabric netdev of {who} (NCCL/GLOO_SOCKET_IFNAME)")
    _per_node(locals(), "CX7_IB", HcaList, list, lambda who, r: f"RoCE HCAs of {who} (NCCL_IB_HCA)")
    _per_node(locals(), "GID", Gid, "auto", lambda who, r: f"NCCL_IB_GID_INDEX of {who}, or auto")
    fabric_mtu: Int(576, 9216) = Field(9000, description="expected fabric MTU")
    bootstrap_if: IfName = Field("", description="interface common to every node for Gloo / NCCL socket / "
                                 "TP TCP (seed B TP3_BOOTSTRAP_IFNAME); empty = each node's *_CX7_IF")
    _per_node(locals(), "BOOTSTRAP_IP", IPv4, "", lambda who, r: f"IPv4 of {who} on BOOTSTRAP_IF (its VLLM_HOST_IP"
              + ("; the master address)" if r == 0 else ")"))
    expect_rdma: Bool = Field(True, description="RoCE devices must exist and pass bandwidth checks")
    expect_gpu: Bool = Field(True, description="a GB10 GPU must be visible on every node")
    expect_link_gbps: Int(0, 1600) = Field(200, description="expected link speed; 0 = do not check")
    min_rdma_gbps_rail: Float(0) = Field(90.0, description="ib_write_bw per rail, Gb/s")
    min_rdma_gbps_total: Float(0) = Field(180.0, description="ib_write_bw all rails, Gb/s")
    degraded_gbps: Float(0) = Field(25.0, description="below this a path is called degraded (TCP fallback)")
    min_nccl_busbw_gbs: Float(0) = Field(21.875, description="all_reduce busbw, GB/s")
    min_tcp_gbps: Float(0) = Field(50.0, description="iperf3 TCP, Gb/s")
    max_rtt_ms: Float(0, lo_open=True) = Field(1.0, description="fabric ping RTT, ms")
    max_clock_offset_ms: Float(0, lo_open=True) = Field(50.0, description="clock offset between nodes, ms")
    install_net_tools: Bool = Field(False, description="01_network installs the network tools a node lacks "
                                    "(apt-get with sudo -n, nccl-tests built at its pinned tag); 0 = FAIL with the "
                                    "exact commands")

    # --- runtime and serve
    runtime: Runtime = Field("docker", description="docker container or bare process")
    image: Image = Field("", description="runtime image (docker)")
    allow_moving_image_tag: Bool = Field(False, description="accept an IMAGE without an @sha256: digest on a real "
                                         "recipe (a tag can be re-pushed: the bytes that run may change)")
    recipe_repo: RecipeRepo = Field("", description="git repository of the recipe whose start chain every rank runs "
                                     "(lab: a local path); empty = stock vllm serve (lab only)")
    recipe_commit: Commit = Field("", description="the recipe's pinned commit (40 hex)")
    recipe_dir: NodePath = Field("", description="the recipe checkout on every node (cloned on the head, shipped "
                                 "to the workers over the fabric)")
    container_head: Word = Field("spark-runbook-head", description="container name on the head")
    container_worker: Word = Field("spark-runbook-worker", description="container name on workers")
    vllm_bin: Command = Field("vllm", description="command that starts vLLM (process runtime)")
    shm_size: ShmSize = Field("32g", description="docker --shm-size")
    port: Int(1, 65535) = Field(8000, description="API port")
    api_host: BindAddress = Field("127.0.0.1", description="address the API binds on the head (--host): "
                                  "127.0.0.1 or the fabric IP = reached through an SSH forward; anything "
                                  "else serves other machines and needs VLLM_API_KEY (step 04 generates one)")
    master_port: Int(1, 65535) = Field(29501, description="torch.distributed rendezvous port")
    executor: Executor = Field("mp", description="vLLM's distributed executor: mp (vLLM's own multi-node "
                               "launcher, a rank per node) or ray (a Ray cluster in the recipe's container on every "
                               "node, then `vllm serve --distributed-executor-backend ray` on the head alone)")
    tp: Int(1, 64) = Field(2, description="--tensor-parallel-size (TP x PP = NNODES: one GPU per Spark)")
    pp: Int(1, 64) = Field(1, description="--pipeline-parallel-size (TP x PP = NNODES: one GPU per Spark)")
    nnodes: Int(1, 64) = Field(2, description="--nnodes")
    served_model_name: ServedModelName = Field("", description="--served-model-name")
    model_dir: ModelDir = Field("", description="what vllm serve loads (path in the runtime, or repo id)")
    max_model_len: Int(1, 1048576, _SEED_A) = Field(4096, description="--max-model-len")
    max_num_seqs: Int(1, 4096, _SEED_A) = Field(8, description="--max-num-seqs")
    max_num_batched_tokens: Int(1, 8388608, _SEED_A) = Field(8192, description="--max-num-batched-tokens")
    long_prefill_token_threshold: Int(0, 8388608) = Field(0, description="--long-prefill-token-threshold; 0 = not passed")
    gpu_mem_util: Float(0, 1, lo_open=True, why=_SEED_A) = Field(0.9, description="--gpu-memory-utilization")
    kv_cache_memory_bytes: Int(0) = Field(0, description="--kv-cache-memory-bytes; 0 = not pinned")
    kv_cache_dtype: KvCacheDtype = Field("", description="--kv-cache-dtype; empty = not passed")
    kv_block_size: Int(0, 1024, pow2_or_zero=True) = Field(0, description="--block-size; 0 = vLLM default")
    enforce_eager: Bool = Field(False, description="--enforce-eager")
    quantization: Word = Field("", description="--quantization; empty = not passed")
    spec_method: SpecMethod = Field("none", description="speculative decoding method")
    spec_tokens: Int(0, 32) = Field(0, description="num_speculative_tokens (DSpark k)")
    draft_sample_method: DraftSampleMethod = Field("", description="DSpark draft sampling; empty = not passed")
    vision: Bool = Field(False, description="serve images (off = --language-model-only)")
    limit_mm: LimitMM = Field(default_factory=dict, description="--limit-mm-per-prompt JSON")
    tokenizer_mode: Word = Field("auto", description="--tokenizer-mode")
    tool_call_parser: Word = Field("", description="--tool-call-parser; empty = no tools")
    reasoning_parser: Word = Field("", description="--reasoning-parser")
    chat_template: RuntimePath = Field("", description="--chat-template path in the runtime")
    default_thinking: DefaultThinking = Field("", description="default reasoning effort")
    tool_strict_level: ToolStrictLevel = Field("", description="--tool-strict-level")
    extra_args: ExtraArgs = Field("", description="appended to vllm serve argv")
    allow_egress_flags: Bool = Field(False, description="accept EXTRA_ARGS flags that send data off the node or "
                                     "listen beyond the API (--kv-events-config, --otlp-traces-endpoint, "
                                     "--tool-server, ...) or bind every address; listed by validate for review")
    ready_timeout: Int(1, 86400) = Field(1500, description="seconds to wait for /health")
    hang_seconds: Int(0, 86400) = Field(420, description="log silence that counts as a hang; 0 = off")
    expect_kv_tokens: Int(0) = Field(0, description="expected 'GPU KV cache size' tokens; 0 = unknown")

    # --- weights and engram
    hf_model_repo: HfRepo = Field("", description="weights repo id")
    hf_revision: HfRevision = Field("main", description="weights revision: a commit id")
    hf_endpoint: Url = Field("", description="HF endpoint; empty = huggingface.co")
    hf_endpoint_trusted: Bool = Field(False, description="send the HF token to an HF_ENDPOINT other than "
                                      "huggingface.co and the lab's hub (off: that endpoint gets no token)")
    weights_dir: NodePath = Field("", description="weights directory on the head")
    worker_weights_dir: NodePath = Field("", description="weights directory on workers; empty = WEIGHTS_DIR")
    weight_sync: WeightSync = Field("nfs", description="how workers get weights")
    weight_transport: WeightTransport = Field("rsync", description="WEIGHT_SYNC=rsync's transport: rsync over ssh, or "
                                              "stream (plain TCP on the fabric, sendfile/splice, token, sha256 on "
                                              "arrival)")
    weights_gib: Float(0) = Field(0.0, description="expected weights size, GiB; 0 = unknown")
    hf_max_workers: Int(1, 64) = Field(8, description="parallel download workers")
    engram: Bool = Field(False, description="V4.1 Engram tables served from NVMe")
    hf_engram_repo: HfRepo = Field("", description="repo holding the Engram shards")
    hf_engram_revision: EngramRevision = Field("main", description="Engram repo revision")
    engram_src_dir: NodePath = Field("", description="slim Engram source dir on each node")
    engram_packed_dir: NodePath = Field("", description="packed per-rank Engram shards on each node")
    engram_gib: Float(0) = Field(0.0, description="expected Engram source size, GiB")

    # --- memory and disk
    weight_budget_gib: Float(0) = Field(0.0, description="weights per rank, GiB; 0 = unknown")
    boot_margin_gib: Float(0) = Field(12.0, description="MemAvailable margin above weights at boot, GiB")
    mem_floor_gib: Float(0) = Field(1.5, description="MemAvailable floor on every rank while starting, GiB: below "
                                    "it the start is aborted and its ranks stopped; 0 = off")
    mem_psi_full_max: Float(0, 100) = Field(0.0, description="memory PSI 'full' avg10 ceiling on every rank while "
                                            "starting, percent: above it the start is aborted; 0 = off (recorded)")
    cache_dir: NodePath = Field("~/.cache/spark-runbook", description="node-local JIT caches")

    # --- bench
    bench_prompt_tokens: Int(1, 1048576) = Field(256, description="decode bench prompt length")
    bench_decode_tokens: Int(1, 1048576) = Field(128, description="decode bench output tokens")
    bench_concurrency: IntList(1, 4096, nonempty=True) = Field(default_factory=lambda: [1, 2, 4], description="concurrency levels")
    bench_prefill_tokens: IntList(1, 1048576) = Field(default_factory=lambda: [1024], description="prefill sizes")
    bench_repeats: Int(1, 100) = Field(3, description="repeats per cell")
    soak_seconds: Int(0, 86400) = Field(300, description="soak duration, s; 0 = skip")

    # --- private state (set by load_profile)
    _source: Path | None = PrivateAttr(default=None)
    _key_lines: dict[str, int] = PrivateAttr(default_factory=dict)
    _overrides: dict[str, str] = PrivateAttr(default_factory=dict)
    _reload: Any = PrivateAttr(default=None)      # load_profile, handed over by it (load.py imports this module)

    # ---------------------------------------------------------------- locations
    @property
    def source(self) -> Path | None:
        """The profile file this was loaded from."""
        return self._source

    @property
    def key_lines(self) -> dict[str, int]:
        """KEY -> line number in the profile file, for every key the file sets."""
        return dict(self._key_lines)

    @property
    def overrides(self) -> dict[str, str]:
        """KEY -> value given as overrides (``-p KEY=VALUE``)."""
        return dict(self._overrides)

    @property
    def name(self) -> str:
        return self.profile_name or (self._source.stem if self._source else "profile")

    @property
    def root(self) -> Path:
        """Directory relative local paths resolve against (the repo root)."""
        if self._source is not None:
            parent = self._source.resolve().parent
            if parent.name == "env":
                return parent.parent
        return REPO_ROOT

    def resolve_path(self, value: str | os.PathLike) -> Path:
        """A local path from the profile: ``~`` expanded, relative paths against :attr:`root`."""
        p = Path(os.path.expanduser(os.fspath(value)))
        return p if p.is_absolute() else self.root / p

    def value(self, key: str) -> Any:
        """The value of KEY (upper-case name)."""
        return getattr(self, key.lower())

    # ---------------------------------------------------------------- derived values
    @property
    def is_lab(self) -> bool:
        return self.recipe == "lab"

    @property
    def node_count(self) -> int:
        """Nodes configured: the head and the worker, then one per WORKER<k>_SSH set (k = 2, 3, ... without a
        gap; a WORKER<k>_SSH after a gap is refused by validate)."""
        return configured_count(self.value(k) for k in node_keys("SSH"))

    @property
    def topology(self) -> str:
        """The fabric's shape (:func:`runbook.profile.nodes.topology`): ``cable`` (2 nodes), ``switch`` (3+ nodes
        whose fabric IPs are all on one /24), ``triangle`` (3 nodes otherwise) or ``ring`` (4+ nodes, not one /24:
        the switchless ring, rendered and planned only)."""
        return topology(self.node_count, (self.value(k) for k in node_keys("IP")))

    @property
    def master_addr(self) -> str:
        """Rendezvous address: the head's BOOTSTRAP_IF address when set (seed B TP3: on a QSFP ring
        the head's fabric address on one link is not reachable from the node on the other), else HEAD_IP."""
        return self.head_bootstrap_ip if self.bootstrap_if else self.head_ip

    def cpu_bind(self, rank: int, *, cpus: int) -> str:
        """The lab CPU vLLM's VLLM_CPU_OMP_THREADS_BIND for a rank: LAB_CPU_BIND's item; empty (every recipe
        profile, so a rehearsal keeps it) = derived from the ``cpus`` CPUs the lab's nodes share: the head alone
        on CPU 0, the other ranks in turn on the others (the rank number while ranks <= CPUs).

        >>> from runbook.profile import load_profile
        >>> p = load_profile("env/tp3-dspark.env")
        >>> [p.cpu_bind(r, cpus=2) for r in range(3)], [p.cpu_bind(r, cpus=16) for r in range(3)]
        (['0', '1', '1'], ['0', '1', '2'])
        """
        items = [x for x in self.lab_cpu_bind.split(",") if x]
        if rank < len(items):
            return items[rank]
        return "0" if rank == 0 or cpus < 2 else str(1 + (rank - 1) % (cpus - 1))

    def tp_rank(self, rank: int) -> int:
        """The tensor-parallel rank of the node at ``rank`` within its pipeline stage. vLLM numbers the ranks TP
        innermost (rank = stage x TP + tp_rank; measured on the lab, docs/four-nodes.md), one rank per node, so
        at TP=2 x PP=2 the nodes 0 1 2 3 are TP ranks 0 1 0 1: a stage-1 node packs and attaches the same Engram
        shard (``engram-l{L}-r{tp_rank}of{TP}.bin``) as its stage-0 twin.

        >>> from runbook.profile import load_profile
        >>> p = load_profile("env/lab-tp2pp2.env")
        >>> [(p.tp_rank(r), p.pp_stage(r)) for r in range(4)]
        [(0, 0), (1, 0), (0, 1), (1, 1)]
        """
        return int(rank) % max(1, int(self.tp))

    def pp_stage(self, rank: int) -> int:
        """The pipeline stage of the node at ``rank`` (0 without PP): ``rank // TP``."""
        return int(rank) // max(1, int(self.tp))

    def holds_rank(self, rank: int) -> bool:
        """The node at ``rank`` runs a vLLM rank (TP x PP of them, one per node; validate refuses TP x PP !=
        NNODES, so on a valid profile every node does)."""
        return int(rank) < int(self.tp) * int(self.pp)

    @property
    def spec_k(self) -> int:
        """Speculative tokens actually used (0 when SPEC_METHOD=none)."""
        return self.spec_tokens if self.spec_method != "none" else 0

    @property
    def cudagraph_capture_size(self) -> int:
        """round_up(MAX_NUM_SEQS x (k+1), 8): seed B newer start script (6 x (6+1) = 42 -> 48;
        "plain 42 truncates to 40 and costs 12 % at c=6")."""
        return round_up(self.max_num_seqs * (self.spec_k + 1), 8)

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        """The ``--speculative-config`` object, or None when speculation is off."""
        if self.spec_method == "none":
            return None
        cfg: dict[str, Any] = {"method": self.spec_method, "num_speculative_tokens": self.spec_tokens}
        if self.draft_sample_method:
            cfg["draft_sample_method"] = self.draft_sample_method
        return cfg

    @property
    def extra_args_list(self) -> list[str]:
        return shlex.split(self.extra_args)

    @property
    def nodes(self) -> list[NodeSpec]:
        """Nodes ordered by rank: head, worker, worker2 ... (``node_count`` of them)."""
        return node_specs(self)

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def weights_dir_on(self, node_name: str) -> str:
        """Weights directory on a node (workers fall back to WEIGHTS_DIR)."""
        if node_name == "head":
            return self.weights_dir
        return self.worker_weights_dir or self.weights_dir

    def engram_source_shared_on(self, node_name: str) -> bool:
        """The node reads the head's Engram source through a share (a worker with WEIGHT_SYNC=nfs), so its slim
        /engram-src dir links to the shared files instead of holding a copy of them."""
        return bool(self.engram) and node_name != "head" and self.weight_sync == "nfs"

    def container_on(self, node_name: str) -> str:
        return self.container_head if node_name == "head" else self.container_worker

    # ---------------------------------------------------------------- export
    def redacted(self) -> dict[str, Any]:
        """KEY -> value for every key (JSON-ready). Nothing secret is in a profile; values that
        look like a Hugging Face token are masked anyway."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, list):
                v = list(v)
            elif isinstance(v, dict):
                v = dict(v)
            elif isinstance(v, str):
                v = mask_tokens(v)
            out[name.upper()] = v
        return out

    def with_overrides(self, overrides: Mapping[str, Any]) -> "Profile":
        """Reload the same file with more overrides (validated like the originals)."""
        if self._source is None or self._reload is None:
            raise ValueError("profile has no source file")
        return self._reload(self._source, {**self._overrides, **{k: str(v) for k, v in overrides.items()}})


#: every key, in field order (the form, the docs and the env files' tests follow it)
KEYS: tuple[str, ...] = tuple(name.upper() for name in Profile.model_fields)
REQUIRED_KEYS: tuple[str, ...] = (
    "RECIPE", "HEAD_SSH", "WORKER_SSH", "HEAD_IP", "WORKER_IP", "HEAD_CX7_IF", "WORKER_CX7_IF",
    "SERVED_MODEL_NAME", "MODEL_DIR",
)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
