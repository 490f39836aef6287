"""Issue 36's sixth round, breadth: the common multi-node serving failures that had no entry, each keyed on the
emitting component's own message (docs/diagnose.md, "sixth round"). Every positive text is a real report's (its
thread beside it; where the only copy found is a document in the code index rather than a thread, it says so); every
entry also has a near text that must not name it with high confidence."""
from __future__ import annotations

import pytest

from support.ranking import first as _first, ranked as _ranked


def _high(text: str) -> set[str]:
    return {i for i, c in _ranked(text) if c == "high"}


def _assert_first(text: str, entry: str, confidence: str = "high"):
    top = _first(text)
    assert (top.id, top.confidence) == (entry, confidence), _ranked(text)
    return top


# --------------------------------------------------------------------------- vLLM's configuration refusals

def test_heads_not_divisible_by_tp_is_named_with_both_numbers():
    # vllm-project/vllm#414 (LLaMA 33B on 3 V100s), THU-KEG/AdaptThink#1 (28 heads, TP 8)
    for text, heads, tp in (
            ("ValueError: Total number of attention heads (52) must be divisible by tensor parallel size (3).", "52", "3"),
            ("ValueError: Total number of attention heads (28) must be divisible by tensor parallel size (8)", "28", "8")):
        top = _assert_first(text, "tp-size-not-divisible")
        assert f"heads={heads}" in " ".join(top.lines) and f"tp={tp}" in " ".join(top.lines)


def test_another_frameworks_head_check_is_not_vllms_refusal():
    # deepspeedai/DeepSpeed#3634: DeepSpeed's own assertion (mp_size), not vLLM's check
    assert "tp-size-not-divisible" not in _high("AssertionError: num_heads (52) must be divisible by mp_size (8)")


def test_an_unregistered_architecture_is_named_with_it():
    # vllm-project/vllm#22231 (Qwen3 on an older build), vllm-project/vllm#32338 (pydantic's `Value error,` form)
    for text, arch in (
            ("ValueError: Model architectures ['Qwen3ForCausalLM'] are not supported for now. Supported architectures: "
             "['AquilaModel', 'AquilaForCausalLM', 'ArcticForCausalLM', 'BaiChuanForCausalLM']", "Qwen3ForCausalLM"),
            ('"Value error, Model architectures [\'LlavaQwenForCausalLM\'] are not supported for now."vllm version is '
             "0.13.0", "LlavaQwenForCausalLM")):
        top = _assert_first(text, "model-architecture-unsupported")
        assert f"arch={arch}" in " ".join(top.lines)


def test_a_question_about_supported_architectures_is_no_failure():
    # vllm-project/vllm#1757's question
    assert "model-architecture-unsupported" not in _high(
        "Best practice to check if a model architecture is supported by VLLM? If not I will default to HF.")


def test_a_quantization_the_gpu_cannot_run_is_named_with_both_capabilities():
    # vllm-project/vllm#4327 (fp8 through Ray workers on capability 86)
    text = ("(RayWorkerWrapper pid=2202821) ERROR 04-24 16:06:40 worker_base.py:157] ValueError: The quantization method "
            "fp8 is not supported for the current GPU. Minimum capability: 90. Current capability: 86. [repeated 2x "
            "across cluster]")
    top = _assert_first(text, "quantization-unsupported-on-gpu")
    assert "min_capability=90" in " ".join(top.lines) and "capability=86" in " ".join(top.lines)


def test_another_tools_fp8_capability_message_is_never_high():
    # 1038lab/ComfyUI-QwenVL#28: a ComfyUI node's own check, not vLLM's
    text = ("ERROR: FP8 models require a GPU with Compute Capability 8.9 or higher (e.g., RTX 4090). Your GPU's "
            "capability is 8.6. Please select a non-FP8 model.")
    assert "quantization-unsupported-on-gpu" not in _high(text)


