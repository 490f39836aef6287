"""The engine's own start-up refusals and the API's: a KV cache smaller than max_model_len, CUDA out of memory
while loading or capturing graphs, tool calls without (or with the wrong) tool-call parser, a request longer than
the served max_model_len, and a chat request to a model without a chat template. Each extracts the numbers or
names the fix needs."""
from __future__ import annotations

from .entry import DEGRADED, FATAL, Entry, either, extracting


#: vLLM's KV check at start-up: V1 vllm/v1/core/kv_cache_utils.py:1030 at vllm 0.32.0 (the lab's pin; :1011 "No
#: available memory for the cache blocks") ("To serve at
#: least one request with the models's max seq len (X), (Y GiB KV cache is needed, which is larger than the
#: available KV cache memory (Z GiB). Based on the available memory, the estimated maximum model length is W.");
#: V0 vllm/worker/worker.py raise_if_cache_size_invalid ("The model's max seq len (X) is larger than the maximum
#: number of tokens that can be stored in KV cache (N).")
_KV = (r"max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number of tokens that can be stored in "
       r"KV cache \((?P<kv_tokens>\d+)\)",
       r"max seq len \((?P<max_model_len>\d+)\), \((?P<needed_gib>[\d.]+) GiB KV cache is needed, which is larger than "
       r"the available KV cache memory \((?P<available_gib>[\d.]+) GiB\)(?:.{0,80}?estimated maximum model length is "
       r"(?P<kv_tokens>\d+))?",
       r"No available memory for the cache blocks")

KV_CACHE_BELOW_MAX_MODEL_LEN = Entry(
    "kv-cache-below-max-model-len", "The KV cache cannot hold one request of max_model_len", FATAL,
    symptom="the start stops after profiling with `max seq len (X) is larger than ... KV cache (N)` or `... KV "
            "cache is needed, which is larger than the available KV cache memory`",
    detect="vLLM's start-up KV check in a rank log; max_model_len and the KV pool (tokens or GiB) are extracted",
    cause="after the weights and the profiled activations, the memory left for the KV cache "
          "(gpu_memory_utilization's share) holds fewer tokens than one request of max_model_len",
    fix="lower MAX_MODEL_LEN to at most {kv_tokens} tokens (it asked for {max_model_len}), or raise "
        "GPU_MEMORY_UTILIZATION if MemAvailable allows it, or use an fp8 KV cache dtype; then start again",
    proof="grep -E 'KV cache|max seq len|maximum model length' <head rank log>",
    signature=extracting(*_KV),
    source="vllm-project/vllm vllm/v1/core/kv_cache_utils.py:1011,1030 @ v0.32.0 (check_enough_kv_cache_memory); "
           "vllm/worker/worker.py raise_if_cache_size_invalid (V0, before 0.10); report vllm-project/vllm#10517",
    words=(r"max[_ ]model[_ ]len|max seq len|context (length|window)|"
           # the check's outcome told without the length: the KV cache reported insufficient once the weights are
           # loaded (vLLM runs the check right after loading and profiling); in Chinese, 不足 / 不够 ("not enough"),
           # heldout-9's fz9-kv-01 (vllm-project/vllm-ascend#9099)
           r"kv[- _]?cache\s*(is |was )?(不足|不够|insufficient|not (big |large )?enough|too small)|"
           r"(insufficient|not enough) (gpu memory for (the )?)?kv[- _]?cache",
           r"kv[- _]?cache|kv pool|cache blocks",
           r"too (small|large|big)|larger than|not enough|insufficient|不足|不够|does not fit|won'?t fit|lower"),
    lab="none yet: a lab start with MAX_MODEL_LEN above its 1 GiB KV pool would produce it")

#: torch's allocator on OOM (c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate X GiB.
#: GPU N has a total capacity of ..."), counted here only during vLLM's start-up: loading weights, the profile
#: run or CUDA-graph capture (vllm/v1/worker/gpu_model_runner.py load_model / profile_run / capture_model)
#: torch's graph-capture API is a phase too: vLLM captures through `with torch.cuda.graph(` (vllm/compilation/
#: cuda_graph.py:314 @ v0.32.0), whose CUDAGraph.capture_begin / capture_end (torch/cuda/graphs.py:120,160 @ 2.13.0)
#: appear as frames of a capture traceback
_OOM_PHASE = (r"(?:Loading (?:model )?weights|load_model|profile_run|_dummy_run|[Cc]apturing CUDA graph|capture_model|"
              r"cuda[ _]?graph|torch\.cuda\.graph\(|capture_(?:begin|end)\b|compile_or_warm_up_model|"
              r"determine_available_memory|_dummy_sampler_run)")
