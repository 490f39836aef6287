"""What each recipe's own smoke tests send and expect (seeds-repos.md §A.11, §B.7): the probe, its answer,
the thinking switches, the context lengths and the concurrency; shared by steps 05 and 06."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..errors import RunbookError


@dataclass(frozen=True)
class RecipeSpec:
    """What the recipe's own smoke tests send and expect (seeds-repos.md §A.11, §B.7)."""
    recipe: str
    hardware: bool                      # real weights: answers are judged
    probe: str                          # the deterministic question
    expected: str                       # the answer that must appear (word match)
    thinking_off: dict[str, Any]        # chat_template_kwargs that switch reasoning off
    thinking_on: dict[str, Any]         # ... and on (thinking + tool case)
    context_lengths: tuple[int, ...]    # needle lengths (hardware); the lab scales to its max_model_len
    concurrency: int                    # parallel smoke requests; 0 = MAX_NUM_SEQS
    probe_max_tokens: int = 32
    reply_max_tokens: int = 64          # concurrency / streaming requests
    source: str = ""


PROBE = "What is 17*19? Reply with the integer only."

RECIPES: dict[str, RecipeSpec] = {
    # repo A README / tests/test_smoke.sh: must contain 323; smokes must send enable_thinking=false.
    "exl3-v41": RecipeSpec(
        "exl3-v41", True, PROBE, "323",
        thinking_off={"enable_thinking": False},
        thinking_on={"enable_thinking": True, "reasoning_effort": "low"},
        context_lengths=(8192, 32768, 131072, 262144), concurrency=6,
        source="seed A README smoke (17*19 -> 323, enable_thinking=false)"),
    # repo B: smoke CONCURRENCY=6; probe {"thinking": ..., "reasoning_effort": "low"}; 1M context.
    "dspark-v4": RecipeSpec(
        "dspark-v4", True, PROBE, "323",
        thinking_off={"thinking": False},
        thinking_on={"thinking": True, "reasoning_effort": "low"},
        context_lengths=(8192, 32768, 131072, 262144, 1_000_000), concurrency=6,
        source="seed B smoke (6 parallel) and start-script probe (chat_template_kwargs.thinking)"),
    # the lab's random tiny model: same request path, answers not judged.
    "lab": RecipeSpec(
        "lab", False, PROBE, "323",
        thinking_off={"enable_thinking": False},
        thinking_on={"enable_thinking": True},
        context_lengths=(), concurrency=0, probe_max_tokens=32, reply_max_tokens=16,
        source="lab: random-weight tiny model (answers are not judged)"),
}

LAB_REASON = "lab: random-weight tiny model; the answer is judged only on real weights"


def recipe_spec(profile) -> RecipeSpec:
    try:
        spec = RECIPES[profile.recipe]
    except KeyError:
        raise RunbookError(f"no smoke spec for RECIPE={profile.recipe}", fix=f"use one of {sorted(RECIPES)}") from None
    if profile.rehearsal:
        # the recipe's requests, the lab's tiny model answering: answers are not judged, sizes are the lab's
        lab = RECIPES["lab"]
        spec = dataclasses.replace(spec, hardware=False, context_lengths=lab.context_lengths,
                                   concurrency=lab.concurrency, probe_max_tokens=lab.probe_max_tokens,
                                   reply_max_tokens=lab.reply_max_tokens,
                                   source=f"{spec.source}; rehearsal on the lab: answers not judged")
    return spec


def answer_matches(text: str, expected: str) -> bool:
    """The expected answer appears as a word of its own (323, not 3230 or 1.323)."""
    return re.search(rf"(?<![\w.]){re.escape(expected)}(?![\w])", text or "") is not None

