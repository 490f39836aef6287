"""The fit model: memory per node and disk per filesystem, against the nodes' facts. Pure: no I/O.

Memory, per host (a Spark is one host; the lab's nodes share one kernel, so their ranks add up):

* weights per rank  W = WEIGHT_BUDGET_GIB, else checkpoint / (TP x PP) (never below the even split);
* KV pool per rank  KV = KV_CACHE_MEMORY_BYTES when pinned, else GPU_MEM_UTIL x total - W - R, where
  R is what vLLM's profiling run measured besides the weights (from a published boot of the recipe);
* runtime per rank  G = CUDA context, CUDA graphs, workspaces, NCCL (published/nominal per recipe);
* OS floor          F = what the OS, docker and the desktop keep (published for a Spark).

Rows (each names the knob to turn when it fails):

* vLLM startup check   GPU_MEM_UTIL x total <= MemAvailable (vLLM refuses to start otherwise);
* boot                 max(W + KV + G, W + BOOT_MARGIN_GIB) <= MemAvailable at launch;
* steady state         W + KV + G + F <= MemTotal (the rest is MemAvailable after warm-up);
* KV pool tokens       KV / bytes-per-token >= MAX_MODEL_LEN (vLLM refuses a pool that cannot hold
                       one full request).

Disk, per filesystem: every item (weights, Engram source, packed Engram, image, caches) is placed on
the filesystem holding its path on its node; items on one filesystem are summed (bytes and inodes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..checks import Check, Status
from ..profile.nodes import MAX_NODES, NODE_NAMES, node_key
from .figures import (DERIVED, DOCKER_ROOT, GIB, LAB_CPU_KV, NOMINAL, PROFILE, PUBLISHED, RECIPES, Figure,
                      RecipeFigures, gib)

FITS, DOES_NOT_FIT, UNKNOWN = "FITS", "DOES NOT FIT", "UNKNOWN"
BYTES, TOKENS, FILES = "bytes", "tokens", "files"


# ------------------------------------------------------------------------------------------------
# facts about the nodes (measured, published or nominal)
# ------------------------------------------------------------------------------------------------
@dataclass
class FsFacts:
    """The filesystem holding a path on a node."""
    mount: str
    avail_bytes: Figure
    size_bytes: Figure | None = None
    avail_inodes: Figure | None = None     # None: unknown; value 0 with total 0: no inode limit (btrfs)
    total_inodes: Figure | None = None
    device: str = ""                       # st_dev: same device = same filesystem, whatever the mount

    def to_dict(self) -> dict[str, Any]:
        fig = lambda f: f.to_dict() if f else None
        return {"mount": self.mount, "device": self.device, "avail_bytes": fig(self.avail_bytes),
                "size_bytes": fig(self.size_bytes), "avail_inodes": fig(self.avail_inodes),
                "total_inodes": fig(self.total_inodes)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FsFacts":
        fig = lambda k: Figure.from_dict(d[k]) if d.get(k) else None
        return cls(str(d["mount"]), fig("avail_bytes"), fig("size_bytes"), fig("avail_inodes"),
                   fig("total_inodes"), str(d.get("device", "")))


@dataclass
class NodeCapacity:
    name: str
    mem_total: Figure
    mem_available: Figure
    paths: dict[str, FsFacts] = field(default_factory=dict)   # path -> its filesystem
    used: dict[str, Figure] = field(default_factory=dict)     # path -> bytes already there (du)
    image_present: bool | None = None                         # None: not known
    host: str = ""                       # nodes with the same host share memory and filesystems
    default_fs: FsFacts | None = None    # nominal facts: every path lives on this one filesystem

    def fs_of(self, path: str) -> FsFacts | None:
        return self.paths.get(path) or self.default_fs

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mem_total": self.mem_total.to_dict(),
                "mem_available": self.mem_available.to_dict(),
                "paths": {p: fs.to_dict() for p, fs in self.paths.items()},
                "used": {p: f.to_dict() for p, f in self.used.items()},
                "image_present": self.image_present, "host": self.host,
                "default_fs": self.default_fs.to_dict() if self.default_fs else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NodeCapacity":
        return cls(str(d["name"]), Figure.from_dict(d["mem_total"]), Figure.from_dict(d["mem_available"]),
                   {p: FsFacts.from_dict(v) for p, v in (d.get("paths") or {}).items()},
                   {p: Figure.from_dict(v) for p, v in (d.get("used") or {}).items()},
                   d.get("image_present"), str(d.get("host", "")),
                   FsFacts.from_dict(d["default_fs"]) if d.get("default_fs") else None)


# ------------------------------------------------------------------------------------------------
# result rows
# ------------------------------------------------------------------------------------------------
@dataclass
class Row:
    section: str                  # "memory" | "disk" | "inodes"
    name: str
    node: str                     # "head", "worker", "head+worker" (a shared lab host)
    status: Status
    unit: str = BYTES
    need: float | None = None
    have: float | None = None
    terms: list[tuple[str, Figure]] = field(default_factory=list)   # what `need` is made of
    have_figure: Figure | None = None
    detail: str = ""
    knob: str = ""                # the profile key (or thing) to turn
    fix: str = ""

    @property
    def headroom(self) -> float | None:
        return None if self.need is None or self.have is None else self.have - self.need

    def fmt(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.unit == BYTES:
            return f"{value / GIB:,.2f} GiB"
        return f"{value:,.0f} {self.unit}"

    def to_check(self) -> Check:
        sources = {label: f.source for label, f in self.terms}
        if self.have_figure is not None:
            sources["have"] = self.have_figure.source
        observed = self.detail or (f"need {self.fmt(self.need)}, have {self.fmt(self.have)}")
        expected = (f"need <= {self.fmt(self.have)} ({self.have_figure.source})"
                    if self.have_figure is not None and self.have is not None else "")
        return Check(name=f"fit: {self.name}", node=self.node, status=self.status, observed=observed,
                     expected=expected, fix="" if self.status in (Status.PASS, Status.NA) else self.fix,
                     data={"section": self.section, "unit": self.unit, "need": self.need, "have": self.have,
                           "headroom": self.headroom, "knob": self.knob, "sources": sources})

    def to_dict(self) -> dict[str, Any]:
        return {"section": self.section, "name": self.name, "node": self.node, "status": self.status.value,
                "unit": self.unit, "need": self.need, "have": self.have, "headroom": self.headroom,
                "terms": [{"label": label, **f.to_dict()} for label, f in self.terms],
                "have_figure": self.have_figure.to_dict() if self.have_figure else None,
                "detail": self.detail, "knob": self.knob, "fix": self.fix}


def _status(ok: bool) -> Status:
    return Status.PASS if ok else Status.FAIL


def _terms_text(terms: Iterable[tuple[str, Figure]], unit: str = BYTES) -> str:
    parts = []
    for label, f in terms:
        value = f"{f.gib:.2f} GiB" if unit == BYTES else f"{f.value:,.0f}"
        parts.append(f"{label} {value} [{f.source}]")
    return " + ".join(parts)


# ------------------------------------------------------------------------------------------------
# weights and KV
# ------------------------------------------------------------------------------------------------
@dataclass
class Weights:
    per_rank: Figure | None
    checkpoint: Figure | None
    row: Row


def recipe_figures(profile) -> RecipeFigures:
    # the figures of the hardware the profile runs on: a rehearsal of a recipe runs on the lab
    return RECIPES["lab" if profile.lab else profile.recipe]


def checkpoint_size(profile, measured: Figure | None = None) -> Figure | None:
    """Bytes of the whole checkpoint: a local/node index (``measured``) > WEIGHTS_GIB > published."""
    if measured is not None:
        return measured
    if profile.weights_gib > 0:
        return gib(profile.weights_gib, PROFILE, "WEIGHTS_GIB")
    return recipe_figures(profile).checkpoint_bytes


def weights_per_rank(profile, checkpoint: Figure | None) -> Weights:
    """W per rank: WEIGHT_BUDGET_GIB (a per-rank figure such as seed A's weight_budget.py, which counts
    replicated tensors), else the even split checkpoint / (TP x PP; plan --layouts weighs uneven stages). A budget
    below the even split is impossible and is reported against WEIGHT_BUDGET_GIB."""
    tp, pp = profile.tp, profile.pp
    ranks = f"TP={tp} x PP={pp}" if pp > 1 else f"TP={tp}"
    split = (Figure(checkpoint.value / (tp * pp), DERIVED, f"checkpoint {checkpoint.gib:.2f} GiB [{checkpoint.source}] "
                    f"/ {ranks}") if checkpoint else None)
    budget = gib(profile.weight_budget_gib, PROFILE, "WEIGHT_BUDGET_GIB") if profile.weight_budget_gib > 0 else None
    name = "weights per rank"
    if budget is None and split is None:
        return Weights(None, checkpoint, Row("memory", name, "cluster", Status.FAIL,
                                             detail="no checkpoint size: WEIGHTS_GIB and WEIGHT_BUDGET_GIB are 0 "
                                                    "and the recipe publishes none",
                                             knob="WEIGHTS_GIB",
                                             fix="set WEIGHTS_GIB (checkpoint size) or WEIGHT_BUDGET_GIB (per rank), "
                                                 "or pass --index with the checkpoint's model.safetensors.index.json"))
    if budget is None:
        per_rank = Figure(split.value, DERIVED, split.note + " (even split: replicated tensors add to it)")
        return Weights(per_rank, checkpoint, Row("memory", name, "cluster", Status.PASS, need=per_rank.value,
                                                 terms=[("weights", per_rank)], detail=per_rank.note))
    if split is not None and budget.value < split.value * 0.999:
        return Weights(split, checkpoint, Row(
            "memory", name, "cluster", Status.FAIL, need=split.value, have=budget.value,
            terms=[("even split", split)], have_figure=budget,
            detail=f"WEIGHT_BUDGET_GIB {budget.gib:.2f} GiB is below the even split {split.note} = "
                   f"{split.gib:.2f} GiB",
            knob="WEIGHT_BUDGET_GIB",
            fix=f"set WEIGHT_BUDGET_GIB to the per-rank size (>= {split.gib:.2f}; seed A: "
                "scripts/weight_budget.py --tp N) or 0 to use the even split; check WEIGHTS_GIB"))
    detail = f"WEIGHT_BUDGET_GIB {budget.gib:.2f} GiB" + (
        f" (even split {split.note} = {split.gib:.2f} GiB; {budget.gib - split.gib:.2f} GiB replicated)"
        if split else "")
    return Weights(budget, checkpoint, Row("memory", name, "cluster", Status.PASS, need=budget.value,
                                           terms=[("weights", budget)], detail=detail))


@dataclass
class KvPool:
    mode: str                          # "pinned" | "util" | "cpu"
    pool: Figure                       # per rank
    bytes_per_token: Figure | None     # None: no published boot with this KV dtype and block size
    profiled_runtime: Figure | None = None

    @property
    def tokens(self) -> int | None:
        if self.bytes_per_token is None:
            return None
        return max(0, int(self.pool.value // self.bytes_per_token.value))


def kv_bytes_per_token(profile) -> Figure | None:
    ref = recipe_figures(profile).kv_reference
    if ref is None or profile.kv_cache_dtype not in ref.kv_dtypes or profile.kv_block_size not in ref.block_sizes:
        return None
    return Figure(ref.bytes_per_token, DERIVED, f"{ref.pool_bytes / GIB:.2f} GiB / {ref.tokens:,} tokens ({ref.note})")


def kv_pool(profile, total: Figure, weights: Figure) -> KvPool:
    bpt = kv_bytes_per_token(profile)
    if profile.kv_cache_memory_bytes:
        return KvPool("pinned", Figure(profile.kv_cache_memory_bytes, PROFILE, "KV_CACHE_MEMORY_BYTES"), bpt)
    if profile.lab:
        return KvPool("cpu", LAB_CPU_KV, bpt)
    figs = recipe_figures(profile)
    r = figs.util_boot.profiled_runtime if figs.util_boot else figs.runtime
    value = profile.gpu_mem_util * total.value - weights.value - r.value
    pool = Figure(value, DERIVED, f"GPU_MEM_UTIL {profile.gpu_mem_util} x {total.gib:.2f} GiB [{total.source}] "
                                  f"- weights {weights.gib:.2f} - profiling run {r.gib:.2f} GiB [{r.source}]")
    return KvPool("util", pool, bpt, r)


# ------------------------------------------------------------------------------------------------
# memory rows
# ------------------------------------------------------------------------------------------------
def _floor2(x: float) -> float:
    return math.floor(x * 100) / 100


def _memory_knob(profile, kv: KvPool, short: float, ranks: int, total: Figure, where: str,
                 weights_alone_short: bool) -> tuple[str, str]:
    """(knob, fix) for a memory row that is ``short`` bytes over."""
    if weights_alone_short:
        n = profile.node_count
        more = (f"add a Spark ({node_key(NODE_NAMES[n], 'SSH')}, TP={n + 1}, NNODES={n + 1}) or "
                if n < MAX_NODES else "")
        return "TP", (f"the weights alone leave no room on this node: {more}use a smaller checkpoint "
                      "(HF_MODEL_REPO, WEIGHTS_GIB)")
    short_gib = short / GIB
    if kv.mode == "pinned":
        new = kv.pool.value - short / ranks
        if new > 0:
            return "KV_CACHE_MEMORY_BYTES", (f"lower KV_CACHE_MEMORY_BYTES to <= {int(new)} ({new / GIB:.2f} GiB; "
                                             f"fewer KV tokens) or {where} by {short_gib:.2f} GiB")
        return "KV_CACHE_MEMORY_BYTES", f"{where} by {short_gib:.2f} GiB (the KV pool alone cannot absorb it)"
    if kv.mode == "util":
        new = _floor2(profile.gpu_mem_util - short / total.value)
        return "GPU_MEM_UTIL", (f"lower GPU_MEM_UTIL to <= {new:.2f} (a smaller KV pool) or {where} by "
                                f"{short_gib:.2f} GiB")
    return "KV_CACHE_MEMORY_BYTES", (f"{where} by {short_gib:.2f} GiB, or pin a smaller CPU KV pool with "
                                     "KV_CACHE_MEMORY_BYTES")


def memory_rows(profile, facts: NodeCapacity, ranks: list[str], weights: Figure, figs: RecipeFigures) -> list[Row]:
    """Rows for one host running ``ranks`` (one rank on a Spark; every rank on the lab host)."""
    node = "+".join(ranks)
    n = len(ranks)
    total, avail = facts.mem_total, facts.mem_available
    kv = kv_pool(profile, total, weights)
    g = figs.runtime
    rows: list[Row] = []
    times = (lambda label: f"{n} x {label}") if n > 1 else (lambda label: label)
    w_term = (times("weights"), Figure(n * weights.value, weights.source, weights.note))
    kv_term = (times(f"KV pool ({kv.mode})"), Figure(n * kv.pool.value, kv.pool.source, kv.pool.note))
    g_term = (times("runtime"), Figure(n * g.value, g.source, g.note))

    # vLLM's own startup check (GPU backends): requested = util x total must be free
    if profile.lab:
        rows.append(Row("memory", "vLLM startup check", node, Status.NA,
                        detail="CPU vLLM (lab): no GPU_MEM_UTIL startup check"))
    else:
        need = profile.gpu_mem_util * total.value
        ok = need <= avail.value
        knob, fix = "", ""
        if not ok:
            knob = "GPU_MEM_UTIL"
            fix = (f"lower GPU_MEM_UTIL to <= {_floor2(avail.value / total.value):.2f}, or free "
                   f"{(need - avail.value) / GIB:.2f} GiB on {node} (stop other workloads; drop the page cache)")
        rows.append(Row("memory", "vLLM startup check", node, _status(ok), need=need, have=avail.value,
                        terms=[("GPU_MEM_UTIL x total", Figure(need, DERIVED,
                                f"{profile.gpu_mem_util} x {total.gib:.2f} GiB [{total.source}]"))],
                        have_figure=avail,
                        detail=f"GPU_MEM_UTIL {profile.gpu_mem_util} x {total.gib:.2f} GiB [{total.source}] = "
                               f"{need / GIB:.2f} GiB must be free; MemAvailable {avail.gib:.2f} GiB [{avail.source}]",
                        knob=knob, fix=fix))

    # boot: everything the launch allocates must fit in MemAvailable (and seed A's margin gate)
    terms = [w_term, kv_term, g_term]
    alloc = sum(f.value for _, f in terms)
    gate = n * (weights.value + profile.boot_margin_gib * GIB)
    need = max(alloc, gate)
    ok = need <= avail.value
    binding = ("weights + KV pool + runtime" if alloc >= gate else
               f"weights + BOOT_MARGIN_GIB {profile.boot_margin_gib:g} (seed A's gate)")
    detail = (f"{_terms_text(terms)} = {alloc / GIB:.2f} GiB; {times('(weights + BOOT_MARGIN_GIB)')} = "
              f"{gate / GIB:.2f} GiB; "
              f"binding: {binding}; MemAvailable {avail.gib:.2f} GiB [{avail.source}]")
    knob = fix = ""
    if not ok:
        alone = n * (weights.value + g.value) > avail.value
        knob, fix = _memory_knob(profile, kv, need - avail.value, n, total,
                                 f"free memory on {node} (stop other workloads; drop the page cache)", alone)
    rows.append(Row("memory", "boot: MemAvailable at launch", node, _status(ok), need=need, have=avail.value,
                    terms=terms, have_figure=avail, detail=detail, knob=knob, fix=fix))

    # steady state against the node's total, with the OS floor
    if figs.os_floor is None:
        rows.append(Row("memory", "steady state: MemTotal", node, Status.NA,
                        detail="not a Spark: the host's own use is in MemAvailable (boot row)"))
    else:
        terms = [w_term, kv_term, g_term, ("OS floor", figs.os_floor)]
        need = sum(f.value for _, f in terms)
        ok = need <= total.value
        knob = fix = ""
        if not ok:
            alone = n * (weights.value + g.value) + figs.os_floor.value > total.value
            knob, fix = _memory_knob(profile, kv, need - total.value, n, total,
                                     "trim what the OS/desktop keeps", alone)
        rows.append(Row("memory", "steady state: MemTotal", node, _status(ok), need=need, have=total.value,
                        terms=terms, have_figure=total,
                        detail=f"{_terms_text(terms)} = {need / GIB:.2f} GiB of {total.gib:.2f} GiB "
                               f"[{total.source}]; MemAvailable after warm-up ~ {(total.value - need) / GIB:.2f} GiB",
                        knob=knob, fix=fix))

    rows.append(_kv_tokens_row(profile, kv, node))
    return rows


def _kv_tokens_row(profile, kv: KvPool, node: str) -> Row:
    name = "KV pool holds MAX_MODEL_LEN"
    if kv.pool.value <= 0:
        return Row("memory", name, node, Status.FAIL, unit=TOKENS, need=profile.max_model_len, have=0,
                   terms=[("KV pool", kv.pool)],
                   detail=f"KV pool {kv.pool.gib:.2f} GiB: {kv.pool.note}", knob="GPU_MEM_UTIL",
                   fix="raise GPU_MEM_UTIL (the weights and runtime take the whole budget) or use a smaller checkpoint")
    if kv.bytes_per_token is None:
        why = ("no published boot for RECIPE=lab" if profile.is_lab else
               f"no published boot with KV_CACHE_DTYPE={profile.kv_cache_dtype or '(auto)'} and "
               f"KV_BLOCK_SIZE={profile.kv_block_size}")
        return Row("memory", name, node, Status.NA, unit=TOKENS,
                   detail=f"KV pool {kv.pool.gib:.2f} GiB [{kv.pool.source}]; tokens unknown: {why}")
    tokens = kv.tokens
    bpt = kv.bytes_per_token
    ok = tokens >= profile.max_model_len
    detail = (f"KV pool {kv.pool.gib:.2f} GiB [{kv.pool.source}] / {bpt.value:,.0f} B per token [{bpt.source}] = "
              f"{tokens:,} tokens = {tokens / profile.max_model_len:.2f} x MAX_MODEL_LEN {profile.max_model_len:,}")
    if profile.expect_kv_tokens:
        detail += (f"; EXPECT_KV_TOKENS {profile.expect_kv_tokens:,} "
                   f"({(tokens - profile.expect_kv_tokens) / profile.expect_kv_tokens:+.1%})")
    knob = fix = ""
    if not ok:
        knob = "MAX_MODEL_LEN"
        want = profile.max_model_len * bpt.value
        grow = (f"KV_CACHE_MEMORY_BYTES >= {int(math.ceil(want))}" if kv.mode == "pinned" else
                "a larger pool (GPU_MEM_UTIL)" if kv.mode == "util" else "a larger KV_CACHE_MEMORY_BYTES")
        fix = (f"lower MAX_MODEL_LEN to <= {tokens:,}, or {grow} -- the memory rows must still pass "
               "(seed A: every extra 0.5 GiB of pool costs ~1 GiB of prefill margin)")
    return Row("memory", name, node, _status(ok), unit=TOKENS, need=profile.max_model_len, have=tokens,
               terms=[("KV pool", kv.pool), ("bytes per token", bpt)],
               have_figure=Figure(tokens, DERIVED, "KV pool / bytes per token"), detail=detail, knob=knob, fix=fix)


# ------------------------------------------------------------------------------------------------
# disk
# ------------------------------------------------------------------------------------------------
@dataclass
class DiskItem:
    label: str            # "weights", "Engram source", "packed Engram", "image", "caches"
    key: str              # what places it: a profile key, or docker's data-root
    node: str
    path: str
    size: Figure          # bytes when complete
    files: Figure
    present: Figure | None = None     # bytes already there (measured)

    @property
    def need(self) -> float:
        return max(0.0, self.size.value - (self.present.value if self.present else 0.0))


def hf_cache_repo_dir(profile, weights_dir: str) -> str:
    """Where the checkpoint's bytes live under WEIGHTS_DIR: the repo's ``hub/models--org--name`` folder
    when MODEL_DIR is a repo id resolved from the HF cache (seed B), else WEIGHTS_DIR itself."""
    if profile.model_dir and not profile.model_dir.startswith(("/", "~")) and profile.hf_model_repo:
        return f"{weights_dir.rstrip('/')}/hub/models--{profile.hf_model_repo.replace('/', '--')}"
    return weights_dir


def disk_items(profile, node: str, checkpoint: Figure | None, *, image_present: bool | None = None,
               used: dict[str, Figure] | None = None) -> list[DiskItem]:
    """What ``node`` must hold on disk for this profile."""
    figs = recipe_figures(profile)
    used = used or {}
    items: list[DiskItem] = []
    shares_from_head = profile.weight_sync == "nfs" and node != "head"

    def add(label, key, path, size, files):
        if path and size is not None and size.value > 0:
            items.append(DiskItem(label, key, node, path, size, files, used.get(path)))

    if not shares_from_head and checkpoint is not None:
        wdir = profile.weights_dir_on(node)
        files = figs.checkpoint_files or Figure(0, NOMINAL, "file count unknown")
        add("weights", "WEIGHTS_DIR" if node == "head" or not profile.worker_weights_dir else "WORKER_WEIGHTS_DIR",
            hf_cache_repo_dir(profile, wdir), checkpoint, files)
    if profile.engram:
        engram = gib(profile.engram_gib, PROFILE, "ENGRAM_GIB") if profile.engram_gib > 0 else None
        if not shares_from_head:
            add("Engram source", "ENGRAM_SRC_DIR", profile.engram_src_dir, engram,
                Figure(4, PUBLISHED, "seed A: shards 47+48, index, config"))
        whole = figs.engram_packed_all_ranks or engram      # the packed rows are the source's tables
        packed = (Figure(whole.value / profile.tp, DERIVED, f"{whole.gib:.2f} GiB [{whole.source}] / TP={profile.tp}"
                         f" ({whole.note})") if whole is not None else None)
        add("packed Engram", "ENGRAM_PACKED_DIR", profile.engram_packed_dir, packed,
            Figure(2, NOMINAL, "one packed file per Engram layer"))
    if profile.runtime == "docker" and image_present is not True:
        add("image", "docker data-root", DOCKER_ROOT, figs.image_bytes, figs.image_files)
    add("caches", "CACHE_DIR", profile.cache_dir, figs.cache_bytes, figs.cache_files)
    return items


def _fs_key(host: str, fs: FsFacts) -> tuple[str, str]:
    return (host, fs.device or fs.mount)


def _disk_fix(items: list[DiskItem], short: float, mount: str, weight_sync: str) -> tuple[str, str]:
    moves = []
    worker_weights = [i for i in items if i.label in ("weights", "Engram source") and i.node != "head" and i.need > 0]
    if worker_weights and weight_sync != "nfs":
        moves.append(("WEIGHT_SYNC", "WEIGHT_SYNC=nfs (the worker reads the head's copy, none of its own)"))
    for i in sorted(items, key=lambda i: -i.need):
        if i.need > 0:
            moves.append((i.key, f"point {i.key} ({i.label}, {i.need / GIB:.2f} GiB on {i.node}) at another "
                                 "filesystem"))
    text = f"free {short / GIB:.2f} GiB on {mount}"
    if moves:
        text += ", or " + "; or ".join(m for _, m in moves)
    return (moves[0][0] if moves else "disk"), text


def disk_rows(profile, items: list[DiskItem], facts: dict[str, NodeCapacity], hosts: dict[str, str]) -> list[Row]:
    groups: dict[tuple[str, str], tuple[FsFacts, list[DiskItem]]] = {}
    rows: list[Row] = []
    for item in items:
        fs = facts[item.node].fs_of(item.path)
        if fs is None:
            rows.append(Row("disk", f"disk: {item.label}", item.node, Status.NA,
                            detail=f"no df fact for {item.path} ({item.key}); {item.need / GIB:.2f} GiB not placed",
                            knob=item.key))
            continue
        key = _fs_key(hosts[item.node], fs)
        groups.setdefault(key, (fs, []))[1].append(item)
    for (host, _), (fs, group) in groups.items():
        nodes = "+".join(dict.fromkeys(i.node for i in group))
        labels = ", ".join(dict.fromkeys(i.label for i in group))
        terms = []
        for i in group:
            label = i.label + (f"@{i.node}" if "+" in nodes else "")
            if i.present is not None and i.present.value > 0:
                label += f" ({i.size.gib:.2f} - {i.present.gib:.2f} GiB already there)"
                terms.append((label, Figure(i.need, DERIVED, f"{i.size.note}; minus du [{i.present.source}]")))
            else:
                terms.append((label, Figure(i.need, i.size.source, i.size.note)))
        need = sum(i.need for i in group)
        have = fs.avail_bytes
        ok = need <= have.value
        knob = fix = ""
        if not ok:
            knob, fix = _disk_fix(group, need - have.value, fs.mount, profile.weight_sync)
        rows.append(Row("disk", f"disk {fs.mount} ({labels})", nodes, _status(ok), need=need, have=have.value,
                        terms=terms, have_figure=have,
                        detail=f"{_terms_text(terms)} = {need / GIB:.2f} GiB; free on {fs.mount} "
                               f"{have.gib:.2f} GiB [{have.source}]" + (f" (device {fs.device})" if fs.device else ""),
                        knob=knob, fix=fix))
        # inodes: only what still has to be written
        todo = [i for i in group if i.need > 0]
        name = f"inodes {fs.mount}"
        if fs.avail_inodes is None or fs.total_inodes is None:
            rows.append(Row("inodes", name, nodes, Status.NA, unit=FILES, detail=f"no df -i fact for {fs.mount}"))
        elif fs.total_inodes.value == 0:
            rows.append(Row("inodes", name, nodes, Status.NA, unit=FILES,
                            detail=f"{fs.mount} reports no inode limit (dynamic inodes)"))
        else:
            iterms = [(i.label, i.files) for i in todo]
            ineed = sum(f.value for _, f in iterms)
            ok = ineed <= fs.avail_inodes.value
            rows.append(Row("inodes", name, nodes, _status(ok), unit=FILES, need=ineed,
                            have=fs.avail_inodes.value, terms=iterms, have_figure=fs.avail_inodes,
                            detail=f"{_terms_text(iterms, FILES) or 'nothing to write'} = {ineed:,.0f} files; "
                                   f"free inodes {fs.avail_inodes.value:,.0f} [{fs.avail_inodes.source}]",
                            knob="" if ok else (todo[0].key if todo else ""),
                            fix="" if ok else f"free inodes on {fs.mount} (delete small files, e.g. stale JIT "
                                              f"caches) or move {', '.join(i.key for i in todo)} elsewhere"))
    return rows


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    profile: str
    origin: str                          # where the node facts come from
    rows: list[Row]
    facts: dict[str, NodeCapacity]
    weights: Weights
    items: list[DiskItem]

    missing: list[str] = field(default_factory=list)   # nodes without facts (not planned)

    @property
    def verdict(self) -> str:
        """DOES NOT FIT on any FAIL; UNKNOWN when a node could not be planned; else FITS."""
        if any(r.status is Status.FAIL for r in self.rows):
            return DOES_NOT_FIT
        return UNKNOWN if self.missing else FITS

    def failures(self) -> list[Row]:
        return [r for r in self.rows if r.status is Status.FAIL]

    def knobs(self) -> list[str]:
        return list(dict.fromkeys(r.knob for r in self.failures() if r.knob))

    def row(self, name: str, node: str | None = None) -> Row:
        for r in self.rows:
            if r.name == name and (node is None or r.node == node):
                return r
        raise KeyError(f"{name}@{node}")

    def to_checks(self) -> list[Check]:
        return [r.to_check() for r in self.rows]

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "origin": self.origin, "verdict": self.verdict, "knobs": self.knobs(),
                "missing": list(self.missing),
                "rows": [r.to_dict() for r in self.rows],
                "facts": {name: f.to_dict() for name, f in self.facts.items()}}


def hosts_of(profile, facts: dict[str, NodeCapacity]) -> dict[str, str]:
    """node -> host. The lab's nodes share one kernel (and its memory and disks); Sparks are one each."""
    return {name: (f.host or ("lab" if profile.lab else name)) for name, f in facts.items()}