def test_batched_tokens_below_max_model_len_is_named_with_both_numbers():
    # the message as quoted in a vLLM validation report stored in the code index (a 1M-context deployment that
    # crash-looped with --no-enable-chunked-prefill); thread: vllm-project/vllm#18681
    top = _assert_first("max_num_batched_tokens (4096) is smaller than max_model_len (1010000)",
                        "max-num-batched-tokens-below-max-model-len")
    assert "max_model_len=1010000" in " ".join(top.lines)


def test_the_chunked_prefill_variant_of_another_tool_is_never_high():
    # a training harness's own check with the opposite condition (the code index, a rollout script), not vLLM's
    text = ("ValueError: Enable chunked prefill, max_num_batched_tokens (2048) is smaller than max_model_len (4096), "
            "please increase max_num_batched_tokens or disable chunked prefill")
    ranked = _ranked(text)
    assert ("max-num-batched-tokens-below-max-model-len", "high") in ranked  # the same numbers, the same fix
    # but a question about the two limits is no failure
    assert "max-num-batched-tokens-below-max-model-len" not in _high(
        "Why can max-num-batched-tokens be smaller than max-model-len with chunked prefill?")


def test_a_repository_with_custom_code_needs_trust_remote_code():
    # vllm-project/vllm#9531 (InternVL2: its command, then the pre-4.35 wording as the reporter pasted it,
    # lower-cased), runpod-workers/worker-vllm#43 (the current wording, in a container that cannot answer the prompt)
    for text, repo in (
            ("vllm serve/ internvl2-8b\nvalueerror: loading internvl2-8b/ requires you to execute the configuration file in that repo on your "
             "local machine. make sure you have read the code there to avoid malicious use, then set the option "
             "'trust_remote_code=true' to remove this error.", "internvl2-8b/"),
            ("2024-02-08T08:40:56.016480879Z engine.py           :43   2024-02-08 08:40:56,015 vLLM config: {'model': "
             "'TheBloke/Nous-Capybara-34B-AWQ', 'quantization': 'awq', 'trust_remote_code': True}\n"
             "2024-02-08T08:40:56.161703147Z The repository for TheBloke/Nous-Capybara-34B-AWQ contains custom code "
             "which must be executed to correctly load the model. You can inspect the repository content at "
             "https://hf.co/TheBloke/Nous-Capybara-34B-AWQ.\n2024-02-08T08:40:56.162202300Z EOFError: EOF when reading "
             "a line", "TheBloke/Nous-Capybara-34B-AWQ")):
        top = _assert_first(text, "trust-remote-code-required")
        assert f"repo={repo}" in " ".join(top.lines)


def test_transformers_own_refusal_without_the_serving_stack_is_off_domain():
    # h2oai/h2o-llmstudio#560's message alone: any transformers user (a notebook, a trainer) meets it
    text = ("ValueError: Loading pansophic/rocket-3B requires you to execute the configuration file in that repo on your "
            "local machine. Make sure you have read the code there to avoid malicious use, then set the option "
            "`trust_remote_code=True` to remove this error.")
    assert "trust-remote-code-required" not in [i for i, _ in _ranked(text)]


def test_the_flag_in_a_pasted_command_is_no_cue():
    # fz3-served-01's shape: a served-name 404 after a command line that passes --trust-remote-code
    text = ("python -m vllm.entrypoints.openai.api_server --model /models/Qwen1.5-14B-Chat-GPTQ-Int8 --trust-remote-code\n"
            '{"object":"error","message":"The model `Qwen1.5-14B-Chat-GPTQ-Int8` does not exist.","type":"NotFoundError"}')
    assert "trust-remote-code-required" not in [i for i, _ in _ranked(text)]
    # vllm-project/vllm#595's question
    assert "trust-remote-code-required" not in _high("How to set trust_remote_code=True ?")


def test_ray_nodes_with_one_ip_are_named():
    # ray-project/ray#63917 (vLLM workers on a docker network), vllm-project/vllm#43095 (multi-NIC nodes, as quoted)
    for text in ("RuntimeError: Every node should have a unique IP address",
                 "RuntimeError: Every node should have a unique IP address. Got N nodes\nwith N+1 unique IP addresses {...}"):
        _assert_first(text, "ray-duplicate-node-ip")
    # vLLM's own message with the counts (vllm/v1/executor/ray_executor.py:312 @ v0.32.0), the addresses extracted
    text = ("RuntimeError: Every node should have a unique IP address. Got 2 nodes with node ids ['a1', 'b2'] and 1 "
            "unique IP addresses {'172.17.0.2'}. Please check your network configuration.")
    top = _assert_first(text, "ray-duplicate-node-ip")
    assert "n_ips=1" in " ".join(top.lines) and "172.17.0.2" in " ".join(top.lines)


