"""Profile and secrets-file text (issue 35 item 7): secret forms in comments refused (whole-line and trailing), a
token-shaped key name refused without being echoed, and characters a reviewer cannot see (format characters such
as the TAG block U+E0000-E007F, zero-width and bidirectional controls, fillers, variation selectors) refused in
every value, naming the key and file:line, never showing the value."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runbook.errors import ProfileError
from runbook.profile import load_profile
from runbook.secrets import SecretsError, load_secrets

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "env" / "lab.env"
TOKEN = "hf_" + "Zq8wE3rT5yU7iO9pA1sD2fG4"         # token-shaped, not a real token
API = "sk-live-9f8e7d6c5b4a"


def _profile(tmp_path: Path, extra: str = "", *, replace: tuple[str, str] | None = None) -> Path:
    text = LAB.read_text()
    if replace:
        text = text.replace(*replace, 1)
    p = tmp_path / "p.env"
    p.write_text(text + extra)
    return p


def _issues(path: Path, overrides=None) -> list:
    with pytest.raises(ProfileError) as ei:
        load_profile(path, overrides, environ={})
    assert ei.value.exit_code == 2
    return ei.value.issues


def _last_line(path: Path) -> int:
    return len(path.read_text().rstrip("\n").split("\n"))


@pytest.mark.parametrize("comment,secret", [
    (f"# hf_token: {TOKEN}", TOKEN),
    (f"# VLLM_API_KEY: {API}", API),
    (f"# api_key: {API}", API),
    (f'# {{"api_key": "{API}"}}', API),
    (f"#export HF_TOKEN='{API}'", API),
    (f"# curl -H 'Authorization: Bearer {API}' http://h:8000/v1/models", API),
    (f"# mirror https://ops:{API}@mirror.internal/hf", API),
    (f"# GET /resolve/main/x?token={API}", API),
    (f"# password = {API}", API),
])
def test_a_secret_form_in_a_comment_is_refused_without_echo(tmp_path, comment, secret):
    p = _profile(tmp_path, comment + "\n")
    found = [i for i in _issues(p) if i.key == "<comment>"]
    assert [(i.path, i.line) for i in found] == [(str(p), _last_line(p))]
    assert "revoke" in found[0].fix and secret not in str(found[0]) and secret[3:] not in str(found[0])


def test_a_secret_form_in_a_trailing_comment_is_refused(tmp_path):
    p = _profile(tmp_path, replace=("PROFILE_NAME=lab", f"PROFILE_NAME=lab   # api_key={API}"))
    found = [i for i in _issues(p) if i.key == "<comment>"]
    assert [i.line for i in found] == [1 + LAB.read_text().split("\n").index("PROFILE_NAME=lab")]
    assert API not in "\n".join(map(str, found))


@pytest.mark.parametrize("comment", ["# token: see the README", "# the API key comes from secrets.env",
                                     "# password: none on the lab", "# Bearer of news: the worker",
                                     "# https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash?tab=files",
                                     "PROFILE_NAME=lab  # max_tokens: 128"])
def test_ordinary_comments_still_load(tmp_path, comment):
    if comment.startswith("PROFILE_NAME"):
        p = _profile(tmp_path, replace=("PROFILE_NAME=lab", comment))
    else:
        p = _profile(tmp_path, comment + "\n")
    assert load_profile(p, environ={}).profile_name == "lab"


def test_a_token_shaped_key_name_is_refused_and_never_echoed(tmp_path):
    p = _profile(tmp_path, f"{TOKEN}=1\n")
    with pytest.raises(ProfileError) as ei:
        load_profile(p, environ={})
    text = str(ei.value)
    assert TOKEN not in text and TOKEN[3:] not in text
    (issue,) = [i for i in ei.value.issues if i.line == _last_line(p)]
    assert issue.key == "<key>" and "looks like a token" in issue.message and issue.path == str(p)


INVISIBLE = ["\U000e0041", "\U000e007f", "\U000e0001", "\u200b", "\u2060", "\ufeff", "\u202e", "\u2066", "\u00ad",
             "\u180e", "\ufe0f", "\u3164", "\U000e0100"]


@pytest.mark.parametrize("ch", INVISIBLE, ids=[f"U+{ord(c):04X}" for c in INVISIBLE])
def test_an_invisible_character_in_a_value_is_refused_naming_key_and_line(tmp_path, ch):
    p = _profile(tmp_path, replace=("PROFILE_NAME=lab", f"PROFILE_NAME=la{ch}b"))
    (issue,) = [i for i in _issues(p) if i.key == "PROFILE_NAME"]
    assert (issue.path, issue.line) == (str(p), 1 + LAB.read_text().split("\n").index("PROFILE_NAME=lab"))
    assert f"U+{ord(ch):04X}" in issue.message and "column 16" in issue.message and ch not in str(issue)


def test_every_value_of_the_lab_profile_refuses_a_tag_character(tmp_path):
    """TAG characters (U+E0000-E007F) spell hidden ASCII text: refused in whatever key carries them."""
    lines = LAB.read_text().split("\n")
    keyed = [(n, ln.split("=", 1)[0]) for n, ln in enumerate(lines, start=1) if ln[:1].isupper() and "=" in ln]
    assert len(keyed) >= 40
    wrong = []
    for n, key in keyed:
        edited = lines.copy()
        k, _, v = edited[n - 1].partition("=")
        edited[n - 1] = f"{k}={v}\U000e0069\U000e0067\U000e006e"          # "ign" in tags
        p = tmp_path / f"{key}.env"
        p.write_text("\n".join(edited))
        got = {(i.key, i.line) for i in _issues(p) if "U+E0069" in i.message}
        if got != {(key, n)}:
            wrong.append((key, got))
    assert wrong == []


def test_an_override_with_a_tag_character_is_refused():
    (issue,) = _issues(LAB, {"PROFILE_NAME": "lab\U000e0041"})
    assert issue.key == "PROFILE_NAME" and issue.path == "<override>" and "U+E0041" in issue.message


def test_the_secrets_file_refuses_an_invisible_character_in_a_value(tmp_path):
    f = tmp_path / "secrets.env"
    f.write_text(f"# mine\nHF_TOKEN={TOKEN}\u200b\n")
    f.chmod(0o600)
    with pytest.raises(SecretsError) as ei:
        load_secrets({}, f)
    (issue,) = ei.value.issues
    assert (issue.key, issue.line, issue.path) == ("HF_TOKEN", 2, str(f)) and "U+200B" in issue.message
    assert TOKEN not in str(ei.value) and ei.value.exit_code == 2


def test_the_secrets_file_keeps_commented_out_tokens():
    """A comment in the secrets file may hold an old token: that file is never shared."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "secrets.env"
        f.write_text(f"# HF_TOKEN={TOKEN}\nVLLM_API_KEY={API}\n")
        f.chmod(0o600)
        assert load_secrets({}, f).api_key == API


