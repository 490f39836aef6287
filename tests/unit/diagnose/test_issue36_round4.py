"""Issue 36, fourth round: the classes a blind measurement missed, each from the emitting component's source and
tested on a real report's text (its thread beside it). Every positive case here failed on the catalogue before this
round (run against 6ac262c: 21 of 21 failed); the negatives pass on both. The reporter's-words cases at the end are
sentences written for the test (plain descriptions of the classes above), not quoted reports."""
from __future__ import annotations

import pytest

from runbook.diagnose.catalogue import BY_ID
from runbook.diagnose.offline import diagnose_text
from support.ranking import first as _first


def _ranked(text: str):
    return diagnose_text(text)


# --------------------------------------------------------------------------- image built for another architecture

@pytest.mark.parametrize("text", [
    # BaptisteBdn/docker-selfhosted-apps#3 (an arm64 board, the amd64 image; runc <= 1.0's wording)
    "Both gotify and seafile logs inlude this error: \"standard_init_linux.go:228: exec user process caused: exec "
    "format error\"",
    # NVIDIA-AI-IOT/deepstream_360_d_smart_parking_application#19 (Jetson Nano, aarch64; the quoted form)
    "jetson nano,aarch64,in perception_docker run.sh,error info \"standard_init_linux.go:211: exec user process caused "
    "\"exec format error\"",
])
def test_runc_exec_format_error_is_the_image_architecture(text):
    top = _first(text)
    assert top.id == "image-arch-mismatch" and top.confidence == "high"


def test_containerd_no_match_for_platform_names_the_image():
    # containerd core/images/handlers.go LimitManifests (`no match for platform in manifest`), as kubelet reports it
    text = ('Failed to pull image "nginx:1.14.2": rpc error: code = NotFound desc = failed to pull and unpack image '
            '"docker.io/library/nginx:1.14.2": no match for platform in manifest: not found')
    top = _first(text)
    assert top.id == "image-arch-mismatch"
    assert any("image=docker.io/library/nginx:1.14.2" in l for l in top.lines), top.lines


# --------------------------------------------------------------------------- NVIDIA container toolkit

def test_the_toolkit_hooks_own_error_is_named_with_its_reason():
    # NVIDIA/nvidia-container-toolkit#556: the toolkit is installed; its hook says why it cannot set up the GPU
    text = ("docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
            "failed: unable to start container process: error during container init: error running hook #0: error "
            "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
            "nvidia-container-cli: initialization error: driver rpc error: failed to process request: unknown.")
    top = _first(text)
    assert top.id == "nvidia-container-toolkit-missing" and top.confidence == "high"
    assert "driver rpc error: failed to process request" in top.fix, top.fix
    assert "driver-not-loaded" not in [r.id for r in _ranked(text) if r.confidence == "high"]


def test_an_unresolvable_cdi_device_names_the_cdi_spec():
    # NVIDIA/nvidia-container-toolkit#146 (podman, CDI)
    text = "Error: error setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=all"
    top = _first(text)
    assert top.id == "nvidia-container-toolkit-missing"
    assert "nvidia-ctk cdi generate" in top.fix


def test_nvml_driver_errors_through_the_hook_are_the_drivers_and_never_high():
    # HonuRobotics/dockwater#10 (the reporter: "The problem was from my own system Nvidia driver"): NVML's answer
    # through the hook means /dev/nvidiactl could not be opened; a symptom of the driver, not a proof
    text = "stderr: nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown"
    ranked = _ranked(text)
    assert ranked[0].id == "driver-not-loaded" and ranked[0].confidence == "medium"
    assert not [r for r in ranked if r.confidence == "high"], [(r.id, r.confidence) for r in ranked]
    # docker's own message that no GPU driver is registered stays the toolkit's, first and high beside it
    both = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].\n' + text
    assert _first(both).id == "nvidia-container-toolkit-missing" and _first(both).confidence == "high"


# --------------------------------------------------------------------------- chat template (transformers' own text)

