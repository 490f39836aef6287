"""Issue 36, the classes it left without an entry: each is named from its component's own message (the texts are
the tuning reports' lines, their threads beside them), extracts what its fix names, and stays quiet on the same
component's healthy or unrelated lines."""
from __future__ import annotations

from runbook.diagnose import Bundle, match
from runbook.diagnose import bundle as B
from runbook.diagnose.offline import diagnose_text


def _found(entry_id: str, text: str, node: str = "head"):
    return [f for f in match(Bundle(texts={node: {B.RANK_LOG: text}})) if f.id == entry_id]


def _first(text: str) -> str:
    ranked = diagnose_text(text)
    return ranked[0].id if ranked else "nothing"


def test_a_bare_404_is_a_served_name_mismatch_naming_the_model_asked_for():
    # spark-arena/sparkrun#257: the bench asked for a name the server does not serve
    text = ("openai.NotFoundError: Error code: 404 - {'object': 'error', 'message': 'The model `qwen3-coder` does not "
            "exist.', 'type': 'NotFoundError', 'param': None, 'code': 404}")
    f = _found("served-model-name-mismatch", text)
    assert f and "`qwen3-coder`" in f[0].fix
    assert _first(text) == "served-model-name-mismatch"
    # the reporter says an old server answers: that is the port, not the name
    old = "Requests get 404 model does not exist: /v1/models lists a different model, an old server still holds the port."
    assert _first(old) == "wrong-model-on-port"


def test_ray_memory_monitor_kill_names_the_node_and_threshold():
    # vllm-project/vllm#15102
    text = ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\nMemory on the node "
            "(IP: 29.45.33.204, ID: 3486ef92) where the task (actor ID: 46c8d4da, name=RayWorkerWrapper.__init__, "
            "pid=13378, memory used=3.37GB) was running was 2152.43GB / 2265.25GB (0.950196), which exceeds the memory "
            "usage threshold of 0.95. Ray killed this worker")
    f = _found("ray-memory-monitor-kill", text)
    assert f and "29.45.33.204" in f[0].fix and "2152.43GB" in f[0].fix and "0.95" in f[0].fix
    assert _first(text) == "ray-memory-monitor-kill"


def test_nccl_hca_set_mismatch_extracts_the_device_counts():
    # NVIDIA/nccl src/init.cc:1339 @ v2.30.7-1 (the WARN as NCCL prints it)
    text = ("spark-b:211:402 [0] NCCL INFO Rank 1 has 1 local Net devices (max 2).\n"
            "spark-b:211:402 [0] init.cc:1339 NCCL WARN Detected mixed local Net device counts across ranks (min 1, "
            "max 2). Set NCCL_IGNORE_NET_MISMATCH=1 to continue.")
    f = _found("nccl-hca-set-mismatch", text)
    assert f and "between 1 and 2" in f[0].fix
    assert _first(text) == "nccl-hca-set-mismatch"
    healthy = "spark-a:1:2 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1"
    assert diagnose_text(healthy) == []


def test_gloo_on_a_loopback_address_is_named_and_a_real_address_is_not():
    # aws-samples/aws-do-eks#69 shape (gloo pair.cc through ProcessGroupGloo's connectFullMesh)
    text = ("RuntimeError: Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] "
            "timed out connecting: SO_ERROR: Connection refused, remote=[127.0.1.1]:41235 (rank=1, size=2, "
            "local=[127.0.1.1])")
    f = _found("gloo-loopback-hostname", text)
    assert f and "127.0.1.1" in f[0].fix
    assert _first(text) == "gloo-loopback-hostname"
    fabric = text.replace("127.0.1.1", "169.254.30.2")
    assert not _found("gloo-loopback-hostname", fabric)
    assert _first(fabric) == "socket-ifname-invalid"


def test_p2p_check_hang_only_when_nothing_follows_the_probe():
    line = ("INFO 07-29 10:04:03 custom_all_reduce_utils.py:202] generating GPU P2P access cache in "
            "/root/.cache/vllm/gpu_p2p_access_cache_for_0,1.json")
    f = _found("p2p-check-hang", line)
    assert f and "/root/.cache/vllm/gpu_p2p_access_cache_for_0,1.json" in f[0].fix
    went_on = line + "\nINFO 07-29 10:04:20 custom_all_reduce_utils.py:240] reading GPU P2P access cache from x\n"
    assert not _found("p2p-check-hang", went_on)


def test_host_list_split_by_character_and_a_plain_dns_failure():
    # spark-arena/sparkrun#257
    text = ("Running script in parallel on 12 hosts: s, p, a, r, k, 1, s, p, a, r, k, 2\n"
            "  SSH cmd <- s FAILED rc=255: ssh: Could not resolve hostname s: Temporary failure in name resolution")
    f = _found("host-list-split", text)
    assert f and ("`s`" in f[0].fix or "`s, p, a" in f[0].fix)
    assert _first(text) == "host-list-split"
    joined = "ssh: Could not resolve hostname spark1,spark2: Name or service not known"
    assert _found("host-list-split", joined)
    plain = "ssh: Could not resolve hostname spark-worker: Name or service not known"
    assert not _found("host-list-split", plain) and diagnose_text(plain) == []


