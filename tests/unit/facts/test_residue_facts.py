"""Residue parsers (runbook/facts/residue.py) on captured or published outputs, and the preflight rows they
feed (runbook/preflight/verify.residue_checks): N/A on the lab where the profile does not use what they break.

Samples: this machine's /proc/meminfo (a kernel that reports no CmaTotal); nvidia-smi headers as printed in
ctransformers#87 and weiyithu/SurroundOcc#121; image environments as NGC (``CUDA_VERSION=13.0.2.006``) and
nvidia/cuda (``CUDA_VERSION=13.0.1``) Dockerfiles set them; the nccl.conf of luxingcom/aicad-nccl-optimization#1.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from runbook.checks import Status
from runbook.facts import residue, system
from runbook.preflight import verify
from runbook.profile import load_profile

ENV = Path(__file__).resolve().parents[3] / "env"

SMI_CTRANSFORMERS = "| NVIDIA-SMI 525.125.06   Driver Version: 525.125.06   CUDA Version: 12.0     |\n"
SMI_SPARK = ("+-----------------------------------------------------------------------------------------+\n"
             "| NVIDIA-SMI 580.173.02             Driver Version: 580.173.02     CUDA Version: 13.0     |\n")
NGC_ENV = "PATH=/usr/local/bin:/usr/bin\nCUDA_VERSION=13.0.2.006\nCUDA_DRIVER_VERSION=580.95.05\nNVVM_VERSION=13.0.88\n"
NVCUDA_ENV = "NVARCH=sbsa\nNV_CUDA_CUDART_VERSION=13.0.96-1\nCUDA_VERSION=13.0.1\n"
LEFTOVER_CONF = "# shipped with the base image\nNCCL_IB_USE_INLINE=1\nNCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS=1\nNCCL_DEBUG=WARN\n"
MEMINFO_CMA0 = "MemTotal:       127601344 kB\nMemAvailable:   121309876 kB\nCmaTotal:              0 kB\nCmaFree:               0 kB\n"
MEMINFO_CMA = "MemTotal:       127601344 kB\nMemAvailable:   121309876 kB\nCmaTotal:         131072 kB\n"


def test_cma_from_this_machine_and_from_the_report():
    here = system.parse_meminfo(subprocess.run(["cat", "/proc/meminfo"], capture_output=True, text=True).stdout)
    assert here.get("MemTotal"), "this machine's meminfo parsed"
    assert residue.cma_total_kb(here) == (here["CmaTotal"] // 1024 if "CmaTotal" in here else None)
    assert residue.cma_total_kb(system.parse_meminfo(MEMINFO_CMA0)) == 0
    assert residue.cma_total_kb(system.parse_meminfo(MEMINFO_CMA)) == 131072


def test_nccl_conf_leftover_is_found_and_comments_are_not_settings():
    conf = residue.parse_nccl_conf("## /etc/nccl.conf\n" + LEFTOVER_CONF + "# NCCL_IB_USE_INLINE=1\n")
    assert conf == {"NCCL_IB_USE_INLINE": "1", "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS": "1", "NCCL_DEBUG": "WARN"}
    assert residue.risky_nccl_settings(conf) == ["NCCL_IB_USE_INLINE=1", "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS=1"]
    assert residue.risky_nccl_settings(residue.parse_nccl_conf("NCCL_IB_USE_INLINE=0\nNCCL_DEBUG=INFO\n")) == []
    assert residue.parse_nccl_conf("") == {}


def test_driver_header_and_image_cuda():
    assert residue.parse_nvidia_smi_header(SMI_CTRANSFORMERS) == residue.DriverInfo("525.125.06", "12.0")
    assert residue.parse_nvidia_smi_header(SMI_SPARK) == residue.DriverInfo("580.173.02", "13.0")
    assert residue.parse_nvidia_smi_header("nvidia-smi: command not found") == residue.DriverInfo(None, None)
    assert residue.parse_image_cuda(NGC_ENV) == "13.0.2.006"
    assert residue.parse_image_cuda(NVCUDA_ENV) == "13.0.1"
    assert residue.parse_image_cuda("PATH=/bin\n") is None
    assert residue.driver_supports("13.0", "13.0.2.006") is True
    assert residue.driver_supports("12.0", "12.2") is False            # the CUDA-error-222 case
    assert residue.driver_supports("13.0", "12.8.0") is True
    assert residue.driver_supports(None, "13.0") is None


def test_modprobe_options_and_override_files():
    text = ("/etc/modprobe.d/zz-nvidia-drm-override.conf:options nvidia-drm modeset=1 fbdev=1\n"
            "/etc/modprobe.d/nvidia-graphics-drivers-kms.conf:options nvidia-drm modeset=1\n"
            "file: /etc/modprobe.d/zz-nvidia-drm-override.conf\n"
            "file: /etc/modprobe.d/nvidia-extra.conf\n")
    got = residue.parse_modprobe_nvidia(text)
    assert [(o.file.rsplit("/", 1)[1], o.line) for o in got] == [
        ("zz-nvidia-drm-override.conf", "options nvidia-drm modeset=1 fbdev=1"),
        ("nvidia-graphics-drivers-kms.conf", "options nvidia-drm modeset=1"),
        ("nvidia-extra.conf", "")]
    here = subprocess.run(["bash", "-c", residue.MODPROBE_CMD], capture_output=True, text=True, timeout=20)
    assert here.returncode == 0
    assert all(o.file.startswith(("/etc/", "/run/", "/usr/lib/", "/lib/")) for o in residue.parse_modprobe_nvidia(here.stdout))


def _facts(meminfo: str, **residue_texts) -> dict:
    r = {"modprobe": "", "smi": "", "image_env": "", "nccl_conf": "", "nccl_conf_where": "/etc/nccl.conf in img"}
    r.update(residue_texts)
    return {"mem": system.parse_meminfo(meminfo), "residue": r}


def _rows(facts, profile) -> dict[str, object]:
    rows = verify.residue_checks("head", facts, profile)
    assert rows
    return {r.name: r for r in rows}


def test_preflight_rows_on_the_lab_are_na_where_they_do_not_apply():
    rows = _rows(_facts(MEMINFO_CMA0), load_profile(ENV / "lab.env"))
    assert rows["kernel CMA pool"].status is Status.NA and "CmaTotal 0 kB" in rows["kernel CMA pool"].observed
    assert rows["driver supports the image's CUDA"].status is Status.NA
    assert rows["no nvidia modprobe overrides"].status is Status.NA
    assert rows["no NCCL residue in nccl.conf"].status is Status.PASS       # read on every profile
    bad = _rows(_facts(MEMINFO_CMA0, nccl_conf=LEFTOVER_CONF), load_profile(ENV / "lab.env"))
    assert bad["no NCCL residue in nccl.conf"].failed and "NCCL_IB_USE_INLINE=1" in bad["no NCCL residue in nccl.conf"].observed


@pytest.mark.parametrize("meminfo,smi,env,modprobe,failed,warned", [
    (MEMINFO_CMA, SMI_SPARK, NGC_ENV, "", set(), set()),
    (MEMINFO_CMA0, SMI_SPARK, NGC_ENV, "", {"kernel CMA pool"}, set()),
    (MEMINFO_CMA, SMI_CTRANSFORMERS, NVCUDA_ENV, "", {"driver supports the image's CUDA"}, set()),
    (MEMINFO_CMA, "", NGC_ENV, "", set(), {"driver supports the image's CUDA"}),        # header unread: WARN
    (MEMINFO_CMA, SMI_SPARK, NGC_ENV, "/etc/modprobe.d/zz-nvidia-drm-override.conf:options nvidia-drm modeset=1",
     set(), {"no nvidia modprobe overrides"}),
    (MEMINFO_CMA, SMI_SPARK, NGC_ENV, "/etc/modprobe.d/nvidia-graphics-drivers-kms.conf:options nvidia-drm modeset=1",
     set(), set()),
])
def test_preflight_rows_on_a_spark_profile(meminfo, smi, env, modprobe, failed, warned):
    rows = _rows(_facts(meminfo, smi=smi, image_env=env + "MAX_JOBS=2\n", modprobe=modprobe, jit_env="nproc 20\n"),
                 load_profile(ENV / "exl3-v41.env"))
    assert {n for n, r in rows.items() if r.status is Status.FAIL} == failed
    assert {n for n, r in rows.items() if r.status is Status.WARN} == warned
    assert all(r.status is not Status.NA for r in rows.values())
    for r in rows.values():
        if r.status in (Status.FAIL, Status.WARN):
            assert r.fix


# --------------------------------------------------------------------------- JIT build jobs (field report 6)

def test_jit_jobs_follow_flashinfer_and_ninja():
    """FlashInfer's JIT runs `ninja -j $MAX_JOBS` when MAX_JOBS is digits (flashinfer/jit/cpp_ext.py
    _get_num_workers @ 048e35c), else ninja's default: CPUs + 2, the 22 compiles of the field report on a GB10."""
    assert residue.ninja_default_jobs(20) == 22 and residue.ninja_default_jobs(2) == 3
    assert residue.ninja_default_jobs(1) == 2 and residue.ninja_default_jobs(None) is None
    assert residue.parse_nproc("nproc 20\nMAX_JOBS=2\n") == 20 and residue.parse_nproc("nproc \n") is None
    unset = residue.jit_jobs([("image", {"PATH": "/bin"})], 20)
    assert (unset.parallel, unset.capped) == (22, False) and "ninja's default for 20 CPUs" in unset.source
    capped = residue.jit_jobs([("image", {"MAX_JOBS": "2"})], 20)
    assert (capped.parallel, capped.capped) == (2, True) and "MAX_JOBS=2 (image)" in capped.source
    # a later environment wins (docker run -e over the image's ENV); threads per nvcc multiply
    later = residue.jit_jobs([("image", {"MAX_JOBS": "2"}), ("rank", {"MAX_JOBS": "8",
                                                                      "FLASHINFER_NVCC_THREADS": "2"})], 20)
    assert later.parallel == 16 and "(rank)" in later.source
    assert residue.jit_jobs([("image", {"MAX_JOBS": "two"})], 20).parallel == 22      # ignored, as FlashInfer does
    assert residue.parse_env_lines("MAX_JOBS=2\nnproc 20\nnot a line\nA_B=x=y\n") == {"MAX_JOBS": "2", "A_B": "x=y"}