def test_a_docs_line_about_vllm_host_ip_is_no_failure():
    # vllm-project/vllm#20593 (the docs: VLLM_HOST_IP is unique for each worker)
    assert "ray-duplicate-node-ip" not in _high(
        "Note that VLLM_HOST_IP is unique for each worker. Keep the shells running these commands open.")


def test_two_ranks_on_one_gpu_are_named_with_the_bus_id():
    # horovod/horovod#3929 (mpirun), NVIDIA/Megatron-LM#661 (the torch-wrapped form)
    for text, bus in (
            ("[1,2]<stdout>:smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 "
             "both on CUDA device 1000\n[1,2]<stdout>:smc-gpu-03:29880:30398 [0] NCCL INFO init.cc:867 -> 5", "1000"),
            ("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : "
             "rank 3 and rank 0 both on CUDA device f000", "f000")):
        top = _assert_first(text, "nccl-duplicate-gpu")
        assert f"bus_id={bus}" in " ".join(top.lines)


def test_ncclinvalidusage_alone_is_not_a_duplicate_gpu():
    text = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1727, invalid usage (run with "
            "NCCL_DEBUG=WARN for details), NCCL version 2.19.3\nncclInvalidUsage: This usually reflects invalid usage of "
            "NCCL library.")
    assert "nccl-duplicate-gpu" not in _high(text)


# --------------------------------------------------------------------------- what the node or container lacks

def test_the_docker_socket_permission_error_is_named():
    # NVIDIA/nvidia-docker#255 (nvidia-docker as a user outside the docker group)
    text = ("nvidia-docker | 2017/09/19 18:46:49 Error: Got permission denied while trying to connect to the Docker daemon "
            "socket at unix:///var/run/docker.sock: Get http://%2Fvar%2Frun%2Fdocker.sock/v1.30/version: dial unix "
            "/var/run/docker.sock: connect: permission denied")
    top = _assert_first(text, "docker-socket-permission")
    assert "socket=unix:///var/run/docker.sock" in " ".join(top.lines)


def test_another_programs_docker_socket_error_is_the_same_cause():
    # docker-library/postgres#1124: a postgres pull, nothing of the serving stack in the text. Off-domain until issue
    # 36's eighth round: a user who may not open the docker socket has one cause and one fix whatever program asked
    text = ('permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: '
            'Post "http://%2Fvar%2Frun%2Fdocker.sock/v1.24/images/create?fromImage=postgres&tag=latest": dial unix '
            '/var/run/docker.sock: connect: permission denied')
    assert [i for i, _ in _ranked(text)][:1] == ["docker-socket-permission"]


def test_the_runbooks_own_docker_command_needs_no_context():
    import json
    from runbook.diagnose import bundle as B
    from runbook.diagnose.offline import diagnose_bundle
    rec = {"node": "worker", "command": "docker pull nvcr.io/nvidia/vllm:26.05-py3", "exit_code": 1,
           "stderr_tail": "permission denied while trying to connect to the Docker daemon socket at "
                          "unix:///var/run/docker.sock: Post \"http://%2Fvar%2Frun%2Fdocker.sock/v1.47/images/create\": "
                          "dial unix /var/run/docker.sock: connect: permission denied"}
    bundle = B.Bundle(texts={B.LOCAL: {B.LOCAL_COMMANDS: json.dumps(rec) + "\n"}})
    assert [r.id for r in diagnose_bundle(bundle)][:1] == ["docker-socket-permission"]


def test_a_daemon_that_is_not_running_is_not_a_permission_problem():
    text = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    assert "docker-socket-permission" not in _high(text)


