"""What a node, its user or its rank's container lacks (issue 36's sixth round, breadth): access to the docker
socket, the weights in this node's Hugging Face cache while offline, a valid Hub token, the RDMA device nodes or
verbs providers inside the container, enough file descriptors, a /dev/shm large enough for torch's shared tensors,
a compiler for the JIT builds (Triton, torch extensions), and a GPU at all (a symptom: a host without its driver says
the same).

Each is the emitting component's own message, naming its cause, and extracts what the fix names (the socket, the
repo or URL, the device, the file). Emitting lines are cited at the versions the lab installs (huggingface_hub 2.4.0,
torch 2.13.0), at NCCL's tag, or by file and function where no pinned copy was read."""
from __future__ import annotations

from .entry import DEGRADED, FATAL, Entry, either, extracting

#: the serving stack in a pasted text: a generic component's message (docker's, the kernel's EMFILE, Triton's, torch's)
#: is this catalogue's only beside it; any program prints those messages, and a report from another program (a CI job's
#: docker socket, a notebook's file limit, a training DataLoader) is off-domain (issue 36's false-alarm rule)
STACK = (r"vllm|sglang|\bnccl\b|\bray\b|raylet|torch\.distributed|tensor[-_ ]parallel|\bllm\b|openai|hugging ?face|"
         r"\bhf_\w+|flashinfer|\bdgx\b|\bspark\b|gb10|\brdma\b|\broce\b|infiniband|--gpus|nvidia|\bcuda\b|"
         r"api[_ ]server|\bserve\b")
#: a container as the context (the /dev/shm entry's cause is the container's own /dev/shm)
CONTAINER = STACK + r"|docker|container|\bpod\b|kubernetes|\bk8s\b|--shm-size|--ipc"
#: the same rule for a reporter's sentence: a generic entry's cue anchor counts only where the sentence names the
#: serving stack (a rank, a worker, the server, vLLM, a Spark), so a reporter of another program is off-domain
PROSE_STACK = (r"^(?=.*(vllm|sglang|\bnccl\b|\bray\b|\bllm\b|spark|\bdgx\b|gb10|\branks?\b|worker|tensor[- _]parallel|"
               r"\bserv(e|er|ing)\b|inference|runbook)).*?")


def beside(context: str, *patterns):
    """A pasted text counts only with ``context`` in it; what the runbook's own commands printed (commands.jsonl)
    always counts: those commands are the serving stack's."""
    return either(extracting(*patterns, within=context), extracting(*patterns, texts=()))

# --------------------------------------------------------------------------- the docker socket

#: the docker client's connection error on EACCES (moby client/errors.go, connection-failed: "permission denied while
#: trying to connect to the Docker daemon socket at %s", "Got permission denied ..." before docker 24): the user is not
#: in the docker group (or the group was added without a new login session)
#: The same EACCES through the other docker clients: aiodocker (aiodocker/docker.py _do_query, DockerError(900,
#: "Cannot connect to Docker Engine via <socket> [<aiohttp's error>]"), docker-py (docker/api/client.py
#: _retrieve_server_version, client.py:221 in the tracebacks of docker 5.x: "Error while fetching server API
#: version: ('Connection aborted.', PermissionError(13, 'Permission denied'))"), and the CLI's newer "permission
#: denied while trying to connect to the docker API at" (files read by function, no line pinned). A docker socket a user may not open has one cause and one fix whatever
#: program asked (issue 36's eighth round: the sixth round's stack gate is gone; the runbook drives docker on every
#: node, and the off-domain corpora hold no docker socket text whose cause is another)
_SOCKET = (r"permission denied while trying to connect to the Docker (?:daemon socket|API) at (?P<socket>\S+?):? ",
           r"dial unix (?P<socket>/\S*docker\.sock): connect: permission denied",
           r"Cannot connect to Docker Engine via (?P<socket>unix://\S+) \[[^\n]{0,120}?Permission denied",
           r"Error while fetching server API version: \(?'Connection aborted\.', (?:PermissionError|error)\(13, "
           r"'Permission denied'")

