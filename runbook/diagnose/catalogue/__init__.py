"""The catalogue of known multi-node failures: each entry is a pure signature over a
:class:`~runbook.diagnose.bundle.Bundle` (rank logs, node facts, timings) with its cause, its fix and
the command that proves it on the node.

Each entry sits beside its signature in the module of its failure family: ``network`` (rendezvous,
firewall, fabric), ``nccl`` (NCCL and RDMA settings), ``ranks`` (how the ranks were started), ``runtime``
(image pull, the server), ``host`` (memory, I/O, kernel, mDNS), ``memory`` (unified-memory accounting,
pinned memory, JIT builds), ``residue`` (kernel, driver, library and image residue, version skew),
``perf`` (a server that runs slow or silently wrong), ``components`` (keyed on the emitting component's message
shape: served-model-name 404, Ray's memory monitor, NCCL HCA sets, Gloo on loopback, the P2P check, host lists,
dependency skew, missing GPU arch, more GPUs than the node has, CUDA_VISIBLE_DEVICES, VA reservations, OpenMPI's daemon launch and TCP
transport); ``config`` (vLLM's own start-up configuration refusals and the launch configurations NCCL and the Ray
executor refuse: heads and TP size, architecture, quantization, batched tokens, remote code, node IPs, GPUs),
``container`` (what a node, its user or the rank's container lacks: the docker socket, the weights offline, a valid
Hub token, the RDMA devices, file descriptors, /dev/shm, a compiler), ``crashes`` (a crash whose message many causes
print: an illegal memory access, a dead Ray actor; symptoms only); ``entry`` holds :class:`Entry`,
:class:`Hit` and the readers the families share. An entry's constant is its id in capitals
(``oom-killed`` -> ``host.OOM_KILLED``). This module fixes the catalogue's order: ``match`` reports in it
within a severity and docs/diagnose.md lists it. Sources: ``shared/reference/anchors-2026-12.md``
(failure modes 1-17), ``bringup-anchors.md`` §5 and ``field-reports-2026-12.md`` §2, each entry naming its
public thread.
"""
from __future__ import annotations

from . import (access, components, config, container, crashes, engine, host, memory, nccl, network, perf, ranks, residue,
               runtime, storage)
from .entry import Entry

