"""The measurement conditions of the seeds' published figures, the recipe profiles' bench defaults.

Published decode figures are chat, prose, temperature 0, thinking off, 256-token prompts (seed
000_31ff04ecb79e2cfd.txt; seeds-repos.md A.12 "400-token prose"; B.10 "max_tokens=min_tokens=128,
thinking false"); the prefill figures are single requests of 32,789 and 262,158 prompt tokens (seed
000). With speculative decoding (DSpark/MTP) the text decides the acceptance rate and so decode
tok/s: measured under other conditions, our figures could not be set beside the published ones.
The lab keeps its scaled sizes (random-weight tiny model; nothing published to compare with).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SeedConditions:
    recipe: str
    prompt_tokens: int
    decode_tokens: int
    concurrency: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    thinking_off: dict[str, Any]           # chat_template_kwargs the recipe's own smoke/bench send
    source: str
    endpoint: str = "chat"
    workload: str = "prose"
    temperature: float = 0.0
    #: the node counts a run is validated at under these conditions alone; on any other count the verdict also
    #: needs a published figure of that many Sparks reproduced (report/verdict.py "published N-node figure")
    nodes: tuple[int, ...] = (2,)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["concurrency"], d["prefill_tokens"] = list(self.concurrency), list(self.prefill_tokens)
        d["nodes"] = list(self.nodes)
        return d


#: the 32k and 256k prefill cases exactly as published (prompt tokens incl. the chat template)
PUBLISHED_PREFILL = (32789, 262158)

SEEDS: dict[str, SeedConditions] = {
    "exl3-v41": SeedConditions(
        "exl3-v41", prompt_tokens=256, decode_tokens=400, concurrency=(1, 2, 4), prefill_tokens=PUBLISHED_PREFILL,
        thinking_off={"enable_thinking": False},
        source="seed 000_31ff04ecb79e2cfd.txt (prose decode, temp 0, thinking off, prompt 256 tok, x1/x2/x4; "
               "prefill 32,789 and 262,158 tok) and repo A README via seeds-repos.md A.12 (400-token prose)"),
    "dspark-v4": SeedConditions(
        "dspark-v4", prompt_tokens=256, decode_tokens=128, concurrency=(1, 2, 4, 6), prefill_tokens=PUBLISHED_PREFILL,
        thinking_off={"thinking": False},
        source="seeds-repos.md B.10 matrix (256-token prompts, max_tokens=min_tokens=128, thinking false, "
               "c=1/2/4/6) at the seed's prose/temp 0 conditions; prefill cases as published in seed 000",
        # 3: the seed's TP=3 lane (start-tp3.sh, docs/TP3.md) is the same recipe and bench; tp3-dspark runs were
        # validated under these conditions before the node-count requirement existed, and still are
        nodes=(2, 3)),
}

#: profile key -> (field of BenchConfig and SeedConditions, Profile attribute)
PROFILE_KEYS = {
    "BENCH_PROMPT_TOKENS": ("prompt_tokens", "bench_prompt_tokens"),
    "BENCH_DECODE_TOKENS": ("decode_tokens", "bench_decode_tokens"),
    "BENCH_CONCURRENCY": ("concurrency", "bench_concurrency"),
    "BENCH_PREFILL_TOKENS": ("prefill_tokens", "bench_prefill_tokens"),
}
