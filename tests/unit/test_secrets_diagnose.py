"""Planted secrets through the real ``python -m runbook diagnose --log FILE`` (text and ``--json``), issue 35 item 4/6:
each form sits on a log line that a catalogue entry matches (so the line itself comes back: its case marker is
asserted in the output) and no form of any planted secret may come back. The known secrets come once from the
environment and once from the 0600 secrets file; the shape-only ones are known to nobody.

The leak check does not reuse the redactor's own list of forms: it decodes the output every way a secret was
encoded here (percent, hex, base64 at every offset, std and URL-safe) and looks for any 12 characters of a secret."""
from __future__ import annotations

import base64
import binascii
import json
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HF = "hf_PlantedDiag7Kq2Wm9Xr4Tb8Ny3Lc6Vz5Ab"            # the known HF token (env or secrets file)
API = "sr-Pl4nt/ed+Key=9f8e7d6c5b4a"                      # the known API key: / + = make its %-encoding differ
UNK_HF = "hf_Unkn0wnShapeOnly5Rt7Yu9Io2Pa4Sd6"            # shape only: nobody registered these
UNK_BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.Sig4ture"
UNK_QUERY = "Unkn0wnQueryVal9x"
UNK_KEY = "sk-unknownApiKey-4d3c2b1a"
UNK_PW = "s3cr3tPassw0rdZ"
UNK_SECRET = "cl1entS3cretValue7"
SECRETS = (HF, API, UNK_HF, UNK_BEARER, UNK_QUERY, UNK_KEY, UNK_PW, UNK_SECRET)

# one line per catalogue entry per file: each of these is matched by a different entry and echoed whole
ANCHORS = (
    "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
    "sh: 1: ray: not found",
    "Version mismatch: The cluster was started with Ray 2.40 but this is 2.49",
    "Cannot provide a placement group of size 2",
    "ValueError: No common block size for 64",
    "The server socket has failed to listen on any local network address",
    "Killed signal terminated program cc1plus",
    "Application timeout caused pair closure",
    "provided PTX was compiled with an unsupported toolchain",
    "Found no NVIDIA driver on your system",
    "ibv_modify_qp failed with error 110",
    "AttributeError: SemLock._rebuild",
    "Free memory on device cuda:0 (10.0/119.7 GiB) on startup is less than desired GPU memory utilization",
)


def _b64(raw: bytes, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode()


def _pct_all(s: str) -> str:
    return "".join(f"%{b:02X}" for b in s.encode())


def _lower_pct(s: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), s)


Q = urllib.parse.quote
FORMS = [
    # the known HF token
    HF, f"({HF})", f"HF_TOKEN={HF}", f"HUGGING_FACE_HUB_TOKEN={HF}", f'export HF_TOKEN="{HF}"', f"hf_token: {HF}",
    json.dumps({"hf_token": HF}), f"--hf-token {HF}", f"huggingface-cli login --token {HF}",
    f"Authorization: Bearer {HF}", f"GET /api/models?token={HF}", f"https://user:{HF}@huggingface.co/m",
    f"https://{HF}@huggingface.co/m", _b64(HF.encode()), _b64(b"a" + HF.encode()), _b64(b"ab" + HF.encode(), True),
    f"Authorization: Basic {_b64(('user:' + HF).encode())}", HF.encode().hex(), HF.encode().hex().upper(),
    _pct_all(HF), _lower_pct(_pct_all(HF)), json.dumps({"msg": f"token {HF}"}),
    "headers={'Authorization': 'Bearer %s'}" % HF, f"docker run -e HF_TOKEN={HF} img",
    # the known API key
    f"key {API} again", f"Authorization: Bearer {API}", f"authorization: bearer {API}",
    f"curl -H 'Authorization: Bearer {API}' http://h:8000/v1/models", f"--api-key {API}", f"--api-key={API}",
    f"VLLM_API_KEY={API}", json.dumps({"api_key": API}), "{'api_key': '%s'}" % API, f"api_key={Q(API, safe='')}",
    f"x-api-key: {API}", f"GET /v1/models?x=1&api_key={Q(API, safe='')}", f"?key={Q(API, safe='')}",
    Q(API, safe=""), _lower_pct(Q(API, safe="")), Q(API), _b64(API.encode()),
    _b64(b"x" + API.encode()), f"Authorization: Basic {_b64(('u:' + API).encode())}", _b64(b"xy" + API.encode()), _b64(b"\xff" + API.encode(), True),
    API.encode().hex(), API.encode().hex().upper(), f"https://ops:{Q(API, safe='')}@mirror.internal/x",
    _pct_all(API),
    # nobody knows these: their shape alone must mask them
    UNK_HF, f"Bearer {UNK_BEARER}", f"GET /file?token={UNK_QUERY}&x=1", f"/v1/models?a=1&api_key={UNK_KEY}",
    json.dumps({"api_key": UNK_KEY}), f"api_key={UNK_KEY}", f"https://admin:{UNK_PW}@proxy.internal:3128",
    UNK_HF.encode().hex(), _b64(UNK_HF.encode()), f"/cb?access_token={UNK_QUERY}", f"&apikey={UNK_KEY}",
    f"password={UNK_PW}", json.dumps({"password": UNK_PW}), f"postgres://u:{UNK_PW}@db.internal/x",
    f"X-Api-Key: {UNK_KEY}", f"client_secret={UNK_SECRET}", f"git clone https://oauth2:{UNK_QUERY}@git.internal/r",
]


