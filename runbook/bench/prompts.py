"""Prompts of an exact token length, counted by the *served* tokenizer (``POST /tokenize``).

Each prompt starts with a per-request nonce (``<run-tag>-<namespace>-<index>``) so it is unique from
token 0: prefix caching matches from token 0 in whole blocks, so a suffix nonce would not defeat it.
Filler is pseudo-random common words (~1 token/word on BPE tokenizers). The word count is searched
with /tokenize until the count equals the target; when one word adds two tokens at the boundary,
short alternative last words are tried. Chat prompts put the nonce in a system message so that the
template's own default system prompt (shared by every request) is not emitted.
"""
from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

WORDS = ["time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company", "system", "program", "question", "work", "government", "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others", "level", "office", "door", "health", "person", "art", "war", "history", "party", "result", "change", "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education", "river", "garden", "stone", "light", "music", "paper", "table", "window", "market", "street", "field", "color", "green", "blue", "small", "large", "early", "late", "open", "close", "quick", "slow", "warm", "cold", "bright", "dark", "simple"]
ALT_LAST = ("a", "I", "to", "of", "and", "in", "it", "is", "on", "at", ".", ",", "x", "1")


@dataclass
class BuiltPrompt:
    nonce: str
    prompt: Any              # str (completions) or messages (chat)
    tokens: int              # count by the server's /tokenize
    target: int
    tokenize_calls: int

    @property
    def exact(self) -> bool:
        return self.tokens == self.target


def filler(n_words: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WORDS) for _ in range(n_words)]


class PromptBuilder:
    """Builds exact-length prompts; remembers the word count that worked for each target length."""

    def __init__(self, tokenize: Callable[..., Awaitable[int]], endpoint: str = "completions",
                 seed: int = 1234):
        self.tokenize, self.endpoint, self.seed = tokenize, endpoint, seed
        self._words: list[str] = []
        self._hint: dict[int, int] = {}

    def _w(self, n: int) -> list[str]:
        if len(self._words) < n:
            self._words = filler(max(n, 2 * len(self._words)), self.seed)
        return self._words[:n]

    def _make(self, nonce: str, n_words: int, last: str | None = None) -> Any:
        words = self._w(n_words)
        if last is not None and words:
            words = words[:-1] + [last]
        body = " ".join(words)
        if self.endpoint == "chat":
            return [{"role": "system", "content": nonce}, {"role": "user", "content": body}]
        return f"{nonce} {body}"

    async def _count(self, prompt: Any) -> int:
        if self.endpoint == "chat":
            return await self.tokenize(messages=prompt)
        return await self.tokenize(prompt=prompt)

    async def build(self, target: int, nonce: str, max_calls: int = 24) -> BuiltPrompt:
        calls = 0
        cache: dict[int, int] = {}

        async def count(m: int) -> int:
            nonlocal calls
            if m not in cache:
                calls += 1
                cache[m] = await self._count(self._make(nonce, m))
            return cache[m]

        m = self._hint.get(target, max(1, target - 8))
        c = await count(m)
        # secant-like steps assuming ~1 token per word, then a bracket search
        for _ in range(8):
            if c == target or calls >= max_calls:
                break
            m = max(0, m + (target - c))
            c = await count(m)
        lo = [k for k, v in cache.items() if v <= target]
        hi = [k for k, v in cache.items() if v > target]
        if c != target and lo and hi:
            a, b = max(lo), min(hi)
            while b - a > 1 and calls < max_calls:
                mid = (a + b) // 2
                if await count(mid) <= target:
                    a = mid
                else:
                    b = mid
            m, c = a, cache[a]
        if c == target:
            self._hint[target] = m
            return BuiltPrompt(nonce, self._make(nonce, m), c, target, calls)
        # one short: try alternative last words on m+1 words
        if c < target:
            for alt in ALT_LAST:
                if calls >= max_calls:
                    break
                p = self._make(nonce, m + 1, alt)
                calls += 1
                cc = await self._count(p)
                if cc == target:
                    return BuiltPrompt(nonce, p, cc, target, calls)
        return BuiltPrompt(nonce, self._make(nonce, m), c, target, calls)
