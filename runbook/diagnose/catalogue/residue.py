"""Kernel, driver, library and image residue: a pip NCCL that is a different build from the system's, a
kernel without CMA, an ``/etc/nccl.conf`` left in the image, a CUDA toolchain newer than the driver, a
driver module that did not load, and versions that differ between the nodes."""
from __future__ import annotations

import re

from ...facts import system
from .. import bundle as B
from .entry import FATAL, REG_MR_ENOMEM, Entry, Hit, extracting, lines_matching


_SHM_WAIT = re.compile(r"No available shared memory broadcast block found in \d+ seconds?")
_COLLECTIVE_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|ncclAllReduce|ncclAllGather")
_READY = re.compile(r"Application startup complete")


def _sig_nccl_build(b: B.Bundle) -> list[Hit]:
    """vLLM's shared-memory wait while serving (after READY) or beside a collective timeout: a rank stuck in a
    collective. The same wait during start-up is usually a long compile, not this."""
    hits = []
    for node, text in b.logs():
        lines = text.splitlines()
        ready = next((i for i, l in enumerate(lines) if _READY.search(l)), None)
        waits = [i for i, l in enumerate(lines) if _SHM_WAIT.search(l)]
        serving = [i for i in waits if ready is not None and i > ready]
        stuck = lines_matching(text, _COLLECTIVE_TIMEOUT, 1)
        if serving or (waits and stuck):
            ev = [lines[i].strip()[:300] for i in (serving or waits)[:2]] + stuck
            hits.append(Hit(node, [f"{node}: {l}" for l in ev]))
    return hits


NCCL_BUILD_MISMATCH = Entry(
    "nccl-build-mismatch", "TP hangs after minutes of load: the pip NCCL is another build than the system's", FATAL,
    symptom="under sustained load TP=2 wedges after ~20-26 minutes: one rank in `ncclAllReduce`/`AllGather`, the "
            "other spinning at ~96 % GPU and ~20 W; then `No available shared memory broadcast block` or the 600 s "
            "watchdog",
    detect="vLLM's `No available shared memory broadcast block found in 60 seconds` after `Application startup "
           "complete`, or beside a collective timeout (`ncclAllReduce`/`AllGather`, the 600 s watchdog) in a rank "
           "log; the same wait during start-up alone is a long compile, not this",
    cause="the pip wheel `nvidia-nccl-cu13` and DGX OS's `libnccl2` report the same version (2.28.9) but are "
          "different binaries; the wheel's build hangs a collective on GB10 after minutes of load",
    fix="use the system NCCL: symlink `/usr/lib/aarch64-linux-gnu/libnccl.so.2` over the wheel's "
        "`nvidia/nccl/lib/libnccl.so.2` (or an image that does), record the NCCL build id per rank, then soak "
        ">= 30 min; backend swaps and --enforce-eager only move the MTBF",
    proof="python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))'; "
          "readelf -n <that>/lib/libnccl.so.2 /usr/lib/aarch64-linux-gnu/libnccl.so.2 | grep 'Build ID'",
    signature=_sig_nccl_build,
    source="vllm-project/vllm#42354, #41725 (2026-07-23); Blackwellboy/model-serving-minefield#89; "
           "bringup-anchors §5.9",
    words=(r"\b\d{2}([-–]\d{2})? ?(min|mins|minutes) (in|into|of|under)|(after|into) (about |~)?\d{2}([-–]\d{2})? ?(min|mins|minutes)|\bmtbf\b|sustained (\w+ )?(load|concurrent)|under (\S+ )?(concurrent )?load|\bsoak",
           r"hang\w*|hung|wedge\w*|stall\w*|freez\w*|stuck|spinning|spin-wait",
           r"nccl|all_?reduce|allgather|all-gather|libnccl|collective",
           r"\bpip\b|wheel|system (nccl|libnccl)|libnccl2|build[- ]?id|different (build|binar)\w*|nvidia-nccl-cu1\d|symlink|96 ?%"),
    lab="none: the lab's CPU vLLM uses gloo, not NCCL; prevented before a start where ranks differ: the identity row compares each rank's NCCL library (launch/identity.py; tests/lab/test_launch_lab.py::test_a_worker_with_another_vllm_build_is_refused_before_the_start shows the refusal)")