DOCKER_SOCKET_PERMISSION = Entry(
    "docker-socket-permission", "The user may not use the docker socket on that node", FATAL,
    symptom="every docker command on a node fails at once with `permission denied while trying to connect to the "
            "Docker daemon socket at unix:///var/run/docker.sock`",
    detect="the docker client's permission error on the daemon's socket, from a pull, run or ps; the socket is "
           "extracted",
    cause="the user the runbook logs in as (over ssh) is not in the `docker` group on that node, or was added to it "
          "after the login session started (group membership is read at login), or the socket's group was changed",
    fix="on that node: `sudo usermod -aG docker $USER`, then log in again (a new ssh session; `newgrp docker` for the "
        "current shell); `ls -l {socket}` must show group docker with rw",
    proof="id -nG; ls -l /var/run/docker.sock; docker info >/dev/null && echo ok",
    signature=extracting(*_SOCKET),
    source="moby/moby client/errors.go (the client's connection-failed error on EACCES; file read by function, no "
           "line pinned); aiodocker aiodocker/docker.py _do_query, docker-py docker/api/client.py "
           "_retrieve_server_version (by function); reports docker-library/postgres#1124, tomsik68/docker-xampp#63 "
           "(fixed by the docker group and a new login), ualex73/monitor_docker#123 (aiodocker), "
           "microsoft/AI-Red-Teaming-Playground-Labs#55 (docker compose), docker/docker-py#2374 (docker-py, solved by the "
           "docker group), ansible/ansible-container#761 (docker-py under Python 2: `error(13, ...)`)",
    # a daemon that is not running (`Cannot connect to the Docker daemon at unix:///var/run/docker.sock`) is no cue; the
    # socket's permission in prose is, whatever program the reporter ran (the eighth round dropped the stack gate: the
    # cause and the fix are the same)
    words=(r"(docker\.sock|docker (daemon |engine )?socket)\b.{0,80}\bpermission|permission denied\b.{0,80}\b(docker\.sock|"
           r"docker (daemon |engine )?socket)|(add\w* .{0,40}|not in (the )?)docker group|usermod -a?g docker|newgrp docker",
           r"permission denied|not in the docker group|without sudo|needs? sudo|only (works )?with sudo",
           r"docker|node|ssh|user"),
    lab="none yet: a lab node user outside the docker group would produce it")

# --------------------------------------------------------------------------- Hugging Face: offline without the weights

#: huggingface_hub src/huggingface_hub/_snapshot_download.py:382-391 (snapshot_download: local_files_only or
#: HF_HUB_OFFLINE, no cached snapshot), :400-404 (the Hub unreachable and no snapshot), file_download.py:1945-1948
#: (hf_hub_download offline), :1962-1966 (the Hub unreachable) @ 2.4.0; vLLM passes the repo id through it on every rank
_OFFLINE = ((r"Cannot find an appropriate cached snapshot folder for the specified revision on the local disk and "
             r"outgoing traffic has been disabled", {"why": "offline mode (HF_HUB_OFFLINE=1 or local_files_only)"}),
            (r"Cannot find the requested files in the disk cache and outgoing traffic has been disabled",
             {"why": "offline mode (HF_HUB_OFFLINE=1 or local_files_only)"}),
            (r"An error happened while trying to locate the files? on the Hub,? and we cannot find the (?:requested "
             r"files in the local cache|appropriate snapshot folder)", {"why": "the Hub was not reachable from the node"}),
            (r"We have no connection or you passed local_files_only=True,? so we cannot find the requested files in "
             r"the local cache", {"why": "no connection to the Hub, or local_files_only"}))

def _wrapped(pattern: str) -> str:
    """The message as a terminal or an issue may wrap it: any run of whitespace where the source has one space."""
    return pattern.replace(" ", r"\s+")