def _views(out: str) -> list[str]:
    """The output and every decoding of it that a planted form used."""
    views = [out, urllib.parse.unquote(out), urllib.parse.unquote_plus(out)]
    for run in re.findall(r"[0-9a-fA-F]{24,}", out):
        views.append(bytes.fromhex(run[: len(run) // 2 * 2]).decode("latin-1"))
    for run in re.findall(r"[A-Za-z0-9+/_-]{16,}", out):
        for skip in range(4):
            body = run[skip:]
            body = body[: len(body) // 4 * 4]
            for alt in (b"+/", b"-_"):
                try:
                    views.append(base64.b64decode(body, altchars=alt, validate=False).decode("latin-1"))
                except (binascii.Error, ValueError):
                    pass
    return views


def _leaks(out: str) -> list[str]:
    views = _views(out)
    found = []
    for secret in SECRETS:
        windows = {secret[i:i + 12] for i in range(len(secret) - 11)}
        if any(w in v for v in views for w in windows):
            found.append(secret)
    return found


def test_the_corpus_is_the_issue_size_and_the_oracle_sees_every_form():
    assert len(FORMS) >= 52 and len(set(FORMS)) == len(FORMS)
    unseen = [f for f in FORMS if not _leaks(f)]
    assert unseen == []                  # each form, unmasked, is a leak the check below would report


def _batches() -> list[list[tuple[int, str]]]:
    cases = list(enumerate(FORMS))
    return [cases[i:i + len(ANCHORS)] for i in range(0, len(cases), len(ANCHORS))]


def _env(tmp_path: Path, source: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY") and not k.startswith("RUNBOOK_")}
    secrets = tmp_path / "secrets.env"
    env["RUNBOOK_SECRETS_FILE"] = str(secrets)
    if source == "env":
        env.update(HF_TOKEN=HF, VLLM_API_KEY=API)
    else:
        secrets.write_text(f"HF_TOKEN={HF}\nVLLM_API_KEY={API}\n")
        secrets.chmod(0o600)
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.mark.parametrize("source", ["env", "secrets-file"])
def test_diagnose_log_prints_no_planted_secret(tmp_path, source):
    env = _env(tmp_path, source)
    seen_markers = 0
    for n, batch in enumerate(_batches()):
        log = tmp_path / f"planted-{n}.log"
        log.write_text("".join(f"{ANCHORS[i]} [case-{k:02d}] {form}\n" for i, (k, form) in enumerate(batch)))
        for mode in ([], ["--json"]):
            r = subprocess.run([sys.executable, "-m", "runbook", "diagnose", "--log", str(log), "--top", "99", *mode],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr[-2000:]
            out = r.stdout + r.stderr
            if mode:
                json.loads(r.stdout)                         # still one JSON document
            missing = [k for k, _ in batch if f"[case-{k:02d}]" not in out]
            assert missing == [], f"lines not echoed (the case proves nothing): {missing}\n{out[-3000:]}"
            seen_markers += len(batch)
            leaked = {k: form for k, form in batch if _leaks(_line_of(out, k))}
            assert leaked == {}, leaked
            assert _leaks(out) == [], mode
    assert seen_markers == 2 * len(FORMS)


def _line_of(out: str, k: int) -> str:
    return "\n".join(line for line in out.splitlines() if f"[case-{k:02d}]" in line)


def test_a_missing_log_named_like_a_token_is_not_echoed(tmp_path):
    env = _env(tmp_path, "env")
    for name in (HF, UNK_HF, f"x?token={UNK_QUERY}", _b64(API.encode()).replace("/", "_")):
        r = subprocess.run([sys.executable, "-m", "runbook", "diagnose", "--log", str(tmp_path / name)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "no such log or bundle" in r.stderr, r.stderr
        assert _leaks(r.stdout + r.stderr) == [], r.stderr
