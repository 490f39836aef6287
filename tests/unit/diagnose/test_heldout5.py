"""The misses of the blind held-out files heldout-4 and heldout-5 (issue 36), fixed by class from the emitting
component's message (docs/diagnose.md, "heldout-5"). Each text is a real report's, its thread beside it; where
the only report at hand is the held-out case itself it says so (those cases are no longer blind)."""
from __future__ import annotations

from runbook.diagnose.offline import diagnose_text
from support.ranking import first as _first, ranked as _ranked


# --------------------------------------------------------------------------- symptoms: named, never "high"

def test_a_sigbus_under_nccl_names_the_small_dev_shm_at_medium():
    # NVIDIA/nccl#983 (title), pytorch/tutorials#2475 (a PR's words: segfault in ncclShmOpen without --shm-size)
    for text in ("call ncclCommInitRank got Signal: Bus error (7)",
                 "If `data_parallel_tutorial.py` is executed without this option it would segfault in `ncclShmOpen` "
                 "while executing `nn.DataParallel(model)`"):
        first = _first(text)
        assert first.id == "nccl-shm-too-small" and first.confidence != "high", _ranked(text)


def test_a_bare_nccl_system_error_is_the_dev_shm_only_when_no_warn_names_the_call():
    # NVIDIA/nccl#473: only the test's line; the reporter's fix was --ipc=host
    bare = "fastmoe: Test NCCL failure common.cu:777 'unhandled system error'\nRuntimeError: NCCL Error 2: unhandled system error"
    first = _first(bare)
    assert first.id == "nccl-shm-too-small" and first.confidence == "medium"
    assert "unhandled system error" in first.lines[0]
    # NVIDIA/nccl#551: the WARN before it names the failing verbs call: not a /dev/shm answer
    warned = ("gpunodev2:10770:10794 [0] misc/ibvwrap.cu:284 NCCL WARN Call to ibv_modify_qp failed with error No such device\n"
              "gpunodev2:10770:10794 [0] NCCL INFO transport/net_ib.cu:382 -> 2\n"
              "gpunodev2: Test NCCL failure common.cu:788 'unhandled system error'")
    assert "nccl-shm-too-small" not in [i for i, _ in _ranked(warned)]


def test_a_roce_retry_exceeded_completion_names_the_gid_index_at_medium():
    # NVIDIA/nccl#880 quoting the WARN (error 12 = IBV_WC_RETRY_EXC_ERR); the NCCL >= 2.19 wording of net_ib.cc:2543
    for text in ("NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129",
                 "node1:1:2 [0] transport/net_ib.cc:2543 NCCL WARN NET/IB: Got completion from peer 10.0.0.2<41234> with "
                 "status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=0 vendor_err=129 req_type=Send hca mlx5_0"):
        first = _first(text)
        assert (first.id, first.confidence) == ("gid-index-per-nic", "medium"), _ranked(text)
    # NVIDIA/nccl#523: error 4 (a local protection error) is another cause: not named the GID index
    assert "gid-index-per-nic" not in [i for i, _ in _ranked(
        "NCCL WARN NET/IB : Got completion with error 4, opcode 0, len 32694, vendor err 81")]


def test_a_401_from_the_hub_names_the_token_at_medium():
    # boheumd/MA-LMM#9 (requests' form), huggingface/huggingface_hub#2847 (hf_raise_for_status' form),
    # huggingface/candle#418 (a Rust client's form; the heldout-5 case fz5-gated-01)
    for text in ("HTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/llm/vicuna-7b/resolve/main/"
                 "tokenizer_config.json",
                 "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root=1-67aa2e37)\n\n"
                 "Repository Not Found for url: https://huggingface.co/openai-community/gpt2/resolve/main/config.json.",
                 "Error: request error: https://huggingface.co/meta-llama/Llama-2-7b-hf/resolve/main/tokenizer.json: "
                 "status code 401"):
        first = _first(text)
        assert (first.id, first.confidence) == ("hf-gated-repo-token", "medium"), _ranked(text)


def test_a_missing_nvml_library_in_the_container_toolkit_names_the_driver_at_medium():
    # NVIDIA/nvidia-docker#1711 (after a reboot the driver was gone), docker/for-win#13835 ("drivers not installed")
    text = ("nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: cannot open shared "
            "object file: no such file or directory: unknown.")
    first = _first(text)
    assert (first.id, first.confidence) == ("driver-not-loaded", "medium")


def test_a_client_worded_unknown_model_names_the_served_name_at_medium():
    # CraftJarvis/JarvisVLA#5 (heldout-4 fz4-served-02: a client library re-raises vLLM's 404 in its own words)
    text = ("When I run `CUDA_VISIBLE_DEVICES=0 vllm serve jarvis_vla_qwen2_vl_7b_sft --port 8000` and call it, I get:\n"
            "requests.exceptions.HTTPError: The request model: jarvis_vla_qwen2_vl_7b_sft does not exist!")
    first = _first(text)
    assert (first.id, first.confidence) == ("served-model-name-mismatch", "medium")


# --------------------------------------------------------------------------- the component's own error: high

