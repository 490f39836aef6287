"""Prompts of an exact token length, counted by the *served* tokenizer (``POST /tokenize``).

The one exact-length prompt builder of the project: :func:`build_exact_prompt` (a ``count``
callable that returns the server's token count, e.g. an HTTP client's /tokenize) and
:func:`abuild_exact_prompt` (the same with an async ``count``) drive one search, :func:`search`.

* Each prompt starts with a per-request nonce so it is unique from token 0: prefix caching matches
  from token 0 in whole blocks, so a suffix nonce would not defeat it. Chat prompts put the nonce in
  a system message so that the template's own default system prompt (shared by every request) is
  not emitted.
* The body is units (a word and the whitespace after it) of a workload's text (:data:`WORKLOADS`):
  ``filler`` = pseudo-random common words (~1 token/word on BPE tokenizers; the lab's default);
  the classes (:data:`CLASSES`) ``prose`` = natural-language passages of the shipped corpus
  (``corpus.json``) after an instruction to continue them (the seeds' figures are prose), ``code``
  = small Python modules to continue, ``structured`` = seeded synthetic records to turn into JSON
  lines, ``tool`` = an agentic turn (task, a first tool call, its long result: the body) whose next
  tool call is decoded. With speculative decoding the text decides the acceptance rate, so each
  class is measured and reported on its own. ``start`` picks the first passage, so concurrent
  streams read different text; long prompts run through the passages in a seeded order, again and
  again.
* The word count is searched until /tokenize returns the target (secant steps, then bisection),
  then single-token pads close a gap smaller than one word. An inexact result is returned as such
  (``BuiltPrompt.exact``); a target below the fixed part (nonce, instruction, template) is an error.
"""
from __future__ import annotations

import json
import random
import re
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from ..errors import BenchError

WORDS = ["time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company", "system", "program", "question", "work", "government", "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others", "level", "office", "door", "health", "person", "art", "war", "history", "party", "result", "change", "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education", "river", "garden", "stone", "light", "music", "paper", "table", "window", "market", "street", "field", "color", "green", "blue", "small", "large", "early", "late", "open", "close", "quick", "slow", "warm", "cold", "bright", "dark", "simple"]
PADS = (" a", " 0", ".", " x", "!", " 1", ",", " I")
PARAGRAPH = "\n\n"


@cache
def corpus() -> dict[str, Any]:
    """The shipped text corpus (``runbook/api/corpus.json``): written for this project, no downloads."""
    return json.loads(resources.files(__package__).joinpath("corpus.json").read_text())


@dataclass(frozen=True)
class Workload:
    """What a prompt's text is: an instruction before the body, where the body's units come from,
    and how the messages are laid out (``tool``: the body is a tool result inside an agentic turn)."""
    name: str
    instruction: str = ""
    source: str = "filler"            # filler | prose | code | records | tool (its result is prose)
    layout: str = "plain"             # plain | tool
    description: str = ""


WORKLOADS: dict[str, Workload] = {
    "filler": Workload("filler", description="pseudo-random common words (lab default; not comparable with "
                                             "published prose figures)"),
    "prose": Workload("prose", "Continue the following text in the same style, as one long passage of plain "
                               "prose.\n\n", "prose",
                      description="natural-language passages of the shipped corpus, continued as prose "
                                  "(the seeds' decode condition)"),
    "code": Workload("code", "Continue this Python module: add more functions in the same style, with "
                             "docstrings and no commentary.\n\n", "code",
                     description="small Python modules of the shipped corpus, continued as code"),
    "structured": Workload("structured", "Convert every record below into one JSON object per line with the "
                                         "keys id, name, city, year, amount and status. Output only JSON "
                                         "lines.\n\n", "records",
                           description="seeded synthetic records turned into JSON lines (predictable output)"),
    "tool": Workload("tool", "", "prose", layout="tool",
                     description="an agentic turn: task, a first tool call, its (long) result; the model "
                                 "decodes the next tool call (tools API, tool_choice auto)"),
}
#: the workload classes of the class panel (filler is not a class: it is the lab's scaled default)
CLASSES = ("prose", "code", "structured", "tool")


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise BenchError("unknown bench workload", observed=repr(name), expected=" | ".join(WORKLOADS),
                         fix="set BenchConfig.workload to one of the listed workloads")
    return WORKLOADS[name]


def request_extra(workload_name: str) -> dict[str, Any]:
    """Request-body fields a workload needs besides its messages (the tool turn: its tools)."""
    if get_workload(workload_name).layout == "tool":
        return {"tools": corpus()["tool"]["tools"], "tool_choice": "auto"}
    return {}