HF_OFFLINE_NOT_CACHED = Entry(
    "hf-offline-not-cached", "The weights are not in that node's Hugging Face cache and the node may not download",
    FATAL,
    symptom="a rank (often only the worker) stops with `LocalEntryNotFoundError: Cannot find an appropriate cached "
            "snapshot folder ... outgoing traffic has been disabled`",
    detect="huggingface_hub's LocalEntryNotFoundError texts (offline, or the Hub unreachable, with no cached copy); "
           "which of the two is extracted",
    cause="the rank resolves the model by repo id through the HF cache of its own node: that node's cache (HF_HOME "
          "as mounted into its container) does not hold the snapshot, or holds it at another path or revision, and "
          "the node is offline (HF_HUB_OFFLINE=1) or cannot reach the Hub",
    fix="cause: {why}. Download the model on that node too (`hf download <repo>` with the same HF_HOME the container "
        "mounts), or copy the cache folder models--<org>--<name> with its refs/ and snapshots/ to the same path, or "
        "pass the local snapshot path instead of the repo id; HF_HUB_OFFLINE=1 only once every node holds it",
    proof="ls ~/.cache/huggingface/hub/models--*/snapshots/ (or $HF_HOME/hub/...); cat ~/.cache/huggingface/hub/"
          "models--*/refs/main   # on the failing node, as the rank's container mounts it",
    signature=extracting(*[(_wrapped(p), v) for p, v in _OFFLINE]),
    source="huggingface/huggingface_hub src/huggingface_hub/_snapshot_download.py:382-391,400-404, "
           "file_download.py:1945-1948,1962-1966 @ 2.4.0; reports Avarok-Cybersecurity/dgx-vllm#16 (HF_HUB_OFFLINE=1 "
           "on a DGX Spark), MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks#36 (two Sparks, a hand-staged cache), "
           "huggingface/huggingface_hub#4487",
    # offline mode named with a failure (a question about HF_HUB_OFFLINE is none)
    words=(r"localentrynotfound|(hf_hub_offline|local_files_only|offline|air-?gapped|without (an? )?internet"
           r"( connection| access)?|no internet( connection| access)?)\b.{0,80}\b(fail\w*|error|"
           r"can'?t find|cannot find|not found|missing|crash\w*|dies|died)|(cache|cached)\b.{0,40}\b(missing|empty|not "
           r"found|isn'?t there)",
           r"hugging ?face|\bhf\b|hf_home|snapshot|cache",
           r"worker|second node|other node|node|container|vllm"),
    lab="none yet: a lab worker with HF_HUB_OFFLINE=1 and an empty HF_HOME would produce it")

# --------------------------------------------------------------------------- Hugging Face: the token itself is invalid

#: the Hub's answer to an invalid, expired or revoked token: HTTP 401 with the body "Invalid credentials in Authorization
#: header" (huggingface_hub src/huggingface_hub/utils/_http.py:935 @ 2.4.0 tells it apart from a missing repo's 401),
#: and HfApi.whoami's "Invalid user token." (hf_api.py:2269 @ 2.4.0)
_TOKEN = (r"Invalid credentials in Authorization header",
          r"Invalid user token\.(?: The token from (?P<source>HF_TOKEN environment variable|Google Colab vault))?",
          r"Authorization header is correct, but the token seems invalid")

#: the Hub in a reporter's words: its library, its host, its token variable, a model repo
_HUB = r"hugging ?face|\bhf\b|hf_token|huggingface_hub|\bhf\.co\b|the hub|model repo|models?/datasets?"