def plan(profile, facts: dict[str, NodeCapacity], *, checkpoint: Figure | None = None, origin: str = "") -> Plan:
    """The fit plan of ``profile`` on nodes described by ``facts``. A node without facts gets one N/A
    row and makes the verdict UNKNOWN (never FITS)."""
    nodes = [n for n in profile.nodes if n.name in facts]
    missing = [n.name for n in profile.nodes if n.name not in facts]
    figs = recipe_figures(profile)
    ckpt = checkpoint_size(profile, checkpoint)
    weights = weights_per_rank(profile, ckpt)
    rows = [weights.row] + [Row("memory", "node facts", name, Status.NA,
                                detail=f"no facts for {name}: memory and disk not planned") for name in missing]
    hosts = hosts_of(profile, facts)
    by_host: dict[str, list[str]] = {}
    for n in nodes:
        by_host.setdefault(hosts[n.name], []).append(n.name)
    if weights.per_rank is not None:
        for host, ranks in by_host.items():
            rows += memory_rows(profile, facts[ranks[0]], ranks, weights.per_rank, figs)
    items: list[DiskItem] = []
    for n in nodes:
        f = facts[n.name]
        items += disk_items(profile, n.name, ckpt, image_present=f.image_present, used=f.used)
    rows += disk_rows(profile, items, facts, hosts)
    return Plan(profile.name, origin, rows, facts, weights, items, missing)
