"""Published and nominal figures the fit planner uses when no node has been measured.

Every number carries its source (``Figure.source``):

* ``profile``   -- a key of the loaded profile;
* ``measured``  -- read on a node (preflight facts);
* ``published`` -- reported by a seed recipe or an operator running it (docs/fit.md cites each one);
* ``nominal``   -- a spec-sheet value or the runbook's own allowance, never measured on a Spark here;
* ``derived``   -- computed from the figures above (the note says how).

The seed texts are summarised in /work/shared/reference/seeds-repos.md (§A.6 memory model, §A.8
downloads, seed B's boot log lines); section names are quoted in each note.
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
GB = 10 ** 9

PROFILE, MEASURED, PUBLISHED, NOMINAL, DERIVED = "profile", "measured", "published", "nominal", "derived"
SOURCES = (PROFILE, MEASURED, PUBLISHED, NOMINAL, DERIVED)


@dataclass(frozen=True)
class Figure:
    """One number (bytes, tokens, files or a ratio) and where it comes from."""
    value: float
    source: str
    note: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown figure source {self.source!r} (one of {', '.join(SOURCES)})")

    @property
    def gib(self) -> float:
        return self.value / GIB

    def to_dict(self) -> dict:
        return {"value": self.value, "source": self.source, "note": self.note}

    @classmethod
    def from_dict(cls, d: dict) -> "Figure":
        return cls(float(d["value"]), str(d["source"]), str(d.get("note", "")))


def gib(value: float, source: str, note: str = "") -> Figure:
    return Figure(value * GIB, source, note)


# ------------------------------------------------------------------------------------------------
# a DGX Spark (GB10) node, before anyone measured it
# ------------------------------------------------------------------------------------------------
GB10_MEM_TOTAL = gib(121.69, NOMINAL, "GB10 memory as vLLM sees it (seed A .env: 'util x 121.69 GiB'); "
                                      "spec sheet: 128 GB LPDDR5x unified, shared by CPU, GPU and OS")
GB10_MEM_AVAILABLE = gib(114.9, PUBLISHED, "MemAvailable before launch, lower of head/worker "
                                           "(116.1/114.9 GiB, seed A operator notes 2026-09-15)")
GB10_DISK = Figure(4 * 10 ** 12, NOMINAL, "DGX Spark Founders Edition: 4 TB NVMe, one root filesystem "
                                          "(empty: the real free space is measured by preflight)")
GB10_INODES = Figure(4 * 10 ** 12 // 16384, NOMINAL, "ext4 default: one inode per 16 KiB of disk")
DOCKER_ROOT = "/var/lib/docker"      # docker's default data-root; DGX OS keeps it on the root filesystem


# ------------------------------------------------------------------------------------------------
# per recipe
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KvReference:
    """A published boot: this many KV bytes per rank held this many tokens (``GPU KV cache size``)."""
    pool_bytes: float
    tokens: int
    kv_dtypes: tuple[str, ...]       # KV_CACHE_DTYPE values it applies to ("" = vLLM's choice)
    block_sizes: tuple[int, ...]     # KV_BLOCK_SIZE values it applies to
    note: str

    @property
    def bytes_per_token(self) -> float:
        return self.pool_bytes / self.tokens


@dataclass(frozen=True)
class UtilBoot:
    """A published boot with a GPU_MEM_UTIL-sized pool: what vLLM subtracted besides the weights."""
    util: float
    total: Figure
    weights_per_rank: Figure
    kv_pool: Figure
    note: str

    @property
    def profiled_runtime(self) -> Figure:
        """util x total - weights - KV: activations and non-torch memory of vLLM's profiling run."""
        value = self.util * self.total.value - self.weights_per_rank.value - self.kv_pool.value
        return Figure(value, DERIVED, f"{self.util} x {self.total.gib:.2f} - {self.weights_per_rank.gib:.2f} "
                                      f"- {self.kv_pool.gib:.2f} GiB ({self.note})")


@dataclass(frozen=True)
class RecipeFigures:
    checkpoint_bytes: Figure | None      # whole checkpoint, all ranks
    checkpoint_files: Figure | None      # files the checkpoint adds on disk (inodes)
    runtime: Figure                      # per rank beside weights and KV: CUDA context, graphs, workspaces, NCCL
    os_floor: Figure | None              # what the OS, docker and desktop keep (None: not a Spark)
    kv_reference: KvReference | None
    util_boot: UtilBoot | None
    image_bytes: Figure | None
    image_files: Figure
    engram_packed_all_ranks: Figure | None   # packed Engram over all ranks (each rank holds 1/TP)
    cache_bytes: Figure
    cache_files: Figure


# nominal allowances with no published figure: a vLLM image's files, JIT caches
_IMAGE_FILES = Figure(100_000, NOMINAL, "allowance: an Ubuntu + CUDA + torch + vLLM image tree")
_CACHE_BYTES = gib(10, NOMINAL, "allowance for vLLM/Triton/TileLang/FlashInfer JIT caches (no published size)")
_CACHE_FILES = Figure(50_000, NOMINAL, "allowance: JIT caches are many small files")
_SPARK_RUNTIME = gib(7, PUBLISHED, "seed A README memory model: context workspaces + CUDA ctx + NCCL + graphs "
                                   "~5-7 GiB per node (upper end)")
