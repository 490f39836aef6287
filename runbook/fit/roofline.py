"""Bytes read per decode step per rank, from a checkpoint's safetensors headers (or its config and stated dtypes), and the decode ceiling they set against memory bandwidth and all-reduce latency.

Pure: the only I/O is reading ``config.json`` and the first bytes of each ``*.safetensors`` file (the
8-byte little-endian header length and the JSON header; never a tensor).

A decode step reads, per token, every weight the token passes through:

* routed experts: ``active`` experts of each MoE layer (``num_experts_per_tok``); one expert's bytes are
  the layer's expert tensors (weights and any scales: MXFP4 / FP8 / EXL3 tensors are counted by their
  bytes in the file) divided by the layer's expert count;
* shared experts, attention (with the sparse indexer and the KV compressors), ``lm_head`` and the rest
  (dense MLPs, routers, norms): all of them;
* the embedding: one row per token;
* not read: the vision tower, MTP / draft layers (only a speculative step reads them, below) and Engram
  tables (rows looked up per token, listed apart).

At tensor parallel ``tp`` every rank holds ``1/tp`` of each of these (vLLM shards experts, attention
heads and ``lm_head`` across the ranks; norms and routers are replicated but negligible), so per rank
the weight bytes are the sum divided by ``tp``, plus the embedding row.

A speculative (verify) step feeds ``m = k + 1`` tokens through the target: each token picks ``active``
of ``E`` experts, so the step reads ``E * (1 - (1 - active/E)^m)`` distinct experts per layer when routing is
independent (``b`` sequences: ``b * m`` tokens); correlated routing of consecutive tokens lowers it, down to
``active`` (``StepBytes.distinct_experts``' ``overlap``), plus the draft layers once. It yields ``L`` accepted
tokens (vLLM's mean acceptance length), so tok/s = L / step time.

N ranks (``allreduce_s``, ``rank_row``): a small all-reduce costs the 2-rank latency x log2 N (tree) or x (N - 1)
(ring); ``published_ceiling`` checks every published figure (tests/unit/data/published_figures.json) against
its checkpoint's bytes (``CHECKPOINTS``: the dtypes each tensor group has in that checkpoint).

KV and indexer reads grow with the context (``kv_read_bytes``); with a single KV head (DeepSeek's
MQA) every rank reads the whole cache.

Ceiling: step time = bytes per rank / bandwidth + all-reduces per step x their latency (two per layer:
after attention and after the MLP); tok/s = tokens per step / step time.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RunbookError
from .figures import MEASURED, NOMINAL, PUBLISHED, Figure

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 256 << 20      # a safetensors header is JSON of names and shapes: far below this

PARTS = ("routed_experts", "shared_experts", "attention", "lm_head", "rest", "embedding")
NOT_READ = ("draft", "vision", "engram")

# ------------------------------------------------------------------------------------------------
# published figures: the hardware (field-reports-2026-12.md "Physical limits", bringup-anchors.md §1.6)
# ------------------------------------------------------------------------------------------------
GB10_PEAK_BW = Figure(273e9, PUBLISHED, "GB10 LPDDR5X peak 273 GB/s (NVIDIA spec, field-reports-2026-12.md)")
GB10_DECODE_BW = Figure(230e9, PUBLISHED, "GB10 decode-shaped GEMV reads, fast state, 230 GB/s "
                                          "(tonyd2wild #1; slow state 70 GB/s)")
ALLREDUCE_FAST = Figure(28e-6, PUBLISHED, "2-rank all_reduce 8 KiB at MTU 9000: ~28 us (PR #103 comment)")
ALLREDUCE_SLOW = Figure(77e-6, PUBLISHED, "BF16 all-reduce 10 KiB through NCCL: 67-77 us (christopherowen "
                                          "dgx-spark-networking README)")


# ------------------------------------------------------------------------------------------------
# the checkpoint: config.json and safetensors headers
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte little-endian length, then the JSON): tensor
    name -> {dtype, shape, data_offsets}; ``__metadata__`` dropped. Reads only the header."""
    p = Path(path)
    with p.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise RunbookError(f"{p}: not a safetensors file (shorter than its 8-byte header length)",
                               fix="re-download the file (step 02 verifies sizes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise RunbookError(f"{p}: header length {n} is not plausible (> {MAX_HEADER_BYTES})",
                               fix="the file is not safetensors or is damaged: re-download it")
        raw = f.read(n)
    if len(raw) != n:
        raise RunbookError(f"{p}: header truncated ({len(raw)} of {n} bytes)", fix="re-download the file")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise RunbookError(f"{p}: header is not JSON ({exc})", fix="re-download the file") from exc
    obj.pop("__metadata__", None)
    return obj