@dataclass
class BuiltPrompt:
    nonce: str
    prompt: Any              # str (completions) or messages (chat)
    tokens: int              # count by the server's /tokenize
    target: int
    tokenize_calls: int
    words: int = 0           # body words used (the next search's first guess)
    workload: str = "filler"

    @property
    def exact(self) -> bool:
        return self.tokens == self.target


def filler(n_words: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WORDS) for _ in range(n_words)]


_UNIT = re.compile(r"\S+\s*")


def _units(text: str) -> list[str]:
    """Words with the whitespace that follows them (joining them restores the text exactly)."""
    return _UNIT.findall(text)


def _records(seed: int, start: int, n: int) -> list[str]:
    """Synthetic records (one line each) from the corpus word lists, seeded."""
    r = corpus()["records"]
    rng = random.Random(seed * 7919 + start)
    out = []
    for i in range(start, start + n):
        out.append(f"R{i:05d} {rng.choice(r['first_names'])} {rng.choice(r['last_names'])}, "
                   f"{rng.choice(r['cities'])}, {rng.randint(1950, 2024)}, {rng.randint(100, 99999) / 100:.2f}, "
                   f"{rng.choice(r['statuses'])}\n")
    return out


@dataclass
class _Text:
    """The body's units for one prompt: filler words, or corpus items from ``start`` on (corpus order
    first, then seeded shuffles), or generated records."""
    wl: Workload
    start: int = 0
    seed: int = 1234
    units: list[str] = field(default_factory=list)
    _cycle: int = 0

    def take(self, n: int) -> list[str]:
        while len(self.units) < n:
            if self.wl.source == "filler":
                self.units = [w + " " for w in filler(max(n, 2 * len(self.units), 64), self.seed)]
                continue
            if self.wl.source == "records":
                for line in _records(self.seed, self.start * 1000 + self._cycle * 200, 200):
                    self.units += _units(line)
                self._cycle += 1
                continue
            items = corpus()[self.wl.source]
            order = list(range(len(items)))
            if self._cycle:                       # later cycles: a seeded shuffle (first: corpus order)
                random.Random(self.seed + self._cycle).shuffle(order)
            k = self.start % len(order)
            for i in order[k:] + order[:k]:
                item = f"doc-{i + 1:03d}: {items[i]}" if self.wl.layout == "tool" else items[i]
                us = _units(item.rstrip())
                us[-1] = us[-1].rstrip() + PARAGRAPH
                self.units += us
            self._cycle += 1
        return self.units[:n]