def test_transformers_chat_template_refusal_from_a_server_is_named():
    # jundot/omlx#2005: the server answers a chat request with transformers' refusal in an OpenAI-style error
    text = ('Error: {"error":{"message":"Chat template error: Cannot use chat template functions because '
            'tokenizer.chat_template is not set and no template argument was passed! For information about writing '
            'templates and setting the tokenizer.chat_template attribute, please see the documentation at '
            'https://huggingface.co/docs/transformers/main/en/chat_templating","type":"invalid_request_error",'
            '"param":null,"code":null}}')
    top = _first(text)
    assert top.id == "chat-template-missing" and top.confidence == "high"
    assert top.fix.startswith("the tokenizer has no chat template")


def test_transformers_chat_template_refusal_outside_a_server_stays_off_domain():
    # the tuning corpus's neg-err-08: the same refusal from any transformers user (a trainer, a notebook)
    text = ("ValueError: Cannot use chat template functions because tokenizer.chat_template is not set and no "
            "template argument was passed! For information about writing templates and setting the "
            "tokenizer.chat_template attribute, please see the documentation.")
    assert _ranked(text) == []


# --------------------------------------------------------------------------- CUDA OOM at start-up (vLLM's own text)

def test_vllms_own_sampler_warmup_oom_is_a_startup_oom():
    # vllm-project/vllm#17939
    text = ("(VllmWorker rank=1 pid=2445156) ERROR 05-10 16:00:15 [multiproc_executor.py:470] RuntimeError: CUDA out "
            "of memory occurred when warming up sampler with 256 dummy requests. Please try lowering `max_num_seqs` "
            "or `gpu_memory_utilization` when initializing the engine.")
    top = _first(text)
    assert top.id == "cuda-oom-startup" and top.confidence == "high"
    assert "MAX_NUM_SEQS" in top.fix


