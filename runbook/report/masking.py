"""Secret-looking keys in what the report shows (profile, rank environments): masked, whatever the value."""
from __future__ import annotations

import re
from typing import Any

from ..secrets import MASK, Redactor

__all__ = ["secret_key", "mask_mapping"]

_SECRET_KEY = re.compile(r"(?i)(api_?key|secret|passw(or)?d|credential|authoriz|token(?!s\b|s_|izer))")


def secret_key(key: str) -> bool:
    """A key whose value is a secret (``*_TOKEN``, ``*API_KEY``, ``*SECRET*``, ...); ``*_TOKENS`` counts and
    ``TOKENIZER_*`` are not."""
    return bool(_SECRET_KEY.search(key or ""))


def mask_mapping(obj: Any, red: Redactor, key: str = "") -> Any:
    """Secret-looking keys get ``***`` (belt and braces: profile.json is already masked); every other
    string goes through the redactor."""
    if isinstance(obj, dict):
        return {k: mask_mapping(v, red, str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_mapping(v, red, key) for v in obj]
    if isinstance(obj, str):
        if obj and key and secret_key(key) and obj != MASK:
            return MASK
        return red.redact(obj)
    return obj
