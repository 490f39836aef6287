"""vLLM's own refusals of a start-up configuration, and the launch configurations NCCL and vLLM's Ray executor
refuse across ranks (issue 36's sixth round, breadth): attention heads not divisible by the tensor-parallel size, a
model architecture the build does not register, a quantization method the GPU's compute capability lacks,
max_num_batched_tokens below max_model_len, a repository that needs --trust-remote-code, two Ray nodes reporting the
same IP, and two ranks on one GPU.

Each is the emitting component's own error, naming its cause (a "high" line), and each extracts the numbers or names
its fix needs. Emitting lines are cited at the versions the lab installs (vLLM 0.32.0, transformers 5.19.0) and at
NCCL's tag."""
from __future__ import annotations

from .container import STACK, beside
from .entry import FATAL, Entry, either, extracting

# --------------------------------------------------------------------------- heads not divisible by the TP size

#: vllm/config/model.py:1547-1551 @ v0.32.0 (ModelConfig.verify_with_parallel_config): "Total number of attention
#: heads ({total}) must be divisible by tensor parallel size ({tp})."
_TP_HEADS = (r"Total number of attention heads \((?P<heads>\d+)\) must be divisible by tensor parallel size "
             r"\((?P<tp>\d+)\)",)

TP_SIZE_NOT_DIVISIBLE = Entry(
    "tp-size-not-divisible", "The model's attention heads do not divide by the tensor-parallel size", FATAL,
    symptom="the start stops at once with `ValueError: Total number of attention heads (N) must be divisible by "
            "tensor parallel size (M)`",
    detect="vLLM's own check of the model's head count against --tensor-parallel-size; both numbers are extracted",
    cause="tensor parallelism splits the attention heads evenly over the ranks: a TP size that does not divide the "
          "model's head count (3 nodes for a 32- or 40-head model, 8 GPUs for a 28-head one) cannot shard it",
    fix="the model has {heads} attention heads and TP is {tp}: choose a TP size that divides {heads} (spread the rest "
        "over pipeline parallelism: TP x PP = the number of ranks, e.g. TP 2 x PP 2 on four nodes), or a model whose "
        "head count the node count divides",
    proof="python3 -c \"import json;c=json.load(open('<weights>/config.json'));print(c.get('num_attention_heads'), "
          "c.get('num_key_value_heads'))\"",
    signature=extracting(*_TP_HEADS),
    source="vllm-project/vllm vllm/config/model.py:1547-1551 @ v0.32.0 (verify_with_parallel_config); reports "
           "vllm-project/vllm#414 (52 heads on 3 GPUs), vllm-project/vllm#2652, THU-KEG/AdaptThink#1 (28 heads, TP 8)",
    words=(r"(attention )?heads?\b.{0,60}\b(not )?divisible|divisible by (the )?tensor[- _]parallel|"
           r"(heads?|head count)\b.{0,40}\b(doesn'?t|does not|won'?t|can'?t|cannot) (divide|split)",
           r"tensor[- _]parallel|\btp\b|--tensor-parallel-size|\b(three|3|5|6|7) (nodes|gpus|sparks)\b",
           r"vllm|start\w*|fail\w*|error|refus\w*"),
    lab="none yet: a lab start of a model whose head count the lab's TP does not divide would produce it")

# --------------------------------------------------------------------------- the build does not know the architecture

#: vllm/model_executor/models/registry.py:1205-1208 @ v0.32.0 (_raise_for_unsupported): "Model architectures [...] are
#: not supported for now. Supported architectures: ..."; the plugin variant at :1199; transformers' own
#: configuration_auto.py:430-432 @ 5.19.0: "The checkpoint you are trying to load has model type `X` but Transformers
#: does not recognize this architecture" (the image's transformers is older than the model)
_ARCH = ((r"Model architectures? \[?'?(?P<arch>[\w.]+)'?[^\n]{0,80}?\]? (?:are|is) not supported for now",
          {"who": "this vLLM build"}),
         (r"Model architecture (?P<arch>[\w.]+) is not supported in-tree anymore", {"who": "this vLLM build (an "
                                                                                           "out-of-tree plugin now)"}),
         (r"has model type `(?P<arch>[\w.-]+)` but Transformers does not recognize this architecture",
          {"who": "the image's transformers"}))