#: besides the allocator's message, a CUDA call of its own can fail with the runtime's cudaErrorMemoryAllocation
#: string, "CUDA error: out of memory" (raised through C10_CUDA_CHECK, e.g. by capture_end), with no size printed
_OOM = (r"(?:OutOfMemoryError|RuntimeError): CUDA out of memory\. Tried to allocate (?P<tried>[\d.]+ [GM]iB)",
        (r"CUDA error: out of memory", {"tried": "a CUDA call's own allocation (no size printed)"}))
#: vLLM's own start-up OOM messages need no phase line: they say it (vllm/v1/worker/gpu_model_runner.py:5140
#: "Failed to load model - not enough GPU memory", :5991 "CUDA out of memory occurred when warming up sampler with N
#: dummy requests", :6094 the pooler's @ v0.32.0)
_OOM_OWN = ((r"Failed to load model - not enough GPU memory(?:.{0,400}?Tried to allocate (?P<tried>[\d.]+ [GM]iB))?",
             {"tried": "the weights' own allocation"}),
            (r"CUDA out of memory occurred when warming up (?P<warmup>sampler|pooler) with (?P<num_reqs>\d+) dummy "
             r"requests", {"tried": "the sampler/pooler warm-up's activations"}))

CUDA_OOM_STARTUP = Entry(
    "cuda-oom-startup", "CUDA out of memory while the engine starts (weights, profiling or graph capture)", FATAL,
    symptom="the start dies with `CUDA out of memory. Tried to allocate ...` while loading weights, profiling or "
            "capturing CUDA graphs",
    detect="torch's `OutOfMemoryError: CUDA out of memory. Tried to allocate N` (or a CUDA call's `CUDA error: out "
           "of memory`) after vLLM's weight loading, profile run or CUDA-graph capture lines (or torch's capture "
           "frames) in the same log, or vLLM's own `Failed to load model - not enough GPU memory` / `CUDA out of "
           "memory occurred when warming up sampler`; the allocation size is extracted",
    cause="gpu_memory_utilization leaves too little for the start-up's own peaks (activations of "
          "max_num_batched_tokens, the graphs of every capture size) beside the weights; on GB10 page cache and "
          "other processes also count as used",
    fix="the failed allocation was {tried}: lower GPU_MEMORY_UTILIZATION or MAX_NUM_BATCHED_TOKENS (MAX_NUM_SEQS for "
        "the sampler warm-up), capture fewer "
        "graph sizes (--cuda-graph-sizes / --enforce-eager to confirm), and free page cache and other GPU users "
        "before the start",
    proof="grep -nE 'out of memory|Capturing CUDA graph|Loading weights' <rank log>; free -g",
    signature=either(extracting(*_OOM_OWN), extracting(*_OOM, after=(_OOM_PHASE, 20000))),
    source="pytorch c10/cuda/CUDACachingAllocator.cpp (the OOM message); vllm-project/vllm "
           "vllm/v1/worker/gpu_model_runner.py:5140 (Failed to load model - not enough GPU memory), :5991 (CUDA out of "
           "memory occurred when warming up sampler), "
           ":5028 load_model, :6133 profile_run, :6482 capture_model (:6657 "
           "'Capturing CUDA graphs'), vllm/compilation/cuda_graph.py:314 (torch.cuda.graph) @ v0.32.0; torch/cuda/"
           "graphs.py:120,160 @ 2.13.0 (capture_begin/end); reports vllm-project/vllm#46307, vllm-project/vllm#7593 (OOM "
           "while capturing CUDA graphs), vllm-project/vllm#19186, vllm-project/vllm#17939 (the sampler warm-up's OOM); "
           "prose: vllm-project/vllm#188 (`loading Qwen1.5 7B model ... throws a torch.cuda.OutOfMemoryError`), "
           "vllm-project/vllm#13582 (heldout-8's fz8-oomstart-01)",
    words=(r"cuda out of memory|\boom(s|ed|ing)?\b(?![- ]?kill)|out of memory(?!: kill)|runs? out of (gpu |cuda |device )?memory|"
           r"\b(torch\.(cuda\.)?)?outofmemoryerror\b",
           # how reporters say "at start-up": the server/engine starting, or the model being started, loaded or served
           # ("server to start DeepSeek-R1 model", "loading Qwen1.5 7B model": vllm-project/vllm#188)
           r"(graph|cudagraph) captur\w*|captur\w+ (cuda )?graphs?|start[- ]?up|(server|engine|vllm|vllm serve) "
           r"(to )?(start|boot|launch)\w*|(while|when|during|at) (the server |vllm |the engine )?(start|boot|launch)(ing|s)?\b|"
           r"load\w* (the )?weights|profil\w+|"
           r"\b(start\w*|launch\w*|load\w*|serv(e|es|ed|ing))\b (up )?(the |a |my )?([\w.-]+ ){0,3}models?\b",
           r"gpu[_ ]memory[_ ]utili[sz]ation|enforce[- ]eager|max[_ ]num[_ ]batched"),
    lab="none: the lab has no GPU")

