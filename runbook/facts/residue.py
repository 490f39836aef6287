"""Kernel, driver and image residue that breaks a bring-up before it starts (pure parsers and the read-only
commands that feed them): the kernel's CMA pool, an ``/etc/nccl.conf`` baked into the image, the image's
CUDA against what the driver supports, and nvidia module options left in ``/etc/modprobe.d``.

Each comes from a field report (docs/diagnose.md, entries ``cma-total-zero``, ``image-nccl-conf-residue``,
``cuda-toolchain-newer-than-driver``, ``modprobe-memory-cap``); preflight turns them into rows.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

#: the driver's header: driver version and the highest CUDA it supports
NVIDIA_SMI_CMD = "nvidia-smi 2>&1 | head -n 6"
#: nvidia module options and override files, wherever modprobe reads them
MODPROBE_CMD = ("grep -rsHE '^[[:space:]]*options[[:space:]]+nvidia' /etc/modprobe.d /run/modprobe.d "
                "/usr/lib/modprobe.d /lib/modprobe.d 2>/dev/null; "
                "ls -1 /etc/modprobe.d 2>/dev/null | grep -i nvidia | sed 's|^|file: /etc/modprobe.d/|'; true")
#: the files NCCL reads its defaults from on the host (process runtime)
HOST_NCCL_CONF_CMD = 'for f in /etc/nccl.conf "$HOME/.nccl.conf"; do [ -r "$f" ] && { echo "## $f"; cat "$f"; }; done; true'

#: settings in a leftover nccl.conf that froze NCCL's warm-up (luxingcom/aicad-nccl-optimization#1)
RISKY_NCCL_CONF = {"NCCL_IB_USE_INLINE": "1", "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS": "1"}


def image_env_cmd(image: str) -> str:
    """The image's environment, one ``KEY=VALUE`` a line (``CUDA_VERSION=13.0.2.006`` in NGC images)."""
    return f"docker image inspect --format '{{{{range .Config.Env}}}}{{{{println .}}}}{{{{end}}}}' {shlex.quote(image)}"


def image_nccl_conf_cmd(image: str) -> str:
    """``/etc/nccl.conf`` inside the image (a throw-away container with no network; prints nothing when absent)."""
    return (f"docker run --rm --network none --entrypoint cat {shlex.quote(image)} /etc/nccl.conf 2>/dev/null; true")


def cma_total_kb(meminfo: dict[str, int]) -> int | None:
    """``CmaTotal`` in kB from :func:`runbook.facts.system.parse_meminfo` (bytes), None when the kernel does
    not report it."""
    v = meminfo.get("CmaTotal")
    return None if v is None else v // 1024


def parse_nccl_conf(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of an nccl.conf (comments, ``## file`` headers and blank lines skipped; the last
    assignment wins, as NCCL reads it)."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.*?)\s*$", line)
        if m:
            out[m.group(1)] = m.group(2).strip("'\"")
    return out


def risky_nccl_settings(conf: dict[str, str]) -> list[str]:
    """The settings of :data:`RISKY_NCCL_CONF` that the file turns on."""
    return [f"{k}={conf[k]}" for k, bad in RISKY_NCCL_CONF.items() if conf.get(k, "").strip() == bad]


@dataclass(frozen=True)
class DriverInfo:
    driver: str | None          # "580.173.02"
    cuda: str | None            # the highest CUDA the driver supports, "13.0"


def parse_nvidia_smi_header(text: str) -> DriverInfo:
    """Driver version and supported CUDA from ``nvidia-smi``'s header. Sample (ctransformers#87)::

        | NVIDIA-SMI 525.125.06   Driver Version: 525.125.06   CUDA Version: 12.0     |
    """
    drv = re.search(r"Driver Version:\s*([\d.]+)", text or "")
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text or "")
    return DriverInfo(drv.group(1) if drv else None, cuda.group(1) if cuda else None)


def parse_image_cuda(env_text: str) -> str | None:
    """The image's CUDA from its environment: ``CUDA_VERSION`` (``13.0.2.006`` in NGC images, ``13.0.1`` in
    nvidia/cuda), else ``NV_CUDA_CUDART_VERSION``; None when the image says nothing."""
    env = {}
    for line in (env_text or "").splitlines():
        k, sep, v = line.strip().partition("=")
        if sep:
            env[k] = v
    for key in ("CUDA_VERSION", "NV_CUDA_CUDART_VERSION"):
        if re.match(r"^\d+\.\d+", env.get(key, "")):
            return env[key]
    return None


