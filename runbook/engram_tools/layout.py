"""Engram table layout: hash columns, prime bucket sizes, per-rank row ranges, the packed-file
header, and where the tables sit inside the source safetensors shards.

STDLIB ONLY. This file is shipped next to ``pack.py``/``check.py``/``probe.py`` and run with a
node's own ``python3`` (no numpy, no ``runbook`` imports), so the layout is computed by exactly
the same code on the laptop and on the nodes.

Hash layout (V4.1, see docs/engram.md and the reference notes §A.9):

* each Engram layer has ``(engram_max_ngram_size - 1)`` n-gram orders x ``engram_n_heads`` hash
  columns (3 x 8 = 24 for V4.1);
* column ``c`` owns a disjoint bucket range whose size is a prime; primes are walked in
  (layer, order, head) order: for every order the search restarts at ``engram_vocab_size - 1``
  and takes the next prime strictly above the previous one that has not been used by any
  earlier column (of any layer);
* the sum of a layer's column sizes is its row count and must equal
  ``engram_num_embeddings[layer_index]`` (V4.1: 384006168 and 384016682 from vocab 16,000,000);
* tensor-parallel rank ``r`` (data-parallel rank ``d``) owns whole columns: with
  ``part = ceil(columns / (tp * dp))`` it owns columns ``[(r*dp + d)*part, +part)`` (clipped),
  i.e. the row range ``[sum(sizes[:c0]), sum(sizes[:c1]))`` -- NOT an even row split.

Packed file ``engram-l{L}-r{rank}of{tp}.bin``: a 4096-byte header whose first 48 bytes are six
little-endian u64 ``(magic, layer, lo, hi, total_rows, row_bytes)`` (rest zero; magic: see MAGIC), then
rows ``lo..hi-1``, each ``head_dim`` weight bytes (F8_E4M3) followed by ``head_dim/32`` scale
bytes (F8_E8M0): 256 + 8 = 264 bytes for V4.1.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

# The magic is the u64 0x31344E4531565344, written little-endian like the other five fields --
# exactly what the serving reader (repo A overlay/row_store.cpp: memcpy to uint64_t, compare with
# kPackedMagic) and the reference packers (struct.pack("<6Q", MAGIC, ...)) use. Their comments call
# it "DSV41EN1", but the bytes on disk are b"DSV1EN41" (the label read as a big-endian string).
# Writing the literal bytes b"DSV41EN1" would make row_store ignore every packed file.
MAGIC = 0x31344E4531565344
MAGIC_LABEL = "DSV41EN1"
MAGIC_BYTES = struct.pack("<Q", MAGIC)            # b"DSV1EN41"
HEADER_BYTES = 4096
HEADER_STRUCT = struct.Struct("<6Q")             # 48 bytes
WEIGHT_DTYPE = "F8_E4M3"
SCALE_DTYPE = "F8_E8M0"
SCALE_GROUP = 32                                  # one E8M0 scale per 32 weights
INDEX_NAME = "model.safetensors.index.json"

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)   # deterministic for n < 3.3e24


class LayoutError(ValueError):
    """The config, the source checkpoint or a packed file does not match the Engram layout.
    (A plain ValueError subclass so the standalone scripts need nothing from ``runbook``.)"""


# -- primes ----------------------------------------------------------------------------------

def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin; exact for every n < 3.3e24 (so for all 64-bit n)."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x == 1 or x == n - 1:
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_unused_prime(start: int, used: set[int]) -> int:
    """Smallest prime strictly greater than ``start`` that is not in ``used``."""
    c = start + 1
    while c in used or not is_prime(c):
        c += 1
    return c


def column_sizes(vocab_size: int, n_heads: int, max_ngram_size: int,
                 n_layers: int) -> list[list[int]]:
    """Bucket sizes per layer (outer) and column (inner, order-major then head)."""
    if vocab_size < 2 or n_heads < 1 or max_ngram_size < 2 or n_layers < 0:
        raise LayoutError(f"invalid Engram hash parameters: vocab={vocab_size} heads={n_heads} "
                          f"max_ngram={max_ngram_size}")
    used: set[int] = set()
    layers: list[list[int]] = []
    for _ in range(n_layers):
        sizes: list[int] = []
        for _order in range(max_ngram_size - 1):
            current = vocab_size - 1
            for _head in range(n_heads):
                current = next_unused_prime(current, used)
                used.add(current)
                sizes.append(current)
        layers.append(sizes)
    return layers


def shard_columns(n_columns: int, rank: int, tp: int, dp: int = 1, dp_rank: int = 0) -> tuple[int, int]:
    """Columns ``[c0, c1)`` owned by TP rank ``rank`` (TP-major, then DP rank)."""
    if tp < 1 or dp < 1 or not 0 <= rank < tp or not 0 <= dp_rank < dp:
        raise LayoutError(f"invalid rank {rank}/{tp} (dp rank {dp_rank}/{dp})")
    part = -(-n_columns // (tp * dp))
    c0 = min((rank * dp + dp_rank) * part, n_columns)
    return c0, min(c0 + part, n_columns)


# -- the layout object --------------------------------------------------------------------

def engram_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The mapping that holds the ``engram_*`` keys (V4.1 nests them under ``text_config``)."""
    if "engram_layer_ids" in config:
        return config
    text = config.get("text_config")
    if isinstance(text, Mapping) and "engram_layer_ids" in text:
        return text
    raise LayoutError("config.json has no engram_layer_ids (neither top level nor text_config): "
                      "not a DeepSeek-V4.1 checkpoint config")