def test_offline_without_the_cached_snapshot_is_named_even_when_wrapped():
    # MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks#36 (two Sparks, wrapped as the issue pastes it),
    # jianchang512/stt#132 (local_files_only's variant, wrapped)
    for text in ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate\ncached snapshot folder for "
                 "the specified revision on the local disk and\noutgoing traffic has been disabled.",
                 "Cannot find an appropriate\n cached snapshot folder for the\n specified revision on the local\n disk and "
                 "outgoing traffic has\n been disabled. To enable repo\n look-ups and downloads\nonline, pass\n"
                 "'local files_only=False' as input."):
        _assert_first(text, "hf-offline-not-cached")


def test_a_question_about_offline_mode_is_no_failure():
    assert "hf-offline-not-cached" not in _high(
        "Should I set HF_HUB_OFFLINE=1 on both nodes once the weights are downloaded?")


def test_an_invalid_hub_token_is_not_a_gated_repo():
    # deepbeepmeep/Wan2GP#455, Comfy-Org/ComfyUI#9415
    for text in ("HfHubHTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/DeepBeepMeep/Wan2.1/"
                 "resolve/main/pose/dw-ll_ucoco_384.onnx (Request ID: Root=1-68633b9c-28815ed66c58f6cd6dfce7ac)\n\n"
                 "Invalid credentials in Authorization header",
                 "huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/"
                 "api/models/black-forest-labs/FLUX.1-dev/revision/main (Request ID: Root=1-68a3ff5e-10e4d1e1466c79)\n\n"
                 "Invalid credentials in Authorization h"
                 "eader"):
        _assert_first(text, "hf-token-invalid")
        assert ("hf-gated-repo-token", "high") not in _ranked(text)


def test_a_401_without_the_invalid_credentials_body_stays_the_gated_repos_symptom():
    text = ("requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: "
            "https://huggingface.co/fancyfeast/llama-joycaption-beta-one-hf-llava/resolve/main/config.json")
    assert "hf-token-invalid" not in [i for i, _ in _ranked(text)]


def test_an_rdma_device_the_container_cannot_open_is_named_before_the_socket_fallback():
    # NVIDIA/nccl#451 (docker without /dev/infiniband: the device is listed, does not open, NCCL uses sockets)
    text = ("NCCL INFO NCCL_IB_DISABLE set by environment to 0.\nmisc/ibvwrap.cc:212 NCCL WARN Call to ibv_open_device "
            "failed\ntransport/net_ib.cc:148 NCCL WARN NET/IB : Unable to open device mlx5_bond_0\nNCCL INFO NET/IB : No "
            "device found.\nNCCL INFO NET/Socket : Using [0]bond0:200.1.93.2<0>")
    top = _assert_first(text, "ib-device-not-in-container")
    assert "device=mlx5_bond_0" in " ".join(top.lines)
    assert "nccl-ib-no-device" in [i for i, _ in _ranked(text)[:3]]
    # NVIDIA/caffe#590: the image has no verbs provider for the NIC
    text = ("ibv_devinfo -l\nlibibverbs: Warning: no userspace device-specific driver found for "
            "/sys/class/infiniband_verbs/uverbs4\n0 HCAs found:")
    _assert_first(text, "ib-device-not-in-container")


def test_no_device_found_alone_stays_the_hca_names_entry():
    text = "spark-a:315:401 [0] NCCL INFO NET/IB : No device found.\nspark-a:315:401 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:10.0.0.1<0>"
    assert "ib-device-not-in-container" not in [i for i, _ in _ranked(text)]


def test_too_many_open_files_is_named_beside_the_serving_stack():
    # vllm-project/vllm#7920 (the OpenAI server under 800 concurrent streams: its command, and the title's error as pyzmq
    # prints it)
    text = ("# vllm serve meta-llama/Meta-Llama-3-8B-Instruct  --disable-log-requests\n"
            "zmq.error.ZMQError: Too many open files")
    _assert_first(text, "open-files-limit-low")
    # the path is extracted where Python prints it (facebookresearch/fairseq#87's line, here beside a vLLM rank)
    top = _assert_first("(VllmWorker rank=1 pid=4242) OSError: [Errno 24] Too many open files: '/tmp/pymp-tgep00l9'",
                        "open-files-limit-low")
    assert "path=/tmp/pymp-tgep00l9" in " ".join(top.lines)


