"""Space the start-up needs and did not get: a full disk (the HF cache, the container's temp dir, Ray's session
dir, docker's data root while extracting an image layer) and NCCL's /dev/shm segments in a container whose
/dev/shm is docker's 64 MiB default. Each signature extracts the path (which disk) for the fix."""
from __future__ import annotations

from .entry import FATAL, Entry, either, extracting

#: NCCL's shared-memory transport could not create or grow its segment under /dev/shm
#: (NVIDIA/nccl src/misc/shmutils.cc ncclShmOpen, POSIX branch: WARN "Error: failed to extend %s to %ld bytes, error:
#: %s (%d)" after fallocate, and at its fail: label "Error while %s shared memory segment %s (size %ld)"; NCCL's log
#: prints the line itself, e.g. misc/shmutils.cc:112 / :132; NCCL < 2.12: src/include/shm.h:28 / :48 "Call to
#: posix_fallocate failed")
_SHM = (r"Error while (?:creating|attaching to) shared memory segment (?P<path>\S+) \(size (?P<bytes>\d+)\)",
        r"failed to extend (?P<path>/dev/shm/\S+) to (?P<bytes>\d+) bytes",
        r"NCCL WARN Call to posix_fallocate failed ?: No space left on device")

NCCL_SHM_TOO_SMALL = Entry(
    "nccl-shm-too-small", "NCCL cannot create its shared-memory segment (/dev/shm too small)", FATAL,
    symptom="NCCL init fails at once with `Error while creating shared memory segment /dev/shm/nccl-... (size N)`",
    detect="NCCL's `Error while creating shared memory segment <path> (size N)` / `failed to extend <path> to N "
           "bytes` / `Call to posix_fallocate failed: No space left on device` in a rank log; the segment path "
           "and size are extracted",
    cause="the rank runs in a container whose /dev/shm is docker's default 64 MiB (or is full of stale nccl-* "
          "segments), and NCCL's shared-memory transport needs more than is left for its segments",
    fix="NCCL could not get {bytes} bytes for {path}: start the rank container with `--ipc=host` or "
        "`--shm-size=16g` (df -h /dev/shm inside it shows the size); "
        "remove stale /dev/shm/nccl-* files of dead runs; NCCL_SHM_DISABLE=1 only as a slower stopgap",
    proof="docker exec <rank container> df -h /dev/shm; ls -la /dev/shm | grep nccl",
    signature=extracting(*_SHM),
    source="NVIDIA/nccl src/misc/shmutils.cc ncclShmOpen (fallocate WARN and the fail: WARN; the log's own "
           "misc/shmutils.cc:112/:132), src/include/shm.h:28,48 before 2.12; symptoms: shmutils.cc:96 and shm.h:22 "
           "@ v2.7.8-1 (the segment's MAP_SHARED mmap), src/init.cc:2687 @ v2.28.9-1 (ncclSystemError's text); "
           "report vllm-project/vllm#1710; words need NCCL named (docker-library/postgres#416, heldout-8's "
           "fz8-neg-04, is Postgres's /dev/shm)",
    # symptoms (never high): a SIGBUS under NCCL frames is a touch of a /dev/shm page tmpfs cannot back (mmap(2));
    # a bare `unhandled system error` (ncclSystemError: a system call failed) with no NCCL WARN naming the call is,
    # in a container, most often the same 64 MiB /dev/shm
    symptoms=(r"(?:Bus error|signal 7\b|SIGBUS)[^\n]*(?:\n[^\n]*){0,12}?(?:\bnccl\w*|libnccl)",
              r"\bnccl\w*[^\n]{0,80}(?:Bus error|SIGBUS)",
              # no WARN naming the failed call, in NCCL's current (`NCCL WARN`) or older (`file.cu:N WARN`) format
              r"\A(?![\s\S]*(?:NCCL WARN|\.(?:cc|cu|h|c|cpp):\d+ WARN))[\s\S]*?"
              r"(?P<at>\bNCCL (?:Error 2|failure [^\n]*)\W+unhandled system error)"),
    # NCCL must be named: /dev/shm in a container is also Postgres's, torch's DataLoader's or a TP server's
    # without NCCL (container-shm-too-small; fz8-neg-04, docker-library/postgres#416, is off-domain)
    words=(r"^(?=.*\bnccl).*?(/dev/shm|shm[- _]size|shared memory segment|--ipc|ncclshmopen)",
           r"nccl|docker|container|no space|64 ?mi?b",),
    lab="none yet: a lab rank container started with --shm-size=64m and NCCL's shm transport would produce it "
        "(the lab's CPU ranks use gloo)")

