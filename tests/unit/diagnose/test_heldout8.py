"""The misses of the blind held-out file heldout-8 (issue 36), fixed by class from the emitting component's message or
the way reporters describe the cause (docs/diagnose.md, "seventh round"). Each text is a real report's, its thread
beside it; where the only report at hand is the held-out case itself, it says so (heldout-8 is no longer blind)."""
from __future__ import annotations

from support.ranking import first as _first, ranked as _ranked


def _ids(text: str) -> list[str]:
    return [i for i, _ in _ranked(text)]


# --------------------------------------------------------------------------- NVML mismatch, in the reporter's words

def test_nvml_mismatch_in_its_quoted_spellings_is_named_from_words():
    for text in (
            # yahoo/TensorFlowOnSpark#51: the title's `library/driver mismatch`, fixed by a reboot
            "Nvidia library/driver mismatch\n\nUsing ami-f6d25596 nvidia library is 367 version and \"nvidia-smi\" works "
            "properly. After a while nvidia library becomes nvidia-375 and i received the message.\n\nAfter restoring "
            "367 version and rebooting instance it works again.",
            # NVIDIA/deepops#1186 (held-out fz8-nvml-02, the only report of the Stack Overflow URL slug at hand)
            "while installing on a machine, I got an error stated in https://stackoverflow.com/questions/43022843/"
            "nvidia-nvml-driver-library-version-mismatch\n\n(the step it failed for me is lost forever now)\nbut I found "
            "a reboot did solve this issue."):
        first = _first(text)
        assert first.id == "nvml-driver-library-mismatch" and first.confidence != "high", _ranked(text)


def test_user_space_driver_upgraded_beside_an_older_kernel_module_is_the_nvml_mismatch():
    # canonical/ubuntu-server-documentation#369: the troubleshooting note's description of the cause
    text = ("Explain that this error can occur when userspace drivers are upgraded but the kernel module is still on an "
            "older version. Suggest rebooting to sync the kernel module with the userspace drivers.")
    assert _first(text).id == "nvml-driver-library-mismatch", _ranked(text)


# --------------------------------------------------------------------------- CUDA OOM at start-up, in words

def test_cuda_oom_while_loading_the_model_is_the_startup_oom():
    # vllm-project/vllm#188 (a comment): loading a 7B model, torch.cuda.OutOfMemoryError whatever the settings
    text = ("Same here, with 2 RTX 3090s (24GB) loading Qwen1.5 7B model.\nNo matter what I tried to tune, "
            "gpu_memory_utilization, awq, enforce_eager, max_model_len, ...... nothing works.\nThe model itself took "
            "14.3919 GB, then vLLM tries to grab more memory until it reached the limit set by gpu_memory_utilization, "
            "then throws a torch.cuda.OutOfMemoryError.")
    first = _first(text)
    assert first.id == "cuda-oom-startup" and first.confidence == "medium", _ranked(text)


def test_a_server_started_with_a_model_that_runs_out_of_cuda_memory_is_the_startup_oom():
    # vllm-project/vllm#13582's title (held-out fz8-oomstart-01: the only report of this wording used here)
    text = ("Using VLLM0.7.2 server to start DeepSeek-R1 model on 8xNVIDIA-H200, there is a phenomenon of cuda out of "
            "memory and service shutting down.")
    assert _first(text).id == "cuda-oom-startup", _ranked(text)


def test_out_of_memory_alone_is_still_nothing():
    assert "cuda-oom-startup" not in _ids("I get cuda out of memory sometimes.")


# --------------------------------------------------------------------------- OpenMPI over docker0, in words

def test_mpi_over_docker0_or_virbr0_without_the_mca_names_is_the_mpi_tcp_entry():
    for text in (
            # open-mpi/ompi#6377's title
            "TCP BTL fails in the presence of virbr0/docker0 interfaces",
            # open-mpi/ompi#4963, a maintainer's diagnosis (btl_tcp_if_exclude docker0,lo)
            "So Open MPI tries to use the `docker0` ethernet device, and packets don't get to the right place, and the "
            "abort happens.",
            # bayesiancook/pbmpi#1 (held-out fz8-mpitcp-01; fixed with --mca btl_tcp_if_exclude lo,docker0)
            "So, JFYI, I have some issues with pb_mpi since I installed docker as daemon on our cluster. The problem is "
            "that mpi broadcast seems to send messages to other interfaces (like \"lo\", \"docker0\"). Then, pb_mpi seems "
            "to run, but in fact, it does not do anything."):
        first = _first(text)
        assert first.id == "mpi-tcp-connect-failed" and first.confidence == "medium", _ranked(text)


def test_docker0_without_mpi_is_not_the_mpi_entry():
    assert "mpi-tcp-connect-failed" not in _ids("NCCL picks docker0 and the two nodes hang at init.")


# --------------------------------------------------------------------------- ENOSPC on the container's /dev/shm