MODEL_ARCHITECTURE_UNSUPPORTED = Entry(
    "model-architecture-unsupported", "The engine build does not know the model's architecture", FATAL,
    symptom="the start stops with `Model architectures ['X'] are not supported for now` or transformers' `has model "
            "type `x` but Transformers does not recognize this architecture`",
    detect="vLLM's registry refusal, or transformers' unknown model_type; the architecture is extracted",
    cause="the model is newer than the image (its architecture was added to vLLM or transformers in a later "
          "release), or the import of the model's module failed in this build (a kernel or dependency error logged "
          "above the refusal, which vLLM then reports as unsupported)",
    fix="{who} does not register {arch}: use an image whose vLLM and transformers support the model (the model "
        "card names the minimum versions), or read the traceback above the refusal (an `Error in inspecting model "
        "architecture` names the import that failed)",
    proof="python3 -c \"import vllm;from vllm import ModelRegistry;print('{arch}' in "
          "ModelRegistry.get_supported_archs(), vllm.__version__)\"",
    # transformers' own message (any transformers user meets it) counts only beside the serving stack
    signature=either(extracting(*_ARCH[:2]), beside(STACK, _ARCH[2])),
    source="vllm-project/vllm vllm/model_executor/models/registry.py:1199,1205-1208 @ v0.32.0; huggingface/transformers "
           "src/transformers/models/auto/configuration_auto.py:430-432 @ 5.19.0; reports vllm-project/vllm#22231 "
           "(Qwen3ForCausalLM on an old build), vllm-project/vllm#9377 (an import error reported as unsupported)",
    words=(r"(architecture|model type)\b.{0,60}\b(not supported|unsupported|not recogni[sz]ed|does ?n[o']t recogni[sz]e)|"
           r"(not supported|unsupported)\b.{0,40}\barchitecture|(does ?n[o']t|do ?n[o']t|does not|do not) (yet )?support "
           r"(the |this |my |our )?(model'?s? )?architecture",
           r"vllm|transformers|\bimage\b|version|upgrad\w*|new(er)? model",
           r"start\w*|load\w*|serve|fail\w*|error"),
    lab="none yet: a lab start of a model the CPU build does not register would produce it")

# --------------------------------------------------------------------------- quantization vs compute capability

#: vllm/config/vllm.py:901-906 @ v0.32.0 (VllmConfig._get_quantization_config): "The quantization method {q} is not
#: supported for the current GPU. Minimum capability: {min}. Current capability: {cur}."
_QUANT = (r"The quantization method (?P<method>[\w-]+) is not supported for the current GPU\. Minimum capability: "
          r"(?P<min_capability>\d+)\. Current capability: (?P<capability>\d+)",)

QUANTIZATION_UNSUPPORTED_ON_GPU = Entry(
    "quantization-unsupported-on-gpu", "The checkpoint's quantization needs a newer GPU architecture", FATAL,
    symptom="the start stops with `The quantization method fp8 is not supported for the current GPU. Minimum "
            "capability: 89. Current capability: 86.`",
    detect="vLLM's capability check of the quantization method; the method and both capabilities are extracted",
    cause="the checkpoint is quantized with a method whose kernels need a newer compute capability than this GPU's "
          "(FP8 below sm_89, NVFP4 below sm_100, Marlin kernels below sm_80), or a build that reports the wrong "
          "capability for a new GPU",
    fix="{method} needs compute capability {min_capability} and this GPU has {capability}: use a checkpoint quantized "
        "for this GPU (another quantization, or BF16), or a newer GPU; on a GB10 (121) check the build knows its "
        "arch (engine-build-arch-missing)",
    proof="nvidia-smi --query-gpu=name,compute_cap --format=csv; grep -A3 quantization_config <weights>/config.json",
    signature=extracting(*_QUANT),
    source="vllm-project/vllm vllm/config/vllm.py:901-906 @ v0.32.0 (_get_quantization_config); report "
           "vllm-project/vllm#4327 (fp8 on capability 86, through Ray workers)",
    words=(r"quantiz\w*\b.{0,80}\b(not supported|unsupported)\b.{0,40}\b(gpu|card|capability|arch\w*)|"
           r"(minimum|compute) capability",
           r"fp8|fp4|nvfp4|mxfp4|awq|gptq|marlin|int4|int8|quantiz\w*",
           r"vllm|\bsm_?\d+|ampere|hopper|blackwell|\bgpu\b|3090|a100|4090"),
    lab="none: the lab has no GPU")