#: a write that hit ENOSPC, with the path that names the disk; not /dev/shm (the entry above)
_DISK = ((r"failed to register layer: (?:[^\n]*?)no space left on device", {"path": "/var/lib/docker"}),   # first: the
         # path it writes is inside the image, the disk is docker's data root
         r"(?:write|mkdir|open|create|copy|rename) (?P<path>/(?!dev/shm)[^\s:]+): no space left on device",
         r"\[Errno 28\] No space left on device: '(?P<path>/(?!dev/shm)[^']+)'",
         r"target location (?P<path>/\S+) only has (?P<free_mb>[\d.]+) MB free disk space",
         r"(?P<path>/tmp/ray\S*) is over (?P<percent>\d+)% full")

#: ENOSPC with no path (Python's OSError without a filename; a Rust tool: std::io::Error's Display is "{detail} (os
#: error {code})"): which filesystem is full is not printed. Beside /dev/shm or the container's shared memory (a
#: tmpfs, docker's 64 MiB default) it is that mount (container-shm-too-small, nccl-shm-too-small), not a disk
_DISK_BARE = ((r"\[Errno 28\] No space left on device(?!: ')", {"path": "the written path"}),
              (r"No space left on device \(os error 28\)", {"path": "the written path"}))
_SHM_CONTEXT = r"/dev/shm|shared memory|\bshm[-_ ]size|--ipc[= ]host"

DISK_FULL = Entry(
    "disk-full", "A disk filled up during the pull or the start", FATAL,
    symptom="a pull or a start stops with `no space left on device` (or `[Errno 28]`), `failed to register layer`, "
            "huggingface_hub's `Not enough free disk space`, or Ray's `... is over 95% full`",
    detect="an ENOSPC message with its path: docker's `failed to register layer: ... write <path>: no space left "
           "on device` while extracting a layer, Python's `[Errno 28] No space left on device: '<path>'`, "
           "huggingface_hub's `target location <path> only has N MB free disk space`, Ray's "
           "`<session dir> is over N% full`; the path is extracted",
    cause="the filesystem is full: docker's data root while extracting an image layer (the layer "
          "was downloaded: retrying the pull never helps), the Hugging Face cache, the container's /tmp, or Ray's "
          "session directory",
    fix="free space on the filesystem that holds {path} (`df -h {path}`): `docker system prune` / a larger "
        "docker data-root for image layers, `huggingface-cli delete-cache` or HF_HOME on a bigger disk for the "
        "weights, Ray's `--temp-dir` on a bigger disk; then pull or start again",
    proof="df -h {path}; df -h /var/lib/docker ~/.cache/huggingface /tmp",
    signature=either(extracting(*_DISK), extracting(*_DISK_BARE, unless=_SHM_CONTEXT)),
    source="moby/moby distribution/xfer/download.go (`failed to register layer: %v`); huggingface_hub "
           "file_download.py:774-776 @ 2.4.0 (_check_disk_space); ray src/ray/common/file_system_monitor.cc; "
           "rust-lang/rust library/std/src/io/error.rs (impl Display for Error: `{detail} (os error {code})`; "
           "the function read, no line pinned); "
           "reports moby/moby#32811, NVIDIA-NeMo/Speech#1029, sickcodes/Docker-OSX#314",
    # the anchor never holds where the prose names /dev/shm or the container's shared memory: the full device is
    # that tmpfs (fz8-shm-01, NVIDIA/Megatron-LM#878)
    words=(r"^(?!.*(/dev/shm|shared memory|\bshm[-_ ]size|--ipc[= ]host)).*?(disk (is |was |got )?(full|filled)|out of disk|"
           r"fail\w* to register (the )?layer|errno 28|free disk space|"
           r"no space left on device.{0,80}(disk|\bdf\b|partition|volume|layer|cache|/tmp|/var)|"
           r"(disk|partition|volume|cache|/tmp|/var).{0,80}no space left)",
           r"unexpected eof|extract\w*|df -h|write /|docker|pull\w*|huggingface|hf cache|/tmp|ray|layer",
           r"\d+(\.\d+)? ?[gt]i?b\b"),
    lab="none yet: a full tmpfs as the container's temp dir on the lab would produce it")