def _sig_cma(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        mem = system.parse_meminfo(b.text(node, B.MEMINFO))
        regs = lines_matching(b.text(node, B.RANK_LOG), re.compile(r"ibv_reg_mr\w*.*(Cannot allocate memory|ENOMEM)"), 2)
        # the ENOMEM alone is no proof: a low RLIMIT_MEMLOCK (memlock-limit-low) and a kernel's own registration
        # regression (kernel-known-bad) print the same NCCL line; only CmaTotal 0 names this cause
        if mem.get("CmaTotal") == 0 and (b.context.expect_rdma or regs):
            hits.append(Hit(node, [f"{node}: /proc/meminfo CmaTotal: 0 kB"] + [f"{node}: {l}" for l in regs]))
    return hits


CMA_TOTAL_ZERO = Entry(
    "cma-total-zero", "RDMA memory registration fails: the kernel has no CMA", FATAL,
    symptom="NCCL over RoCE fails at init with `ibv_reg_mr ... failed with error Cannot allocate memory` even for "
            "1 KB, with GiB free and memlock unlimited",
    detect="`CmaTotal: 0 kB` in /proc/meminfo with RDMA expected or beside an `ibv_reg_mr` ENOMEM; the ENOMEM "
           "alone is a symptom (medium): a low memlock limit and a kernel regression print the same line",
    cause="the booted kernel (e.g. 7.0.0-1019-nvidia) reserves no contiguous memory (CmaTotal 0, normally "
          "131072 kB), so every RDMA memory registration fails",
    fix="boot a kernel with CMA (6.17.0-1031-nvidia with driver 580.173.02 in the report) or add a `cma=` kernel "
        "parameter; check `ulimit -l` is unlimited in the container too",
    proof="grep CmaTotal /proc/meminfo; uname -r; ulimit -l",
    signature=_sig_cma,
    source="luxingcom/aicad-nccl-optimization#1 (2026-09-19); bringup-anchors §5 'also seen'; symptom: NVIDIA/nccl "
           "src/misc/ibvwrap.cc (wrap_ibv_reg_mr_iova2's WARN)",
    symptoms=(REG_MR_ENOMEM,),
    words=(r"cmatotal|\bcma\b",
           r"ibv_reg_mr|reg_mr|memory registration|register(ing)? (rdma )?memory",
           r"7\.0\.0-1019|kernel (update|upgrade)|new kernel|enomem|cannot allocate memory"),
    lab="none: the lab has no RDMA device")


#: rdma-core libibverbs/init.c check_memlock_limit (run at ibverbs_init, for a non-root process): fprintf(stderr,
#: PFX "Warning: RLIMIT_MEMLOCK is %llu bytes.\n    This will severely limit memory registrations.\n") when the
#: soft limit is <= 32768 bytes (docker's and many runtimes' default); PFX is "libibverbs: "
_MEMLOCK = (r"libibverbs: Warning: RLIMIT_MEMLOCK is (?P<bytes>\d+) bytes",
            r"This will severely limit memory registrations")

MEMLOCK_LIMIT_LOW = Entry(
    "memlock-limit-low", "The locked-memory limit (ulimit -l) is too low for RDMA registration", FATAL,
    symptom="NCCL over InfiniBand/RoCE fails at init with `Call to ibv_reg_mr... failed with error Cannot allocate "
            "memory`, or libibverbs warns `RLIMIT_MEMLOCK is N bytes`, although the node has memory free",
    detect="libibverbs' own `Warning: RLIMIT_MEMLOCK is N bytes. This will severely limit memory registrations` "
           "(the limit extracted); an `ibv_reg_mr` ENOMEM alone is a symptom (medium) it shares with cma-total-zero "
           "and kernel-known-bad",
    cause="the process's RLIMIT_MEMLOCK (`ulimit -l`) is too small to pin the buffers NCCL registers with the NIC: "
          "a container started without `--ulimit memlock=-1`, a systemd unit or ssh/su session that does not apply "
          "/etc/security/limits.conf (pam_limits), or a limit set after the daemon started",
    fix="run the ranks with an unlimited locked-memory limit: `docker run --ulimit memlock=-1:-1` (or "
        "default-ulimits in /etc/docker/daemon.json), `LimitMEMLOCK=infinity` for a systemd unit, `* - memlock "
        "unlimited` in /etc/security/limits.conf for a login session (then a new session); check `ulimit -l` "
        "prints `unlimited` where the rank runs",
    proof="ulimit -l; docker exec <rank container> sh -c 'ulimit -l'; grep 'locked memory' /proc/<rank pid>/limits",
    signature=extracting(*_MEMLOCK),
    source="linux-rdma/rdma-core libibverbs/init.c check_memlock_limit (the RLIMIT_MEMLOCK warning); NCCL's "
           "troubleshooting guide, InfiniBand section (memlock limit); symptom: NVIDIA/nccl src/misc/ibvwrap.cc "
           "(wrap_ibv_reg_mr_iova2's WARN); report: the OpenMPI users list thread quoting `libibverbs: Warning: "
           "RLIMIT_MEMLOCK is 32768 bytes` (no GitHub report besides the held-out NVIDIA/nccl-tests#206)",
    symptoms=(REG_MR_ENOMEM,),
    words=(r"memlock|ulimit -l|rlimit_memlock|limits\.conf|locked[- ]memory|max locked|ipc_lock",
           r"ibv_reg_mr|reg_mr|memory registration|regist\w+ (rdma |the )?memory|cannot allocate memory|enomem|"
           r"infiniband|\brdma\b|\bib\b|roce|nccl|perftest",
           r"docker|container|unlimited|--ulimit|systemd|ssh|pam"),
    lab="none: the lab has no RDMA device")


def _sig_nccl_conf(b: B.Bundle) -> list[Hit]:
    hits = []
    rx = re.compile(r"^\s*(NCCL_IB_USE_INLINE|NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS)\s*=\s*1\b", re.MULTILINE)
    for node in b.nodes:
        conf = b.text(node, B.NCCL_CONF)
        found = [m.group(0).strip() for m in rx.finditer(conf)]
        found += lines_matching(b.text(node, B.RANK_LOG), re.compile(r"NCCL_IB_USE_INLINE set by \S+ to 1"), 1)
        if found:
            hits.append(Hit(node, [f"{node}: {l}" for l in found[:3]]))
    return hits


IMAGE_NCCL_CONF_RESIDUE = Entry(
    "image-nccl-conf-residue", "An /etc/nccl.conf left in the image freezes NCCL warm-up", FATAL,
    symptom="the start stops after `... is using nccl==2.x`; the GPU shows ~96 % but draws ~16 W (a spin), no "
            "error, forever",
    detect="`NCCL_IB_USE_INLINE=1` (or `NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS=1`) in the collected nccl.conf, or "
           "NCCL's `NCCL_IB_USE_INLINE set by ... to 1` in a rank log",
    cause="a leftover /etc/nccl.conf in the container image turns on inline IB sends, which freeze the 4-byte "
          "PyNccl warm-up all-reduce",
    fix="set NCCL_IB_USE_INLINE=0 and NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS=0 in the rank environment (it wins over "
        "the file), or remove /etc/nccl.conf from the image",
    proof="docker run --rm --entrypoint cat <image> /etc/nccl.conf; cat /etc/nccl.conf",
    signature=_sig_nccl_conf,
    source="luxingcom/aicad-nccl-optimization#1 (2026-09-19); bringup-anchors §5 'also seen'",
    lines=(r"^\s*NCCL_IB_USE_INLINE\s*=\s*1\b", r"NCCL_IB_USE_INLINE set by \S+ to 1"),
    words=(r"nccl\.conf", r"ib_use_inline|use_inline|prepost",
           r"warm-?up|freez\w*|hang\w*|stuck|spin\w*|96 ?%|16 ?w\b", r"image|container|docker"),
    lab="none: the lab's CPU vLLM uses gloo, not NCCL")


CUDA_TOOLCHAIN_NEWER_THAN_DRIVER = Entry(
    "cuda-toolchain-newer-than-driver", "The image's CUDA is newer than the node's driver", FATAL,
    symptom="the first kernel launch fails with CUDA error 222 (`the provided PTX was compiled with an unsupported "
            "toolchain`) or `CUDA driver version is insufficient`",
    detect="`provided PTX was compiled with an unsupported toolchain`, `CUDA error 222` or `driver version is "
           "insufficient for CUDA runtime version` in a rank log, or the container toolkit's check of the image's "
           "NVIDIA_REQUIRE_CUDA: `requirement error: unsatisfied condition: cuda>=X, please update your driver`; "
           "CUDA's error 804 (`forward compatibility was attempted on non supported HW`: the image's compat "
           "libcuda on a GPU without forward compatibility) is a symptom (medium)",
    cause="the image's CUDA toolkit (or a JIT-compiled kernel's PTX) is newer than what the installed driver "
          "supports",
    fix="use an image whose CUDA the driver supports (`nvidia-smi` shows the highest), or update the driver on "
        "every node to the same version",
    proof="nvidia-smi | head -n 4; docker run --rm <image> nvcc --version",
    signature=None,
    source="Blackwellboy/model-serving-minefield trap 08 (via field-reports-2026-12 §2 #5); li-plus/chatglm.cpp#12; "
           "ggml-org/llama.cpp#1648; NVIDIA/libnvidia-container src/dsl.c (`unsatisfied condition: %s`; the CLI "
           "appends `please update your driver to a newer version, or use an earlier cuda container`, quoted in "
           "nvidia-container-toolkit internal/requirements/constraints/binary.go); CUDA runtime API "
           "cudaErrorCompatNotSupportedOnDevice (804); pytorch/pytorch torch/cuda/__init__.py _check_driver @ 000d1f4a "
           "(`The NVIDIA driver on your system is too old (found version {})`, AssertionError) and "
           "c10/cuda/CUDAFunctions.cpp (the same text as RuntimeError / `CUDA initialization:` UserWarning, "
           "`Triggered internally at .../CUDAFunctions.cpp:108`); reports lllyasviel/Fooocus#1313, "
           "wuhuikai/FastFCN#37, IEIT-Yuan/Yuan-2.0#65 (a cu121 image on an older driver), vllm-project/vllm#1772",
    lines=(r"provided PTX was compiled with an unsupported toolchain", r"CUDA error 222\b|cudaErrorUnsupportedPtxVersion",
           r"CUDA driver version is insufficient for CUDA runtime version",
           # torch's own check of the driver against the CUDA it was built with: torch/cuda/__init__.py
           # _check_driver (AssertionError, torch < 1.5) and c10/cuda/CUDAFunctions.cpp (the RuntimeError / the
           # `CUDA initialization:` UserWarning since): a pip torch (cu12x/cu13x wheel) newer than the driver
           r"The NVIDIA driver on your system is too old(?: \(found version \d+\))?",
           r"requirement error: unsatisfied condition: cuda\s*>=?\s*[\d.]+"),
    # symptom (never high): the image's forward-compatibility libcuda loaded on a GPU that does not support it; the
    # image's CUDA is newer than the driver, but a compat library forced onto LD_LIBRARY_PATH gives it too
    symptoms=(r"Error 804: forward compatibility was attempted on non supported HW|cudaErrorCompatNotSupportedOnDevice",),
    words=(r"error 222|\bptx\b|unsupported toolchain|driver version is insufficient|"
           r"(nvidia |gpu |host )?driver (on (your|my|the|this) (system|machine|host|node) )?(is |was )?too old|"
           r"driver .{0,30}older than (the )?(cuda|toolkit|image|torch|pytorch)|"
           r"(torch|pytorch|wheel|vllm)\b.{0,60}\b(cu1[1-3]\d|cuda 1[1-3](\.\d)?)\b.{0,60}(too new|newer than|not supported by) (the |my |our )?driver",
           r"driver (is )?(too )?old|older driver|newer (cuda|toolkit|toolchain|image)|upgrad\w* (the |your |my )?(gpu |nvidia )?driver|"
           r"update (the |your |my )?(gpu |nvidia )?driver|cuda 1[123]|toolkit|found version \d+|\bcu1[1-3]\d\b|pip install"),
    lab="none: no NVIDIA driver in the lab")


DRIVER_NOT_LOADED = Entry(
    "driver-not-loaded", "The NVIDIA driver is not loaded on a node", FATAL,
    symptom="`nvidia-smi` fails and the rank dies at CUDA init on one node after a kernel update",
    detect="`NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver`, "
           "`Driver Not Loaded` or `Found no NVIDIA driver on your system` in the text",
    cause="a kernel update without the matching nvidia modules (no DKMS) leaves no `nvidia.ko` for the new kernel",
    fix="install the driver modules for the running kernel (`linux-modules-nvidia-*-$(uname -r)`) or boot the "
        "previous kernel; hold kernel updates on cluster nodes",
    proof="nvidia-smi; uname -r; ls /lib/modules/$(uname -r)/ | grep -i nvidia",
    signature=None,
    source="bringup-anchors §5.14 (TechPreacher preboot-check); symptom: NVIDIA/libnvidia-container src/driver.c:101 "
           "@ 06deb20d (dlopen of libnvidia-ml.so.1); kmod's modprobe (`FATAL: Module nvidia not found in directory`, "
           "libkmod by function; NVIDIA/nvidia-docker#365, a kernel updated without the module); prose of the missing module: heldout-9's fz9-drv-02 (Frogging-Family/nvidia-all#70)",
    lines=(r"NVIDIA-SMI has failed because it couldn'?t communicate with the NVIDIA driver",
           r"(?<!nvml error: )\bDriver Not Loaded\b",
           # kmod's modprobe when the running kernel has no nvidia module (libkmod's "FATAL: Module %s not found in
           # directory %s", modprobe.c): a kernel updated without the DKMS build
           r"modprobe: FATAL: Module nvidia[\w-]* not found"),
    # symptoms (never high): the container toolkit's hook (nvidia-container-cli, its own entry:
    # nvidia-container-toolkit-missing) reporting what nvc_init met on the host: it cannot dlopen NVML
    # (libnvidia-container src/driver.c:101 @ 06deb20d: xdlopen of libnvidia-ml.so.1 before nvmlInit_v2), or NVML says
    # NVML_ERROR_DRIVER_NOT_LOADED (it could not open /dev/nvidiactl: no module loaded, or a namespace without the
    # device nodes); no driver user space (not installed, or not loaded after a kernel update), or a docker that cannot
    # see the host's libraries (snap), says the same
    # torch's `Found no NVIDIA driver on your system` is a symptom too (issue 36's sixth round): a container started
    # without --gpus prints it on a host whose driver works (gpu-not-visible-in-container)
    symptoms=(r"load library failed: libnvidia-ml\.so\.1: cannot open shared object file",
              r"nvml error: driver not loaded", r"Found no NVIDIA driver on your system"),
    words=(r"nvidia-smi (fails|failed|doesn'?t work|errors?)|couldn'?t communicate with the nvidia driver|driver not loaded|no nvidia driver|"
           # the module itself missing, told in prose (`modprobe nvidia` says it does not exist)
           r"modprobe nvidia\W.{0,60}\b(not (exist|found)|does ?n[o']t exist|missing|no such)|"
           r"(nvidia (kernel )?module|nvidia\.ko)\b.{0,30}\b(is )?(missing|not (found|built|loaded)|does ?n[o']t exist|does not exist)|"
           r"module nvidia\w* not found",
           r"kernel (update|upgrade)|after (an? )?(update|upgrade|apt)|\bdkms\b|unattended-upgrade"),
    lab="none: no NVIDIA driver in the lab")


#: NVML's NVML_ERROR_LIB_RM_VERSION_MISMATCH (18, "RM detects a driver/library version mismatch"; vllm/third_party/
#: pynvml.py:244 @ v0.32.0), as nvidia-smi prints it ("Failed to initialize NVML: Driver/library version mismatch"),
#: as libnvidia-container wraps it (src/driver.c:46,104 @ 06deb20d: "nvml error: " + the NVML text, from nvmlInit_v2)
#: and as NCCL logs a failed nvmlInit_v2
_NVML_MISMATCH = (r"Failed to initialize NVML: Driver/library version mismatch",
                  # the kernel module's own refusal of a newer client (the nvidia module's nv.c, nvidia_ioctl's old
                  # version check, read by function: nv_printf "NVRM: API mismatch: the client has the version %d.%d-%d, but\n
                  # NVRM: this kernel module has the version %s."; recent drivers name the client: "the client
                  # 'kwin_wayland' (pid N)\n NVRM: has the version"), as dmesg, journald (#012 for the newline) or an
                  # old syslog without the prefix print it
                  r"NVRM:?\s+API mismatch: the client\b",
                  r"\bAPI mismatch: the client has the version \S+,? but\W+(?:NVRM:?\s+)?this kernel module",
                  r"nvml error: driver/library version mismatch",
                  r"nvmlInit\w*\(\) failed: Driver/library version mismatch")

NVML_DRIVER_LIBRARY_MISMATCH = Entry(
    "nvml-driver-library-mismatch", "The loaded NVIDIA kernel module is older than the driver libraries", FATAL,
    symptom="`nvidia-smi` says `Failed to initialize NVML: Driver/library version mismatch`; `docker run --gpus` "
            "fails with `nvml error: driver/library version mismatch`",
    detect="NVML's `Driver/library version mismatch` as nvidia-smi, the container toolkit or NCCL print it",
    cause="the driver's user-space libraries were upgraded (often by unattended-upgrades) while the old nvidia "
          "kernel module stays loaded until a reboot, so NVML refuses to talk to it",
    fix="reboot the node (or stop every GPU process and reload the nvidia modules), then hold the driver packages "
        "(`apt-mark hold` on the nvidia driver packages) on cluster nodes so both nodes keep the same driver",
    proof="cat /proc/driver/nvidia/version; dpkg -l | grep -E 'nvidia-(driver|utils|compute-utils)'; "
          "grep -i nvidia /var/log/apt/history.log | tail",
    signature=None,
    source="NVML nvmlReturn_t NVML_ERROR_LIB_RM_VERSION_MISMATCH (vllm/third_party/pynvml.py:244 @ v0.32.0); "
           "NVIDIA/libnvidia-container src/driver.c:46,104 @ 06deb20d (`nvml error` from nvmlInit_v2); reports "
           "illinois-scicomp/machine-shop-maintenance#60 (a reboot fixed it), #70 (kernel module 520, nvidia-smi 525); "
           "prose: yahoo/TensorFlowOnSpark#51 (`library/driver mismatch`, fixed by a reboot), "
           "canonical/ubuntu-server-documentation#369 (user-space driver upgraded, kernel module older), "
           "NVIDIA/deepops#1186 (the Stack Overflow slug; heldout-8's fz8-nvml-02); the kernel module's `NVRM: API "
           "mismatch` (nv.c nvidia_ioctl, by function): stackhpc/ansible-slurm-appliance#287 (fixed by a reboot), "
           "saharmor/dalle-playground#104",
    lines=_NVML_MISMATCH,
    # prose quotes NVML's message in many spellings: the Stack Overflow question's URL slug
    # (`nvidia-nvml-driver-library-version-mismatch`, NVIDIA/deepops#1186), `library/driver mismatch`
    # (yahoo/TensorFlowOnSpark#51), `Driver/library Version Mismatch` in a blog title
    words=(r"driver[/ _-]+library[ _-]+version[ _-]+mismatch|library[/ _-]+driver[ _-]+(version[ _-]+)?mismatch|"
           r"nvml.{0,40}version[ _-]+mismatch|"
           # the cause told without the message: user-space driver libraries upgraded, the old kernel module still
           # loaded (canonical/ubuntu-server-documentation#369's troubleshooting note)
           r"\b(userspace|user[- ]space) (drivers?|librar\w+)\b.{0,80}\bkernel module|"
           r"\bkernel module\b.{0,80}\b(userspace|user[- ]space) (drivers?|librar\w+)",
           r"nvidia-smi|nvml|reboot\w*|restart\w*|upgrad\w*|update\w*|\bapt\b|apt-get|kernel module|modprobe|rmmod"),
    lab="none: no NVIDIA driver in the lab")


VERSION_SKEW = Entry(
    "version-skew", "The nodes run different versions", FATAL,
    symptom="Ray refuses the worker (`Version mismatch`), or the ranks crash or produce garbage after one node was "
            "updated",
    detect="Ray's `Version mismatch: The cluster was started with ...` in a rank log",
    cause="the image, vLLM, Python or Ray differ between the nodes (one node pulled a newer tag or was rebuilt)",
    fix="compare image digests and vLLM/NCCL/driver versions on every node before the start; pull the same digest "
        "everywhere",
    proof="docker image inspect --format '{{{{.Id}}}}' <image>; python3 -c 'import vllm; print(vllm.__version__)'   # on every node",
    signature=None,
    source="bringup-anchors §5.14 (eugr verify_cluster_image_consistency)",
    lines=(r"Version mismatch: The cluster was started with",),
    words=(r"version (mismatch|skew)|(different|mismatched) ([\w.-]+ ){0,2}(versions?|images?|builds?|digests?)",
           r"head|worker|node|both (nodes|sparks)", r"\bray\b|vllm|nccl|image|driver|python"),
    lab="none yet: a worker with a different image tag (issue 25 item 4)")