# --------------------------------------------------------------------------- max_num_batched_tokens below max_model_len

#: vllm/config/scheduler.py:319-326 @ v0.32.0 (SchedulerConfig.verify_max_model_len, chunked prefill off):
#: "max_num_batched_tokens (N) is smaller than max_model_len (M). This effectively limits the maximum sequence length
#: to max_num_batched_tokens and makes vLLM reject longer sequences."
_MNBT = (r"max_num_batched_tokens \((?P<max_num_batched_tokens>\d+)\) is smaller than max_model_len "
         r"\((?P<max_model_len>\d+)\)",)

MAX_NUM_BATCHED_TOKENS_BELOW_MAX_MODEL_LEN = Entry(
    "max-num-batched-tokens-below-max-model-len", "max_num_batched_tokens is below max_model_len (chunked prefill off)",
    FATAL,
    symptom="the start stops with `max_num_batched_tokens (N) is smaller than max_model_len (M)`",
    detect="vLLM's scheduler check; both numbers are extracted",
    cause="without chunked prefill a whole prompt must fit one batch, so max_num_batched_tokens must be at least "
          "max_model_len; chunked prefill was turned off (--no-enable-chunked-prefill, a model or backend without "
          "it) while MAX_NUM_BATCHED_TOKENS stayed below the served length",
    fix="max_num_batched_tokens is {max_num_batched_tokens} and max_model_len {max_model_len}: raise "
        "--max-num-batched-tokens to at least {max_model_len}, lower --max-model-len, or keep chunked prefill on",
    proof="grep -nE 'max_num_batched_tokens|max_model_len|chunked' <rank log> | head",
    signature=extracting(*_MNBT),
    source="vllm-project/vllm vllm/config/scheduler.py:319-326 @ v0.32.0 (verify_max_model_len); reports "
           "vllm-project/vllm#18681 (the two limits asked about), scaleapi/llm-engine#335 (max_num_batched_tokens "
           "raised above the context window to start)",
    words=(r"max[-_ ]num[-_ ]batched[-_ ]tokens\b.{0,60}\b(smaller|less|lower|below)\b.{0,30}\bmax[-_ ]model[-_ ]len|"
           r"max[-_ ]model[-_ ]len\b.{0,60}\b(larger|greater|bigger|above)\b.{0,30}\bmax[-_ ]num[-_ ]batched",
           r"chunked[- _]prefill|vllm|start\w*",
           r"fail\w*|error|refus\w*|reject\w*"),
    lab="none yet: a lab start with --no-enable-chunked-prefill and a small MAX_NUM_BATCHED_TOKENS would produce it")

# --------------------------------------------------------------------------- --trust-remote-code