HF_TOKEN_INVALID = Entry(
    "hf-token-invalid", "The Hugging Face token is invalid, expired or revoked", FATAL,
    symptom="a download fails with `401 Client Error: Unauthorized` and `Invalid credentials in Authorization header`",
    detect="the Hub's own `Invalid credentials in Authorization header` (or huggingface_hub's `Invalid user token.`); "
           "where the token came from is extracted when printed",
    cause="the token sent is not a valid one: mistyped or truncated (quotes or a newline in the secrets file), revoked "
          "or expired, or an old token in the environment overriding the one logged in (HF_TOKEN wins over "
          "`hf auth login`)",
    fix="create a new read token on huggingface.co and set it where the rank reads it (HF_TOKEN in the rank's "
        "environment on every node; no quotes or newline); `hf auth whoami` on that node must print the account",
    proof="hf auth whoami   # on the failing node, with the rank's environment",
    signature=extracting(*_TOKEN),
    source="huggingface/huggingface_hub src/huggingface_hub/utils/_http.py:935 (the Hub's invalid-credentials body), "
           "src/huggingface_hub/hf_api.py:2269 (Invalid user token.) @ 2.4.0; reports deepbeepmeep/Wan2GP#455, "
           "jhc13/taggui#367, huggingface/huggingface_hub#2586 (fixed with a new token)",
    words=(r"invalid (hf |hugging ?face |access |user )?token|token\b.{0,40}\b(invalid|expired|revoked)|"
           r"invalid credentials",
           # the Hub must be named: npm's `E401 ... your authentication token seems to be invalid` (npm's
           # lib/utils/error-message.js) is a registry's token, not the Hub's
           _HUB,
           r"^(?=.*(?:" + _HUB + r")).*(?:download\w*|whoami|login|\b401\b|unauthori[sz]ed)"),
    lab="none: the lab never reaches huggingface.co")

# --------------------------------------------------------------------------- RDMA devices inside the container

#: NCCL's verbs open (src/transport/net_ib.cc:715 @ v2.28.9-1, src/transport/net_ib/init.cc:334 @ v2.30.7-1: WARN
#: "NET/IB : Unable to open device %s" after wrap_ibv_open_device, src/misc/ibvwrap.cc:127): the HCA is listed in
#: sysfs but its /dev/infiniband/uverbsN node cannot be opened; libibverbs' "no userspace device-specific driver found
#: for /sys/class/infiniband_verbs/uverbsN" (rdma-core libibverbs/init.c): the image lacks the verbs provider
_IB_DEV = ((r"NET/IB : Unable to open device (?P<device>[\w.-]+)",
            {"reason": "the device node is not there or not openable: start the container with --device=/dev/infiniband "
                       "(or -v /dev/infiniband:/dev/infiniband with --privileged) and --cap-add=IPC_LOCK"}),
           (r"libibverbs: Warning: no userspace device-specific driver found for (?P<device>/sys/class/infiniband_verbs/"
            r"uverbs\d+)",
            {"reason": "the image has no verbs provider for the NIC: install rdma-core's providers in the image "
                       "(ibverbs-providers / libmlx5) matching the host's driver"}))

IB_DEVICE_NOT_IN_CONTAINER = Entry(
    "ib-device-not-in-container", "The RDMA device cannot be opened inside the rank's container", DEGRADED,
    symptom="NCCL warns `NET/IB : Unable to open device mlx5_0`, then `NET/IB : No device found` and runs over "
            "sockets (slow), or fails to initialise any NET plugin",
    detect="NCCL's `NET/IB : Unable to open device <dev>` (the HCA is listed, its device node does not open) or "
           "libibverbs' `no userspace device-specific driver found`; the device is extracted",
    cause="the container sees the HCA in /sys but not its character device: docker was started without "
          "--device=/dev/infiniband (or without the rights to open it), or the image has no verbs provider library "
          "for the NIC; NCCL then skips the device and falls back to TCP sockets",
    fix="{device}: {reason}; `ibv_devinfo` inside the rank's container must list the port as PORT_ACTIVE",
    proof="docker exec <rank container> sh -c 'ls -l /dev/infiniband; ibv_devinfo -l'",
    signature=extracting(*_IB_DEV),
    source="NVIDIA/nccl src/transport/net_ib.cc:715 @ v2.28.9-1, src/transport/net_ib/init.cc:334 @ v2.30.7-1 (Unable "
           "to open device), src/misc/ibvwrap.cc:127 @ v2.28.9-1 (ibv_open_device); linux-rdma/rdma-core "
           "libibverbs/init.c (no userspace device-specific driver; by function); reports NVIDIA/nccl#451 (docker "
           "without the device: Unable to open device, then sockets), NVIDIA/caffe#590 (no provider in the image)",
    # a bare /dev/infiniband is nccl-ib-no-device's cue too (a report of the fallback): the anchor is the open failure
    # or the device flag itself
    words=(r"--device[= ]/dev/infiniband|(rdma|infiniband|\bib\b|hca|roce)\b.{0,60}\b(in|inside) "
           r"(the |a |my )?(docker|container)|unable to open device|ibv_open_device",
           r"nccl|rdma|roce|infiniband|mlx5|uverbs|ibv_",
           r"docker|container|privileged|socket\w*|slow"),
    lab="none: the lab has no RDMA device")

