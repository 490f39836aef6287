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
    rows = _rows(_facts(meminfo, smi=smi, image_env=env, modprobe=modprobe), load_profile(ENV / "exl3-v41.env"))
    assert {n for n, r in rows.items() if r.status is Status.FAIL} == failed
    assert {n for n, r in rows.items() if r.status is Status.WARN} == warned
    assert all(r.status is not Status.NA for r in rows.values())
    for r in rows.values():
        if r.status in (Status.FAIL, Status.WARN):
            assert r.fix