@dataclass(frozen=True)
class RankRange:
    layer: int          # model layer id (1 or 14 for V4.1)
    rank: int
    tp: int
    col_lo: int
    col_hi: int
    lo: int             # first row owned
    hi: int             # one past the last row owned
    total_rows: int
    row_bytes: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo

    @property
    def packed_bytes(self) -> int:
        return HEADER_BYTES + self.rows * self.row_bytes

    @property
    def file_name(self) -> str:
        return packed_name(self.layer, self.rank, self.tp)

    def header(self) -> bytes:
        return pack_header(self.layer, self.lo, self.hi, self.total_rows, self.row_bytes)


@dataclass(frozen=True)
class EngramLayout:
    layer_ids: tuple[int, ...]
    vocab_size: int
    n_heads: int
    max_ngram_size: int
    head_dim: int
    columns: tuple[tuple[int, ...], ...]       # per layer index: prime bucket size per column
    tp: int = 1
    dp: int = 1
    config_num_embeddings: tuple[int, ...] = field(default=())

    @classmethod
    def from_params(cls, *, layer_ids: Sequence[int], vocab_size: int, n_heads: int,
                    max_ngram_size: int, head_dim: int = 256, tp: int = 1, dp: int = 1) -> "EngramLayout":
        cols = column_sizes(int(vocab_size), int(n_heads), int(max_ngram_size), len(layer_ids))
        if head_dim < SCALE_GROUP or head_dim % SCALE_GROUP:
            raise LayoutError(f"engram_head_dim {head_dim} is not a multiple of {SCALE_GROUP}")
        if tp < 1 or dp < 1:
            raise LayoutError(f"tp={tp} dp={dp} must be >= 1")
        return cls(tuple(int(x) for x in layer_ids), int(vocab_size), int(n_heads),
                   int(max_ngram_size), int(head_dim), tuple(tuple(c) for c in cols), int(tp), int(dp))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], tp: int, dp: int = 1) -> "EngramLayout":
        """Build from a config.json dict and self-check against ``engram_num_embeddings``."""
        cfg = engram_config(config)
        try:
            layer_ids = [int(x) for x in cfg["engram_layer_ids"]]
            expected = [int(x) for x in cfg["engram_num_embeddings"]]
            layout = cls.from_params(layer_ids=layer_ids, vocab_size=int(cfg["engram_vocab_size"]),
                                     n_heads=int(cfg["engram_n_heads"]),
                                     max_ngram_size=int(cfg["engram_max_ngram_size"]),
                                     head_dim=int(cfg.get("engram_head_dim", 256)), tp=tp, dp=dp)
        except KeyError as exc:
            raise LayoutError(f"config.json lacks {exc.args[0]}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"config.json Engram keys malformed: {exc}") from None
        if len(expected) != len(layer_ids):
            raise LayoutError(f"engram_num_embeddings has {len(expected)} entries for "
                              f"{len(layer_ids)} engram_layer_ids")
        got = [sum(c) for c in layout.columns]
        if got != expected:
            raise LayoutError(f"Engram prime layout gives {got} rows per layer, config.json "
                              f"engram_num_embeddings says {expected}: the hash walk does not match "
                              "this checkpoint; refusing to pack with a wrong row range")
        return replace(layout, config_num_embeddings=tuple(expected))

    # -- derived ----------------------------------------------------------------------------
    @property
    def row_bytes(self) -> int:
        return self.head_dim + self.head_dim // SCALE_GROUP

    @property
    def n_columns(self) -> int:
        return (self.max_ngram_size - 1) * self.n_heads

    def layer_index(self, layer: int) -> int:
        try:
            return self.layer_ids.index(int(layer))
        except ValueError:
            raise LayoutError(f"layer {layer} is not an Engram layer {list(self.layer_ids)}") from None

    def num_rows(self, layer: int) -> int:
        return sum(self.columns[self.layer_index(layer)])

    def column_offsets(self, layer: int) -> list[int]:
        """Prefix sums: row offset of each column, plus the total at the end."""
        out = [0]
        for size in self.columns[self.layer_index(layer)]:
            out.append(out[-1] + size)
        return out

    def rank_range(self, layer: int, rank: int, dp_rank: int = 0) -> RankRange:
        c0, c1 = shard_columns(self.n_columns, rank, self.tp, self.dp, dp_rank)
        offs = self.column_offsets(layer)
        return RankRange(int(layer), rank, self.tp, c0, c1, offs[c0], offs[c1], offs[-1], self.row_bytes)

    def rank_ranges(self, layer: int) -> list[RankRange]:
        return [self.rank_range(layer, r) for r in range(self.tp)]

    def summary(self) -> dict[str, Any]:
        return {"layer_ids": list(self.layer_ids), "tp": self.tp, "dp": self.dp,
                "columns_per_layer": self.n_columns, "row_bytes": self.row_bytes,
                "rows": {str(l): self.num_rows(l) for l in self.layer_ids},
                "ranks": {str(l): [[r.lo, r.hi] for r in self.rank_ranges(l)] for l in self.layer_ids}}


# -- packed-file header ----------------------------------------------------------------------

def packed_name(layer: int, rank: int, tp: int) -> str:
    return f"engram-l{int(layer)}-r{int(rank)}of{int(tp)}.bin"


def pack_header(layer: int, lo: int, hi: int, total_rows: int, row_bytes: int) -> bytes:
    head = HEADER_STRUCT.pack(MAGIC, layer, lo, hi, total_rows, row_bytes)
    return head + bytes(HEADER_BYTES - len(head))


def parse_header(data: bytes) -> dict[str, Any]:
    if len(data) < HEADER_STRUCT.size:
        raise LayoutError(f"packed header too short: {len(data)} bytes")
    magic, layer, lo, hi, total, row_bytes = HEADER_STRUCT.unpack_from(data)
    return {"magic": magic, "layer": layer, "lo": lo, "hi": hi,
            "total_rows": total, "row_bytes": row_bytes}


# -- source safetensors --------------------------------------------------------------------

def weight_name(layer: int) -> str:
    return f"layers.{int(layer)}.engram.embed.weight"


def scale_name(layer: int) -> str:
    return f"layers.{int(layer)}.engram.embed.scale"


@dataclass(frozen=True)
class TensorLoc:
    name: str
    path: str           # shard file
    dtype: str
    shape: tuple[int, ...]
    offset: int         # absolute byte offset of the data in the shard
    nbytes: int


def engram_shards(index: Mapping[str, Any] | None, files: Iterable[str] = ()) -> list[str]:
    """Shard files that hold Engram tensors, per the checkpoint's index (keys with ``.engram.embed.``),
    or every ``*.safetensors`` of ``files`` when the index names none."""
    wm = (index or {}).get("weight_map") or {}
    shards = sorted({v for k, v in wm.items() if ".engram.embed." in k})
    if shards:
        return shards
    return sorted(n for n in files if n.endswith(".safetensors"))


def read_safetensors_header(path: str) -> tuple[dict[str, Any], int]:
    """(header dict, absolute data start) -- reads only the length prefix and the JSON."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise LayoutError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 * 1024 * 1024:
            raise LayoutError(f"{path}: safetensors header length {n} is implausible")
        text = f.read(n)
    try:
        header = json.loads(text)
    except ValueError as exc:
        raise LayoutError(f"{path}: safetensors header is not JSON: {exc}") from None
    return header, 8 + n


def _shards(src: str) -> list[str]:
    return sorted(os.path.join(src, n) for n in os.listdir(src) if n.endswith(".safetensors"))


def locate_tensors(src: str, names: Iterable[str]) -> dict[str, TensorLoc]:
    """Find each tensor's shard via the index (or by scanning shard headers) and return its
    absolute data location. Only headers are read."""
    wanted = list(names)
    by_shard: dict[str, list[str]] = {}
    index_path = os.path.join(src, INDEX_NAME)
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map", {})
        for name in wanted:
            if name in weight_map:
                by_shard.setdefault(os.path.join(src, weight_map[name]), []).append(name)
    missing = [n for n in wanted if not any(n in v for v in by_shard.values())]
    headers: dict[str, tuple[dict[str, Any], int]] = {}
    if missing:                                   # no index, or the index lacks them: scan
        for shard in _shards(src):
            header, start = read_safetensors_header(shard)
            headers[shard] = (header, start)
            for name in list(missing):
                if name in header:
                    by_shard.setdefault(shard, []).append(name)
                    missing.remove(name)
    if missing:
        raise LayoutError(f"tensor(s) {', '.join(missing)} not found in {src} "
                          f"(index {'present' if os.path.exists(index_path) else 'absent'}, "
                          f"{len(_shards(src))} shard(s) scanned)")
    out: dict[str, TensorLoc] = {}
    for shard, names_in in by_shard.items():
        if not os.path.exists(shard):
            raise LayoutError(f"{INDEX_NAME} maps {names_in[0]} to {os.path.basename(shard)}, "
                              f"which is missing from {src}")
        header, start = headers.get(shard) or read_safetensors_header(shard)
        size = os.path.getsize(shard)
        for name in names_in:
            entry = header.get(name)
            if not isinstance(entry, dict):
                raise LayoutError(f"tensor {name}: listed for {os.path.basename(shard)} but not in "
                                  "its header")
            b, e = entry["data_offsets"]
            if not 0 <= b <= e or start + e > size:
                raise LayoutError(f"tensor {name}: data offsets [{b}, {e}) run past the end of "
                                  f"{os.path.basename(shard)} ({size} bytes): truncated download?")
            out[name] = TensorLoc(name, shard, entry.get("dtype", "?"),
                                  tuple(int(x) for x in entry.get("shape", ())), start + b, e - b)
    return out


def validate_tables(layout: EngramLayout, layer: int, weight: TensorLoc, scale: TensorLoc) -> None:
    """Refuse (naming the tensor) on a wrong dtype, shape or byte size."""
    rows = layout.num_rows(layer)
    for loc, dtype, cols in ((weight, WEIGHT_DTYPE, layout.head_dim),
                             (scale, SCALE_DTYPE, layout.head_dim // SCALE_GROUP)):
        if loc.dtype != dtype:
            raise LayoutError(f"refused: tensor {loc.name} in {os.path.basename(loc.path)} has dtype "
                              f"{loc.dtype}, expected {dtype}")
        if loc.shape != (rows, cols):
            raise LayoutError(f"refused: tensor {loc.name} in {os.path.basename(loc.path)} has shape "
                              f"{list(loc.shape)}, expected {[rows, cols]} (from config.json)")
        if loc.nbytes != rows * cols:
            raise LayoutError(f"refused: tensor {loc.name} spans {loc.nbytes} bytes, expected "
                              f"{rows * cols} for {dtype} {[rows, cols]}")


def read_exact(fd: int, n: int, off: int) -> bytes:
    """``n`` bytes at ``off`` (fewer only at end of file)."""
    out = b""
    while len(out) < n:
        chunk = os.pread(fd, n - len(out), off + len(out))
        if not chunk:
            break
        out += chunk
    return out


def source_rows(fw: int, fs: int, weight: TensorLoc, scale: TensorLoc, first: int, n: int) -> bytes:
    """Global rows ``[first, first + n)`` as the packed file holds them (weight bytes, then scale
    bytes, per row), read from the shards open as ``fw``/``fs``. Short where a shard is truncated."""
    head, tail = weight.shape[1], scale.shape[1]
    w = read_exact(fw, n * head, weight.offset + first * head)
    s = read_exact(fs, n * tail, scale.offset + first * tail)
    return b"".join(w[i * head:(i + 1) * head] + s[i * tail:(i + 1) * tail] for i in range(n))


def load_config(src: str, config_path: str | None = None) -> dict[str, Any]:
    path = config_path or os.path.join(src, "config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise LayoutError(f"{path} not found: the Engram source dir needs the checkpoint's "
                          "config.json next to the shards") from None