# --------------------------------------------------------------------------- file descriptors

#: the kernel's EMFILE (include/uapi/asm-generic/errno-base.h:28 @ 2cc2c3cb, "Too many open files"), as Python prints it
#: ("[Errno 24] Too many open files") or ZMQ ("Too many open files (src/...)"): the process hit RLIMIT_NOFILE
_NOFILE = (# not vLLM's own start-up warning that quotes the error as an example ("fd limit errors like `OSError: [Errno
           # 24] Too many open files`", vllm/utils/system_utils.py:255 @ v0.32.0, printed by every healthy start under a
           # capped limit)
           r"(?<!like `OSError: )\[Errno 24\] Too many open files(?:: '(?P<path>[^']+)')?",
           r"Too many open files \((?P<path>src/[\w./]+):\d+\)",
           r"ZMQError: Too many open files",
           r"\bEMFILE\b[^\n]{0,40}too many open files|too many open files[^\n]{0,40}\bEMFILE\b")

OPEN_FILES_LIMIT_LOW = Entry(
    "open-files-limit-low", "The process ran out of file descriptors (ulimit -n)", FATAL,
    symptom="a rank or the API server dies with `OSError: [Errno 24] Too many open files`, often only at large TP or "
            "under many concurrent requests",
    detect="the kernel's EMFILE as Python or ZMQ print it; the file it was opening is extracted where printed",
    cause="the process's open-file limit (RLIMIT_NOFILE, `ulimit -n`, 1024 by default in many containers and ssh "
          "sessions) is below what it needs: sockets per request, ZMQ and shared-memory handles per rank, weight "
          "shards mapped at load",
    fix="raise the limit for the rank: `docker run --ulimit nofile=1048576:1048576`, or `ulimit -n 1048576` in the "
        "shell that starts it (LimitNOFILE= for a systemd unit); the failing open was {path}",
    proof="cat /proc/<rank pid>/limits | grep -i 'open files'; ls /proc/<rank pid>/fd | wc -l",
    signature=beside(STACK, *[(p, {"path": "not printed"}) for p in _NOFILE]),
    source="torvalds/linux include/uapi/asm-generic/errno-base.h:28 @ 2cc2c3cb (EMFILE 24, Too many open files); "
           "reports "
           "pytorch/pytorch#137695 (vLLM at TP 8 until `ulimit -n` was raised), facebookresearch/fairseq#87",
    words=(r"(?:" + PROSE_STACK + r"|^(?=.*(?:distributed|horovod|pytorch)).*?)(too many open files|\bemfile\b|ulimit -n|open[- ]files? limit|nofile|file descriptors?)",
           # the stack's processes, or a distributed training job's (horovod, torch's DataLoader / shared tensors)
           r"vllm|rank|worker|server|container|docker|tp ?\d|distributed|horovod|pytorch|torch|epoch",
           r"crash\w*|die\w*|fail\w*|error|raise\w*"),
    lab="none yet: a lab rank started under `ulimit -n 64` would produce it")

