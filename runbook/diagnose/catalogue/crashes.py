"""A rank's crash whose message many causes print (issue 36's sixth round, breadth): a CUDA kernel's illegal memory
access (through torch or NCCL), and a Ray actor that died. Neither message names its cause, so both are symptoms
(offline: ranked, never "high"): any entry with its own line for the same text ranks above them, and alone they say
where to look next. The Ray entry extracts the actor's node and Ray's exit detail."""
from __future__ import annotations

from .entry import FATAL, Entry

# --------------------------------------------------------------------------- CUDA: an illegal memory access

#: the CUDA runtime's cudaErrorIllegalAddress string ("an illegal memory access was encountered"), as torch raises it
#: (c10/cuda/CUDAException: "CUDA error: an illegal memory access was encountered") and as NCCL logs it
#: (src/include/checks.h:16,24 @ v2.28.9-1: WARN "Cuda failure '%s'", then ncclUnhandledCudaError); a kernel's fault:
#: a backend or graph bug, a build for another arch, memory corrupted by another fault
ILLEGAL_ADDRESS = r"an illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS"

CUDA_ILLEGAL_MEMORY_ACCESS = Entry(
    "cuda-illegal-memory-access", "A CUDA kernel faulted (illegal memory access)", FATAL,
    symptom="a rank dies with `CUDA error: an illegal memory access was encountered` (NCCL: `Cuda failure 'an illegal "
            "memory access was encountered'`, `unhandled cuda error`), at start-up (graph capture, warm-up) or under "
            "load",
    detect="the CUDA runtime's illegal-address error as torch or NCCL print it; a symptom (medium): a kernel bug, a "
           "build for another GPU arch and memory corrupted earlier all end in it",
    cause="a kernel read or wrote outside its memory: a bug in an attention, MoE or all-reduce kernel for this "
          "model, shape or GPU (often only with CUDA graphs or a custom all-reduce), a kernel built for another arch, "
          "or corruption from an earlier fault; the error is asynchronous, so the frame that reports it is often not "
          "the faulting kernel",
    fix="find the kernel: rerun with CUDA_LAUNCH_BLOCKING=1 (the traceback then names it), then try --enforce-eager, "
        "--disable-custom-all-reduce and another attention backend one at a time; report it with the model, TP size "
        "and image digest, or pin the last image that worked",
    proof="CUDA_LAUNCH_BLOCKING=1 <the same start>; grep -n 'illegal memory access' -B 30 <rank log> | grep File",
    signature=None,
    source="CUDA runtime cudaErrorIllegalAddress (the string torch's c10/cuda/CUDAException raises); NVIDIA/nccl "
           "src/include/checks.h:16,24 @ v2.28.9-1 (Cuda failure '%s'); reports vllm-project/vllm#6725 (TP 8 "
           "since v0.5), vllm-project/vllm#24430 (only at TP 2, since v0.10.2), vllm-project/vllm#27067 (PP 4 with a "
           "large max_num_batched_tokens)",
    symptoms=(r"CUDA error: an illegal memory access was encountered",
              r"Cuda failure '?an illegal memory access was encountered",
              r"(?:cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS)"),
    words=(r"illegal memory access|cudaerrorillegaladdress|illegal address",
           r"cuda|nccl|kernel|vllm|rank|\btp\b|graph",
           r"crash\w*|die\w*|fail\w*|error|under load|start\w*"),
    lab="none: the lab has no GPU")

# --------------------------------------------------------------------------- Ray: an actor died

#: ray python/ray/exceptions.py:463 @ 2.60.0 (ActorDiedError.BASE_ERROR_MSG "The actor died unexpectedly before
#: finishing this task.", with the context's `ip:` line and Ray's error message: "The actor is dead because its worker
#: process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: ..."), or "The actor died because of an error
#: raised in its creation task" (:490); RayActorError is its base class
_ACTOR_DIED = (r"The actor died unexpectedly before finishing this task\.(?:[\s\S]{0,400}?\bip: (?P<ip>[\d.]+))?"
               r"(?:[\s\S]{0,400}?Worker exit type: (?P<exit_type>\w+)(?: Worker exit detail: (?P<detail>[^\n]{0,200}))?)?",
               r"The actor died because of an error raised in its creation task",
               r"The actor is dead because its worker process has died\. Worker exit type: (?P<exit_type>\w+)")

RAY_ACTOR_DIED = Entry(
    "ray-actor-died", "A Ray actor (a vLLM rank) died: look for its own error", FATAL,
    symptom="the engine dies with `ray.exceptions.ActorDiedError` / `RayActorError: The actor died unexpectedly before "
            "finishing this task`",
    detect="Ray's actor-death error; a symptom (medium, downstream): the actor's node, Ray's exit type and detail are "
           "extracted, and the cause is the worker's own error or its kill",
    cause="a Ray worker process running a vLLM rank exited: its own exception (in its creation task: a start-up "
          "refusal), a kill (the kernel's OOM killer, Ray's memory monitor, `ray stop`), a crash (SIGSEGV, a CUDA "
          "fault), or its node leaving the cluster",
    fix="the actor on {ip} died ({exit_type}: {detail}): read that worker's own log (`ray logs worker-*.err -ip {ip}`, "
        "or the `(RayWorkerWrapper pid=...)` lines above) for the first error; check dmesg on that node for an OOM "
        "kill and `ray status` for a lost node",
    proof="ray logs raylet.out -ip {ip} | grep -iE 'kill|oom|died' | tail; dmesg -T | grep -i oom | tail   # on that node",
    signature=None,
    downstream=True,
    source="ray-project/ray python/ray/exceptions.py:463,490 @ 2.60.0 (ActorDiedError); reports vllm-project/vllm#19123 "
           "(vLLM on Ray in docker, ip 172.17.0.2), Simple-Efficient/RL-Factory#8, verl-project/verl#4921",
    symptoms=_ACTOR_DIED,
    words=(r"actordiederror|rayactorerror|actor died|actor (is )?dead",
           r"\bray\b|raylet|worker|vllm",
           r"node|crash\w*|kill\w*|oom|exit\w*"),
    lab="none: the lab runs the mp backend")
