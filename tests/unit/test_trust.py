"""Trust boundaries (issue 24): what ``validate`` shows a reviewer, ``-p`` values held to the file's rules, the HF
token from the secrets file and never to a foreign mirror, and the redactor's forms of a secret."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runbook.errors import ProfileError
from runbook.profile import executing_keys_changed, load_profile
from runbook.secrets import Redactor
from runbook.weights import hf_token, hf_token_for

REPO = Path(__file__).resolve().parents[2]
EXL3 = REPO / "env" / "exl3-v41.env"
TOKEN = "hf_" + "Tr7uSt9xK2mP4vL8nR1wB6cD"


def _secrets(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "secrets.env"
    path.write_text(text)
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------- validate shows what executes

def test_shipped_profiles_change_nothing_that_executes():
    for name in ("exl3-v41.env", "dspark-v4.env", "lab.env"):
        assert executing_keys_changed(load_profile(REPO / "env" / name, environ={})) == []


def test_changed_executing_keys_are_listed_with_the_shipped_value():
    p = load_profile(EXL3, {"EXTRA_ARGS": "--seed 7", "HF_ENDPOINT": "https://hf-mirror.internal",
                            "HF_ENDPOINT_TRUSTED": "1"}, environ={})
    changed = {k: (v, ref) for k, v, ref in executing_keys_changed(p)}
    assert changed == {"EXTRA_ARGS": ("--seed 7", ""), "HF_ENDPOINT": ("https://hf-mirror.internal", ""),
                       "HF_ENDPOINT_TRUSTED": ("1", "0")}


def test_cli_validate_prints_the_review_list():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    r = subprocess.run([sys.executable, "-m", "runbook", "validate", "--profile", str(EXL3), "-p",
                        "EXTRA_ARGS=--seed 7"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "review: 1 key(s) that execute or fetch differ from env/exl3-v41.env" in r.stderr
    assert "EXTRA_ARGS=--seed 7   (shipped: (empty))" in r.stderr
    assert json.loads(r.stdout)["EXTRA_ARGS"] == "--seed 7"


# ----------------------------------------------------------------------------- -p values

@pytest.mark.parametrize("value,code", [("8\u202e888", "U+202E"), ("88\u206688", "U+2066"), ("88\n88", "U+000A"),
                                        ("88\x1b88", "U+001B"), ("8\u200f888", "U+200F")])
def test_override_with_control_characters_is_refused_naming_the_key(value, code):
    with pytest.raises(ProfileError) as ei:
        load_profile(EXL3, {"PORT": value}, environ={})
    (issue,) = ei.value.issues
    assert issue.key == "PORT" and issue.path == "<override>" and code in issue.message
    assert ei.value.exit_code == 2


# ----------------------------------------------------------------------------- the HF token

def test_token_comes_from_the_secrets_file(tmp_path):
    f = _secrets(tmp_path, f"HF_TOKEN={TOKEN}\n")
    assert hf_token({"RUNBOOK_SECRETS_FILE": str(f)}) == TOKEN
    assert hf_token({"RUNBOOK_SECRETS_FILE": str(tmp_path / "none.env")}) is None


def test_environment_wins_over_the_file(tmp_path):
    f = _secrets(tmp_path, f"HF_TOKEN={TOKEN}\n")
    assert hf_token({"RUNBOOK_SECRETS_FILE": str(f), "HF_TOKEN": "hf_" + "e" * 30}) == "hf_" + "e" * 30


def test_a_foreign_endpoint_gets_no_token_unless_trusted(tmp_path):
    env = {"RUNBOOK_SECRETS_FILE": str(_secrets(tmp_path, f"HF_TOKEN={TOKEN}\n"))}
    hub = load_profile(EXL3, environ={})
    mirror = load_profile(EXL3, {"HF_ENDPOINT": "https://hf-mirror.example"}, environ={})
    trusted = load_profile(EXL3, {"HF_ENDPOINT": "https://hf-mirror.example", "HF_ENDPOINT_TRUSTED": "1"},
                           environ={})
    official = load_profile(EXL3, {"HF_ENDPOINT": "https://huggingface.co"}, environ={})
    lab = load_profile(REPO / "env" / "lab.env", environ={})
    assert hf_token_for(hub, env) == TOKEN and hf_token_for(official, env) == TOKEN
    assert hf_token_for(mirror, env) is None
    assert hf_token_for(trusted, env) == TOKEN
    assert hf_token_for(lab, env) == TOKEN        # the lab's own hub


def test_a_secrets_file_others_can_read_is_refused(tmp_path):
    f = _secrets(tmp_path, f"HF_TOKEN={TOKEN}\n")
    f.chmod(0o644)
    with pytest.raises(ProfileError) as ei:
        hf_token({"RUNBOOK_SECRETS_FILE": str(f)})
    assert "chmod 600" in str(ei.value) and TOKEN not in str(ei.value)


# ----------------------------------------------------------------------------- the redactor's forms

KEY = 'sk-"quoted\\back-7f3a'


@pytest.mark.parametrize("text", [
    "https://ops:hunter2@hf-mirror.internal/api",
    "X-Api-Key: abcdef123456",
    "Authorization: Basic b3BzOmh1bnRlcjI=",
    "GET /v1/models?token=abcdef123456&x=1",
    "password=hunter2",
    "passwd: hunter2",
    "ghp_" + "A" * 36,
    "api_org_" + "B" * 30,
    base64.b64encode(TOKEN.encode()).decode(),
    json.dumps({"key": KEY}),                              # a notebook's JSON escapes " and \
    base64.b64encode(KEY.encode()).decode(),
])
def test_redactor_masks_the_other_forms_of_a_secret(text):
    red = Redactor([KEY])
    out = red(text)
    assert "***" in out
    for secret in ("hunter2", "abcdef123456", "b3BzOmh1bnRlcjI", "A" * 36, "B" * 30, "quoted", TOKEN[3:],
                   base64.b64encode(KEY.encode()).decode()[:20], base64.b64encode(TOKEN.encode()).decode()[:20]):
        assert secret not in out, (text, out)


def test_redactor_keeps_ordinary_words():
    red = Redactor([KEY])
    text = "max_tokens: 128, prompt_tokens=5, Basic checks passed, tokens=3 https://github.com/a/b"
    assert red(text) == text