_SPARK_OS = gib(9, PUBLISHED, "seed A README memory model: processes/OS/docker/desktop ~9 GiB per node")

RECIPES: dict[str, RecipeFigures] = {
    "exl3-v41": RecipeFigures(
        checkpoint_bytes=gib(196.2, PUBLISHED, "EXL3 2.9 bpw @ 64ba41b: 39 shards, 196.2 GiB (operator pin)"),
        checkpoint_files=Figure(49, PUBLISHED, "EXL3 repo @ 64ba41b: 49 files"),
        runtime=_SPARK_RUNTIME,
        os_floor=_SPARK_OS,
        kv_reference=KvReference(2684354560, 774_400, ("", "fp8_ds_mla"), (64,),
                                 "seed A: a 2.5 GiB pinned fp8_ds_mla pool holds 774,400 tokens"),
        util_boot=None,
        image_bytes=Figure(22.5 * GB, PUBLISHED, "seed A image: ~9 GiB pull, 22.5 GB unpacked (operator)"),
        image_files=_IMAGE_FILES,
        engram_packed_all_ranks=gib(2 * 2 * 47.2, PUBLISHED, "seed A README: 47.2 GiB per layer per rank at "
                                                             "TP=2, two Engram layers (188.8 GiB over all ranks)"),
        cache_bytes=_CACHE_BYTES, cache_files=_CACHE_FILES,
    ),
    "dspark-v4": RecipeFigures(
        checkpoint_bytes=gib(157, PUBLISHED, "DeepSeek-V4-Flash-Vision-Exp: 157 GiB (seed B)"),
        checkpoint_files=Figure(335, PUBLISHED, "Vision-Exp HF cache: 335 files (an operator's rsync)"),
        runtime=gib(7, NOMINAL, "seed A's 5-7 GiB (upper end); seed B publishes no breakdown"),
        os_floor=_SPARK_OS,
        kv_reference=KvReference(17.04 * GIB, 2_331_430, ("nvfp4_ds_mla",), (256,),
                                 "seed B Vision-Exp boot: 'Available KV cache memory: 17.04 GiB', "
                                 "'GPU KV cache size: 2,331,430 tokens'"),
        util_boot=UtilBoot(0.835, GB10_MEM_TOTAL,
                           gib(79.17, PUBLISHED, "seed B issue #160: ~79.17 GiB model per rank"),
                           gib(17.04, PUBLISHED, "seed B Vision-Exp boot log"),
                           "seed B Vision-Exp boot at GPU_MEM_UTIL 0.835 (compose @ 01eed1e default)"),
        image_bytes=Figure(19 * GB, PUBLISHED, "seed B: ghcr.io/anemll/dspark-vllm-gx10:0.1.1 ~19 GB "
                                               "(pull size; unpacked size not published)"),
        image_files=_IMAGE_FILES,
        engram_packed_all_ranks=None,
        cache_bytes=_CACHE_BYTES, cache_files=_CACHE_FILES,
    ),
    "lab": RecipeFigures(
        checkpoint_bytes=None, checkpoint_files=Figure(10, NOMINAL, "tiny model: config, tokenizer, weights"),
        runtime=gib(2.5, NOMINAL, "allowance for one CPU vLLM rank: interpreter, torch, vLLM, gloo"),
        os_floor=None,
        kv_reference=None, util_boot=None,
        image_bytes=None, image_files=Figure(0, NOMINAL, "RUNTIME=process: no image"),
        engram_packed_all_ranks=None,
        cache_bytes=gib(1, NOMINAL, "allowance for the lab's CPU JIT caches"),
        cache_files=Figure(5_000, NOMINAL, "allowance"),
    ),
}

# lab CPU vLLM: the runbook's launch sets VLLM_CPU_KVCACHE_SPACE=1 (GiB) unless KV_CACHE_MEMORY_BYTES is set
LAB_CPU_KV = gib(1, NOMINAL, "lab CPU vLLM: VLLM_CPU_KVCACHE_SPACE=1 set by the runbook's launch")

# figures the golden tests compare the model against (not inputs of the model)
PUBLISHED_CHECKS = {
    # seed A operator notes: MemAvailable 116.1/114.9 GiB before -> 6.0/7.2 GiB at /health
    "exl3-v41 boot consumption GiB": (116.1 - 6.0, 114.9 - 7.2),
    # seed A README: head MemAvailable 4.07-4.21 GiB after warm-up
    "exl3-v41 MemAvailable after warm-up GiB": (4.07, 4.21),
    # seed A: rsync copy / download of weights + Engram source ~387 GiB
    "exl3-v41 download GiB": 387,
    # seed B boot line: maximum concurrency for 1,048,576 tokens per request
    "dspark-v4 concurrency at 1M": 2.22,
    # seed B 0731 boot (same nvfp4_ds_mla KV layout, older checkpoint): 18.08 GiB / 2,493,464 tokens
    "dspark-v4 0731 boot": (18.08 * GIB, 2_493_464),
}