def tensors_of_header(header: dict[str, Any]) -> list[Tensor]:
    out = []
    for name, t in header.items():
        start, end = t["data_offsets"]
        out.append(Tensor(name, str(t.get("dtype", "")), tuple(int(x) for x in t.get("shape", [])), int(end) - int(start)))
    return out


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The shards the index names (or every ``*.safetensors`` when there is no index)."""
    d = Path(model_dir)
    index = d / INDEX_NAME
    if index.is_file():
        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        files = [d / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise RunbookError(f"{d}: {len(missing)} shard(s) named by {INDEX_NAME} are missing",
                               observed=", ".join(missing[:3]), fix="finish the download (step 02_weights)")
        return files
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise RunbookError(f"{d}: no {INDEX_NAME} and no *.safetensors",
                           fix="pass the folder that holds the checkpoint's config.json and safetensors files")
    return files


def load_config(model_dir: str | Path) -> dict[str, Any]:
    p = Path(model_dir) / "config.json"
    if not p.is_file():
        raise RunbookError(f"{p}: missing", fix="pass the checkpoint folder (it holds config.json)")
    return json.loads(p.read_text())


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config (multimodal checkpoints nest it under ``text_config``)."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


# A node's checkpoint, read where it lies: this stdlib script prints its config.json and every
# tensor's name, dtype, shape and byte size from the shards' headers (never a tensor), one JSON line.
HEADER_DUMP_SCRIPT = r"""
import glob, json, os, struct, sys
d = sys.argv[1]
out = {"tool": "st_headers", "dir": d}
try:
    cfg = json.load(open(os.path.join(d, "config.json")))
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        raise SystemExit("no safetensors files in " + d)
    tensors = []
    for f in files:
        with open(os.path.join(d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            if n > (256 << 20):
                raise SystemExit(f + ": implausible header length")
            h = json.loads(fh.read(n))
        for name, t in h.items():
            if name != "__metadata__":
                tensors.append([name, t.get("dtype", ""), t.get("shape", []), t["data_offsets"][1] - t["data_offsets"][0]])
    out.update(config=cfg, files=len(files), tensors=tensors)
except (OSError, ValueError, KeyError, SystemExit) as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)
print(json.dumps(out, separators=(",", ":")))
"""


def header_dump_cmd(model_dir: str, python: str = "python3", timeout_s: int = 120) -> str:
    """The command that runs HEADER_DUMP_SCRIPT on a node for ``model_dir`` (already expanded)."""
    import shlex
    return (f"timeout {timeout_s} {python} - {shlex.quote(model_dir)} "
            f"<<'RUNBOOK_ST_EOF'\n{HEADER_DUMP_SCRIPT}\nRUNBOOK_ST_EOF")


def step_bytes_from_dump(stdout: str) -> tuple[StepBytes, dict[str, Any]]:
    """(bytes per token, config) from HEADER_DUMP_SCRIPT's JSON line; RunbookError when it failed."""
    line = next((ln for ln in reversed((stdout or "").splitlines()) if ln.startswith('{"tool":"st_headers"')), "")
    if not line:
        raise RunbookError("no header listing from the node", observed=(stdout or "")[-200:],
                           fix="check python3 on the head and that step 02 downloaded the checkpoint")
    d = json.loads(line)
    if d.get("error"):
        raise RunbookError(f"reading the checkpoint's headers in {d.get('dir')} failed", observed=d["error"],
                           fix="finish step 02_weights (the checkpoint must be on the head)")
    tensors = [Tensor(n, str(dt), tuple(int(x) for x in shape), int(nb)) for n, dt, shape, nb in d["tensors"]]
    return (step_bytes_from_tensors(tensors, d["config"], source=f"safetensors headers of {d['dir']} on the head "
                                                                 f"({d['files']} file(s), {len(tensors)} tensors)"),
            d["config"])


# ------------------------------------------------------------------------------------------------
# which part of the model a tensor is
# ------------------------------------------------------------------------------------------------
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_EXPERT = re.compile(r"(?:^|\.)experts\.(\d+)\.")
_DRAFT = re.compile(r"(?:^|\.)(?:mtp|nextn|draft|dspark)[._]")
_VISION = re.compile(r"vision|visual|(?:^|\.)vit\.|image_|aligner|multi_modal_projector|mm_projector")
_EMBED = re.compile(r"embed_tokens|tok_embeddings|(?:^|\.)wte\.|(?:^|\.)embed\.weight|word_embeddings")
_HEAD = re.compile(r"(?:^|\.)lm_head\.|^head\.|^output\.weight")
_ATTN = re.compile(r"attn|attention|indexer|compressor")


def classify(name: str, num_layers: int | None = None) -> str:
    """The part a tensor belongs to (one of PARTS or NOT_READ)."""
    low = name.lower()
    if _DRAFT.search(low):
        return "draft"
    m = _LAYER.search(low)
    if m and num_layers is not None and int(m.group(1)) >= num_layers and not _VISION.search(low):
        return "draft"              # DeepSeek V3 stores its MTP module as layer num_hidden_layers
    if _VISION.search(low):
        return "vision"
    if "engram" in low:
        return "engram"
    if "shared_expert" in low:
        return "shared_experts"
    if "experts" in low:
        return "routed_experts"
    if _EMBED.search(low):
        return "embedding"
    if _HEAD.search(low):
        return "lm_head"
    if _ATTN.search(low):
        return "attention"
    return "rest"


def _int(cfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and v:
            return int(v)
    return default


def n_routed_experts(cfg: dict[str, Any]) -> int:
    return _int(cfg, "n_routed_experts", "num_local_experts", "num_experts")


def active_experts(cfg: dict[str, Any]) -> int:
    return _int(cfg, "num_experts_per_tok", "moe_topk", "top_k")


# ------------------------------------------------------------------------------------------------
# bytes per step
# ------------------------------------------------------------------------------------------------
@dataclass
class StepBytes:
    """Bytes one decode token reads from the weights, by part (whole model; ``per_rank`` divides)."""
    parts: dict[str, float]                 # PARTS -> bytes per token (routed: active experts only)
    expert_bytes: float = 0.0               # one routed expert, summed over the MoE layers
    n_experts: int = 0
    active: int = 0
    draft_bytes: float = 0.0                # MTP / draft layers (read once per speculative step)
    not_read: dict[str, float] = field(default_factory=dict)   # vision, engram (and draft) bytes in the files
    layers: int = 0
    source: str = ""                        # where the bytes come from (headers of which files, or config + dtypes)
    assumptions: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def resident(self) -> float:
        """Weights held in memory (every expert and the whole embedding table; draft, vision and Engram apart)."""
        return (self.total - self.parts.get("routed_experts", 0.0) - self.parts.get("embedding", 0.0)
                + self.expert_bytes * self.n_experts + self.not_read.get("embedding table", 0.0))

    def distinct_experts(self, tokens: int, *, batch: int = 1, overlap: float = 0.0) -> float:
        """Expected distinct experts per layer in one step: ``batch`` sequences of ``tokens`` tokens each
        (a verify step: k + 1), every token picking ``active`` of ``n_experts``.

        Independent routing (``overlap`` 0): ``E * (1 - (1 - a/E)^(batch * tokens))``. Consecutive tokens of one
        sequence route alike (temporal correlation), which only lowers the count: ``overlap`` is the share of a
        token's picks that repeat the previous token's, so a sequence counts as ``1 + (tokens - 1) * (1 - overlap)``
        independent tokens (1: every token of the step reads the first token's experts, ``a`` per layer, the
        fewest possible). Different sequences are taken as independent."""
        if not self.n_experts or not self.active:
            return 0.0
        if not 0.0 <= overlap <= 1.0:
            raise ValueError(f"overlap must be within [0, 1], not {overlap}")
        if tokens < 1 or batch < 1:
            raise ValueError(f"tokens and batch must be >= 1, not {tokens} and {batch}")
        independent = batch * (1.0 + (tokens - 1) * (1.0 - overlap))
        return self.n_experts * (1.0 - (1.0 - self.active / self.n_experts) ** independent)

    def per_rank(self, tp: int, *, tokens: int = 1, draft: bool = False, batch: int = 1,
                 overlap: float = 0.0) -> float:
        """Weight bytes one rank reads in one step of ``batch`` x ``tokens`` tokens (1: plain decode; k+1: a
        verify step, ``draft`` adding the draft layers; ``overlap``: see ``distinct_experts``)."""
        if tp < 1:
            raise ValueError(f"tp must be >= 1, not {tp}")
        routed = self.parts.get("routed_experts", 0.0)
        if (tokens > 1 or batch > 1) and self.active:
            routed = self.expert_bytes * self.distinct_experts(tokens, batch=batch, overlap=overlap)
        sharded = routed + sum(v for k, v in self.parts.items() if k not in ("routed_experts", "embedding"))
        sharded += self.draft_bytes if draft else 0.0
        return sharded / tp + self.parts.get("embedding", 0.0) * tokens * batch

    def to_dict(self) -> dict[str, Any]:
        return {"parts": self.parts, "expert_bytes": self.expert_bytes, "n_experts": self.n_experts,
                "active": self.active, "draft_bytes": self.draft_bytes, "not_read": self.not_read,
                "layers": self.layers, "total": self.total, "source": self.source, "assumptions": self.assumptions}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepBytes":
        return cls(parts={k: float(v) for k, v in d["parts"].items()}, expert_bytes=float(d.get("expert_bytes", 0)),
                   n_experts=int(d.get("n_experts", 0)), active=int(d.get("active", 0)),
                   draft_bytes=float(d.get("draft_bytes", 0)), not_read=dict(d.get("not_read", {})),
                   layers=int(d.get("layers", 0)), source=str(d.get("source", "")),
                   assumptions=list(d.get("assumptions", [])))


def step_bytes_from_tensors(tensors: list[Tensor], config: dict[str, Any], source: str = "") -> StepBytes:
    """Bytes per decode token from the tensor list of a checkpoint's headers and its config."""
    cfg = text_config(config)
    layers = _int(cfg, "num_hidden_layers", "n_layers")
    n_exp, active = n_routed_experts(cfg), active_experts(cfg)
    parts = {p: 0.0 for p in PARTS}
    not_read: dict[str, float] = {}
    per_layer_experts: dict[int, float] = {}
    per_layer_ids: dict[int, set[int]] = {}
    draft = 0.0
    for t in tensors:
        part = classify(t.name, layers or None)
        if part == "routed_experts":
            m = _LAYER.search(t.name.lower())
            layer = int(m.group(1)) if m else -1
            per_layer_experts[layer] = per_layer_experts.get(layer, 0.0) + t.nbytes
            e = _EXPERT.search(t.name.lower())
            if e:
                per_layer_ids.setdefault(layer, set()).add(int(e.group(1)))
        elif part == "embedding":
            rows = t.shape[0] if t.shape else 0
            parts["embedding"] += t.nbytes / rows if rows else 0.0
            not_read["embedding table"] = not_read.get("embedding table", 0.0) + t.nbytes
        elif part in NOT_READ:
            not_read[part] = not_read.get(part, 0.0) + t.nbytes
            if part == "draft":
                draft += t.nbytes
        else:
            parts[part] += t.nbytes
    if not any(classify(t.name, layers or None) == "lm_head" for t in tensors) and cfg.get("tie_word_embeddings"):
        parts["lm_head"] = not_read.get("embedding table", 0.0)      # tied: the output layer reads the embedding
    expert_bytes = 0.0
    assumptions = []
    for layer, b in per_layer_experts.items():
        count = len(per_layer_ids.get(layer, ())) or n_exp
        if not count:
            raise RunbookError(f"{source or 'checkpoint'}: expert tensors in layer {layer} but no expert count",
                               fix="config.json must give n_routed_experts (or num_local_experts / num_experts)")
        expert_bytes += b / count
    if per_layer_experts:
        if not active:
            raise RunbookError(f"{source or 'checkpoint'}: routed experts but no num_experts_per_tok in config.json",
                               fix="pass the checkpoint's own config.json")
        parts["routed_experts"] = expert_bytes * active
        assumptions.append(f"{active} of {n_exp} routed experts per token and layer")
    return StepBytes(parts=parts, expert_bytes=expert_bytes, n_experts=n_exp if per_layer_experts else 0,
                     active=active if per_layer_experts else 0, draft_bytes=draft, not_read=not_read,
                     layers=layers, source=source, assumptions=assumptions)


def step_bytes_from_checkpoint(model_dir: str | Path) -> StepBytes:
    """Read ``config.json`` and every shard's header of a local checkpoint."""
    files = checkpoint_files(model_dir)
    tensors = [t for f in files for t in tensors_of_header(read_header(f))]
    return step_bytes_from_tensors(tensors, load_config(model_dir),
                                   source=f"safetensors headers of {Path(model_dir)} ({len(files)} file(s), "
                                          f"{len(tensors)} tensors)")


# ------------------------------------------------------------------------------------------------
# config only: parameter counts per part and stated dtypes
# ------------------------------------------------------------------------------------------------
def params_from_config(config: dict[str, Any]) -> dict[str, float]:
    """Parameters per part read by one token (routed: the active experts), from config.json alone.

    DeepSeek-V4 (``o_lora_rank`` / ``compress_ratios``): q low-rank (``wq_a`` hidden x q_lora, ``wq_b``
    q_lora x heads x head_dim), one KV head (``wkv`` hidden x head_dim), grouped low-rank output
    (``wo_a`` heads x head_dim x o_lora, ``wo_b`` o_groups x o_lora x hidden); the KV compressor of a
    compressed layer (weight and gate, hidden x head_dim x 2 at ratio 4 where blocks overlap, x 1
    otherwise); the indexer of a ratio-4 layer (``wq_b`` q_lora x index_heads x index_head_dim,
    ``weights_proj`` hidden x index_heads, its own compressor hidden x index_head_dim x 2 x 2); the router
    (hidden x experts). Llama / Qwen / Mixtral: q, k, v, o and a gated MLP (3 x hidden x intermediate).
    Experts: 3 x hidden x moe_intermediate each. ``lm_head``: vocab x hidden. Embedding: one row."""
    cfg = text_config(config)
    h = _int(cfg, "hidden_size", "dim")
    layers = _int(cfg, "num_hidden_layers", "n_layers")
    heads = _int(cfg, "num_attention_heads", "n_heads")
    hd = _int(cfg, "head_dim", default=h // heads if heads else 0)
    kvh = _int(cfg, "num_key_value_heads", default=heads)
    vocab = _int(cfg, "vocab_size")
    if not (h and layers and heads and vocab):
        raise RunbookError("config: hidden_size, num_hidden_layers, num_attention_heads and vocab_size are needed",
                           observed=", ".join(f"{k}={cfg.get(k)}" for k in ("hidden_size", "num_hidden_layers",
                                                                          "num_attention_heads", "vocab_size")),
                           fix="pass the checkpoint's own config.json")
    n_exp, active = n_routed_experts(cfg), active_experts(cfg)
    moe_i = _int(cfg, "moe_intermediate_size", default=_int(cfg, "intermediate_size"))
    expert = 3 * h * moe_i
    p = {k: 0.0 for k in PARTS}
    if cfg.get("o_lora_rank"):                                  # DeepSeek-V4 attention
        ql, ol, og = _int(cfg, "q_lora_rank"), _int(cfg, "o_lora_rank"), _int(cfg, "o_groups", default=1)
        per_layer = h * ql + ql * heads * hd + h * hd + heads * hd * ol + og * ol * h
        ratios = list(cfg.get("compress_ratios") or [0] * layers)[:layers]
        ih, ihd = _int(cfg, "index_n_heads"), _int(cfg, "index_head_dim")
        attn, native = per_layer * layers, 0
        for r in ratios:
            if r:
                native += 2 * h * hd * (2 if r == 4 else 1)     # KV compressor: wkv + wgate (BF16 in the checkpoint)
            if r == 4 and ih and ihd:
                attn += ql * ih * ihd                           # indexer wq_b (FP8)
                native += h * ih + 2 * h * ihd * 2              # indexer weights_proj, its compressor (BF16)
        p["attention"] = float(attn)
        p["attention_native"] = float(native)
        hc = _int(cfg, "hc_mult")
        if hc:                                                  # mHC mixing: hc_attn_fn, hc_ffn_fn (F32) per layer
            p["hc"] = float(layers * 2 * (2 * hc + hc * hc) * hc * h)
    else:                                                       # q, k, v, o
        p["attention"] = float(layers * (h * heads * hd + 2 * h * kvh * hd + heads * hd * h))
    if n_exp:
        p["routed_experts"] = float(layers * active * expert)
        p["shared_experts"] = float(layers * _int(cfg, "n_shared_experts") * expert)
        p["rest"] = float(layers * h * n_exp)                    # routers
    else:
        p["rest"] = float(layers * 3 * h * _int(cfg, "intermediate_size"))
    p["lm_head"] = float(vocab * h)
    p["embedding"] = float(h)
    return p


@dataclass(frozen=True)
class ArchFacts:
    """A recipe's model for the config-only path: its config values and bytes per parameter by part."""
    config: dict[str, Any]
    bytes_per_param: dict[str, float]       # PARTS -> bytes per parameter (scales included)
    source: str
    assumptions: tuple[str, ...]


def step_bytes_from_config(config: dict[str, Any], bytes_per_param: dict[str, float], *, source: str = "",
                           assumptions: tuple[str, ...] = ()) -> StepBytes:
    params = params_from_config(config)
    missing = [k for k in PARTS + ("attention_native", "hc") if params.get(k) and k not in bytes_per_param]
    if missing:
        raise RunbookError(f"config-only bytes: no dtype stated for {', '.join(missing)}",
                           fix="state bytes per parameter for every part (roofline.ARCH / roofline.CHECKPOINTS)")
    parts = {k: params[k] * bytes_per_param.get(k, 0.0) for k in PARTS}
    # the groups a part holds in another dtype: attention's BF16 compressors, the mHC F32 mixing (under rest)
    parts["attention"] += params.get("attention_native", 0.0) * bytes_per_param.get("attention_native", 0.0)
    parts["rest"] += params.get("hc", 0.0) * bytes_per_param.get("hc", 0.0)
    cfg = text_config(config)
    active, n_exp = active_experts(cfg), n_routed_experts(cfg)
    expert_bytes = parts["routed_experts"] / active if active else 0.0
    table = {"embedding table": _int(cfg, "vocab_size") * _int(cfg, "hidden_size", "dim") * bytes_per_param.get("embedding", 0.0)}
    return StepBytes(parts=parts, expert_bytes=expert_bytes, n_experts=n_exp, active=active if n_exp else 0,
                     not_read=table, layers=_int(cfg, "num_hidden_layers", "n_layers"), source=source,
                     assumptions=list(assumptions))


# The checkpoints' dtypes. V4-Flash (0731, Vision-Exp) and V4.1-Flash as published: dense weights (attention,
# shared experts, indexer wq_b) F8_E4M3 with one F8_E8M0 scale (1 byte) per 128 x 128 block; routed experts FP4
# packed two per byte with one F8_E8M0 scale per 32 values (MXFP4); embedding, lm_head ("head.weight"), routers,
# the KV/indexer compressors and weights_proj BF16; the mHC mixing (hc_*_fn) F32. Sources:
# anthony-chaudhary/fak#12639 (0731: "F8_E4M3 with F8_E8M0 128x128 scale grids", experts "packed FP4 with E8M0
# scales per 32"), NVIDIA-NeMo/Automodel#2034 (w1.weight I8 [2048, 2048], w1.scale F8_E8M0 [2048, 128]),
# EfficientMoE/MoE-Infinity#210 (V4.1 index: expert_dtype fp4 under the FP8 config), and a public test fixture
# shaped after the V4-Flash index (head/embed BF16 [129280, 4096], compressor wkv/wgate BF16, hc_attn_fn F32 [24, 16384]).
FP8_BLOCK128 = 1 + 1 / (128 * 128)
MXFP4 = (4 + 8 / 32) / 8
BF16 = 2.0
F32 = 4.0

# DeepSeek-V4-Flash text config (the published config.json's values, as quoted in the public index and
# field-reports-2026-12.md: hidden 4096, 43 layers, 256 routed experts, 6 active + 1 shared, expert width 2048)
V4_FLASH_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "hidden_size": 4096, "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8, "qk_rope_head_dim": 64,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "sliding_window": 128,
    "compress_ratios": [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)],
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 2048,
    "vocab_size": 129280, "num_hash_layers": 3, "hc_mult": 4,
}

ARCH: dict[str, ArchFacts] = {
    "dspark-v4": ArchFacts(
        config=V4_FLASH_CONFIG,
        bytes_per_param={"routed_experts": MXFP4, "shared_experts": FP8_BLOCK128, "attention": FP8_BLOCK128,
                         "attention_native": BF16, "hc": F32, "lm_head": BF16, "rest": BF16, "embedding": BF16},
        source="config-only: DeepSeek-V4-Flash config values (field-reports-2026-12.md; model card)",
        assumptions=("routed experts MXFP4: 4 bits + one E8M0 scale per 32 values = 0.53125 B/param",
                     "shared experts and attention FP8 E4M3 with an E8M0 (1-byte) scale per 128x128 block",
                     "lm_head, embedding, routers, KV/indexer compressors in BF16; mHC mixing in F32",
                     "compress ratios: layers 0-1 none, then alternating 4 / 128 (published pattern)",
                     "draft (DSpark) layers not counted: their size is not in the config (the headers path counts them)")),
    "lab": ArchFacts(
        # runbook/lab/tinymodel.py TEXT_DIMS and VOCAB_SIZE (a unit test keeps them equal)
        config={"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                "vocab_size": 2048},
        bytes_per_param={k: 4.0 for k in PARTS},
        source="config-only: the lab's tiny model (runbook/lab/tinymodel.py dims)",
        assumptions=("fp32 weights (the tiny model's safetensors)",)),
}


def recipe_step_bytes(recipe: str) -> StepBytes | None:
    """The config-only bytes of a recipe's model, or None when the recipe states no architecture."""
    a = ARCH.get(recipe)
    if a is None:
        return None
    return step_bytes_from_config(a.config, a.bytes_per_param, source=a.source, assumptions=a.assumptions)


# ------------------------------------------------------------------------------------------------
# KV and indexer reads at a context
# ------------------------------------------------------------------------------------------------
KV_DTYPE_BYTES = {"": 2.0, "auto": 2.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0,
                  "fp8_e5m2": 1.0, "fp8_ds_mla": 1.0, "nvfp4_ds_mla": 0.5625}


def kv_read_bytes(config: dict[str, Any], context: int, *, tp: int, kv_dtype: str = "",
                  weight_bytes: float = 2.0) -> float:
    """Bytes one rank reads from the KV cache (and the sparse indexer's keys) for one token at
    ``context`` tokens. ``weight_bytes``: the element size when the KV dtype is the model's (``auto``).

    DeepSeek-V4: per layer the sliding window (``sliding_window`` entries of ``head_dim``); at ratio 4
    the indexer scores ``context/4`` compressed keys (``index_head_dim``, FP8) and attention reads its
    ``index_topk`` picks; at ratio 128 attention reads all ``context/128`` compressed entries. One KV
    head: every rank reads it all. Others: ``context`` x 2 (K and V) x KV heads on this rank x head_dim."""
    if context < 0:
        raise ValueError("context must be >= 0")
    cfg = text_config(config)
    key = (kv_dtype or "").lower()
    if key not in KV_DTYPE_BYTES:
        raise RunbookError(f"KV_CACHE_DTYPE={kv_dtype!r}: element size unknown to the roofline",
                           fix=f"one of {', '.join(k for k in KV_DTYPE_BYTES if k)} (or empty)")
    el = KV_DTYPE_BYTES[key] if key not in ("", "auto") else weight_bytes
    layers = _int(cfg, "num_hidden_layers", "n_layers")
    heads = _int(cfg, "num_attention_heads", "n_heads")
    hd = _int(cfg, "head_dim", default=_int(cfg, "hidden_size") // heads if heads else 0)
    if cfg.get("compress_ratios"):
        window, topk, ihd = _int(cfg, "sliding_window"), _int(cfg, "index_topk"), _int(cfg, "index_head_dim")
        total = 0.0
        for r in list(cfg["compress_ratios"])[:layers]:
            entries = min(context, window)
            if r == 4:
                compressed = context / 4
                entries += min(compressed, topk)
                total += compressed * ihd * 1.0           # indexer keys (FP8)
            elif r:
                entries += context / r
            total += entries * hd * el
        return total
    kvh = _int(cfg, "num_key_value_heads", default=heads)
    per_rank_heads = max(1.0, kvh / tp)
    return layers * context * 2 * per_rank_heads * hd * el


# ------------------------------------------------------------------------------------------------
# the ceiling
# ------------------------------------------------------------------------------------------------
def allreduces_per_step(config: dict[str, Any], tp: int) -> int:
    """Two all-reduces per layer (after attention, after the MLP/MoE) when tp > 1, else none."""
    return 2 * _int(text_config(config), "num_hidden_layers", "n_layers") if tp > 1 else 0


@dataclass(frozen=True)
class Ceiling:
    """One decode step at one stream. With pipeline stages (``stages`` > 1) ``bytes_per_rank`` is what a rank
    reads at its own stage, and a token passes every stage in turn: the read is ``stages`` x that (the pipeline
    bubble: at one stream only one stage works at a time), the all-reduces are every stage's (``allreduces`` counts
    them all), and ``stages - 1`` hand-offs of the activations cost ``p2p_s`` each."""
    bytes_per_rank: float
    bandwidth: float                  # bytes/s
    allreduces: int
    allreduce_s: float
    tokens_per_step: float = 1.0
    stages: int = 1
    p2p_s: float = 0.0

    @property
    def read_s(self) -> float:
        return self.stages * self.bytes_per_rank / self.bandwidth

    @property
    def hops_s(self) -> float:
        return (self.stages - 1) * self.p2p_s

    @property
    def collectives_s(self) -> float:
        return self.allreduces * self.allreduce_s + self.hops_s

    @property
    def bubble(self) -> float:
        """The share of a step each rank idles at one stream: (stages - 1) / stages."""
        return (self.stages - 1) / self.stages

    @property
    def step_s(self) -> float:
        return self.read_s + self.collectives_s

    @property
    def tok_s(self) -> float:
        return self.tokens_per_step / self.step_s

    def to_dict(self) -> dict[str, float]:
        return {"bytes_per_rank": self.bytes_per_rank, "bandwidth_gbs": self.bandwidth / 1e9,
                "allreduces": self.allreduces, "allreduce_us": self.allreduce_s * 1e6,
                "tokens_per_step": self.tokens_per_step, "read_ms": self.read_s * 1e3,
                "collectives_ms": self.collectives_s * 1e3, "step_ms": self.step_s * 1e3, "tok_s": self.tok_s,
                "stages": self.stages, "p2p_us": self.p2p_s * 1e6, "bubble": self.bubble}


@dataclass
class Roofline:
    """Bytes per step per rank of one model at one TP x PP and context, and what they allow. With pipeline
    stages (``pp`` > 1) a rank reads its stage's 1/PP of the layers (even split: ``plan --layouts`` weighs uneven
    stages and the embedding/lm_head ends), and the ceiling pays the pipeline bubble: at one stream the stages
    work one after another (:class:`Ceiling`)."""
    step: StepBytes
    config: dict[str, Any]
    tp: int
    context: int = 0
    kv_dtype: str = ""
    spec_k: int = 0
    pp: int = 1

    @property
    def kv_bytes(self) -> float:
        wb = 4.0 if self.step.source.startswith("config-only: the lab") else 2.0
        return kv_read_bytes(self.config, self.context, tp=self.tp, kv_dtype=self.kv_dtype,
                             weight_bytes=wb) / self.pp

    @property
    def weights_bytes(self) -> float:
        """The weights one rank reads per plain step at its stage."""
        return self.step.per_rank(self.tp) / self.pp

    def plain_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes

    def verify_bytes(self) -> float:
        """One verify step of k + 1 tokens (the draft layers included); plain when spec_k = 0."""
        if not self.spec_k:
            return self.plain_bytes()
        return self.step.per_rank(self.tp, tokens=self.spec_k + 1, draft=True) / self.pp + self.kv_bytes

    def ceiling(self, bandwidth: float, allreduce_s: float, *, acceptance_length: float | None = None,
                p2p_s: float | None = None) -> Ceiling:
        """Plain (``acceptance_length`` None) or a verify step yielding ``acceptance_length`` tokens. ``p2p_s``:
        one hand-off between pipeline stages; default one 2-rank all-reduce's latency (``allreduce_s``; a send
        is at most that)."""
        n = allreduces_per_step(self.config, self.tp)
        hop = allreduce_s if p2p_s is None else p2p_s
        if acceptance_length is None or not self.spec_k:
            return Ceiling(self.plain_bytes(), bandwidth, n, allreduce_s, 1.0, self.pp, hop)
        return Ceiling(self.verify_bytes(), bandwidth, n, allreduce_s, float(acceptance_length), self.pp, hop)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step.to_dict(), "tp": self.tp, "pp": self.pp, "context": self.context,
                "kv_dtype": self.kv_dtype, "spec_k": self.spec_k, "weights_per_rank": self.weights_bytes,
                "kv_per_rank": self.kv_bytes, "plain_bytes_per_rank": self.plain_bytes(),
                "verify_bytes_per_rank": self.verify_bytes(),
                "allreduces": allreduces_per_step(self.config, self.tp), "config": _slim(self.config)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Roofline":
        return cls(StepBytes.from_dict(d["step"]), dict(d.get("config") or {}), int(d["tp"]),
                   int(d.get("context", 0)), str(d.get("kv_dtype", "")), int(d.get("spec_k", 0)),
                   int(d.get("pp", 1) or 1))


_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "n_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "sliding_window", "index_topk", "index_head_dim", "compress_ratios",
                "n_routed_experts", "num_experts_per_tok", "vocab_size")


def _slim(config: dict[str, Any]) -> dict[str, Any]:
    """The config values the KV model and the all-reduce count read (what a sidecar keeps)."""
    cfg = text_config(config)
    return {k: cfg[k] for k in _CONFIG_KEYS if k in cfg}


def roofline_for(profile, *, model_dir: str | Path | None = None, context: int | None = None) -> Roofline | None:
    """The profile's roofline: from a local checkpoint's headers when ``model_dir`` holds one, else
    config-only for the recipe (None when the recipe states no architecture). ``context`` defaults to
    the bench's decode prompt length (``BENCH_PROMPT_TOKENS``)."""
    ctx = int(profile.bench_prompt_tokens if context is None else context)
    if model_dir is not None:
        step = step_bytes_from_checkpoint(model_dir)
        config = load_config(model_dir)
    else:
        key = "lab" if (profile.is_lab or profile.lab) else profile.recipe   # lab hardware: the tiny model
        step = recipe_step_bytes(key)
        if step is None:
            return None
        config = ARCH[key].config
    return Roofline(step, config, int(profile.tp), ctx, str(profile.kv_cache_dtype or ""), int(profile.spec_k),
                    int(profile.pp))


def spark_ceilings(r: Roofline) -> dict[str, Ceiling]:
    """The published bounds on a GB10 pair: best (273 GB/s, 28 us) and realistic (230 GB/s, 77 us); past two
    ranks also the realistic one with its 2-rank all-reduce taken to TP ranks as a tree (x log2 TP), the two
    above keeping the 2-rank figure (they can only err high)."""
    out = {"best": r.ceiling(GB10_PEAK_BW.value, ALLREDUCE_FAST.value),
           "decode-shaped": r.ceiling(GB10_DECODE_BW.value, ALLREDUCE_SLOW.value)}
    if r.tp > 2:
        out[f"decode-shaped, {r.tp}-rank tree"] = r.ceiling(
            GB10_DECODE_BW.value, allreduce_s(r.tp, 0, two_rank_s=ALLREDUCE_SLOW.value))
    return out


def measured_bandwidth(gbs: float, note: str) -> Figure:
    return Figure(gbs * 1e9, MEASURED, note)


def nominal(value: float, note: str) -> Figure:
    return Figure(value, NOMINAL, note)


def fmt_bytes(b: float) -> str:
    if b >= 1e9:
        return f"{b / 1e9:.2f} GB"
    if b >= 1e6:
        return f"{b / 1e6:.2f} MB"
    if b >= 1e3:
        return f"{b / 1e3:.1f} kB"
    return f"{b:.0f} B"


def roofline_text(r: Roofline, ceilings: dict[str, Ceiling], *, bandwidth_note: str = "") -> str:
    """The ``plan`` section: bytes per step per rank by part, then each ceiling."""
    s = r.step
    layout = f"TP={r.tp} x PP={r.pp}" if r.pp > 1 else f"TP={r.tp}"
    lines = [f"decode roofline (bytes read per step per rank at {layout}, context {r.context:,} tokens):",
             f"  source: {s.source}"]
    lines += [f"  assumption: {a}" for a in s.assumptions]
    for part in PARTS:
        v = s.parts.get(part, 0.0)
        if v:
            per = v * (1 if part == "embedding" else 1 / r.tp) / r.pp
            lines.append(f"  {part:<15} {fmt_bytes(v):>10} per token   {fmt_bytes(per):>10} per rank")
    lines.append(f"  {'KV + indexer':<15} {'':>10}             {fmt_bytes(r.kv_bytes):>10} per rank "
                 f"(KV_CACHE_DTYPE={r.kv_dtype or 'auto'})")
    lines.append(f"  {'total':<15} {fmt_bytes(s.total):>10} per token   {fmt_bytes(r.plain_bytes()):>10} per rank")
    if r.spec_k:
        lines.append(f"  verify step (k={r.spec_k}: {r.spec_k + 1} tokens, {s.distinct_experts(r.spec_k + 1):.1f} "
                     f"distinct experts per layer, draft layers {fmt_bytes(s.draft_bytes)}): "
                     f"{fmt_bytes(r.verify_bytes())} per rank")
    if r.pp > 1:
        lines.append(f"  pipeline: {r.pp} stages of {r.tp} rank(s); at one stream a token passes every stage in turn, "
                     f"so each rank idles {(r.pp - 1) / r.pp:.0%} of a step (the bubble) and the read is {r.pp} x its "
                     f"stage's, plus {r.pp - 1} hand-off(s) between stages")
    for name, c in ceilings.items():
        read = (f"{c.stages} stages x {c.bytes_per_rank / c.bandwidth * 1e3:.2f} ms = " if c.stages > 1 else "")
        hops = (f" + {c.stages - 1} stage hop(s) x {c.p2p_s * 1e6:.0f} us" if c.stages > 1 else "")
        line = (f"  ceiling ({name}): {c.bandwidth / 1e9:.0f} GB/s -> {read}{c.read_s * 1e3:.2f} ms read + "
                f"{c.allreduces} all-reduces x {c.allreduce_s * 1e6:.0f} us{hops} = {c.step_s * 1e3:.2f} ms/step "
                f"-> {c.tok_s:.1f} tok/s plain")
        if r.spec_k:
            spec = r.ceiling(c.bandwidth, c.allreduce_s, acceptance_length=1.0)
            line += f"; verify step {spec.step_s * 1e3:.2f} ms -> {1e3 / (spec.step_s * 1e3):.1f} steps/s x acceptance length"
        lines.append(line)
    if bandwidth_note:
        lines.append(f"  bandwidth: {bandwidth_note}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# N ranks: the all-reduce cost, per-rank rows, and the published figures each checkpoint must stay under
# ------------------------------------------------------------------------------------------------
# 2-rank NCCL all-reduce at MTU 9000: 8 KiB ~28 us, 64 KiB ~65 us (bringup-anchors.md §1.6, PR #103 comment):
# a line through both, latency + size / rate. One-shot RDMA (RoCEnante, christopherowen): 10.9 us at 10 KiB.
NCCL_2RANK_POINTS = ((8 << 10, 28e-6), (64 << 10, 65e-6))
ONESHOT_2RANK_S = 10.9e-6
_NCCL_SLOPE = (NCCL_2RANK_POINTS[1][1] - NCCL_2RANK_POINTS[0][1]) / (NCCL_2RANK_POINTS[1][0] - NCCL_2RANK_POINTS[0][0])
_NCCL_BASE = NCCL_2RANK_POINTS[0][1] - NCCL_2RANK_POINTS[0][0] * _NCCL_SLOPE
ALGOS = ("ring", "tree", "oneshot")


def allreduce_s(ranks: int, message_bytes: float, *, algo: str = "tree", two_rank_s: float | None = None) -> float:
    """One all-reduce of ``message_bytes`` across ``ranks`` ranks, from the 2-rank latency at that size
    (``two_rank_s``, else the published NCCL line above; ``oneshot``: the published one-shot RDMA figure).

    A small all-reduce is latency-bound: a ring passes 2 (N - 1) hops, a tree 2 log2 N, and at N = 2 both are the
    2-rank figure, so ring = t2 x (N - 1) and tree = t2 x log2 N (NCCL picks the tree for small messages on a
    switch; a switchless ring allows only the ring, four-sparks.md §4.3). One-shot RDMA writes to every peer at
    once: t2 plus (N - 2) more sends of the message at the fabric's ~23 GB/s."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, not {ranks}")
    if algo not in ALGOS:
        raise ValueError(f"all-reduce algorithm {algo!r}: one of {', '.join(ALGOS)}")
    if ranks == 1:
        return 0.0
    if algo == "oneshot":
        t2 = ONESHOT_2RANK_S if two_rank_s is None else two_rank_s
        return t2 + (ranks - 2) * message_bytes / 23e9
    t2 = _NCCL_BASE + message_bytes * _NCCL_SLOPE if two_rank_s is None else two_rank_s
    import math
    return t2 * ((ranks - 1) if algo == "ring" else math.log2(ranks))


def hidden_size(config: dict[str, Any]) -> int:
    return _int(text_config(config), "hidden_size", "dim")


def rank_row(step: StepBytes, config: dict[str, Any], *, tp: int, pp: int = 1, tokens: int = 1,
             bandwidth: float = GB10_DECODE_BW.value, algo: str = "tree", overlap: float = 0.0,
             p2p_s: float = 30e-6) -> dict[str, Any]:
    """One layout's decode step for a single stream: bytes each rank reads (its 1/pp of the layers, 1/tp of
    each), the resident weights per rank, the all-reduces (two per layer of its stage, each at ``tp`` ranks)
    and the pipeline hand-offs (pp - 1 sends of the activations, ``p2p_s`` each). At one stream the stages run
    one after another, so the step is the sum over stages; with pp or more streams in flight every stage is busy
    and a step of the pipeline takes one stage's time (``stage_ms``)."""
    if tp < 1 or pp < 1:
        raise ValueError(f"tp and pp must be >= 1, not {tp} and {pp}")
    layers = _int(text_config(config), "num_hidden_layers", "n_layers")
    msg = tokens * hidden_size(config) * 2.0                       # BF16 activations of the step's tokens
    ar = allreduce_s(tp, msg, algo=algo)
    per_rank = step.per_rank(tp, tokens=tokens, overlap=overlap) / pp
    read_stage = per_rank / bandwidth
    coll_stage = (2 * layers / pp) * ar if tp > 1 else 0.0
    step_s = pp * (read_stage + coll_stage) + (pp - 1) * p2p_s
    resident = step.resident() / (tp * pp)
    return {"tp": tp, "pp": pp, "ranks": tp * pp, "tokens": tokens, "bytes_per_rank": per_rank,
            "resident_per_rank": resident, "allreduce_us": ar * 1e6, "allreduces": int(2 * layers / pp) if tp > 1 else 0,
            "read_ms": pp * read_stage * 1e3, "collectives_ms": pp * coll_stage * 1e3,
            "p2p_ms": (pp - 1) * p2p_s * 1e3, "step_ms": step_s * 1e3, "stage_ms": (read_stage + coll_stage + (p2p_s if pp > 1 else 0)) * 1e3,
            "tok_s": tokens / step_s}


# Checkpoints of the published figures: config values and each tensor group's bytes per parameter
V41_FLASH_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
    "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 1152, "sliding_window": 128,
    "compress_ratios": [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 40)],
    "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 2304,
    "vocab_size": 129280, "hc_mult": 4,
}
_V41_ASSUMED = ("V4.1 config (four-sparks.md §6): hidden 5120, 40 layers, 384 routed + 1 shared, top-6, width 2304, "
                "q_lora 1280; indexer dims and compress-ratio pattern taken from V4-Flash (not published for V4.1)",
                "Engram (layers 1 and 14) reads FP8 rows of 264 B, a few per token: kilobytes, not counted")