@pytest.mark.parametrize("name,r,status,said", [
    ("exl3-v41", {"image_env": NGC_ENV, "jit_env": "nproc 20\n"}, Status.WARN, "22 parallel compiles"),
    ("exl3-v41", {"image_env": NGC_ENV + "MAX_JOBS=2\n", "jit_env": "nproc 20\n"}, Status.PASS, "MAX_JOBS=2"),
    ("exl3-v41", {"image_env": NGC_ENV + "MAX_JOBS=6\n", "jit_env": "nproc 20\n"}, Status.WARN, "6 parallel"),
    ("exl3-v41", {"image_env": "", "jit_env": "nproc 20\n"}, Status.NA, "not on this node yet"),
    ("dspark-v4", {"image_env": NGC_ENV, "jit_env": "nproc 20\n"}, Status.WARN, "ninja's default"),
    ("lab", {"jit_env": ""}, Status.NA, "compiles no CUDA kernels"),
])
def test_jit_jobs_row(name, r, status, said):
    row = verify.jit_jobs_check("head", r, load_profile(ENV / f"{name}.env"))
    assert row.status is status and said in row.observed, row
    if status is Status.WARN:
        assert "MAX_JOBS=2" in row.fix and "prebuilt" in row.fix


def test_jit_jobs_row_process_runtime_reads_the_ssh_environment():
    # a stock vllm on GPU nodes without a recipe (a recipe's chain runs in its image only)
    profile = load_profile(ENV / "lab.env", {"LAB": "0", "EXPECT_GPU": "1", "RECIPE_REPO": "", "RECIPE_COMMIT": "",
                                             "RECIPE_DIR": ""})
    assert profile.runtime == "process"
    row = verify.jit_jobs_check("worker", {"image_env": "", "jit_env": "nproc 20\nMAX_JOBS=3\n"}, profile)
    assert row.status is Status.PASS and "worker's SSH environment" in row.observed
    bad = verify.jit_jobs_check("worker", {"image_env": "", "jit_env": "nproc 20\n"}, profile)
    assert bad.status is Status.WARN and "/etc/environment" in bad.fix


def test_jit_env_command_reads_this_machine():
    """The read runs as written: nproc and only the build-job keys of the environment."""
    out = subprocess.run(["bash", "-c", residue.JIT_ENV_CMD], capture_output=True, text=True, timeout=20,
                         env={"PATH": "/usr/bin:/bin", "MAX_JOBS": "2", "OTHER": "1"}).stdout
    assert residue.parse_nproc(out) and residue.parse_env_lines(out) == {"MAX_JOBS": "2"}