def test_a_bare_training_oom_stays_off_domain():
    # the tuning corpus's neg-err-03 and a reporter's sentence about training: not a server's start
    assert _ranked("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                   "capacity of 23.64 GiB of which 1.12 GiB is free.") == []
    assert _ranked("My fine-tuning script OOMs at the start of the second epoch on a single RTX 4090.") == []


# --------------------------------------------------------------------------- vLLM's start-up and API refusals

def test_vllms_placement_check_names_the_placement_group():
    # vllm-project/vllm#29265 (vllm/v1/executor/ray_utils.py:635 @ v0.32.0)
    text = ("(EngineCore_DP0 pid=504) ValueError: Current node has no GPU available. current_node_resource="
            "{'accelerator_type:T4': 1.0, 'memory': 188995160884.0, 'node:74.10.28.48': 1.0, 'CPU': 112.0}. vLLM "
            "engine cannot start without GPU. Make sure you have at least 1 GPU available in a node "
            "current_node_id='25ce3df78af6f2152950b2eb804c59f55b331e21f8c4f92db852228d' current_ip='74.10.28.48'.")
    top = _first(text)
    assert top.id == "ray-placement-group" and top.confidence == "high"


def test_the_tool_choice_refusal_json_escaped_is_a_line():
    # langchain4j/langchain4j#3475
    text = ('{"object":"error","message":"\\"auto\\" tool choice requires --enable-auto-tool-choice and '
            '--tool-call-parser to be set","type":"BadRequestError","param":null,"code":400}')
    top = _first(text)
    assert top.id == "tool-parser-missing" and top.confidence == "high"


def test_nccls_numeric_completion_status_12_is_the_gid_symptom():
    # NVIDIA/nccl#1814 (NCCL 2.21's form, src/transport/net_ib.cc:1909 @ v2.21.5-1)
    text = ("NCCL WARN NET/IB : Got completion from peer 10.0.0.2<55921> with status=12 opcode=1 len=0 vendor err "
            "129 (Send) localGid ::ffff:29.87.4.221 remoteGids::ffff:29.87.88.182")
    top = _first(text)
    assert top.id == "gid-index-per-nic" and top.confidence == "medium"


# --------------------------------------------------------------------------- OpenMPI

def test_mpirun_daemon_launch_names_the_host_ssh_could_not_resolve():
    # awslabs/awsome-distributed-ai#868
    text = ("ssh: Could not resolve hostname nccl-tests-worker-3.nccl-tests.default.svc: Name or service not known\n"
            "--------------------------------------------------------------------------\n"
            "ORTE was unable to reliably start one or more daemons.\nThis usually is caused by:\n"
            "* not finding the required libraries and/or binaries on\n  one or more nodes.")
    top = _first(text)
    assert top.id == "mpi-daemon-launch-failed" and top.confidence == "high"
    assert "nccl-tests-worker-3.nccl-tests.default.svc" in top.fix and "resolve" in top.fix


def test_the_daemon_banner_alone_is_a_symptom():
    # the banner lists five causes (help-errmgr-base.txt [failed-daemon-launch]): never high on its own
    top = _first("ORTE was unable to reliably start one or more daemons.\nThis usually is caused by:")
    assert top.id == "mpi-daemon-launch-failed" and top.confidence == "medium"


def test_mpi_tcp_connect_failure_names_the_address_and_the_interface_flag():
    # jbornschein/mpi4py-examples#11 (a link-local address the peer cannot reach)
    text = ("WARNING: Open MPI failed to TCP connect to a peer MPI process.  This\nshould not happen.\n\n"
            "Your Open MPI job may now fail.\n\n  Local host: pi02\n  PID:        24783\n"
            "  Message:    connect() to 169.254.140.13:1026 failed\n  Error:      Resource temporarily unavailable (11)")
    top = _first(text)
    assert top.id == "mpi-tcp-connect-failed" and top.confidence == "high"
    assert "169.254.140.13:1026" in top.fix and "btl_tcp_if_include" in top.fix


# --------------------------------------------------------------------------- a reporter's own words

@pytest.mark.parametrize("expect,text", [
    ("image-arch-mismatch", "The vllm image we pulled only has an amd64 build, so on the arm64 Spark the container "
                            "exits immediately."),
    ("cuda-oom-startup", "vLLM runs out of GPU memory while capturing CUDA graphs at startup; with --enforce-eager it "
                         "starts."),
    ("ray-placement-group", "Ray cannot create the placement group: it only sees the GPU of the head node, the worker "
                            "joined without its GPU."),
    ("version-skew", "The two nodes run different vLLM versions because one pulled a newer image tag."),
    ("chat-template-missing", "vLLM rejects chat requests because the tokenizer has no chat_template set."),
    ("mpi-tcp-connect-failed", "nccl-tests over mpirun hangs because Open MPI tries to connect over docker0 "
                               "172.17.0.1; btl_tcp_if_include fixed it."),
    # the kernel's OOM killer is host memory, not a CUDA allocation at start-up
    ("oom-killed", "The kernel OOM killer killed the vLLM process on the worker while loading weights."),
    ("cuda-toolchain-newer-than-driver", "The image's CUDA 13 is newer than the driver supports, so torch says the "
                                         "driver is too old."),
])
def test_specific_words_name_the_cause_never_high(expect, text):
    top = _first(text)
    assert top.id == expect and top.confidence != "high"


@pytest.mark.parametrize("text", [
    "GitHub API returns 401 unauthorized when our CI downloads release assets without a token.",
    "In my notebook, tokenizer.apply_chat_template fails because the base model has no chat template.",
    "Our MPI homework program segfaults when run with mpirun -np 4 on my laptop.",
    "Spark worker ran out of memory while shuffling a 2 TB dataset; executor lost.",
])
def test_generic_words_raise_no_alarm(text):
    assert _ranked(text) == []


def test_every_new_source_names_a_report():
    for eid in ("mpi-daemon-launch-failed", "mpi-tcp-connect-failed"):
        assert "#" in BY_ID[eid].source and "help-" in BY_ID[eid].source
