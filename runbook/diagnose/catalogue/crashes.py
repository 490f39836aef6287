"""A rank's crash whose message many causes print (issue 36's sixth round, breadth): a CUDA kernel's illegal memory
access (through torch or NCCL), a Ray actor that died, and a peer rank that went away first (its socket closed). No
message names its cause, so all are symptoms (offline: ranked, never "high"): any entry with its own line for the same
text ranks above them, and alone they say where to look next. The Ray entry extracts the actor's node and Ray's exit detail, the peer entry the peer's host."""
from __future__ import annotations

from .container import PROSE_STACK
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
    # only beside the serving stack: any CUDA program's fault prints the same (off-domain)
    symptoms=tuple(r"^(?=[\s\S]*?(?:vllm|sglang|\bnccl\b|\bray\b|tensor[-_ ]parallel|flashinfer|\brank\d*\b|"
                   r"worker_?tp|enginecore))[\s\S]*?(?P<at>" + p + ")"
                   for p in (r"CUDA error: an illegal memory access was encountered",
                             r"Cuda failure '?an illegal memory access was encountered",
                             r"(?:cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS)")),
    words=(PROSE_STACK + r"(illegal memory access|cudaerrorillegaladdress|illegal address)",
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

# --------------------------------------------------------------------------- a peer rank went away first

#: the messages a rank prints when its peer's end of a connection closes: NCCL's socket layer (src/misc/socket.cc:71
#: @ v2.28.9-1 "socketProgress: Connection closed by remote peer %s"; older releases "Net : Connection closed by
#: remote peer"), NCCL's ncclRemoteError text (src/init.cc:2691 @ v2.28.9-1 "remote process exited or there was a
#: network error"), Gloo's pair ("Connection closed by peer"), and torch's TCPStore client ("Connection reset by
#: peer"); the peer crashed or was killed first, or the link dropped
PEER_RANK_EXITED = Entry(
    "peer-rank-exited", "A peer rank exited (or the link dropped) first: its own log says why", FATAL,
    symptom="a rank fails with `NCCL error: remote process exited or there was a network error` / `socketProgress: "
            "Connection closed by remote peer <host>` / Gloo's `Connection closed by peer` / `Connection reset by peer`",
    detect="NCCL's, Gloo's or the TCPStore's closed-by-peer messages; a symptom (medium, downstream): the first "
           "error is on the peer named (its host is extracted where printed)",
    cause="the rank on the other end went away: it crashed (a CUDA fault, an OOM, a start-up refusal), was killed "
          "(the kernel's OOM killer, Ray's memory monitor, a watchdog), or its node or fabric link dropped; this rank "
          "only saw its socket close",
    fix="read the log of the peer named ({peer}) from just before this time for its first error, and dmesg on that "
        "node for an OOM kill or a link flap; fix that, not this rank",
    proof="dmesg -T | grep -iE 'oom|killed|link is down' | tail   # on the peer's node; grep -nE 'Error|Traceback' "
          "<peer rank log> | head",
    signature=None,
    downstream=True,
    source="NVIDIA/nccl src/misc/socket.cc:71, src/init.cc:2691 @ v2.28.9-1; gloo transport/tcp/pair.cc and torch c10d "
           "TCPStore (by function); reports NVIDIA/nccl#1235 (a peer rank's CUDA OOM first), NVIDIA/nccl#795 (a "
           "segfault on the remote rank first), NVIDIA/nccl#1232",
    symptoms=(r"socketProgress: Connection closed by remote peer(?: (?P<peer>[\w.-]+))?",
              r"Net : Connection closed by remote peer(?: (?P<peer>[\w.-]+))?",
              r"remote process exited or there was a network error",
              r"gloo[^\n]*Connection closed by peer(?: \[(?P<peer>[^\]]+)\])?",
              r"(?:TCPStore|DistNetworkError|c10d)[^\n]*Connection reset by peer"),
    words=(r"remote process exited|connection (closed|reset) by (remote )?peer|(other|remote|peer) (rank|node|worker) "
           r"(died|crashed|exited|was killed)",
           r"nccl|gloo|tcpstore|torch\.distributed|\brank\b",
           r"node|worker|crash\w*|kill\w*|exit\w*|oom"),
    lab="none yet: killing the lab worker rank during a collective would produce it")