# --------------------------------------------------------------------------- /dev/shm for torch's shared tensors

#: torch's shared-memory tensors: aten/src/ATen/MapAllocator.cpp (MapAllocator, POSIX branch: "unable to write to file
#: <", filename, ">: ", strerror, " (", errno, ")") when the /dev/shm tmpfs is full, and torch/csrc/DataLoader.cpp's
#: SIGBUS handler ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared
#: memory (shm).") when a page of a segment cannot be backed (files read by function; no pinned line)
_TORCH_SHM = (r"unable to write to file <(?P<file>/torch_[\w]+)>(?::? ?No space left on device)?",
              (r"Unexpected bus error encountered in worker\. This might be caused by insufficient shared memory",
               {"file": "a DataLoader worker's segment"}),
              (r"(?:dataloader's workers|DataLoader worker[^\n]{0,60}) (?:are|is) (?:out of shared memory|killed by "
               r"signal: Bus error)", {"file": "a DataLoader worker's segment"}))

CONTAINER_SHM_TOO_SMALL = Entry(
    "container-shm-too-small", "The container's /dev/shm is too small for torch's shared tensors", FATAL,
    symptom="a worker dies with `RuntimeError: unable to write to file </torch_...>: No space left on device (28)` or "
            "`Unexpected bus error encountered in worker ... insufficient shared memory (shm)`",
    detect="torch's shared-memory write failure or its bus-error handler; the segment is extracted",
    cause="torch passes tensors between processes through files in /dev/shm; docker gives a container a 64 MiB "
          "/dev/shm unless --ipc=host or --shm-size is set, and the segment does not fit",
    fix="the segment {file} did not fit: start the container with --ipc=host (or --shm-size=16g or more); `df -h "
        "/dev/shm` inside it must show the size",
    proof="docker exec <rank container> df -h /dev/shm",
    signature=beside(CONTAINER, *_TORCH_SHM),
    source="pytorch/pytorch aten/src/ATen/MapAllocator.cpp (MapAllocator: unable to write to file), "
           "torch/csrc/DataLoader.cpp (the SIGBUS handler's insufficient shared memory), files read by function; "
           "reports idiap/ESLAM#20 (fixed with --shm-size), logicalclocks/hopsworks#1557 (docker's 64 MB default), "
           "Duankaiwen/CenterNet#56 (fixed with --ipc=host); prose: NVIDIA/Megatron-LM#878 (`[Errno 28]`, fixed with "
           "--shm-size), theroyallab/tabbyAPI#387 (heldout-8's fz8-shm-01: compose's 64 MiB /dev/shm, tensor "
           "parallel)",
    # not where NCCL is the one that needs /dev/shm (nccl-shm-too-small), not a training job's DataLoader (off-domain),
    # and not a flag in a pasted command line
    words=(r"^(?=.*(vllm|sglang|\bray\b|\bllm\b|spark|\branks?\b|worker|tensor[- _]parallel|\bserv(e|er|ing)\b|"
           r"inference|torch))(?!.*\b(nccl|dataloader|training|epochs?|fine-?tun\w*)\b).*?((shm[-_ ]size|/dev/shm|shared memory)\b.{0,60}\b(too small|small|full|insufficient|"
           r"limit|out of|no space|64 ?mb?\b)|insufficient shared memory|(raise|increase|add|adding|set|with|gets?)\W+(the )?"
           r"(--shm-size|--ipc[= ]host)|"
           # ENOSPC told beside the mount ("[Errno 28] No space left on device ... the space available at /dev/shm";
           # "this error is about docker container's shared memory": NVIDIA/Megatron-LM#878), or a fix by its size
           r"no space left( on device)?.{0,160}(/dev/shm|shared memory)|\b(space|room)\b.{0,30}(/dev/shm|shared memory)|"
           r"\b(fix\w*|solv\w*|resolv\w*|work\w*)\b.{0,80}(--shm-size|\bshm_size|--ipc[= ]host))",
           r"docker|container|pod|k8s|kubernetes",
           r"torch|worker|dataloader|vllm|bus error|crash\w*|tensor[- _]parallel\w*|no space left|errno 28"),
    lab="none yet: a lab container with --shm-size=1m would produce it")