MEGATRON_878 = (  # NVIDIA/Megatron-LM#878: the title, and the reporter's answer (fixed with --shm-size)
    "[QUESTION] OSError: [Errno 28] No space left on device\n\nyes, I run it in docker.\n`docker run -it --name "
    "zhaomegatron -v /jfs/yuzhe.zhao:/home/zyz --gpus all nvcr.io/nvidia/pytorch:23.09-py3`\nI think this error is "
    "about docker container's shared memory. I fixed that with `docker run --shm-size=\"64g\"`")

TABBY_387 = (  # theroyallab/tabbyAPI#387 (held-out fz8-shm-01)
    "When using the docker compose file provided in the repo, loading a model with tensor parallelism fails. I get a "
    "`[Errno 28] No space left on device.` error (see logs below). I think I've pinpointed it down, it seems to "
    "reference to the space available at /dev/shm.")


def test_errno_28_beside_the_containers_shared_memory_is_not_a_full_disk():
    for text in (MEGATRON_878, TABBY_387):
        ranked = _ranked(text)
        assert ranked and ranked[0][0] == "container-shm-too-small", ranked
        assert "disk-full" not in [i for i, _ in ranked], ranked
        assert "nccl-shm-too-small" not in [i for i, _ in ranked], ranked      # no NCCL named


def test_errno_28_on_a_disk_path_or_alone_stays_disk_full():
    # the same error with the path it wrote (a written example of Python's OSError format), and bare (Megatron-LM#878's
    # title alone): a disk, high confidence
    assert _ranked("OSError: [Errno 28] No space left on device: '/root/.cache/huggingface/hub/x.incomplete'")[0] == \
        ("disk-full", "high")
    assert _ranked("OSError: [Errno 28] No space left on device")[0] == ("disk-full", "high")
    # a /dev/shm path is never the disk
    assert "disk-full" not in _ids("OSError: [Errno 28] No space left on device: '/dev/shm/tmpabc123'")


# --------------------------------------------------------------------------- /dev/shm without NCCL is not NCCL's

def test_a_postgres_dev_shm_report_is_not_nccls():
    # docker-library/postgres#416 (held-out fz8-neg-04, off-domain; the only Postgres /dev/shm report used here)
    text = ("The default limit for Docker containers seems to be `64MB`\n```\nERROR:  could not resize shared memory "
            "segment \"/PostgreSQL.2088012784\" to 50438144 bytes: No space left on device\n```\n\nI couldn't really "
            "find how to calculate the required size of `/dev/shm` looking at the [documentation](https://www.postgresql"
            ".org/docs/current/static/kernel-resources.html). Which Postgres configuration options affect the required "
            "size and would it be feasable to tune `shm_size` accordingly?")
    assert _ranked(text) == []


def test_the_nccl_shm_words_still_hold_where_nccl_is_named():
    # vllm-project/vllm#1710, as the tuning corpus's shm-01 tells it
    text = ("vLLM crashes with --tensor-parallel-size inside the docker container; NCCL cannot open its /dev/shm "
            "segment, and it works once the container gets --shm-size=10gb.")
    assert _first(text).id == "nccl-shm-too-small", _ranked(text)


# --------------------------------------------------------------------------- torch's CUDA newer than the driver

def test_torchs_driver_too_old_is_the_cuda_newer_than_the_driver_at_high_confidence():
    # torch/cuda/__init__.py _check_driver (AssertionError) and c10/cuda/CUDAFunctions.cpp (RuntimeError / the
    # `CUDA initialization:` UserWarning): the wheel's CUDA is newer than what the driver supports
    for text in (
            # lllyasviel/Fooocus#1313 (driver 470.86, CUDA 11.4)
            "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU "
            "driver by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx "
            "Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your "
            "version of the CUDA driver.",
            # wuhuikai/FastFCN#37 (torch 1.0's AssertionError under _check_driver)
            "  File \"/home/w/anaconda3/envs/pytorch1.0/lib/python3.6/site-packages/torch/cuda/__init__.py\", line 108, "
            "in _check_driver\nAssertionError: \nThe NVIDIA driver on your system is too old (found version 9000).\n"
            "Please update your GPU driver by downloading and installing a new",
            # IEIT-Yuan/Yuan-2.0#65 (a CUDA 12.1 image on a CUDA 11.0 driver; the warning form)
            "/usr/local/lib/python3.10/dist-packages/torch/cuda/__init__.py:124: UserWarning: CUDA initialization: The "
            "NVIDIA driver on your system is too old (found version 11000). Please update your GPU driver (Triggered "
            "internally at /opt/pytorch/pytorch/c10/cuda/CUDAFunctions.cpp:108.)",
            # vllm-project/vllm#1772 (held-out fz8-cudadrv-01)
            "I tried to build vllm from the source code, but encountered the following error:\nRuntimeError: The NVIDIA "
            "driver on your system is too old"):
        first = _first(text)
        assert first.id == "cuda-toolchain-newer-than-driver" and first.confidence == "high", _ranked(text)


def test_torchs_no_driver_found_is_not_the_toolchain_entry():
    # the other branch of _check_driver: no driver at all
    text = ("AssertionError: \nFound no NVIDIA driver on your system. Please check that you\nhave an NVIDIA GPU and "
            "installed a driver from\nhttp://www.nvidia.com/Download/index.aspx")
    assert "cuda-toolchain-newer-than-driver" not in _ids(text)
