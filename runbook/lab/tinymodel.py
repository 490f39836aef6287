"""A tiny, random, locally made model for the lab's CPU vLLM server (no downloads).

    make_tiny_model(out_dir, arch="llama", rigged=True, seed=0) -> Path
    python -m runbook.lab.tinymodel --out DIR [--arch llama|qwen2|llava] [--no-rig] [--seed N]

Run it with the lab venv's python (`.lab/vllm-venv/bin/python -m runbook.lab.tinymodel ...`):
torch, transformers, tokenizers and safetensors live there, so they are imported inside functions
and this module stays importable from the project venv.

What it writes (about 9 MB):
- a byte-level BPE tokenizer (GPT-2 pre-tokenizer, vocab 2048) trained on the top-level stdlib
  `*.py` files of the running Python, with the ChatML / hermes special tokens, wrapped as
  `PreTrainedTokenizerFast` with a ChatML + hermes-tools chat template;
- a 2-layer `LlamaForCausalLM` / `Qwen2ForCausalLM` (hidden 256, intermediate 512, 4 heads, 2 KV
  heads, head_dim 64, max_position_embeddings 4096) with random fp32 weights in safetensors;
- `generation_config.json` with eos = [<|im_end|>, <|endoftext|>];
- `README.md`, a model card saying it is random and made locally.

The "rig" (default; `rigged=False` / `--no-rig` to skip) keeps residual dimension 0 constant
(embedding column 0 = 1; row 0 of every o_proj / down_proj = 0), so after the final RMSNorm it is a
constant and lm_head column 0 becomes a per-token logit bias: whitespace-only and control /
replacement-character tokens get -12, tokens containing `"` get +2. The model is otherwise random,
but grammar-guided JSON (tool calls, json_schema) then ends quickly, greedy included, instead of
looping on whitespace.

Deterministic: the same seed (on the same Python stdlib, torch and transformers versions) gives a
byte-identical `model.safetensors`. Weights are drawn from an explicit `torch.Generator` in sorted
parameter-name order, not from transformers' init.

`arch="llava"` (multimodal, see docs/lab-vllm.md) is `LlavaForConditionalGeneration`: the same tiny
Llama text model plus a tiny random CLIP vision tower (image 56x56, patch 14 -> 16 image tokens)
and a 2-layer projector, with a `LlavaProcessor` whose image processor is the PIL one
(`CLIPImageProcessorPil`): torchvision is not installed in the lab venv (the PyPI build is a CUDA
build that breaks transformers under CPU torch), and Qwen2-VL-style processors need it for video.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

from ..errors import LabError

ARCHS = ("llama", "qwen2", "llava")

VOCAB_SIZE = 2048
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
# The image placeholder of arch="llava" (expanded by LlavaProcessor to one token per image feature).
IMAGE_TOKEN = "<image>"
VISION_TOKENS = [IMAGE_TOKEN]
VISION_DIMS = {
    "image_size": 56,
    "patch_size": 14,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "projection_dim": 64,
}

TEXT_DIMS = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
}

INIT_STD = 0.02
RIG_WHITESPACE_BIAS = -12.0
RIG_CONTROL_BIAS = -12.0
RIG_QUOTE_BIAS = 2.0

# ChatML + hermes tools: a simplified Qwen2.5 template. The `content` of each message is used as a
# string (vLLM flattens OpenAI text parts into a string for such templates).
CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- else %}{{- 'You are a helpful assistant.\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'user' or message.role == 'system' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + (message.content or '') + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# LLaVA variant: content may be a list of OpenAI parts; each image part becomes `<image>`. vLLM sees
# the loop over `content` and hands the template the parts ("openai" content format).
VL_CHAT_TEMPLATE = r"""{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' }}
{%- if message.content is string %}{{- message.content }}
{%- elif message.content %}
{%- for part in message.content %}
{%- if part.type == 'image' or part.type == 'image_url' %}{{- '<image>' }}
{%- elif part.type == 'text' %}{{- part.text }}
{%- endif %}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

MODEL_CARD = """\
# tiny-{arch}{rig_suffix} (random, made locally)

**This model is random. It was made on this machine by `runbook/lab/tinymodel.py`; nothing was
downloaded.** It exists only so the lab can run a real vLLM OpenAI server on CPU. Its output is
noise.

- architecture: `{architecture}`, {n_params:,} parameters, fp32 safetensors, seed {seed}
- text dims: hidden {hidden_size}, intermediate {intermediate_size}, {num_hidden_layers} layers,
  {num_attention_heads} heads, {num_key_value_heads} KV heads, head_dim {head_dim},
  max_position_embeddings {max_position_embeddings}
- tokenizer: byte-level BPE, vocab {vocab_size}, trained on the top-level stdlib `*.py` files of
  Python {python}; special tokens {special}
- chat template: ChatML{template_note}
- eos: `<|im_end|>`, `<|endoftext|>`
- rigged: {rigged}{rig_note}

Regenerate: `python -m runbook.lab.tinymodel --out DIR --arch {arch}{rig_flag} --seed {seed}`
(with the lab venv's python).
"""


def _corpus_files() -> list[Path]:
    """Top-level stdlib *.py files of the running interpreter, sorted (about 6 MB)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    if not files:
        raise LabError(f"no stdlib *.py files under {stdlib}", fix="build the tiny model with a full CPython install")
    return files


def train_tokenizer(
    special_tokens: list[str] | None = None, vocab_size: int = VOCAB_SIZE
):
    """Train the byte-level BPE `tokenizers.Tokenizer` on stdlib sources (deterministic)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    special_tokens = list(special_tokens or SPECIAL_TOKENS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts():
        for path in _corpus_files():
            yield path.read_text(encoding="utf-8", errors="replace")

    tok.train_from_iterator(texts(), trainer=trainer)
    return tok


def build_tokenizer(
    extra_special: list[str] | None = None, chat_template: str = CHAT_TEMPLATE
):
    """The trained tokenizer wrapped as `PreTrainedTokenizerFast` with the chat template."""
    from transformers import PreTrainedTokenizerFast

    specials = SPECIAL_TOKENS + list(extra_special or [])
    tok = train_tokenizer(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=specials[1:2] + specials[3:],
        clean_up_tokenization_spaces=False,
        model_max_length=TEXT_DIMS["max_position_embeddings"],
    )
    fast.chat_template = chat_template
    return fast


def rig_biases(tokenizer) -> dict[int, float]:
    """Per-token logit biases of the rig: {token_id: bias} for the tokens that get one."""
    import unicodedata

    special_ids = set(tokenizer.all_special_ids)
    biases: dict[int, float] = {}
    for tid in range(len(tokenizer)):
        if tid in special_ids:
            continue
        text = tokenizer.decode(
            [tid], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if not text:
            continue
        if text.isspace():
            biases[tid] = RIG_WHITESPACE_BIAS
        elif any(
            ch == "\ufffd"
            or (
                unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn")
                and not ch.isspace()
            )
            for ch in text
        ):
            biases[tid] = RIG_CONTROL_BIAS
        elif '"' in text:
            biases[tid] = RIG_QUOTE_BIAS
    return biases


def _randomize(model, seed: int) -> None:
    """Fill every parameter from one explicit generator, in sorted name order (deterministic)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            module_name = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
            if name.endswith(".bias"):
                param.zero_()
            elif "norm" in module_name:
                param.fill_(1.0)
            else:
                param.copy_(
                    torch.randn(param.shape, generator=gen, dtype=torch.float32)
                    * INIT_STD
                )


def _text_module(model):
    """The decoder stack (`.model` for Llama/Qwen2; `.model.language_model` for LLaVA)."""
    inner = model.model
    return getattr(inner, "language_model", inner)


def _rig(model, tokenizer) -> dict:
    """Apply the rig in place; returns facts about it (for the model card)."""
    import torch

    text = _text_module(model)
    with torch.no_grad():
        text.embed_tokens.weight[:, 0] = 1.0
        for layer in text.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            if getattr(layer.self_attn.o_proj, "bias", None) is not None:
                layer.self_attn.o_proj.bias[0] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        # Measure the constant that dimension 0 takes after the final norm, then scale the lm_head
        # column so the logit bias is the intended one. Single thread: same result every run.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            ids = torch.arange(7, 7 + 256, dtype=torch.long).unsqueeze(0) % len(
                tokenizer
            )
            hidden = text(input_ids=ids).last_hidden_state[0, :, 0]
        finally:
            torch.set_num_threads(threads)
        const = round(float(hidden.mean()), 2)
        spread = float(hidden.std())
        biases = rig_biases(tokenizer)
        col = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.float32)
        for tid, bias in biases.items():
            col[tid] = bias / const
        model.lm_head.weight[:, 0] = col
    counts = {
        "whitespace": sum(
            1
            for t, b in biases.items()
            if b == RIG_WHITESPACE_BIAS and tokenizer.decode([t]).isspace()
        ),
        "quote": sum(1 for b in biases.values() if b == RIG_QUOTE_BIAS),
    }
    counts["control"] = (
        sum(1 for b in biases.values() if b == RIG_CONTROL_BIAS) - counts["whitespace"]
    )
    return {"normed_dim0": const, "normed_dim0_std": round(spread, 3), "tokens": counts}


def _config(arch: str, tokenizer):
    """transformers config for `arch`."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    common = dict(
        vocab_size=len(tokenizer),
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        torch_dtype="float32",
        **TEXT_DIMS,
    )
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(rope_theta=10000.0, **common)
    if arch == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(rope_theta=10000.0, **common)
    if arch == "llava":
        from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

        common.pop("torch_dtype")
        text = LlamaConfig(rope_theta=10000.0, **common)
        vision = CLIPVisionConfig(
            hidden_act="quick_gelu", layer_norm_eps=1e-5, **VISION_DIMS
        )
        n_img = (VISION_DIMS["image_size"] // VISION_DIMS["patch_size"]) ** 2
        return LlavaConfig(
            vision_config=vision,
            text_config=text,
            image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
            projector_hidden_act="gelu",
            vision_feature_select_strategy="default",
            vision_feature_layer=-2,
            image_seq_length=n_img,
            tie_word_embeddings=False,
            torch_dtype="float32",
        )
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def _model_class(arch: str):
    import transformers

    return {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "llava": transformers.LlavaForConditionalGeneration,
    }[arch]


def _save_vl_processor(out: Path, tokenizer) -> None:
    """LlavaProcessor (PIL CLIP image processor + the tokenizer) for arch="llava"; no torchvision."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    size = VISION_DIMS["image_size"]
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=VISION_DIMS["patch_size"],
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(out)


def _llava_hf_names(path: Path) -> None:
    """Rename the vision tower weights to the llava-hf layout vLLM loads.

    transformers 5 saves the CLIP tower as `vision_tower.embeddings...`; vLLM 0.32's llava loader
    wants `vision_tower.vision_model.embeddings...` (else: "There is no module or parameter named
    'vision_tower.embeddings' in LlavaForConditionalGeneration").
    """
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    renamed = {}
    for name, tensor in tensors.items():
        if name.startswith("vision_tower.") and not name.startswith(
            "vision_tower.vision_model."
        ):
            name = "vision_tower.vision_model." + name[len("vision_tower.") :]
        renamed[name] = tensor
    save_file(dict(sorted(renamed.items())), str(path), metadata={"format": "pt"})


def make_tiny_model(
    out_dir, arch: str = "llama", rigged: bool = True, seed: int = 0
) -> Path:
    """Write a tiny random model (tokenizer, config, safetensors, generation config, card) to out_dir."""
    import torch
    from transformers import GenerationConfig

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    vl = arch == "llava"
    tokenizer = build_tokenizer(
        VISION_TOKENS if vl else None, VL_CHAT_TEMPLATE if vl else CHAT_TEMPLATE
    )
    config = _config(arch, tokenizer)
    torch.manual_seed(seed)
    model = _model_class(arch)(config).to(torch.float32).eval()
    _randomize(model, seed)
    rig_facts = _rig(model, tokenizer) if rigged else None

    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if vl:
        _llava_hf_names(out / "model.safetensors")
        _save_vl_processor(out, tokenizer)
    eos = [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]
    GenerationConfig(
        eos_token_id=eos, pad_token_id=eos[1], bos_token_id=None
    ).save_pretrained(out)

    n_params = sum(p.numel() for p in model.parameters())
    rig_note = ""
    if rig_facts:
        t = rig_facts["tokens"]
        rig_note = (
            f" (residual dim 0 constant; after the final norm it is {rig_facts['normed_dim0']} "
            f"± {rig_facts['normed_dim0_std']}; lm_head column 0 = per-token logit bias: "
            f"{t['whitespace']} whitespace-only and {t['control']} control/replacement tokens "
            f"{RIG_WHITESPACE_BIAS:+g}, {t['quote']} tokens containing '\"' {RIG_QUOTE_BIAS:+g})"
        )
    (out / "README.md").write_text(
        MODEL_CARD.format(
            arch=arch,
            rig_suffix="-rigged" if rigged else "",
            architecture=config.architectures[0]
            if getattr(config, "architectures", None)
            else type(model).__name__,
            n_params=n_params,
            seed=seed,
            vocab_size=len(tokenizer),
            python=".".join(map(str, sys.version_info[:3])),
            special=", ".join(
                f"`{t}`" for t in SPECIAL_TOKENS + (VISION_TOKENS if vl else [])
            ),
            template_note=(
                " with image parts as `<image>`; vision: CLIP "
                + json.dumps(VISION_DIMS)
            )
            if vl
            else " + hermes tools (simplified Qwen2.5)",
            rigged="yes" if rigged else "no",
            rig_note=rig_note,
            rig_flag="" if rigged else " --no-rig",
            **TEXT_DIMS,
        )
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m runbook.lab.tinymodel",
        description="Make a tiny random model for the lab's CPU vLLM (no downloads).",
    )
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--arch", default="llama", choices=ARCHS)
    ap.add_argument(
        "--no-rig",
        dest="rigged",
        action="store_false",
        help="plain random weights (no logit-bias rig)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = make_tiny_model(args.out, arch=args.arch, rigged=args.rigged, seed=args.seed)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