def test_another_programs_file_limit_is_off_domain():
    # facebookresearch/fairseq#87 alone: a training run
    assert _ranked("OSError: [Errno 24] Too many open files: '/tmp/pymp-tgep00l9'") == []


def test_vllms_own_ulimit_warning_quoting_the_error_is_no_failure():
    # the healthy lab head log (tests/unit/data/vllm_logs/cpu032_tp2_head.log:9): vLLM quotes the error as an example
    text = ("(APIServer pid=815) WARNING 12-01 04:22:50 [system_utils.py:255] Found ulimit of 20000 and failed to "
            "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like "
            "`OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n")
    assert _ranked(text) == []


def test_torch_shared_tensors_in_a_small_dev_shm_are_named_and_not_a_full_disk():
    # logicalclocks/hopsworks#1557 (docker's 64 MB default: the reporter's sentence and the traceback's lines)
    text = ("To run torch-based model training, it's easy to trigger the problem \"No space left on device\" which is "
            "caused by default small shared memory (64M) when docker starts container.\n"
            "RuntimeError: DataLoader worker (pid 729) is killed by signal: Bus error. It is possible that "
            "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\n"
            "RuntimeError: unable to write to file </torch_739_144252761_4>: No space left on device (28)")
    _assert_first(text, "container-shm-too-small")
    assert "disk-full" not in _high(text)


def test_torch_shm_without_a_container_or_the_stack_is_off_domain():
    # idiap/ESLAM#20's line alone (a SLAM training run)
    text = "RuntimeError: unable to write to file </torch_31911_952036340_6686>: No space left on device (28)"
    assert "container-shm-too-small" not in [i for i, _ in _ranked(text)]


def test_ncclss_own_shm_failure_stays_ncclss():
    # NCCL's /dev/shm segment (nccl-shm-too-small's own line) is not torch's
    text = ("spark-a:211:402 [0] misc/shmutils.cc:83 NCCL WARN Error: failed to extend /dev/shm/nccl-8gPd3A to "
            "9637892 bytes")
    assert "container-shm-too-small" not in _high(text)
    # a report of NCCL's segment that mentions --shm-size is NCCL's (tune case shm-01's shape)
    words = ("vLLM crashes with --tensor-parallel-size inside the docker container; NCCL cannot open its /dev/shm "
             "segment, and it works once the container gets --shm-size=10gb.")
    assert "container-shm-too-small" not in [i for i, _ in _ranked(words)]


def test_a_jit_build_without_a_compiler_is_named():
    # vllm-project/vllm#2997 (its frames and its title's error), sgl-project/sglang#1067 (a runtime base image)
    for text in ('  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/model_runner.py", line 574, in execute_model\n'
                 "    hidden_states = model_executable(\n"
                 "RuntimeError: Failed to find C compiler. Please specify via CC environment variable",
                 "Latest sglang docker image fails with `Failed to find C compiler` error, I'm assuming due to switch from "
                 "`devel` to `runtime` nvidia images.\nRuntimeError: Failed to find C compiler. Please specify via CC "
                 "environment variable."):
        _assert_first(text, "jit-compiler-missing")
    # apple/ml-cross-entropy#5: a trainer's Triton, nothing of the serving stack: off-domain
    assert _ranked("RuntimeError: Failed to find C compiler. Please specify via CC environment variable.") == []


def test_a_compiler_error_is_not_a_missing_compiler():
    text = "gcc: error: unrecognized command-line option '-mavx512f'\nninja: build stopped: subcommand failed."
    assert "jit-compiler-missing" not in _high(text)


# --------------------------------------------------------------------------- crashes many causes print (symptoms)