def cuda_major_minor(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def driver_supports(driver_cuda: str | None, image_cuda: str | None) -> bool | None:
    """True when the driver's CUDA (major.minor) is at least the image's; None when either is unknown.
    (A driver runs a newer minor of the same major only through forward compatibility, which GB10 does not
    offer; CUDA error 222 / 'driver version is insufficient' is what a newer image gets.)"""
    d, i = cuda_major_minor(driver_cuda), cuda_major_minor(image_cuda)
    if d is None or i is None:
        return None
    return d >= i


@dataclass(frozen=True)
class ModprobeOption:
    file: str
    line: str               # "options nvidia NVreg_..." (or "" for an nvidia file with no options line)


def parse_modprobe_nvidia(text: str) -> list[ModprobeOption]:
    """nvidia module options and nvidia-named override files from :data:`MODPROBE_CMD`'s output::

        /etc/modprobe.d/zz-nvidia-drm-override.conf:options nvidia-drm modeset=1
        file: /etc/modprobe.d/zz-nvidia-drm-override.conf
    """
    out: list[ModprobeOption] = []
    files_with_options: set[str] = set()
    for line in (text or "").splitlines():
        line = line.strip()
        if line.startswith("file: "):
            continue
        path, sep, rest = line.partition(":")
        if sep and re.match(r"^\s*options\s+nvidia", rest):
            out.append(ModprobeOption(path, rest.strip()))
            files_with_options.add(path)
    for line in (text or "").splitlines():
        if line.startswith("file: "):
            path = line[len("file: "):].strip()
            if path not in files_with_options:
                out.append(ModprobeOption(path, ""))
    return out


# -- runtime kernel builds (JIT) at first boot ------------------------------------------------------------
#: FlashInfer's JIT (flashinfer/jit/cpp_ext.py ``_get_num_workers`` @ 048e35c) runs ``ninja -j $MAX_JOBS`` and
#: otherwise ninja's default; torch's cpp_extension reads MAX_JOBS too. Each nvcc runs FLASHINFER_NVCC_THREADS
#: threads (default 1). Unset on a 20-core GB10 that is ninja's 22 parallel compiles on every rank at once: the
#: wedge of field report 6 (tonyd2wild README fix 2: "22 parallel jobs ... MAX_JOBS=2" plus prebuilt kernels).
JIT_JOB_KEYS = ("MAX_JOBS", "FLASHINFER_NVCC_THREADS")
#: the parallel compiles per rank a preflight accepts: the field fix ran 2; 4 still leaves room on a node whose
#: weights are already loaded (a judgment, not a measured limit; docs/diagnose.md jit-build-memory-wedge)
JIT_JOBS_LIMIT = 4
#: the node's CPU count and the build-job settings a process-runtime rank inherits from the SSH session
JIT_ENV_CMD = ('echo "nproc $(nproc 2>/dev/null)"; env 2>/dev/null | grep -E "^(' + "|".join(JIT_JOB_KEYS)
               + ')=" ; true')


def parse_env_lines(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (an image's ``Config.Env``, ``env``'s output) -> dict; other lines skipped."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        k, sep, v = line.strip().partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            out[k] = v
    return out


def parse_nproc(text: str) -> int | None:
    """``nproc N`` from :data:`JIT_ENV_CMD`'s first line."""
    m = re.search(r"^nproc (\d+)\s*$", text or "", re.MULTILINE)
    return int(m.group(1)) if m else None


def ninja_default_jobs(nproc: int | None) -> int | None:
    """ninja's ``-j`` default (``GuessParallelism``): 2 for one CPU, 3 for two, else CPUs + 2."""
    if not nproc:
        return None
    return 2 if nproc <= 1 else 3 if nproc == 2 else nproc + 2


@dataclass(frozen=True)
class JitJobs:
    jobs: int | None            # parallel compiler processes per rank (None: unknown)
    threads: int                # threads per nvcc (FLASHINFER_NVCC_THREADS)
    source: str                 # where MAX_JOBS came from, or "ninja's default for N CPUs"
    capped: bool                # MAX_JOBS was set

    @property
    def parallel(self) -> int | None:
        return None if self.jobs is None else self.jobs * self.threads


def jit_jobs(envs: list[tuple[str, dict[str, str]]], nproc: int | None) -> JitJobs:
    """The parallel kernel compiles one rank's JIT would run, from the environments it inherits in order (a later
    one wins, as ``docker run -e`` wins over the image's ``ENV``)."""
    merged: dict[str, str] = {}
    where: dict[str, str] = {}
    for label, env in envs:
        for k in JIT_JOB_KEYS:
            if k in env:
                merged[k], where[k] = env[k].strip(), label
    threads = int(merged["FLASHINFER_NVCC_THREADS"]) if merged.get("FLASHINFER_NVCC_THREADS", "").isdigit() \
        and int(merged["FLASHINFER_NVCC_THREADS"]) >= 1 else 1
    if merged.get("MAX_JOBS", "").isdigit():                      # FlashInfer ignores a non-digit value
        return JitJobs(int(merged["MAX_JOBS"]), threads, f"MAX_JOBS={merged['MAX_JOBS']} ({where['MAX_JOBS']})", True)
    return JitJobs(ninja_default_jobs(nproc), threads, f"ninja's default for {nproc or '?'} CPUs (MAX_JOBS unset)",
                   False)
