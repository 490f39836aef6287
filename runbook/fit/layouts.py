"""Per-rank memory and the decode ceiling of a model at several parallel layouts (TP x PP), for ``plan --layouts``.

Memory per rank (pure arithmetic over the fit model's figures, ``budget.py``):

* weights: the checkpoint over TP x PP, plus what every TP rank holds whole (``replicated``): the part of
  ``WEIGHT_BUDGET_GIB`` above the even split at the profile's own TP when the profile sets it (seed A's
  ``weight_budget.py`` counts replicated tensors), else the routers and a KV projection TP cannot split (one KV
  head, from the model's config). Under PP the largest stage counts: its share of the layers (vLLM's
  ``get_pp_indices``: the remainder goes to the stages before the last), the replicated part spread over the stages
  like the layers, plus the embedding (first stage) or ``lm_head`` (last stage), each split by TP;
* KV room: the largest KV pool one rank can hold, ``min(MemAvailable, MemTotal - OS floor) - weights - runtime``
  (the fit model's boot and steady-state rows solved for the pool), and the tokens it holds: bytes per token from the
  recipe's published boot, times the largest stage's share of the layers (a single KV head is copied to every TP
  rank, so TP does not shrink it; PP does).

Decode ceiling at batch 1 (``roofline.py``'s bytes and constants, not copies): a token passes every stage in turn,
so one step reads the whole model's weights split by TP only, ``step.per_rank(tp)`` plus the KV reads, at the
memory bandwidth; plus ``2 x layers`` all-reduces over TP ranks (after attention and after the MoE) and ``PP - 1``
point-to-point hops between stages. A ring all-reduce of ``B`` bytes over ``N`` ranks costs
``2 (N - 1) / N x B / link + (N - 1) x alpha``, where the per-hop latency alpha is calibrated so that ``N = 2`` gives
the published two-rank figure (``ALLREDUCE_FAST`` / ``ALLREDUCE_SLOW``). PP therefore never speeds up one stream:
it adds hops and only buys memory (and throughput once several requests fill the pipeline).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import RunbookError
from ..profile.layouts import PADDING_RECIPES, ModelShape, expert_parallel, layout_problems, model_shape
from . import roofline as R
from .budget import checkpoint_size, recipe_figures
from .figures import GIB, PUBLISHED, Figure

LINK_BW = Figure(200e9 / 8, PUBLISHED, "one CX-7 port at 200 Gb/s per Spark (NVIDIA switch playbook: >= 200 G ports; "
                                       "four-sparks.md §1.1)")
ACT_BYTES = 2                 # BF16 activations: what an all-reduce and a stage hop carry per hidden element

#: recipes whose profile states no architecture for the roofline: the roofline's own config-only checkpoint entry
#: (V4.1-Flash config values, per-group EXL3 bits from exl3_k_map.json, native dtypes elsewhere; docs/bench.md)
FALLBACK_ARCH = {"exl3-v41": R.CHECKPOINTS["v4.1-exl3-2.9"]}


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int = 1

    @property
    def ranks(self) -> int:
        return self.tp * self.pp

    @property
    def name(self) -> str:
        return f"TP{self.tp}" + (f"xPP{self.pp}" if self.pp > 1 else "")


def parse_layouts(text: str) -> list[Layout]:
    """``tp2,tp3,tp4,tp2xpp2`` (case-insensitive; ``2x2`` = TP2 x PP2) -> layouts."""
    out = []
    for item in [x.strip() for x in text.split(",") if x.strip()]:
        m = re.fullmatch(r"(?:tp)?(\d+)(?:\s*[x*]\s*(?:pp)?(\d+))?", item.lower())
        if not m or int(m.group(1)) < 1 or int(m.group(2) or 1) < 1:
            raise RunbookError(f"--layouts: {item!r} is not a layout", fix="write e.g. --layouts tp2,tp3,tp4,tp2xpp2")
        out.append(Layout(int(m.group(1)), int(m.group(2) or 1)))
    if not out:
        raise RunbookError("--layouts is empty", fix="write e.g. --layouts tp2,tp4,tp2xpp2")
    return out


def ring_allreduce_s(n: int, nbytes: float, link_bw: float, two_rank_s: float) -> float:
    """Ring all-reduce time on ``n`` ranks: ``2 (n-1)/n x bytes / link + (n-1) x alpha``, alpha such that ``n = 2``
    costs ``two_rank_s`` (a published two-rank latency)."""
    if n < 2:
        return 0.0
    alpha = max(two_rank_s - nbytes / link_bw, 0.0)
    return 2 * (n - 1) / n * nbytes / link_bw + (n - 1) * alpha


def hop_s(nbytes: float, link_bw: float, two_rank_s: float) -> float:
    """One point-to-point send between pipeline stages: one hop of the ring's latency plus the bytes."""
    return max(two_rank_s - nbytes / link_bw, 0.0) + nbytes / link_bw