def test_validate_through_the_cli_exits_2_and_echoes_no_secret(tmp_path):
    p = _profile(tmp_path, f"# VLLM_API_KEY: {API}\n{TOKEN}=1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run([sys.executable, "-m", "runbook", "validate", "--profile", str(p)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "<comment>" in r.stderr and "<key>" in r.stderr, r.stderr
    out = r.stdout + r.stderr
    assert API not in out and TOKEN not in out and TOKEN[3:] not in out


def test_a_token_given_as_an_override_key_is_refused_and_never_echoed():
    issues = _issues(LAB, {TOKEN: "1"})
    assert [i.key for i in issues] == ["<key>"] and TOKEN not in "\n".join(map(str, issues))


@pytest.mark.parametrize("param", [TOKEN, f"{TOKEN}=1", f"PORT=Bearer {API}"])
def test_cli_errors_about_a_param_echo_no_secret(param):
    """`-p` is typed by hand: whatever error it gets, the CLI prints it masked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run([sys.executable, "-m", "runbook", "validate", "--profile", str(LAB), "-p", param], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "error:" in r.stderr, r.stderr
    assert TOKEN[3:] not in r.stderr and API not in r.stderr, r.stderr


@pytest.mark.parametrize("endpoint", ["https://hf-mirror.internal/" + TOKEN.replace("_", "%5F"),
                                      "https://hf-mirror.internal/x/" + "".join(f"%{b:02X}" for b in TOKEN.encode())])
def test_a_percent_encoded_token_in_a_value_is_refused(endpoint):
    issues = _issues(LAB, {"HF_ENDPOINT": endpoint, "HF_ENDPOINT_TRUSTED": "1"})
    assert [i.key for i in issues if "Hugging Face token" in i.message] == ["HF_ENDPOINT"]
    assert TOKEN[3:] not in "\n".join(map(str, issues))
