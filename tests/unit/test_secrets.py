"""Secrets loading and redaction (runbook/secrets.py)."""
from __future__ import annotations

import os

import pytest

from runbook import secrets as sec
from runbook.secrets import (MASK, Redactor, Secrets, SecretsError, default_redactor, load_secrets,
                             redactor_from_env, register_secret, reset_default_redactor)

HF = "hf_" + "Ab3" * 10          # token-shaped
KEY = "sk-local-api-key-123"


def secrets_file(tmp_path, text, mode=0o600):
    p = tmp_path / "secrets.env"
    p.write_text(text)
    os.chmod(p, mode)
    return p


def test_env_wins_over_file(tmp_path):
    f = secrets_file(tmp_path, f"HF_TOKEN=hf_{'f' * 30}\nVLLM_API_KEY=fromfile\n")
    s = load_secrets({"HF_TOKEN": HF}, f)
    assert s.hf_token == HF and s.hf_token_source == "env:HF_TOKEN"
    assert s.api_key == "fromfile" and s.api_key_source == f"file:{f}"


def test_hugging_face_hub_token_alias(tmp_path):
    s = load_secrets({"HUGGING_FACE_HUB_TOKEN": HF}, tmp_path / "missing.env")
    assert s.hf_token == HF and s.hf_token_source == "env:HUGGING_FACE_HUB_TOKEN"


def test_missing_file_is_fine(tmp_path):
    s = load_secrets({}, tmp_path / "nope.env")
    assert (s.hf_token, s.api_key) == ("", "") and s.auth_headers() == {}


def test_file_0600_accepted(tmp_path):
    f = secrets_file(tmp_path, f"# mine\nexport HF_TOKEN='{HF}'\nVLLM_API_KEY={KEY}\n", 0o600)
    s = load_secrets({}, f)
    assert (s.hf_token, s.api_key) == (HF, KEY)
    assert s.auth_headers() == {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_file_readable_by_others_refused(tmp_path, mode):
    f = secrets_file(tmp_path, f"HF_TOKEN={HF}\n", mode)
    with pytest.raises(SecretsError) as ei:
        load_secrets({}, f)
    (iss,) = ei.value.issues
    assert iss.fix == f"chmod 600 {f}" and f"{mode:04o}" in iss.message
    assert HF not in str(ei.value) and ei.value.exit_code == 2


def test_file_not_read_when_env_has_everything(tmp_path):
    f = secrets_file(tmp_path, "HF_TOKEN=x\n", 0o644)  # would be refused if read
    s = load_secrets({"HF_TOKEN": HF, "VLLM_API_KEY": KEY}, f)
    assert (s.hf_token, s.api_key) == (HF, KEY)


def test_default_file_from_runbook_secrets_file(tmp_path):
    f = secrets_file(tmp_path, f"VLLM_API_KEY={KEY}\n")
    assert load_secrets({"RUNBOOK_SECRETS_FILE": str(f)}).api_key == KEY


def test_bad_line_not_echoed(tmp_path):
    f = secrets_file(tmp_path, f"{HF}\n")
    with pytest.raises(SecretsError) as ei:
        load_secrets({}, f)
    assert HF not in str(ei.value) and ei.value.issues[0].line == 1


def test_repr_masks():
    s = Secrets(hf_token=HF, api_key=KEY)
    for text in (repr(s), str(s), f"{s}", str([s])):
        assert HF not in text and KEY not in text and MASK in text
    assert "''" in repr(Secrets())


def test_redactor_masks_known_values_and_patterns():
    r = Redactor([KEY, "ab"])  # "ab" too short to mask safely
    text = (f"curl -H 'Authorization: Bearer zzzTOPzzz' --api-key {KEY} x; token {HF}; "
            "HF_TOKEN=plainvalue VLLM_API_KEY: other1 about abc")
    out = r.redact(text)
    for leaked in (KEY, HF, "zzzTOPzzz", "plainvalue", "other1"):
        assert leaked not in out
    assert "about abc" in out and out.count(MASK) >= 5
    assert r(None) is None and r("") == ""


def test_redactor_does_not_mask_ordinary_text():
    r = Redactor([KEY])
    text = '{"max_tokens": 32, "num_speculative_tokens": 3} SPEC_TOKENS=6 bearer of news'
    assert r.redact(text) == text  # plural *_TOKENS keys and prose "bearer" are not secrets
    assert "news" not in r.redact("Bearer news") and "xyz" not in r.redact("authorization: bearer xyz")


def test_redact_obj_nested():
    r = Redactor([KEY])
    out = r.redact_obj({"cmd": [f"x {KEY}", ("y", HF)], "n": 3, KEY: "k"})
    assert out == {"cmd": [f"x {MASK}", ("y", MASK)], "n": 3, MASK: "k"}


def test_redactor_from_env(tmp_path):
    f = secrets_file(tmp_path, f"VLLM_API_KEY={KEY}\n")
    r = redactor_from_env({"HF_TOKEN": "envtoken-123"}, f)
    assert r.redact(f"a envtoken-123 b {KEY}") == f"a {MASK} b {MASK}"


def test_redactor_from_env_tolerates_refused_file(tmp_path):
    f = secrets_file(tmp_path, f"VLLM_API_KEY={KEY}\n", 0o644)
    r = redactor_from_env({"HF_TOKEN": "envtoken-123"}, f)
    assert r.redact("envtoken-123") == MASK


def test_default_redactor_picks_up_later_exports(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "none.env"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    reset_default_redactor()
    try:
        r = default_redactor()
        assert r.redact("late-key-999") == "late-key-999"
        monkeypatch.setenv("VLLM_API_KEY", "late-key-999")
        assert default_redactor() is r and r.redact("late-key-999") == MASK
        register_secret("generated-lab-key")
        assert default_redactor().redact("generated-lab-key") == MASK
    finally:
        reset_default_redactor()


def test_profile_masks_use_same_pattern():
    assert sec.HF_TOKEN_RE.fullmatch(HF) and not sec.HF_TOKEN_RE.fullmatch("hf_short")