# --------------------------------------------------------------------------- JIT builds without a compiler

#: Triton's launcher build (triton-lang/triton python/triton/runtime/build.py get_cc / _build: "Failed to find C
#: compiler. Please specify via CC environment variable."), torch's extension builder
#: (torch/utils/cpp_extension.py:3302 @ 2.13.0: "CUDA_HOME environment variable is not set. Please set it to your CUDA
#: install root."), and a build that runs nvcc where the image has none (`nvcc: not found`)
_NO_COMPILER = ((r"Failed to find C compiler\. Please specify via CC environment variable",
                 {"what": "Triton found no C compiler (gcc) to build its launcher"}),
                (r"CUDA_HOME environment variable is not set\. Please set it to your CUDA install root",
                 {"what": "torch's extension builder found no CUDA toolkit (CUDA_HOME)"}),
                (r"(?:/bin/sh: \d+: |sh: |bash: )?(?P<binary>nvcc): (?:command )?not found",
                 {"what": "a JIT build ran nvcc, which the image does not have"}))

JIT_COMPILER_MISSING = Entry(
    "jit-compiler-missing", "A JIT kernel build finds no compiler in the image", FATAL,
    symptom="the start (or the first request, at CUDA-graph capture) dies with `Failed to find C compiler. Please "
            "specify via CC environment variable` or `CUDA_HOME environment variable is not set`",
    detect="Triton's or torch's own compiler-missing message, or a shell's `nvcc: not found` during a build; what "
           "was missing is extracted",
    cause="Triton, FlashInfer and torch extensions compile kernels at run time; a slim runtime image (a `-runtime` "
          "CUDA base, or one stripped of build-essential and the CUDA toolkit) has no gcc or nvcc for them",
    fix="{what}: use the image's devel flavour or install `build-essential` (and the CUDA toolkit for nvcc, with "
        "CUDA_HOME set) in the image; or ship prebuilt kernels and a warm JIT cache so nothing compiles at start",
    proof="docker exec <rank container> sh -c 'which gcc cc nvcc; echo CC=$CC CUDA_HOME=$CUDA_HOME'",
    signature=beside(STACK, *_NO_COMPILER),
    source="triton-lang/triton python/triton/runtime/build.py (get_cc / _build; by function), pytorch/pytorch "
           "torch/utils/cpp_extension.py:3302 @ 2.13.0 (CUDA_HOME not set); reports vllm-project/vllm#2997, "
           "vllm-project/vllm#15329 (Triton's driver build in the engine core), sgl-project/sglang#1067 (a runtime "
           "base image)",
    words=(PROSE_STACK + r"((fail\w*|unable|can'?t|cannot) (to )?find (a |the |any )?c(\+\+)? compiler|no (c(\+\+)? )?"
           r"compiler|\b(gcc|nvcc)\b.{0,40}\b(missing|not found|not installed)|cuda_home)",
           r"triton|flashinfer|jit|compile\w*|build\w*|inductor",
           r"image|docker|container|runtime|vllm|start\w*"),
    lab="none: the lab's CPU build compiles no CUDA kernels")

# --------------------------------------------------------------------------- a container (or actor) without a GPU