#: vllm/transformers_utils/config.py:411-418 and vllm/tokenizers/hf.py:198-207 @ v0.32.0 re-raise transformers' refusal
#: as "Failed to load the model config. If the model is a custom model not yet available in the HuggingFace
#: transformers library, consider setting `trust_remote_code=True`"; transformers' own texts:
#: src/transformers/dynamic_module_utils.py:736-751 @ 5.19.0 ("The repository X contains custom code which must be
#: executed to correctly load the model"), and before 4.35 "Loading X requires you to execute the configuration file
#: in that repo on your local machine"
_TRUST = (r"The repository (?:for )?(?P<repo>[\w./-]+?) contains custom code which must be executed",
          r"Loading (?P<repo>[\w./-]+?) requires you to execute the (?:configuration|modeling|tokenizer) file in that "
          r"repo",
          (r"Failed to load the model config\. If the model is a custom model not yet available in the HuggingFace "
           r"transformers library, consider setting `trust_remote_code=True`", {"repo": "the model"}))

TRUST_REMOTE_CODE_REQUIRED = Entry(
    "trust-remote-code-required", "The model's repository needs --trust-remote-code", FATAL,
    symptom="the start stops with `... contains custom code which must be executed to correctly load the model` or "
            "`requires you to execute the configuration file in that repo ... set the option trust_remote_code=True`",
    detect="transformers' custom-code refusal (or vLLM's re-raise of it); the repository is extracted",
    cause="the model's config or modeling code lives in its repository (auto_map), not in the installed "
          "transformers; without --trust-remote-code it is not run, so the config cannot load (in a container a "
          "prompt to allow it cannot be answered either)",
    fix="{repo} ships its own code: read it, then start with --trust-remote-code on every rank (EXTRA_ARGS), or use "
        "an image whose transformers supports the model natively",
    proof="grep -n auto_map <weights>/config.json; ls <weights>/*.py",
    # transformers' own refusals count only beside the serving stack; vLLM's re-raise always
    signature=either(extracting(_TRUST[2]), beside(STACK, *_TRUST[:2])),
    source="vllm-project/vllm vllm/transformers_utils/config.py:411-418, vllm/tokenizers/hf.py:198-207 @ v0.32.0; "
           "huggingface/transformers src/transformers/dynamic_module_utils.py:736-751 @ 5.19.0; reports "
           "vllm-project/vllm#9531 (InternVL2: requires you to execute the configuration file), "
           "runpod-workers/worker-vllm#43 (contains custom code, EOFError in a container)",
    # a tokenizer class transformers does not know gets the same advice from vLLM, but an old transformers causes it too
    symptoms=(r"Failed to load the tokenizer\. If the tokenizer is a custom tokenizer not yet available in the "
              r"HuggingFace transformers library",),
    # the flag in a pasted command line is no cue: a report that it was missing or needed is
    words=(r"(without|needs?|requires?|required|missing|forgot|add(ing|ed)?|pass(ing|ed)?|set(ting)?)\W+(\w+\W+){0,2}"
           r"(--)?trust[-_ ]remote[-_ ]code|custom code (which )?must be executed|execute the configuration file",
           r"vllm|model|repo\w*|config",
           r"fail\w*|error|refus\w*|won'?t (load|start)|can'?t load"),
    lab="none yet: a lab model with an auto_map entry would produce it")

# --------------------------------------------------------------------------- two Ray nodes with one IP

#: vllm/v1/executor/ray_executor.py:310-318 @ v0.32.0 (_init_workers_ray): "Every node should have a unique IP address.
#: Got N nodes with node ids [...] and M unique IP addresses {...}. Please check your network configuration. If you set
#: `VLLM_HOST_IP` environment variable, make sure it is unique for each node."
_UNIQUE_IP = (r"Every node should have a unique IP address\. Got (?P<n_nodes>\d+) nodes with node ids [^\n]*? and "
              r"(?P<n_ips>\d+) unique IP addresses (?P<ips>\{[^}\n]*\})",
              r"Every node should have a unique IP address")