def test_ncclsocketinit_with_no_address_family_is_the_socket_ifname():
    # NVIDIA/nccl#1837 (heldout-5 fz5-ifname-01): NCCL_SOCKET_IFNAME=eth2 on nodes without eth2
    text = ("[trainer0|0]:ncclInternalError: Internal check failed.\n[trainer0|0]:Last error:\n"
            "[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor AF_INET6(10)")
    assert _first(text).id == "socket-ifname-invalid"


def test_nvml_driver_library_mismatch_is_its_own_cause_not_version_skew():
    # illinois-scicomp/machine-shop-maintenance#70 (kernel module 520, nvidia-smi 525), NVIDIA/nvidia-container-toolkit#394
    for text in ("kgk2@bock:~$ nvidia-smi\nFailed to initialize NVML: Driver/library version mismatch",
                 "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch: unknown."):
        first = _first(text)
        assert (first.id, first.confidence) == ("nvml-driver-library-mismatch", "high"), _ranked(text)
        assert "reboot" in first.fix


def test_a_request_over_max_model_len_extracts_both_lengths():
    # vllm-project/vllm#20409 (heldout-5 fz5-ctx-01); vLLM 0.32.0's wording (vllm/renderers/params.py:528)
    first = _first("ValueError: This model's maximum context length is 16384 tokens. However, you requested 122946 "
                   "tokens (112946 in the messages, 10000 in the completion).")
    assert first.id == "request-over-max-model-len" and "16384" in first.fix and "122946" in first.fix
    now = _first("This model's maximum context length is 4096 tokens. However, your prompt contains 5000 input tokens, "
                 "which exceeds this limit even without any output tokens.")
    assert now.id == "request-over-max-model-len" and "5000 input tokens" in now.fix
    # a KV pool smaller than max_model_len at start-up is the other entry
    assert _first("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be "
                  "stored in KV cache (3664).").id == "kv-cache-below-max-model-len"


def test_a_chat_request_without_a_chat_template_is_named():
    # vllm-project/vllm#29849 (DeepSeek-V3.2)
    first = _first("ValueError: As of transformers v4.44, default chat template is no longer allowed, so you must "
                   "provide a chat template if the tokenizer does not define one.")
    assert (first.id, first.confidence) == ("chat-template-missing", "high") and "--chat-template" in first.fix


def test_a_rust_clients_enospc_is_a_full_disk():
    # huggingface/hf-hub#9 (heldout-5 fz5-disk-02: /run/user tmpfs of 2.4 GB)
    assert _first("Error: I/O error No space left on device (os error 28)").id == "disk-full"


# --------------------------------------------------------------------------- words

def test_raw_tool_call_text_in_the_answer_is_the_tool_parser():
    # NousResearch/hermes-agent#38376 (heldout-5 fz5-tool-01, Gemma 4 on DGX Spark: `<|tool_call>` left in the text)
    text = ("The symptom was that Hermes printed raw tool-call text like:\n\n  <|tool_call>call:terminal{...}<tool_call|>"
            "\n\n  instead of executing the tool.")
    assert _first(text).id == "tool-parser-missing"


def test_a_ray_oom_with_the_nodes_ram_ranks_the_memory_monitor_first():
    # OpenRLHF/OpenRLHF#1013 (heldout-4 fz4-rayoom-03)
    text = ("Two nodes, 8 GPUs and 512G of RAM each. With --vllm_enable_sleep the job dies with a ray oom error while "
            "loading the data or the model; without that flag it runs.")
    assert _first(text).id == "ray-memory-monitor-kill"


def test_cuda_visible_devices_indexed_by_the_physical_number_is_the_conflict():
    # unslothai/unsloth-zoo#46 (heldout-4 fz4-cvd-02)
    text = "If I set CUDA_VISIBLE_DEVICES=1, the vllm device is set to cuda:1, which is wrong: CUDA only sees GPU 1, as cuda:0."
    assert _first(text).id == "cuda-visible-devices-conflict"


def test_a_firewall_outside_the_multi_node_start_is_not_the_master_port():
    # nextcloud/nextcloudpi#917 (heldout-5 off-domain fz5-neg-03: ufw blocking ssh to a Raspberry Pi)
    text = ("Hi, when UFW is enabled, I loose sometimes my connexion and I can't connect to my rpi (ssh, website etc...).\n"
            "It is refused.\nWhen UFW is disabled, no more issues.")
    assert diagnose_text(text) == []
    # the same words with the rendezvous in them still are
    assert _first("With ufw enabled on the head, the worker's connection to the master port 29501 is refused and the "
                  "start hangs.").id == "firewall-master-port"


def test_the_engine_cores_generic_death_line_is_a_symptom_not_a_confident_name():
    # the four-node lab's Ray head log (docs/four-nodes.md, corpus rcpu-01): the start error above it is the cause
    text = ('File ".../vllm/v1/executor/ray_utils.py", line 574, in initialize_ray_cluster\n    raise ValueError(\n'
            "ValueError: current platform cpu does not support ray.\n"
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    assert _first(text).id == "ray-cpu-platform"
    alone = _first("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    assert (alone.id, alone.confidence) == ("memory-pinned-after-failed-start", "medium")
