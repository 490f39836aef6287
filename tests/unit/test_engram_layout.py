"""Engram hash layout: the V4.1 reproduction, prime search, whole-column rank splits, header."""
from __future__ import annotations

import struct

import pytest

from runbook.engram_tools import layout as L

V41 = {  # DeepSeek-V4.1-Flash config.json text_config (reference notes §A.9)
    "engram_layer_ids": [1, 14],
    "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4,
    "engram_vocab_size": 16000000,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
}


def test_v41_num_embeddings_reproduced_exactly():
    lay = L.EngramLayout.from_config({"text_config": V41}, tp=2)
    assert lay.n_columns == 24                      # (4 - 1) orders x 8 heads
    assert [len(c) for c in lay.columns] == [24, 24]
    assert [lay.num_rows(1), lay.num_rows(14)] == [384006168, 384016682]
    assert lay.row_bytes == 264
    # top-level keys work as well as text_config nesting
    assert L.EngramLayout.from_config(V41, tp=1).num_rows(14) == 384016682


def _is_prime_slow(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def test_v41_prime_walk_details():
    lay = L.EngramLayout.from_config(V41, tp=2)
    flat = [p for layer in lay.columns for p in layer]
    assert len(set(flat)) == 48                     # no prime reused, across layers too
    assert all(p > 16000000 - 1 for p in flat)
    assert flat == sorted(flat)                     # walked upwards in (layer, order, head) order
    first = flat[0]
    assert _is_prime_slow(first)
    assert not any(_is_prime_slow(n) for n in range(16000000, first))   # it is the *next* prime
    assert all(_is_prime_slow(p) for p in (flat[1], flat[23], flat[24], flat[-1]))


def test_is_prime_matches_sieve_and_64bit_cases():
    limit = 20000
    sieve = bytearray([1]) * limit
    sieve[0] = sieve[1] = 0
    for i in range(2, int(limit ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(sieve[i * i::i]))
    assert [n for n in range(limit) if L.is_prime(n)] == [n for n in range(limit) if sieve[n]]
    assert L.is_prime(2 ** 61 - 1)
    assert L.is_prime(18446744073709551557)         # largest 64-bit prime
    assert not L.is_prime(18446744073709551557 * 3)
    for pseudo in (561, 3215031751, 3825123056546413051, 2 ** 64 - 1):
        assert not L.is_prime(pseudo)


@pytest.mark.parametrize("tp,dp", [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (2, 2), (3, 2), (7, 4)])
def test_rank_split_is_whole_columns_covering_without_overlap(tp, dp):
    lay = L.EngramLayout.from_config(V41, tp=tp, dp=dp)
    assert lay.layer_ids, "V4.1 config has no Engram layers"
    for layer in lay.layer_ids:
        offs = lay.column_offsets(layer)
        ranges = [lay.rank_range(layer, r, d) for r in range(tp) for d in range(dp)]
        pos = 0
        for rr in ranges:                           # TP-major order is contiguous
            assert rr.lo == pos and rr.hi >= rr.lo
            assert rr.lo in offs and rr.hi in offs  # boundaries fall on column boundaries
            assert offs[rr.col_lo] == rr.lo and offs[rr.col_hi] == rr.hi
            pos = rr.hi
        assert pos == lay.num_rows(layer) == ranges[0].total_rows


def test_v41_tp2_tp3_row_ranges_are_not_even_splits():
    lay2 = L.EngramLayout.from_config(V41, tp=2)
    r0, r1 = lay2.rank_ranges(1)
    assert (r0.lo, r0.hi, r1.lo, r1.hi) == (0, 192001740, 192001740, 384006168)
    assert (r0.col_lo, r0.col_hi, r1.col_lo, r1.col_hi) == (0, 12, 12, 24)
    assert r0.hi != 384006168 // 2                  # not an even row split
    assert round(r0.packed_bytes / 2 ** 30, 1) == 47.2   # README: 47.2 GiB per layer per rank
    lay3 = L.EngramLayout.from_config(V41, tp=3)
    assert [(r.col_lo, r.col_hi) for r in lay3.rank_ranges(14)] == [(0, 8), (8, 16), (16, 24)]
    assert lay3.rank_ranges(1)[1].lo == sum(lay3.columns[0][:8])


def test_config_mismatch_and_missing_keys_are_refused():
    bad = dict(V41, engram_num_embeddings=[384006168, 384016683])
    with pytest.raises(L.LayoutError, match="384016683"):
        L.EngramLayout.from_config(bad, tp=2)
    with pytest.raises(L.LayoutError, match="engram_vocab_size"):
        L.EngramLayout.from_config({k: v for k, v in V41.items() if k != "engram_vocab_size"}, tp=2)
    with pytest.raises(L.LayoutError, match="engram_layer_ids"):
        L.EngramLayout.from_config({"model_type": "deepseek_v4"}, tp=2)
    with pytest.raises(L.LayoutError):
        L.EngramLayout.from_config(V41, tp=2).rank_range(1, rank=2)
    with pytest.raises(L.LayoutError, match="not an Engram layer"):
        L.EngramLayout.from_config(V41, tp=2).num_rows(2)


def test_packed_header_format():
    lay = L.EngramLayout.from_config(V41, tp=2)
    rr = lay.rank_range(14, 1)
    h = rr.header()
    assert len(h) == 4096 and not any(h[48:])
    # the u64 the serving reader (row_store.cpp kPackedMagic) compares with, little-endian on disk;
    # its comment says "DSV41EN1" but the bytes are b"DSV1EN41"
    assert struct.unpack_from("<Q", h)[0] == 0x31344E4531565344
    assert h[:8] == b"DSV1EN41" == L.MAGIC_BYTES
    assert struct.unpack_from("<5Q", h, 8) == (14, rr.lo, rr.hi, 384016682, 264)
    assert L.parse_header(h) == {"magic": L.MAGIC, "layer": 14, "lo": rr.lo, "hi": rr.hi,
                                 "total_rows": 384016682, "row_bytes": 264}
    assert rr.file_name == "engram-l14-r1of2.bin"
    assert rr.packed_bytes == 4096 + (rr.hi - rr.lo) * 264