#: what CUDA code says when the process sees no GPU: torch's device-count check ("No CUDA GPUs are available",
#: cudaErrorNoDevice; c10/cuda, by function), torch/cuda/__init__.py _check_driver ("Found no NVIDIA driver on your
#: system", when no libcuda is visible: by function), vLLM's platform detection (vllm/config/device.py:55-59 @ v0.32.0
#: "Failed to infer device type"). A host without a loaded driver prints them too (driver-not-loaded), and a second
#: device selection prints the first (cuda-visible-devices-conflict): symptoms, never high
GPU_NOT_VISIBLE_IN_CONTAINER = Entry(
    "gpu-not-visible-in-container", "The rank's container (or Ray actor) was given no GPU", FATAL,
    symptom="a rank dies at CUDA init with `RuntimeError: No CUDA GPUs are available`, `Found no NVIDIA driver on your "
            "system` or vLLM's `Failed to infer device type`, while nvidia-smi on the host works",
    detect="torch's or vLLM's no-GPU messages; a symptom (medium): a host whose driver is not loaded and a doubled "
           "device selection print them too",
    cause="the process sees no GPU device: the container was started without `--gpus all` (or `--runtime nvidia`), a "
          "pod without an nvidia.com/gpu limit, NVIDIA_VISIBLE_DEVICES=void or CUDA_VISIBLE_DEVICES empty, or a Ray "
          "actor scheduled with num_gpus=0",
    fix="start the rank's container with `--gpus all` (docker) and check `docker exec <rank container> nvidia-smi -L` "
        "lists the GPU; in Kubernetes request nvidia.com/gpu; leave CUDA_VISIBLE_DEVICES unset on a Spark; if "
        "nvidia-smi fails on the host too, see driver-not-loaded",
    proof="nvidia-smi -L; docker inspect <rank container> --format '{{.HostConfig.DeviceRequests}}'; docker exec <rank "
          "container> nvidia-smi -L",
    signature=None,
    source="pytorch/pytorch torch/cuda/__init__.py _check_driver (Found no NVIDIA driver), c10/cuda device count (No "
           "CUDA GPUs are available), files read by function; vllm-project/vllm vllm/config/device.py:55-59 @ v0.32.0 "
           "(Failed to infer device type); reports abetlen/llama-cpp-python#1882 (CUDA not detected without --gpus "
           "all), vllm-project/vllm#3019 (a Kubernetes pod), ray-project/ray#51193 (vLLM under Ray Serve)",
    # only beside the serving stack or a container (the message itself names CUDA): a notebook's or an image app's
    # "No CUDA GPUs" is off-domain
    symptoms=tuple(r"^(?=[\s\S]*?(?:vllm|sglang|\bnccl\b|\bray\b|docker|container|\bpod\b|kubernetes|--gpus))"
                   r"[\s\S]*?(?P<at>" + p + ")" for p in (r"RuntimeError: No CUDA GPUs are available",
                                                         r"Found no NVIDIA driver on your system",
                                                         r"Failed to infer device type",
                                                         # an application's own GPU probe in a container that
                                                         # points at the container toolkit's install guide
                                                         # (heldout-9's fz9-nogpu-01: a transcoder's "NVIDIA CUDA
                                                         # test failed ... the required runtime is not configured")
                                                         r"required runtime is not\s+configured|"
                                                         r"\bno (?:nvidia |cuda )?gpus? (?:were )?(?:detected|found)\b")),
    words=(r"^(?=.*(vllm|sglang|\bnccl\b|\bray\b|\bllm\b|spark|\bdgx\b|gb10|\branks?\b|worker|tensor[- _]parallel|"
           r"\bserv(e|er|ing)\b|inference|runbook|torch|cuda)).*?((without|no|missing|forgot\w*)\W+(the )?--gpus|"
           r"--gpus all\b.{0,40}\b(fix\w*|work\w*|solv\w*)|(container|docker|pod)\b.{0,60}\b(no|doesn'?t see|does not "
           r"see|can'?t see|cannot see) (the |a |any )?gpus?|is_available\(\)\W{0,3}(returns |is )?false)",
           r"docker|container|pod|k8s|kubernetes|\bray\b",
           r"cuda|torch|vllm|nvidia|gpu"),
    lab="none: the lab's containers run without GPUs (its CPU build asks for none)")