RAY_DUPLICATE_NODE_IP = Entry(
    "ray-duplicate-node-ip", "The Ray nodes and the driver report IPs that do not match one per node", FATAL,
    symptom="vLLM on Ray stops with `Every node should have a unique IP address. Got 2 nodes ... and 1 unique IP "
            "addresses`",
    detect="vLLM's Ray-executor check of the workers' and driver's IPs against the Ray node count; the counts and "
           "addresses are extracted",
    cause="the IPs the ranks report do not map one to one onto the Ray nodes: containers on a docker bridge all "
          "report 172.17.0.x, VLLM_HOST_IP was copied from the head to the workers (one IP for two nodes), or a "
          "multi-NIC node reports another interface than the one `ray start --node-ip-address` used (more IPs than "
          "nodes)",
    fix="vLLM saw {n_nodes} Ray nodes and {n_ips} unique IPs {ips}: run the containers with --network host, set "
        "VLLM_HOST_IP on each node to that node's own fabric address (never the head's), and start Ray on each node "
        "with --node-ip-address set to the same address",
    proof="ray status; docker exec <rank container> sh -c 'echo $VLLM_HOST_IP; hostname -I'   # on every node",
    signature=extracting(*_UNIQUE_IP),
    source="vllm-project/vllm vllm/v1/executor/ray_executor.py:310-318 @ v0.32.0 (_init_workers_ray); reports "
           "ray-project/ray#63917 (vLLM workers on a docker network), vllm-project/vllm#43095 (multi-NIC nodes: more "
           "IPs than nodes)",
    words=(r"unique ip|same ip|(one|single|identical) ip (address )?for (both|all|two)|ip addresses? (are|is) (the )?same|"
           r"vllm_host_ip\b.{0,60}\b(same|copied|identical|both)",
           r"\bray\b|vllm_host_ip|node-ip-address|docker|bridge|172\.17\.",
           r"\bnodes?\b|worker|head"),
    lab="none yet: two lab Ray nodes given one VLLM_HOST_IP would produce it")

# --------------------------------------------------------------------------- two ranks on one GPU

#: NVIDIA/nccl src/init.cc:904 @ v2.28.9-1 (initTransportsRank, after the first all-gather): WARN("Duplicate GPU
#: detected : rank %d and rank %d both on CUDA device %lx") and ncclInvalidUsage
_DUP_GPU = (r"Duplicate GPU detected : rank (?P<rank>\d+) and rank (?P<peer>\d+) both on CUDA device (?P<bus_id>[0-9a-f]+)",)

NCCL_DUPLICATE_GPU = Entry(
    "nccl-duplicate-gpu", "Two ranks on one host use the same GPU", FATAL,
    symptom="NCCL init fails with `invalid usage` and `Duplicate GPU detected : rank 1 and rank 0 both on CUDA device "
            "1000`",
    detect="NCCL's duplicate-GPU check (two ranks with the same host hash and bus id); the ranks and the bus id are "
           "extracted",
    cause="two ranks landed on the same GPU of one host: both ranks started on one node (a host list that names the "
          "same node twice, two containers on the head), every rank pinned to device 0 on a multi-GPU host, or two "
          "nodes that NCCL takes for one (cloned machines with the same hostname and boot id)",
    fix="ranks {rank} and {peer} share the GPU at bus id {bus_id}: check the launch put one rank per Spark (each "
        "node's host list entry once, its rank's container on that node), give each rank on a multi-GPU host its own "
        "device (LOCAL_RANK), and on cloned nodes set distinct hostnames",
    proof="nvidia-smi --query-gpu=pci.bus_id --format=csv; hostname; cat /proc/sys/kernel/random/boot_id   # on every node",
    signature=extracting(*_DUP_GPU),
    source="NVIDIA/nccl src/init.cc:904 @ v2.28.9-1 (initTransportsRank: Duplicate GPU detected); reports "
           "horovod/horovod#3929, huggingface/accelerate#2246 (a Slurm multi-node run), verl-project/verl#161 (Ray)",
    words=(r"duplicate gpu|same gpu|(both|two) ranks? (on|use|using|share|sharing) (the same|one|a single) (gpu|device)",
           r"nccl|rank|invalid usage",
           r"node|host|container|ray|slurm|torchrun|mpirun"),
    lab="none: the lab has no GPU")