# EXL3 stores K bits per weight (exl3_k_map.json of MiaAI's 2.9 bpw pack, seeds-repos.md §A.1): routed experts 3
# (layers 18-22: 2, so 2.875 on average over 40), shared 5 (21 layers) / 4 (19): 4.525, attention 5, lm_head 6;
# embed, routers, hc_* native.
EXL3_29 = {"routed_experts": 2.875 / 8, "shared_experts": 4.525 / 8, "attention": 5 / 8, "attention_native": 5 / 8,
           "lm_head": 6 / 8, "rest": BF16, "embedding": BF16, "hc": F32}


def _exl3(bits: float, head: float) -> dict[str, float]:
    return {"routed_experts": bits / 8, "shared_experts": bits / 8, "attention": bits / 8, "attention_native": bits / 8,
            "lm_head": head, "rest": BF16, "embedding": BF16, "hc": F32}


NATIVE_V4 = {"routed_experts": MXFP4, "shared_experts": FP8_BLOCK128, "attention": FP8_BLOCK128,
             "attention_native": BF16, "hc": F32, "lm_head": BF16, "rest": BF16, "embedding": BF16}

CHECKPOINTS: dict[str, ArchFacts] = {
    "v4-flash": ArchFacts(V4_FLASH_CONFIG, NATIVE_V4, "DeepSeek-V4-Flash (0731 / Vision-Exp) as published",
                          ("MXFP4 experts, FP8 block-128 dense, BF16 head/embed/routers/compressors, F32 mHC",)),
    "v4.1-native": ArchFacts(V41_FLASH_CONFIG, NATIVE_V4, "DeepSeek-V4.1-Flash as published (MXFP4 experts, FP8 dense)",
                             _V41_ASSUMED),
    "v4.1-fp8": ArchFacts(V41_FLASH_CONFIG, {**NATIVE_V4, "routed_experts": FP8_BLOCK128},
                          "DeepSeek-V4.1-Flash with FP8 block-128 experts (im0xMagnus 'ablated FP8')", _V41_ASSUMED),
    "v4.1-exl3-2.9": ArchFacts(V41_FLASH_CONFIG, EXL3_29, "MiaAI EXL3 2.9 bpw mul1 (per-group K from exl3_k_map.json)",
                               _V41_ASSUMED),
    "v4.1-exl3-2.0": ArchFacts(V41_FLASH_CONFIG, _exl3(2.0, 1 + 1 / 32),
                               "sfxnz EXL3 2.0 bpw MCG, lm_head MXFP8 (rev 2.0bpw-mcg-lmhead-mxfp8)",
                               _V41_ASSUMED + ("every EXL3 group at 2.0 bits (the pack's mean; fewer bytes than any "
                                               "mix with higher-bit attention, so the ceiling errs high)",)),
    "v4.1-exl3-3.5": ArchFacts(V41_FLASH_CONFIG, _exl3(3.5, 3.5 / 8), "tonyd2wild EXL3 3.5 bpw",
                               _V41_ASSUMED + ("every EXL3 group, lm_head included, at 3.5 bits (errs high)",)),
}


