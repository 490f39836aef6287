"""How the reference server reads a prompt: one token per whitespace-separated word, the chat template's
added tokens, and the block prefix cache over those words.

``/tokenize`` and ``usage.prompt_tokens`` use the same count, so exact-length prompts can be built against
it: chat messages add ``chat_template_tokens`` per message, plus 1 for the generation prompt, plus 1 when
``chat_template_kwargs`` switch thinking off. The prefix cache hashes ``block_size``-word blocks in a chain,
as vLLM does, so a hit needs every block before it.
"""
from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["cached_tokens", "prompt_words", "text_head"]


def text_head(req: dict[str, Any]) -> str:
    """The first 80 characters of the last message (chat) or of the prompt, for the emission log."""
    if req.get("messages"):
        content = req["messages"][-1].get("content") or ""
        return content[:80] if isinstance(content, str) else ""
    return str(req.get("prompt", ""))[:80]


def prompt_words(req: dict[str, Any], chat_template_tokens: int, add_generation_prompt: bool = True) -> list[str]:
    """The request's prompt as the server's tokens (their count is the prompt length)."""
    if "messages" in req:
        words: list[str] = ["<bos>"]
        for m in req["messages"]:
            content = m.get("content") or ""
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            words += [f"<{m.get('role', 'user')}>"] * chat_template_tokens + content.split()
        if add_generation_prompt:
            words.append("<assistant>")
            kw = req.get("chat_template_kwargs") or {}
            if kw.get("enable_thinking") is False or kw.get("thinking") is False:
                words.append("</think>")      # as DeepSeek's template: thinking off closes the block
        return words
    prompt = req.get("prompt", "")
    if isinstance(prompt, list):
        prompt = " ".join(map(str, prompt))
    return prompt.split()


def cached_tokens(cache: set[bytes], words: list[str], block_size: int) -> int:
    """Prompt tokens found in ``cache`` (whole leading blocks; never the last token), then the prompt's
    blocks added to it."""
    b = block_size
    h = b""
    hits, hashes = 0, []
    miss = False
    for i in range(len(words) // b):
        h = hashlib.blake2b(h + "\x00".join(words[i * b:(i + 1) * b]).encode(), digest_size=16).digest()
        hashes.append(h)
        if not miss and h in cache:
            hits += b
        else:
            miss = True
    if len(cache) > 2_000_000:
        cache.clear()
    cache.update(hashes)
    return min(hits, max(0, len(words) - 1))