#: vLLM's chat endpoint without a parser (vllm/renderers/online_renderer.py:268,278 @ v0.32.0; serving_chat.py in
#: older releases: '"auto" tool choice requires
#: --enable-auto-tool-choice and --tool-call-parser to be set', 'tool_choice="required" requires
#: --tool-call-parser to be set') and the start-up check of the parser name
#: (vllm/entrypoints/launchers/launcher.py:362 validate_api_server_args: "invalid tool call parser: X (chose from { ... })")
_TOOL = (r"(?P<what>\\?\"?auto\\?\"? tool choice) requires --enable-auto-tool-choice and --tool-call-parser to be set",
         r"tool_choice=\\?\"?(?P<what>[\w\"\\]+?)\\?\"? requires --tool-call-parser to be set",
         r"requires --tool-call-parser to be set",
         r"invalid tool call parser: (?P<parser>[\w.-]+)")

TOOL_PARSER_MISSING = Entry(
    "tool-parser-missing", "Tool calls without a tool-call parser (or with an unknown one)", FATAL,
    symptom="requests with `tools` get HTTP 400 `... requires --tool-call-parser to be set`, or the start fails "
            "with `invalid tool call parser: X`",
    detect="vLLM's tool-choice refusal in an API answer or log, or the parser registry's `invalid tool call "
           "parser: <name>`; the parser name is extracted",
    cause="the server was started without --enable-auto-tool-choice / --tool-call-parser, or with a parser name "
          "this vLLM build does not register (names change between releases and forks)",
    fix="start with `--enable-auto-tool-choice --tool-call-parser <the model family's parser>` (the model card "
        "names it; `vllm serve --help` lists the registered ones: a name the log calls invalid is not one of them)",
    proof="grep -n 'tool-call-parser\\|tool_call_parser' <launch plan>; vllm serve --help | grep -A3 tool-call-parser",
    signature=extracting(*_TOOL),
    source="vllm-project/vllm vllm/renderers/online_renderer.py:268,278 (tool_choice checks), "
           "vllm/entrypoints/launchers/launcher.py:362 (invalid tool call parser), vllm/parser/gemma4.py:40 (Gemma 4's "
           "`<|tool_call>` opener, left in the text without its parser) @ v0.32.0; reports vllm-project/vllm#55754, langchain4j/langchain4j#3475 (the refusal "
           "JSON-escaped in an OpenAI-style error)",
    # the anchor: the flags, or the API's own symptom of a missing or wrong parser (the call left in `content`,
    # `tool_calls` empty); the second cue also knows the parser names vLLM registers
    # (vllm/tool_parsers/__init__.py _TOOL_PARSERS_TO_REGISTER @ v0.32.0)
    # (`<|tool_call>`: Gemma 4's opener, vllm/parser/gemma4.py:40 @ v0.32.0; `<tool_call>`: Hermes/Qwen/GLM's, left as
    # raw text when no parser takes it out)
    words=(r"tool[- _]call[- _]parser|tool parser|enable[- _]auto[- _]tool[- _]choice|"
           r"tool[ _]calls?\b.{0,80}\b(in|inside|into|as) (the )?(`?content`?|plain text|text|message)\b|"
           r"tool_calls\W{0,3}(is |are |was |were |stays? |comes? back )?(empty|\[\]|null|none|missing)|<\|?tool_call\|?>|"
           r"raw tool[- _]call (text|output|tokens?)|tool[- _]call\w*.{0,80}instead of (executing|calling|running)|"
           r"function[ _]call\w*.{0,80}\b(in|as) (the )?(`?content`?|plain text|text)\b",
           r"tool[ _]calls? (come|came|are|were|return\w*|show\w*)|(?<!auto_)tool_choice|function call\w*|\b400\b|"
           r"\b(hermes|llama3_json|llama4_json|llama4_pythonic|pythonic|mistral|qwen3_coder|qwen3_xml|qwen3_json|"
           r"deepseek_v3\d?|deepseek_v4\d?|glm4[57]|kimi_k[23]|granite\d*|xlam|minimax_m[23]|seed_oss|functiongemma|"
           r"gemma4|phi4_mini_json|jamba|internlm)\b",
           r"400|not set|missing|wrong|mismatch\w*|plain text|as text|in (the )?content|invalid"),
    lab="none yet: the lab's 06 tool step against a server started without a parser would produce it")