def checkpoint_step_bytes(name: str) -> StepBytes:
    a = CHECKPOINTS.get(name)
    if a is None:
        raise RunbookError(f"checkpoint {name!r} unknown to the roofline", fix=f"one of {', '.join(CHECKPOINTS)}")
    return step_bytes_from_config(a.config, a.bytes_per_param, source=a.source, assumptions=a.assumptions)


TRANSPORTS = {"nccl": "tree", "nccl-ring": "ring", "oneshot": "oneshot"}   # a figure's all-reduce -> algorithm
FIGURE_KEYS = ("id", "setup", "checkpoint", "tp", "spec_k", "metric", "value", "transport", "source")


def published_ceiling(fig: dict[str, Any]) -> dict[str, Any]:
    """One published figure against its ceilings (single stream). ``metric`` ``tok_s`` (with the published
    acceptance length ``tokens_per_step`` when given, else k + 1, every draft accepted: the most a step can
    yield) or ``step_ms`` (the published decode step time). ``ratio`` = published rate / ceiling rate.

    * ``bound``: 273 GB/s (the LPDDR5X peak), the 2-rank all-reduce of the figure's transport (no N-rank
      penalty), and every token of a verify step on the first token's experts (overlap 1): the fewest bytes a
      step can read, so no real run can pass it;
    * ``independent``: 273 GB/s, tree all-reduce at N ranks, routing independent (overlap 0);
    * ``decode-shaped``: as ``independent`` at the 230 GB/s a decode GEMV reads (the plan's realistic line)."""
    missing = [k for k in FIGURE_KEYS if k not in fig]
    if missing:
        raise RunbookError(f"published figure {fig.get('id', '?')}: missing {', '.join(missing)}",
                           fix=f"every figure needs {', '.join(FIGURE_KEYS)}")
    if fig["metric"] not in ("tok_s", "step_ms"):
        raise RunbookError(f"published figure {fig['id']}: metric {fig['metric']!r}", fix="tok_s or step_ms")
    if fig["transport"] not in TRANSPORTS:
        raise RunbookError(f"published figure {fig['id']}: transport {fig['transport']!r}",
                           fix=f"one of {', '.join(TRANSPORTS)}")
    step = checkpoint_step_bytes(fig["checkpoint"])
    config = CHECKPOINTS[fig["checkpoint"]].config
    tp, k = int(fig["tp"]), int(fig["spec_k"])
    m = k + 1
    per_step = float(fig.get("tokens_per_step") or m)
    layers = _int(text_config(config), "num_hidden_layers", "n_layers")
    msg = m * hidden_size(config) * 2.0
    out: dict[str, Any] = {"id": fig["id"], "setup": fig["setup"], "metric": fig["metric"], "value": fig["value"],
                           "tokens_per_step": per_step, "acceptance_published": bool(fig.get("tokens_per_step")),
                           "source": fig["source"]}
    algo = TRANSPORTS[fig["transport"]]
    cases = {"bound": (GB10_PEAK_BW.value, allreduce_s(min(tp, 2), msg, algo=algo), 1.0),
             "independent": (GB10_PEAK_BW.value, allreduce_s(tp, msg, algo=algo), 0.0),
             "decode-shaped": (GB10_DECODE_BW.value, allreduce_s(tp, msg, algo=algo), 0.0)}
    def ratio(bw: float, ar: float, overlap: float) -> tuple[float, float]:
        step_s = step.per_rank(tp, tokens=m, overlap=overlap) / bw + (2 * layers * ar if tp > 1 else 0.0)
        return step_s, (step_s * 1e3 / float(fig["value"]) if fig["metric"] == "step_ms"
                        else float(fig["value"]) / (per_step / step_s))

    for name, (bw, ar, overlap) in cases.items():
        step_s, out[f"{name}_ratio"] = ratio(bw, ar, overlap)
        out[f"{name}_step_ms"] = step_s * 1e3
        out[f"{name}_tok_s"] = per_step / step_s
    # the least overlap that brings the figure under the independent line (0 when it is already under)
    lo, hi = 0.0, 1.0
    bw, ar, _ = cases["independent"]
    if ratio(bw, ar, 0.0)[1] <= 1.0:
        hi = 0.0
    else:
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if ratio(bw, ar, mid)[1] <= 1.0 else (mid, hi)
    out["overlap_needed"] = hi
    return out