def test_dependency_skew_names_the_package_and_library():
    # vllm-project/vllm#5501 shape: vLLM's own warning around the loader's message
    text = ("WARNING 06-13 11:42:20 _custom_ops.py:11] Failed to import from vllm._C with ImportError('/usr/local/lib/"
            "python3.8/dist-packages/vllm/_C.abi3.so: undefined symbol: _ZN5torch7LibraryC1ENS0_4KindE')")
    f = _found("dependency-skew", text)
    assert f and "vllm does not match" in f[0].fix and "_C.abi3.so" in f[0].fix
    pip = ("ERROR: pip's dependency resolver does not currently take into account all the packages that are installed.\n"
           "vllm 0.10.1 requires torch==2.7.1, but you have torch 2.8.0 which is incompatible.")
    f = _found("dependency-skew", pip)
    assert f and f[0].fix.startswith("vllm does not match")
    assert "torch 2.8.0" in " ".join(f[0].evidence)


def test_engine_build_without_the_gpu_arch_extracts_it():
    # torch/cuda/__init__.py:427 @ 2.13.0 (the warning's own words)
    text = ("UserWarning: NVIDIA GB10 with CUDA capability sm_121 is not compatible with the current PyTorch "
            "installation.\nThe current PyTorch install supports CUDA capabilities sm_80 sm_90.")
    f = _found("engine-build-arch-missing", text)
    assert f and "(121)" in f[0].fix
    # spark-arena/sparkrun#220: a JIT kernel library without the arch's source
    jit = "Failed to open: /usr/local/lib/python3.12/dist-packages/deep_gemm/include/impls/sm121_fp8_mqa_logits.cuh"
    assert _first(jit) == "engine-build-arch-missing"


def test_invalid_device_ordinal_is_a_device_selection_conflict_only_with_a_selection_in_the_text():
    text = ("docker run --gpus '\"device=1\"' -e CUDA_VISIBLE_DEVICES=1 img vllm serve m\n"
            "RuntimeError: CUDA error: invalid device ordinal")
    f = _found("cuda-visible-devices-conflict", text)
    assert f and "CUDA_VISIBLE_DEVICES=1" in f[0].fix and "--gpus" in f[0].fix
    assert not _found("cuda-visible-devices-conflict", "RuntimeError: CUDA error: invalid device ordinal")


def test_a_failed_va_reservation_is_its_own_entry():
    text = "CUDA driver error: cuMemAddressReserve failed with CUDA_ERROR_OUT_OF_MEMORY (reserve 64 GiB)"
    f = _found("cuda-va-reservation-cap", text)
    assert f and f[0].fix.startswith("cuMemAddressReserve failed")
    assert _first(text) == "cuda-va-reservation-cap"


# --------------------------------------------------------------------------- two older classes, wider from their source

def test_a_cuda_call_oom_inside_graph_capture_is_a_startup_oom():
    # vLLM captures through `with torch.cuda.graph(` (vllm/compilation/cuda_graph.py:314 @ v0.32.0); capture_end is
    # torch/cuda/graphs.py:160 @ 2.13.0; a CUDA call's own failure reads "CUDA error: out of memory"
    text = ('  File "/usr/local/lib/python3.12/dist-packages/vllm/compilation/cuda_graph.py", line 314, in __call__\n'
            "    with torch.cuda.graph(\n"
            '  File "/usr/local/lib/python3.12/dist-packages/torch/cuda/graphs.py", line 160, in capture_end\n'
            "    super().capture_end()\n"
            "torch.AcceleratorError: CUDA error: out of memory\n")
    f = _found("cuda-oom-startup", text)
    assert f and "no size printed" in f[0].fix
    assert _first(text) == "cuda-oom-startup"
    assert not _found("cuda-oom-startup", "torch.AcceleratorError: CUDA error: out of memory\n"), "no start-up phase"


def test_tool_calls_left_in_content_are_a_parser_problem_in_a_reporters_words():
    said = ("The model's tool calls come back as plain text in the content field and tool_calls is empty; we serve "
            "it with the hermes parser.")
    assert _first(said) == "tool-parser-missing"
    assert diagnose_text("Which tool calling format does this model use?") == []


def test_an_inferred_signature_is_never_high_and_a_users_own_import_is_not_skew():
    # a log that stops at the P2P probe, CUDA's error beside a device selection: symptoms, not the component's error
    stops = ("INFO 07-29 10:04:03 custom_all_reduce_utils.py:202] generating GPU P2P access cache in "
             "/root/.cache/vllm/gpu_p2p_access_cache_for_0,1.json")
    both = "CUDA_VISIBLE_DEVICES=1 python serve.py\nRuntimeError: CUDA error: invalid device ordinal"
    for text, entry in ((stops, "p2p-check-hang"), (both, "cuda-visible-devices-conflict")):
        ranked = diagnose_text(text)
        assert ranked and ranked[0].id == entry and ranked[0].confidence == "medium"
    assert _first("ImportError: cannot import name 'AutoProcessor' from 'transformers'") == "dependency-skew"
    assert diagnose_text("ImportError: cannot import name 'helper' from 'myapp.utils'") == []