#: vLLM's length check of a request's prompt against the served max_model_len (vllm/renderers/params.py:389,528
#: @ v0.32.0: "This model's maximum context length is N tokens. However, your prompt contains M input tokens ...";
#: earlier releases: "However, you requested M tokens (P in the messages, C in the completion)"), answered as HTTP 400
_OVER_LEN = (r"maximum context length is (?P<max_model_len>\d+) tokens\. However, you requested (?P<asked>\d+) tokens",
             r"maximum context length is (?P<max_model_len>\d+) tokens\. However, your prompt contains (?:at least )?"
             r"(?P<asked>\d+ (?:input tokens|characters))",
             # the same check with the output budget named: "However, you requested N output tokens and your prompt
             # contains at least M input tokens" (quoted by clients that parse vLLM's 400s)
             r"maximum context length is (?P<max_model_len>\d+) tokens\. However, you requested \d+ output tokens and "
             r"your prompt contains (?:at least )?(?P<asked>\d+ input tokens)",
             # the V0 scheduler's refusal (vllm/core/scheduler.py _schedule_prefills, logger.warning "Input prompt (%d
             # tokens) is too long and exceeds limit of %d", the request FINISHED_IGNORED with empty output; in 0.6-0.7
             # the log prints scheduler.py:648 / :949); the limit is min(max_model_len, max_num_batched_tokens)
             # without chunked prefill
             r"Input prompt \((?P<asked>\d+) tokens\) is too long and exceeds limit of (?P<max_model_len>\d+)",
             # V1's input check (vllm/v1/engine/processor.py _validate_model_input, by function): "The decoder prompt
             # (length N) is longer than the maximum model length of M"
             r"prompt \(length (?P<asked>\d+)\) is longer than the maximum model length of (?P<max_model_len>\d+)")

REQUEST_OVER_MAX_MODEL_LEN = Entry(
    "request-over-max-model-len", "A request is longer than the served max_model_len", DEGRADED,
    symptom="a request gets HTTP 400 `This model's maximum context length is N tokens. However, you requested M "
            "tokens` while the server keeps serving others",
    detect="vLLM's length refusal in an API answer or a log; the served max_model_len and the request's length "
           "are extracted",
    cause="the prompt (plus max_tokens) of that request is longer than the server's max_model_len: a client that "
          "sends its whole history or asks for max_tokens up to the model card's context, not the served one",
    fix="the server serves {max_model_len} tokens and the request needed {asked}: shorten the prompt or max_tokens "
        "(clients can read max_model_len from /v1/models), or serve a larger MAX_MODEL_LEN if the KV cache holds it "
        "(kv-cache-below-max-model-len says when it does not)",
    proof="curl -s <api_url>/v1/models | python3 -m json.tool | grep max_model_len",
    signature=extracting(*_OVER_LEN),
    source="vllm-project/vllm vllm/renderers/params.py:389,528 @ v0.32.0; V0 vllm/core/scheduler.py "
           "_schedule_prefills (Input prompt ... exceeds limit of), V1 vllm/v1/engine/processor.py _validate_model_input "
           "(by function); reports gpustack/gpustack#929 (8204 tokens asked of an 8192-token server), "
           "vllm-project/vllm#13209, #13370 (V0's scheduler warning; --max-model-len with --max-num-batched-tokens fixed it)",
    words=(r"maximum context length|context (length|window) (exceeded|is too (short|small))|"
           r"(exceeds?|longer than|over) (the )?(max_model_len|max[- _]model[- _]len|context (length|window))",
           r"\b400\b|request\w*|prompt|max_tokens|messages?|tokens"),
    lab="none yet: a lab request longer than the tiny model's max_model_len would produce it")