ENTRIES: tuple[Entry, ...] = (
    network.RENDEZVOUS_MGMT_ADDRESS,
    network.FIREWALL_MASTER_PORT,
    network.FABRIC_UNREACHABLE,
    network.FABRIC_MTU_BLACKHOLE,
    nccl.GID_INDEX_PER_NIC,
    container.IB_DEVICE_NOT_IN_CONTAINER,
    nccl.NCCL_IB_NO_DEVICE,
    components.GLOO_LOOPBACK_HOSTNAME,
    nccl.SOCKET_IFNAME_INVALID,
    nccl.NO_IP_INTERFACE_IN_CONTAINER,
    components.NCCL_HCA_SET_MISMATCH,
    ranks.ENV_OVERWRITTEN_BY_HEAD,
    nccl.ROCE_ACTIVE_MTU_LOW,
    ranks.WORKER_NOT_RUNNING,
    ranks.ENV_SPLIT_BY_QUOTING,
    runtime.READY_THEN_DEAD,
    components.SERVED_MODEL_NAME_MISMATCH,
    runtime.WRONG_MODEL_ON_PORT,
    host.RANK_IN_D_STATE,
    nccl.NCCL_WATCHDOG_TIMEOUT,
    nccl.INERT_NCCL_SETTINGS,
    runtime.DOCKER_PULL_EOF,
    runtime.DOCKER_PULL_MANIFEST_UNKNOWN,
    runtime.DOCKER_PULL_DNS,
    runtime.DOCKER_PULL_UNREACHABLE,
    access.REGISTRY_RATE_LIMIT,
    access.IMAGE_ARCH_MISMATCH,
    access.NVIDIA_CONTAINER_TOOLKIT_MISSING,
    storage.DISK_FULL,
    storage.NCCL_SHM_TOO_SMALL,
    container.CONTAINER_SHM_TOO_SMALL,
    container.OPEN_FILES_LIMIT_LOW,
    access.HF_GATED_REPO_TOKEN,
    container.HF_TOKEN_INVALID,
    container.HF_OFFLINE_NOT_CACHED,
    container.DOCKER_SOCKET_PERMISSION,
    config.TP_SIZE_NOT_DIVISIBLE,
    config.MODEL_ARCHITECTURE_UNSUPPORTED,
    config.QUANTIZATION_UNSUPPORTED_ON_GPU,
    config.MAX_NUM_BATCHED_TOKENS_BELOW_MAX_MODEL_LEN,
    config.TRUST_REMOTE_CODE_REQUIRED,
    engine.KV_CACHE_BELOW_MAX_MODEL_LEN,
    engine.CUDA_OOM_STARTUP,
    engine.TOOL_PARSER_MISSING,
    engine.REQUEST_OVER_MAX_MODEL_LEN,
    engine.CHAT_TEMPLATE_MISSING,
    host.OOM_KILLED,
    host.MEM_AVAILABLE_LOW,
    runtime.SERVING_WEDGE,
    host.MDNS_HOSTNAME_STORM,
    host.KERNEL_KNOWN_BAD,
    ranks.HOME_DIR_DIFFERS,
    network.RENDEZVOUS_TIMEOUT,
    memory.UMA_FREE_MEMORY_CHECK,
    memory.UMA_POOL_EXHAUSTED,
    memory.MEMORY_PINNED_AFTER_FAILED_START,
    memory.JIT_BUILD_MEMORY_WEDGE,
    memory.JIT_COLD_CACHE_SLOW,
    container.JIT_COMPILER_MISSING,
    memory.MODPROBE_MEMORY_CAP,
    memory.AUTOTUNE_BARRIER_TIMEOUT,
    residue.NCCL_BUILD_MISMATCH,
    residue.CMA_TOTAL_ZERO,
    residue.MEMLOCK_LIMIT_LOW,
    residue.IMAGE_NCCL_CONF_RESIDUE,
    residue.CUDA_TOOLCHAIN_NEWER_THAN_DRIVER,
    residue.DRIVER_NOT_LOADED,
    container.GPU_NOT_VISIBLE_IN_CONTAINER,
    residue.NVML_DRIVER_LIBRARY_MISMATCH,
    residue.VERSION_SKEW,
    nccl.IB_QP_PAIRING_TIMEOUT,
    ranks.RENDEZVOUS_PORT_IN_USE,
    ranks.API_PORT_IN_USE,
    ranks.PORT_RACE,
    ranks.SEMLOCK_BACKEND_MISMATCH,
    ranks.RAY_MISSING,
    ranks.RAY_NODE_NOT_JOINED,
    ranks.RAY_PLACEMENT_GROUP,
    ranks.RAY_CPU_PLATFORM,
    ranks.RAY_OBJECT_STORE,
    config.RAY_DUPLICATE_NODE_IP,
    components.RAY_MEMORY_MONITOR_KILL,
    components.P2P_CHECK_HANG,
    components.HOST_LIST_SPLIT,
    components.MORE_GPUS_REQUESTED_THAN_PRESENT,
    config.NCCL_DUPLICATE_GPU,
    components.CUDA_VISIBLE_DEVICES_CONFLICT,
    components.DEPENDENCY_SKEW,
    components.ENGINE_BUILD_ARCH_MISSING,
    components.CUDA_VA_RESERVATION_CAP,
    components.MPI_DAEMON_LAUNCH_FAILED,
    components.MPI_TCP_CONNECT_FAILED,
    runtime.NO_COMMON_BLOCK_SIZE,
    crashes.CUDA_ILLEGAL_MEMORY_ACCESS,
    crashes.RAY_ACTOR_DIED,
    crashes.PEER_RANK_EXITED,
    perf.GB10_SLOW_STATE,
    perf.ENGRAM_RANK_OFFSET,
    perf.ENGRAM_ROWS_OVER_NFS,
)

BY_ID = {e.id: e for e in ENTRIES}
assert len(BY_ID) == len(ENTRIES), "duplicate catalogue ids"
_DEFINED = {v.id for m in (access, components, config, container, crashes, engine, host, memory, nccl, network, perf, ranks, residue, runtime, storage) for v in vars(m).values() if isinstance(v, Entry)}
assert _DEFINED == set(BY_ID), f"an entry is defined in a family but not listed in ENTRIES: {_DEFINED ^ set(BY_ID)}"
