"""The redactor's encoded forms of a known secret and its shapes that need no known secret (issue 35 item 4/6)."""
from __future__ import annotations

import base64
import re
import urllib.parse

import pytest

from runbook import secrets as S
from runbook.secrets import MASK, Redactor

KEY = "sr-Pl4nt/ed+Key=9f8e7d6c5b4a"


def _decodes_to_key(text: str) -> bool:
    """Any run of base64 characters in ``text`` that decodes (at any start, std or URL-safe) to 12 bytes of KEY."""
    windows = {KEY.encode()[i:i + 12] for i in range(len(KEY) - 11)}
    for run in re.findall(r"[A-Za-z0-9+/_-]{16,}", text):
        for skip in range(4):
            body = run[skip:][: (len(run) - skip) // 4 * 4]
            for alt in (b"+/", b"-_"):
                raw = base64.b64decode(body, altchars=alt)
                if any(w in raw for w in windows):
                    return True
    return False


@pytest.mark.parametrize("prefix", [b"", b"u", b"u:", b"user:"])
def test_base64_of_a_known_secret_is_masked_at_any_offset(prefix):
    """A Basic header encodes "user:" + secret: the secret's base64 differs with the prefix's length mod 3."""
    red = Redactor([KEY])
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        text = f"Authorization: Other {enc(prefix + KEY.encode() + b'!').decode()}"
        assert _decodes_to_key(text)                 # the check sees the planted form
        out = red(text)
        assert MASK in out and not _decodes_to_key(out), (prefix, out)


@pytest.mark.parametrize("form", [KEY.encode().hex(), KEY.encode().hex().upper(), urllib.parse.quote(KEY, safe=""),
                                  urllib.parse.quote(KEY), urllib.parse.quote_plus(KEY),
                                  "".join(f"%{b:02x}" for b in KEY.encode())])
def test_hex_and_percent_forms_of_a_known_secret_are_masked(form):
    assert Redactor([KEY])(f"seen {form} here") == f"seen {MASK} here"


def test_short_secrets_get_no_encoded_forms():
    """Hex or base64 of a 4-7 character value would mask unrelated text."""
    assert S.encoded_forms("abcd") == set()
    assert Redactor(["abcd"])("61626364 YWJjZA") == "61626364 YWJjZA"


@pytest.mark.parametrize("text,value", [
    ('{"api_key": "unk-Value-1234"}', "unk-Value-1234"),
    ("{'api_key': 'unk-Value-1234'}", "unk-Value-1234"),
    ("GET /v1?a=1&apikey=unk-Value-1234", "unk-Value-1234"),
    ("GET /cb?access_token=unk-Value-1234&x=2", "unk-Value-1234"),
    ("GET /f?sig=unk-Value-1234", "unk-Value-1234"),
    ("client_secret=unk-Value-1234", "unk-Value-1234"),
    ("DB_PASSWORD: unk-Value-1234", "unk-Value-1234"),
    ("X-HF-Token: unk-Value-1234", "unk-Value-1234"),
    ("huggingface-cli login --token unk-Value-1234", "unk-Value-1234"),
    ("68665f" + "41" * 24, "41" * 24),                  # the hex of an hf_ token nobody registered
])
def test_secret_shapes_without_a_known_value(text, value):
    out = Redactor()(text)
    assert value not in out and MASK in out, out


def test_shapes_leave_ordinary_log_text_alone():
    text = ('{"max_tokens": 32, "prompt_tokens": 5} GET /v1/models?limit=5 https://huggingface.co/deepseek-ai '
            "num_speculative_tokens=3 tokenizer_mode=auto 68665f")
    assert Redactor()(text) == text


def test_json_numbers_and_generated_token_text_keep_their_values():
    """Bench records carry "t_first_token": <seconds> and generated "token" text: neither is a secret."""
    text = '{"t_first_token": 0.1342, "t_last_token": 0.149, "token": "Hello", "api_key_source": "env:VLLM_API_KEY"}'
    assert Redactor()(text) == text