def test_an_illegal_memory_access_is_a_symptom_never_high():
    # vllm-project/vllm#6725 (TP 8 since v0.5), vllm-project/vllm#24430
    text = ("(VllmWorkerProcess pid=134370) ERROR 07-24 04:24:50 multiproc_worker_utils.py:226] RuntimeError: CUDA "
            "error: an illegal memory access was encountered\n(VllmWorkerProcess pid=134370) ERROR 07-24 04:24:50 "
            "multiproc_worker_utils.py:226] Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    _assert_first(text, "cuda-illegal-memory-access", "medium")


def test_an_illegal_access_after_a_named_cause_ranks_below_it():
    # an arch-less build's own error ahead of the fault (engine-build-arch-missing's line)
    text = ("RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered")
    top = _first(text)
    assert top.id == "engine-build-arch-missing", _ranked(text)


def test_a_dead_ray_actor_is_a_symptom_with_its_node():
    # vllm-project/vllm#19123 (vLLM on Ray in docker)
    text = ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
            "        class_name: LLM\n        actor_id: dcee82d05fe3b519c14d79ce01000000\n        pid: 95366\n"
            "        namespace: 1f98ee75-6fcb-4086-880e-c03c8fb065c8\n        ip: 172.17.0.2\n"
            "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
            "Worker unexpectedly exits with a connection error code 2. End of file.")
    _assert_first(text, "ray-actor-died", "medium")


def test_a_dead_actor_killed_by_rays_memory_monitor_names_the_monitor():
    # the monitor's own line (ray-memory-monitor-kill) explains the death
    text = ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
            "Task was killed due to the node running low on memory.")
    top = _first(text)
    assert (top.id, top.confidence) == ("ray-memory-monitor-kill", "high"), _ranked(text)


@pytest.mark.parametrize("entry", ["tp-size-not-divisible", "model-architecture-unsupported",
                                   "quantization-unsupported-on-gpu", "max-num-batched-tokens-below-max-model-len",
                                   "trust-remote-code-required", "ray-duplicate-node-ip", "nccl-duplicate-gpu",
                                   "docker-socket-permission", "hf-offline-not-cached", "hf-token-invalid",
                                   "ib-device-not-in-container", "open-files-limit-low", "container-shm-too-small",
                                   "jit-compiler-missing", "cuda-illegal-memory-access", "ray-actor-died",
                                   "gpu-not-visible-in-container", "peer-rank-exited"])
def test_each_new_entry_cites_a_pinned_source_and_a_report(entry):
    from runbook.diagnose.catalogue import BY_ID
    e = BY_ID[entry]
    assert "@" in e.source or "by function" in e.source or "no line pinned" in e.source, e.source
    assert "#" in e.source, "a report thread"


def test_no_gpu_in_the_process_is_a_symptom_of_two_causes():
    # ray-project/ray#51193 (vLLM under Ray Serve: its title, vLLM's platform line, the error)
    text = ('[Ray Serve]: "RuntimeError: No CUDA GPUs are available" when running vllm with ray\n'
            "INFO 03-09 17:27:20 __init__.py:207] Automatically detected platform cuda.\n"
            "RuntimeError: No CUDA GPUs are available")
    _assert_first(text, "gpu-not-visible-in-container", "medium")
    # matatonic/openedai-images-flux#7: an image app's compose service, nothing of the serving stack: off-domain
    text = ("openedai-images-flux  |     torch._C._cuda_init()\nopenedai-images-flux  | RuntimeError: No CUDA GPUs are "
            "available")
    assert _ranked(text) == []
    # torch's no-driver message: a host without its driver (driver-not-loaded) or a container without --gpus; alone
    # it is driver-not-loaded's symptom, never high (bringup-anchors §5.14, the holdout case drv-03)
    text = ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
            "a driver from http://www.nvidia.com/Download/index.aspx")
    ranked = _ranked(text)
    assert ranked[0] == ("driver-not-loaded", "medium") and all(c != "high" for _, c in ranked), ranked
    assert ("gpu-not-visible-in-container", "medium") in _ranked("docker run --rm my-vllm-image\n" + text)
    # abetlen/llama-cpp-python#1882, in the reporter's words: the container was run without --gpus all
    words = "CUDA is not detected inside the docker container when I run it without --gpus all; torch says no GPU."
    assert _ranked(words)[0][0] == "gpu-not-visible-in-container", _ranked(words)