def _renderer(text: _Text, nonce: str, endpoint: str, instruction: str, tail: str, needle: str,
              depth: float) -> Callable[[int, str], Any]:
    def render(w: int, pad: str = "") -> Any:
        body = list(text.take(w))
        if needle:
            k = int(w * depth)
            body = body[:k] + [needle + " "] + body[k:]
        content = instruction + "".join(body).rstrip() + pad + tail
        if text.wl.layout == "tool":
            if endpoint != "chat":
                raise BenchError("the tool workload needs the chat endpoint", observed=f"endpoint={endpoint}",
                                 expected="chat", fix="set BenchConfig.endpoint='chat'")
            t = corpus()["tool"]
            call = {"id": "call_0", "type": "function",
                    "function": {"name": t["call"]["name"], "arguments": json.dumps(t["call"]["arguments"])}}
            return [{"role": "system", "content": f"{nonce} {t['system']}"},
                    {"role": "user", "content": t["user"]},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_0", "content": t["result_header"] + content}]
        if endpoint == "chat":
            return [{"role": "system", "content": nonce}, {"role": "user", "content": content}]
        return f"{nonce} {content}"
    return render


def search(target: int, render: Callable[[int, str], Any], *, hint: int = 0, max_calls: int = 40,
           pads: tuple[str, ...] = PADS) -> Generator[Any, int, tuple[int, str, int, int]]:
    """The search as a generator: it yields a prompt to count and is sent the server's count;
    it returns ``(words, pad, tokens, calls)``. Drive it with :func:`build_exact_prompt` (sync) or
    :func:`abuild_exact_prompt` (async)."""
    counts: dict[tuple[int, str], int] = {}
    calls = 0

    def ask(w: int, pad: str = "") -> Generator[Any, int, int]:
        nonlocal calls
        if (w, pad) not in counts:
            if calls >= max_calls:
                raise BenchError(f"could not build a {target}-token prompt within {max_calls} /tokenize calls",
                                 observed=f"counts {sorted(counts.items())[-4:]}", expected=f"{target} tokens",
                                 fix="check that /tokenize counts the same text the requests send")
            calls += 1
            counts[(w, pad)] = yield render(w, pad)
        return counts[(w, pad)]

    n0 = yield from ask(0)
    if target < n0:
        raise BenchError(f"a {target}-token prompt is shorter than its fixed part", observed=f"{n0} tokens with "
                         "no body (nonce, instruction, chat template)", expected=f"<= {target}",
                         fix="raise the prompt length or use a shorter instruction")
    lo, n_lo, hi = 0, n0, None          # lo: most words known to fit (n <= target); hi: fewest that overshoot
    w = hint if hint > 0 else max(1, round((target - n0) / 1.3))
    while n_lo < target:
        n = yield from ask(w)
        if n == target:
            return w, "", n, calls
        if n < target:
            lo, n_lo = w, n
        else:
            hi = w
        if hi is not None and hi - lo <= 1:
            break
        per = max(0.2, (n - n0) / w)                   # tokens per word so far
        step = w + round((target - n) / per)
        if hi is not None and not lo < step < hi:
            step = (lo + hi) // 2
        elif hi is None and step <= lo:
            step = lo + 1
        w = step
    pad, n = "", n_lo
    while n < target:                                 # less than one word short: single-token pads
        for p in pads:
            m = yield from ask(lo, pad + p)
            if n < m <= target:
                pad, n = pad + p, m
                break
        else:
            break
    return lo, pad, n, calls


def _prepare(target: int, nonce: str, endpoint: str, workload_name: str, start: int, seed: int,
             instruction: str | None, tail: str, needle: str, depth: float):
    wl = get_workload(workload_name)
    text = _Text(wl, start, seed)
    return wl, _renderer(text, nonce, endpoint, wl.instruction if instruction is None else instruction,
                         tail, needle, depth)


def build_exact_prompt(count: Callable[[Any], int], target: int, nonce: str, *, endpoint: str = "chat",
                       workload: str = "filler", start: int = 0, seed: int = 1234,
                       instruction: str | None = None, tail: str = "", needle: str = "", depth: float = 0.5,
                       hint: int = 0, max_calls: int = 40) -> BuiltPrompt:
    """A prompt of exactly ``target`` tokens by ``count(prompt)`` (the server's /tokenize of a str for
    completions or of messages for chat, with the requests' chat_template_kwargs). ``instruction``
    replaces the workload's; ``tail`` follows the body (e.g. a question); ``needle`` is inserted at
    ``depth`` of the body."""
    wl, render = _prepare(target, nonce, endpoint, workload, start, seed, instruction, tail, needle, depth)
    gen = search(target, render, hint=hint, max_calls=max_calls)
    try:
        prompt = next(gen)
        while True:
            prompt = gen.send(count(prompt))
    except StopIteration as stop:
        w, pad, n, calls = stop.value
    return BuiltPrompt(nonce, render(w, pad), n, target, calls, w, wl.name)


async def abuild_exact_prompt(count: Callable[[Any], Awaitable[int]], target: int, nonce: str, *,
                              endpoint: str = "chat", workload: str = "filler", start: int = 0, seed: int = 1234,
                              instruction: str | None = None, tail: str = "", needle: str = "",
                              depth: float = 0.5, hint: int = 0, max_calls: int = 40) -> BuiltPrompt:
    """:func:`build_exact_prompt` with an async ``count``."""
    wl, render = _prepare(target, nonce, endpoint, workload, start, seed, instruction, tail, needle, depth)
    gen = search(target, render, hint=hint, max_calls=max_calls)
    try:
        prompt = next(gen)
        while True:
            prompt = gen.send(await count(prompt))
    except StopIteration as stop:
        w, pad, n, calls = stop.value
    return BuiltPrompt(nonce, render(w, pad), n, target, calls, w, wl.name)


class PromptBuilder:
    """The runner's builder: one workload and endpoint, remembering the word count that worked for
    each target length (the next prompt of that length usually needs one /tokenize call)."""

    def __init__(self, tokenize: Callable[..., Awaitable[int]], endpoint: str = "completions",
                 seed: int = 1234, workload: str = "filler", chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenize, self.endpoint, self.seed = tokenize, endpoint, seed
        self.workload = get_workload(workload).name          # unknown: a clear error now
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._hint: dict[int, int] = {}

    async def _count(self, prompt: Any) -> int:
        if self.endpoint == "chat":
            kw: dict[str, Any] = {}
            if self.chat_template_kwargs:
                kw["chat_template_kwargs"] = self.chat_template_kwargs
            tools = request_extra(self.workload).get("tools")
            if tools:
                kw["tools"] = tools              # the template renders them into the prompt
            return await self.tokenize(messages=prompt, **kw)
        return await self.tokenize(prompt=prompt)

    async def build(self, target: int, nonce: str, start: int = 0, max_calls: int = 40) -> BuiltPrompt:
        b = await abuild_exact_prompt(self._count, target, nonce, endpoint=self.endpoint, workload=self.workload,
                                      start=start, seed=self.seed, hint=self._hint.get(target, 0),
                                      max_calls=max_calls)
        if b.exact:
            self._hint[target] = b.words
        return b