def published_table(figures: list[dict[str, Any]]) -> str:
    """The error table of docs/bench.md (published / ceiling per figure), as markdown."""
    rows = ["| Figure | Setup | Published | Tokens/step | Bound | Independent @273 | Decode-shaped @230 | Overlap needed | Source |",
            "|---|---|---|---|---|---|---|---|---|"]
    for f in figures:
        c = published_ceiling(f)
        unit = "ms/step" if c["metric"] == "step_ms" else "tok/s"
        tps = f"{c['tokens_per_step']:.2f}" + ("" if c["acceptance_published"] else " (k+1)")
        if c["metric"] == "step_ms":
            tps = f"{int(f['spec_k']) + 1} verified"
        cells = " | ".join(f"{c[n + '_ratio'] * 100:.0f} %" for n in ("bound", "independent", "decode-shaped"))
        rows.append(f"| {c['id']} | {c['setup']} | {float(c['value']):g} {unit} | {tps} | {cells} | "
                    f"{c['overlap_needed']:.2f} | {c['source']} |")
    return "\n".join(rows)


def scale_text(checkpoint: str = "v4.1-native", nodes: tuple[int, ...] = (2, 4, 8, 16), spec_k: int = 5) -> str:
    """docs/scale.md's numbers: per layout, bytes per rank, resident weights per rank, the all-reduce at N
    ranks (tree and ring), the single-stream step and tok/s, plain and a k+1 verify step."""
    step = checkpoint_step_bytes(checkpoint)
    config = CHECKPOINTS[checkpoint].config
    lines = [f"{checkpoint}: {step.total / 1e9:.2f} GB read per token (whole model), "
             f"{step.resident() / 1e9:.1f} GB resident; "
             f"decode-shaped {GB10_DECODE_BW.value / 1e9:.0f} GB/s; NCCL 2-rank line {_NCCL_BASE * 1e6:.1f} us + "
             f"{_NCCL_SLOPE * 1e6 * 1024:.3f} us/KiB",
             f"{'layout':<10} {'algo':<5} {'tokens':>6} {'GB/rank':>8} {'resident GB':>11} {'AR us':>7} {'ARs':>4} "
             f"{'read ms':>8} {'coll ms':>8} {'step ms':>8} {'steps/s':>7} {'stage ms':>9}"]
    layouts = [(n, 1) for n in nodes] + [(n // pp, pp) for n in nodes for pp in (2, 4) if n // pp >= 2 and n % pp == 0]
    for tp, pp in layouts:
        for algo in ("tree", "ring"):
            if tp == 2 and algo == "ring":
                continue
            for tokens in (1, spec_k + 1):
                r = rank_row(step, config, tp=tp, pp=pp, tokens=tokens, algo=algo)
                lines.append(f"{f'TP{tp}xPP{pp}':<10} {algo:<5} {tokens:>6} {r['bytes_per_rank'] / 1e9:>8.2f} "
                             f"{r['resident_per_rank'] / 1e9:>11.1f} {r['allreduce_us']:>7.1f} {r['allreduces']:>4} "
                             f"{r['read_ms']:>8.2f} {r['collectives_ms']:>8.2f} {r['step_ms']:>8.2f} "
                             f"{1e3 / r['step_ms']:>7.1f} {r['stage_ms']:>9.2f}")
    # single stream: TP=N against TP=N/2 x PP2. PP halves the all-reduces' rank count but each rank now reads
    # twice the bytes (the stages run one after another), so PP wins only once the 2-rank all-reduce t2 passes
    # (R/N/bw + p2p) / (2L (f(N) - f(N/2))), f = log2 (tree) or N - 1 (ring); at one stream, plain decode
    import math
    layers = _int(text_config(config), "num_hidden_layers", "n_layers")
    h = hidden_size(config)
    hc = _int(text_config(config), "hc_mult", default=1)
    lines.append("single stream, plain decode: TP=N vs TP=N/2 x PP2 tie at a 2-rank all-reduce of")
    for n in nodes:
        if n < 4:
            continue
        read = step.per_rank(n) / GB10_DECODE_BW.value
        for algo, f in (("tree", math.log2), ("ring", lambda x: x - 1)):
            t2 = (read + 30e-6) / (2 * layers * (f(n) - f(n // 2)))
            lines.append(f"  N={n:<3} {algo}: {t2 * 1e6:6.1f} us (PP wins above it; published 2-rank NCCL 8 KiB: 28 us)")
    # prefill: what each token puts on the wire per rank. TP: 2 all-reduces per layer of hidden BF16, a ring moving
    # 2 (N - 1) / N of it; PP: one hand-off of the hc_mult residual streams per stage boundary
    lines.append("prefill, bytes on the wire per token per rank (at 23 GB/s, the 2-rank NCCL all-reduce busbw of 187 Gb/s):")
    for n in nodes:
        tp_bytes = 2 * layers * 2 * (n - 1) / n * h * 2
        lines.append(f"  TP{n:<3} {tp_bytes / 1e6:6.2f} MB -> {23e9 / tp_bytes:8.0f} tok/s   "
                     f"PP hand-off {hc * h * 2 / 1e3:5.1f} kB -> {23e9 / (hc * h * 2):8.0f} tok/s")
    return "\n".join(lines)


if __name__ == "__main__":     # python -m runbook.fit.roofline published FILE.json | scale [CHECKPOINT]
    import sys
    if len(sys.argv) >= 3 and sys.argv[1] == "published":
        print(published_table(json.loads(Path(sys.argv[2]).read_text())["figures"]))
    elif len(sys.argv) >= 2 and sys.argv[1] == "scale":
        print(scale_text(*(sys.argv[2:3] or ["v4.1-native"])))
    else:
        raise SystemExit("usage: python -m runbook.fit.roofline published FILE.json | scale [CHECKPOINT]")