def test_a_doubled_device_selection_stays_the_selection_entry():
    # vllm-project/vllm#3722's shape: the ordinal error beside a narrowed device list
    text = ("docker run --gpus '\"device=1\"' -e CUDA_VISIBLE_DEVICES=1 vllm/vllm-openai\n"
            "RuntimeError: No CUDA GPUs are available")
    assert _first(text).id == "cuda-visible-devices-conflict", _ranked(text)


def test_a_peer_that_went_away_first_is_a_symptom_naming_the_peer():
    # NVIDIA/nccl#1232, NVIDIA/nccl#1235 (the peer rank's CUDA OOM came first)
    for text, peer in (("[0] node0:13571:13590 [0] misc/socket.cc:47 NCCL WARN socketProgress: Connection closed by "
                        "remote peer node2<42830>", "node2"),
                       ("ng30903:3063025:3066048 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by "
                        "remote peer ng30903-ib.narval.calcul.quebec<51159>\nng30903:3063025:3066048 [0] proxy.cc:1143 "
                        "NCCL WARN Socket recv failed while polling for opId=0x55a51966cc80",
                        "ng30903-ib.narval.calcul.quebec")):
        top = _assert_first(text, "peer-rank-exited", "medium")
        assert any(peer in l for l in top.lines)
    # deepseek-ai/DeepEP#106: torch's wrapped ncclRemoteError
    text = ("RuntimeError: NCCL error: remote process exited or there was a network error, NCCL version 2.20.5\n"
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.")
    _assert_first(text, "peer-rank-exited", "medium")


def test_the_peers_own_cause_ranks_above_its_closed_socket():
    # the holdout case uma-free-02's shape (Blackwellboy/model-serving-minefield#45): rank 0 refused the start, rank 1
    # saw its socket close
    text = ("ValueError: Free memory on device cuda:0 (109.53/121.69 GiB) on startup is\nless than desired GPU memory "
            "utilization (0.91, 110.74 GiB)\n[rank1]: NCCL WARN socketProgress: Connection closed by remote peer")
    assert [i for i, _ in _ranked(text)[:2]] == ["uma-free-memory-check", "peer-rank-exited"], _ranked(text)


@pytest.mark.parametrize("entry,words", [
    # sentences written for the test, in a reporter's terms (no report quoted): the cues alone name each new entry
    ("tp-size-not-divisible", "vLLM refuses to start on our three Sparks with TP 3: the attention heads are not "
                              "divisible by the tensor parallel size."),
    ("model-architecture-unsupported", "The worker fails because vLLM does not support the model architecture; I think "
                                       "the image is too old for this new model."),
    ("quantization-unsupported-on-gpu", "The fp8 checkpoint won't load: vLLM says the quantization method is not "
                                        "supported on this GPU (compute capability too low)."),
    ("trust-remote-code-required", "The model needs trust-remote-code; without it the start fails loading the config."),
    ("ray-duplicate-node-ip", "Ray complains that every node should have a unique IP; both containers report 172.17.0.2 "
                              "on the docker bridge."),
    ("docker-socket-permission", "Every docker command on the worker fails with permission denied on docker.sock unless "
                                 "I use sudo."),
    ("hf-offline-not-cached", "With HF_HUB_OFFLINE=1 the worker fails: the model is not in its HF cache, only the head "
                              "downloaded it."),
    ("hf-token-invalid", "My HF token is invalid or expired, downloads return 401 from the hub."),
    ("container-shm-too-small", "The worker dies with a bus error; the container's /dev/shm is only 64MB and torch needs "
                                "more shared memory."),
    ("jit-compiler-missing", "Triton fails to find a C compiler in the runtime image when vLLM starts the "
                             "first time."),
    ("peer-rank-exited", "Rank 0 reports the remote process exited; the other node crashed first."),
])
def test_the_reporters_words_name_the_new_entries(entry, words):
    ranked = _ranked(words)
    assert ranked and ranked[0][0] == entry and ranked[0][1] != "high", ranked