def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers per stage as vLLM's ``get_pp_indices`` splits them (the remainder to the stages before the last)."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


@dataclass
class LayoutRow:
    layout: Layout
    problems: list[str]
    weights: float = 0.0                 # per rank, largest stage (bytes)
    replicated: float = 0.0
    kv_room: float | None = None         # per rank (bytes)
    kv_tokens: int | None = None
    stages: list[int] | None = None
    ceilings: dict[str, dict[str, float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout.name, "tp": self.layout.tp, "pp": self.layout.pp, "problems": self.problems,
                "weights_per_rank": self.weights, "replicated_per_rank": self.replicated, "kv_room": self.kv_room,
                "kv_tokens": self.kv_tokens, "stage_layers": self.stages, "ceilings": self.ceilings}


def _n(cfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    return next((int(cfg[k]) for k in keys if isinstance(cfg.get(k), (int, float)) and cfg[k]), default)


def _shape(profile, config: dict[str, Any] | None) -> ModelShape | None:
    return model_shape(profile) or (ModelShape.from_config(config, "roofline config") if config else None)


def _replicated(profile, config: dict[str, Any], checkpoint: Figure | None, tp: int) -> tuple[float, str]:
    """Bytes every TP rank holds whole (beyond its 1/TP share) and where the figure comes from."""
    if tp < 2:
        return 0.0, ""
    if profile.weight_budget_gib > 0 and checkpoint is not None and profile.tp > 1:
        extra = profile.weight_budget_gib * GIB - checkpoint.value / profile.tp
        return max(extra, 0.0), f"WEIGHT_BUDGET_GIB above the even split at TP={profile.tp}"
    cfg = R.text_config(config)
    h, layers = _n(cfg, "hidden_size"), _n(cfg, "num_hidden_layers", "n_layers")
    kvh, hd = _n(cfg, "num_key_value_heads", default=1), _n(cfg, "head_dim")
    routers = layers * h * R.n_routed_experts(cfg) * 2.0                  # BF16 gate, ReplicatedLinear
    kv_proj = layers * h * hd * kvh * 1.0 if kvh < tp else 0.0           # one KV head: copied to every rank (FP8)
    return routers + kv_proj, "routers (BF16) and the KV projection TP cannot split (from config.json)"


def layout_rows(profile, layouts: list[Layout], *, roof: R.Roofline | None, facts, checkpoint: Figure | None,
                ceilings: dict[str, tuple[float, float]]) -> list[LayoutRow]:
    """One row per layout. ``ceilings``: name -> (memory bandwidth B/s, two-rank all-reduce s)."""
    config = roof.config if roof else None
    shape = _shape(profile, config)
    ckpt = checkpoint_size(profile, checkpoint)
    figs = recipe_figures(profile)
    node = next(iter(facts.values()), None) if facts else None
    ep = expert_parallel(profile.extra_args_list)
    rows = []
    for lay in layouts:
        problems = [p.message for p in layout_problems(shape, lay.tp, lay.pp, ep=ep,
                                                       pads=profile.recipe in PADDING_RECIPES)] if shape else []
        row = LayoutRow(lay, problems)
        rows.append(row)
        if problems:
            continue
        layers = shape.layers if shape else 1
        stages = stage_layers(layers, lay.pp)
        row.stages = stages if lay.pp > 1 else None
        frac = max(stages) / layers
        if ckpt is not None and config is not None:
            cfg = R.text_config(config)
            end = _n(cfg, "vocab_size") * _n(cfg, "hidden_size") * ACT_BYTES     # embedding or lm_head, BF16
            ends = 2 * end if not cfg.get("tie_word_embeddings") else end
            rep, _ = _replicated(profile, config, ckpt, lay.tp)
            body = max(ckpt.value - ends, 0.0)
            per_stage = [body * n / layers / lay.tp + rep * n / layers for n in stages]
            per_stage[0] += (ends if lay.pp == 1 else end) / lay.tp
            if lay.pp > 1:
                per_stage[-1] += end / lay.tp
            row.weights, row.replicated = max(per_stage), rep
        if node is not None and row.weights and figs.os_floor is not None:
            limit = min(node.mem_available.value, node.mem_total.value - figs.os_floor.value)
            row.kv_room = limit - row.weights - figs.runtime.value
            ref = figs.kv_reference
            if ref is not None and row.kv_room > 0:
                row.kv_tokens = int(row.kv_room // (ref.bytes_per_token * frac))
        if roof is not None:
            cfg = R.text_config(roof.config)
            layers_r = _n(cfg, "num_hidden_layers", "n_layers")
            h = _n(cfg, "hidden_size")
            r = R.Roofline(roof.step, roof.config, lay.tp, roof.context, roof.kv_dtype, 0)
            read_bytes = r.plain_bytes()
            ar_bytes = h * ACT_BYTES
            hop_bytes = h * max(_n(cfg, "hc_mult", default=1), 1) * ACT_BYTES
            row.ceilings = {}
            for name, (bw, two) in ceilings.items():
                ar = ring_allreduce_s(lay.tp, ar_bytes, LINK_BW.value, two)
                n_ar = 2 * layers_r if lay.tp > 1 else 0
                hops = (lay.pp - 1) * hop_s(hop_bytes, LINK_BW.value, two)
                step = read_bytes / bw + n_ar * ar + hops
                row.ceilings[name] = {"bytes_per_rank_step": read_bytes / lay.pp, "bytes_per_token_path": read_bytes,
                                      "read_ms": read_bytes / bw * 1e3, "allreduces": n_ar,
                                      "allreduce_us": ar * 1e6, "hops_ms": hops * 1e3, "step_ms": step * 1e3,
                                      "tok_s": 1.0 / step}
    return rows


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / GIB:.1f}"


def layouts_text(profile, rows: list[LayoutRow], ceiling_notes: dict[str, str]) -> str:
    names = list(ceiling_notes)
    head = ["layout", "ranks", "weights/rank GiB", "KV room/rank GiB", "KV tokens"] + \
        [f"all-reduce us ({n})" for n in names] + [f"ms/step ({n})" for n in names] + [f"tok/s ({n})" for n in names]
    table = [head]
    notes = []
    for r in rows:
        if r.problems:
            notes.append(f"- {r.layout.name}: cannot split: " + "; ".join(r.problems))
            table.append([r.layout.name, str(r.layout.ranks), "cannot split"] + [""] * (len(head) - 3))
            continue
        c = r.ceilings or {}
        table.append([r.layout.name, str(r.layout.ranks), _gib(r.weights or None), _gib(r.kv_room),
                      f"{r.kv_tokens:,}" if r.kv_tokens is not None else "-"]
                     + [f"{c[n]['allreduce_us']:.0f}" if n in c else "-" for n in names]
                     + [f"{c[n]['step_ms']:.2f}" if n in c else "-" for n in names]
                     + [f"{c[n]['tok_s']:.1f}" if n in c else "-" for n in names])
        if r.stages:
            notes.append(f"- {r.layout.name}: layers per stage {'/'.join(map(str, r.stages))}; the largest stage "
                         "sets the weights and KV per rank")
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [f"parallel layouts of {profile.hf_model_repo or profile.recipe} (batch 1, context "
             f"{profile.bench_prompt_tokens:,} tokens):"]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    lines += notes
    lines += ["- weights/rank: checkpoint / (TP x PP) + what every TP rank holds whole; KV room/rank: "
              "min(MemAvailable, MemTotal - OS floor) - weights - runtime, the largest pool one rank can hold; "
              "KV tokens: that pool at the recipe's published bytes per token (one KV head: TP does not shrink it, "
              "PP does)",
              "- decode: a token passes every stage in turn, so PP adds PP - 1 stage hops and no "
              "speed at one stream (only memory, and throughput once several requests fill the pipeline); TP "
              "splits the reads and pays 2 all-reduces per layer, each a ring: 2(N-1)/N x bytes / link + "
              f"(N-1) x alpha, alpha from the published two-rank latency; link: {LINK_BW.note}"]
    lines += [f"- {n}: {note}" for n, note in ceiling_notes.items()]
    return "\n".join(lines)


def roofline_or_fallback(profile, model_dir: str | None) -> R.Roofline | None:
    """The profile's roofline (``roofline_for``), else the config-only fallback of :data:`FALLBACK_ARCH`."""
    r = R.roofline_for(profile, model_dir=model_dir)
    if r is not None or profile.lab or profile.recipe not in FALLBACK_ARCH:
        return r
    a = FALLBACK_ARCH[profile.recipe]
    step = R.step_bytes_from_config(a.config, a.bytes_per_param, source=a.source, assumptions=a.assumptions)
    return R.Roofline(step, a.config, int(profile.tp), int(profile.bench_prompt_tokens),
                      str(profile.kv_cache_dtype or ""), int(profile.spec_k), int(profile.pp))