#: vLLM's chat-template resolution (vllm/renderers/hf.py:797-801 @ v0.32.0, ChatTemplateResolutionError, and the
#: same text in vllm/entrypoints/openai/chat_completion/protocol.py:362): the tokenizer defines no chat_template and
#: none was passed
_NO_TEMPLATE = (r"default chat template is no longer allowed, so you must provide a chat template",
                r"ChatTemplateResolutionError",
                )
#: transformers' own refusal (tokenization_utils_base.py:3271 get_chat_template @ 5.19.0; older releases: "Cannot use
#: apply_chat_template() because tokenizer.chat_template is not set"), and a processor's (processing_utils.py:2054 @
#: 5.19.0). Any transformers user meets it (a trainer, a notebook): it is this entry only where the text shows a
#: server answering a chat request (vLLM, SGLang, an OpenAI-style error or endpoint)
_HF_NO_TEMPLATE = (r"Cannot use (?:chat template functions|apply_chat_template(?:\(\))?) because "
                   r"(?P<owner>tokenizer)\.chat_template is not set",
                   r"Cannot use apply_chat_template because this (?P<owner>processor) does not have a chat template")
_SERVING = (r"\bvllm\b|sglang|/v1/|chat[/ _]completions|\"object\": ?\"error\"|BadRequestError|api[_ ]server|"
            r"serving_chat|\bOpenAI\b|invalid_request_error|\bserv(?:e|er|ing)\b|\bendpoint\b")

CHAT_TEMPLATE_MISSING = Entry(
    "chat-template-missing", "A chat request to a model without a chat template", DEGRADED,
    symptom="/v1/chat/completions answers HTTP 400 `As of transformers v4.44, default chat template is no longer "
            "allowed ...` while /v1/completions works",
    detect="vLLM's ChatTemplateResolutionError text in an API answer or a log, or transformers' `Cannot use chat "
           "template functions because tokenizer.chat_template is not set` (a processor's: `does not have a chat "
           "template`) where the text shows a server (vLLM, SGLang, an OpenAI-style endpoint or error); which object "
           "lacks the template is extracted",
    cause="the served model's tokenizer defines no chat_template (a base model, or a quantized or converted copy "
          "that lost tokenizer_config.json's template or its chat_template.jinja) and the server got no "
          "--chat-template",
    fix="the {owner} has no chat template: start with `--chat-template <the original model's template .jinja>` (or "
        "copy chat_template.jinja from the original (instruct) repo into the weights folder), or use /v1/completions "
        "for a base model",
    proof="python3 -c \"import json;print('chat_template' in json.load(open('<weights>/tokenizer_config.json')))\"; "
          "ls <weights>/chat_template.jinja",
    signature=either(extracting(*[(p, {"owner": "tokenizer"}) for p in _NO_TEMPLATE]),
                      extracting(*_HF_NO_TEMPLATE, within=_SERVING)),
    source="vllm-project/vllm vllm/renderers/hf.py:797-801, vllm/entrypoints/openai/chat_completion/protocol.py:362 "
           "@ v0.32.0; huggingface/transformers src/transformers/tokenization_utils_base.py:3271 (get_chat_template), "
           "processing_utils.py:2054 @ 5.19.0; reports THUDM/LongWriter#39, vllm-project/vllm#29849, "
           "sgl-project/sglang#3385 (a base Llama-3.2-1B has no template), OpenRLHF/OpenRLHF#613",
    words=(r"chat[- _]template",
           r"no longer allowed|missing|does not define|doesn'?t (have|define)|not (found|defined)|\b400\b|--chat-template|"
           r"\bvllm\b|sglang|/v1/chat|chat (request|completion)s?\b"),
    lab="none yet: the lab's tiny model served without its chat template would produce it")
