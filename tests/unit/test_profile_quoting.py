"""A profile is code: every string key of each shipped recipe profile, set to a hostile value (``$(``,
backticks, quotes, a newline, ``;``) *without* validation (``model_copy``: what a bug in a validator would let
through), is rendered into every launch command and generated script (``launch.render``: docker/process start
lines, the recipe entrypoints of ``launch.recipe``; the weights builders of ``weights.sharing``). A small shell
lexer then proves that every piece of the hostile value lands where the shell does not read it: inside single
quotes, a comment, or a quoted here-document. Double quotes do not count: ``$(...)`` runs there."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from runbook.diagnose.bundle import collect_commands
from runbook.engram.read_probe import plan_probe
from runbook.engram.packing import plan_pack
from runbook.errors import RunbookError
from runbook.launch.checkout import checkout_probe_cmd
from runbook.launch import render as launch_render
from runbook.launch.render import NodeFacts
from runbook.profile import Profile, load_profile
from runbook.weights import sharing

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["lab.env", "exl3-v41.env", "dspark-v4.env", "tp3-dspark.env", "tp4-v41.env", "lab-tp3.env", "lab-tp4.env",
           "lab-tp2pp2.env"]
MARK = "PWN"
# each dangerous construct is followed by the marker: wherever the shell would read one, it reads a marker
PAYLOAD = f"x{MARK}$({MARK})`{MARK}`'{MARK}'\"{MARK}\"\n{MARK};{MARK}&{MARK}|{MARK}\\{MARK}${{{MARK}}}"


# ----------------------------------------------------------------------------- the shell lexer

def live_positions(script: str) -> list[int]:
    """Offsets of the characters of ``script`` that bash reads as code or expands: unquoted or inside double
    quotes (single-quoted text, comments, escaped characters and quoted here-document bodies are inert)."""
    live: list[int] = []
    i, n = 0, len(script)
    state = "plain"
    pending_heredocs: list[tuple[str, bool]] = []   # (delimiter, quoted) opened on the current line
    word_start = True
    while i < n:
        c = script[i]
        if state == "plain":
            if c == "'":
                j = script.find("'", i + 1)
                assert j >= 0, f"unterminated single quote at {i}"
                i, word_start = j + 1, False
                continue
            if c == "\\":
                i, word_start = i + 2, False
                continue
            if c == '"':
                state, word_start = "double", False
                i += 1
                continue
            if c == "#" and word_start:
                j = script.find("\n", i)
                i = n if j < 0 else j
                continue
            if script.startswith("<<", i) and not script.startswith("<<<", i):
                m = re.match(r"<<-?\s*(?:'([^']+)'|\"([^\"]+)\"|\\(\w+)|(\w+))", script[i:])
                if m:
                    delim = next(g for g in m.groups() if g)
                    pending_heredocs.append((delim, m.group(4) is None))
                    live.extend(range(i, i + m.end()))
                    i += m.end()
                    continue
            if c == "\n":
                live.append(i)
                i += 1
                word_start = True
                for delim, quoted in pending_heredocs:
                    end = re.compile(rf"^\t*{re.escape(delim)}$", re.M).search(script, i)
                    assert end, f"here-document {delim!r} never ends"
                    if not quoted:
                        live.extend(range(i, end.start()))
                    i = end.end()
                pending_heredocs = []
                continue
            live.append(i)
            word_start = c in " \t;&|(){}"
            i += 1
        else:   # double quotes: $ and ` expand, \ escapes $ ` " \ and newline
            if c == "\\" and i + 1 < n and script[i + 1] in '$`"\\\n':
                i += 2
                continue
            if c == '"':
                state = "plain"
                i += 1
                continue
            live.append(i)
            i += 1
    assert state == "plain", "unterminated double quote"
    return live


def marker_reaches_shell(script: str) -> list[str]:
    """Each place a marker is read by the shell, with its context."""
    live = set(live_positions(script))
    return [script[max(0, m.start() - 40):m.end() + 20]
            for m in re.finditer(MARK, script) if any(p in live for p in range(m.start(), m.end()))]


def test_lexer_tells_quoted_from_live():
    assert marker_reaches_shell(f"echo '{MARK} $(x)'") == []
    assert marker_reaches_shell(f"# a comment {MARK}\necho hi") == []
    assert marker_reaches_shell(f"echo \"$({MARK})\"")                   # double quotes run $()
    assert marker_reaches_shell(f"# a comment\n{MARK}")                  # a newline ends a comment
    assert marker_reaches_shell(f"cat <<'EOF'\n{MARK} $(x)\nEOF\necho") == []
    assert marker_reaches_shell(f"cat <<EOF\n$({MARK})\nEOF\n")          # an unquoted here-doc expands
    assert marker_reaches_shell(f"echo x{MARK}")
    import shlex
    assert marker_reaches_shell("echo " + shlex.quote(PAYLOAD)) == []
    assert marker_reaches_shell(f"cp {PAYLOAD} /x")


# ----------------------------------------------------------------------------- the profiles and their strings

def _string_keys() -> list[str]:
    out = []
    for name, f in Profile.model_fields.items():
        if f.annotation is str:            # Choice keys are Literal types: no free text reaches them
            out.append(name)
    return out


STRING_KEYS = _string_keys()


def test_string_keys_found():
    assert len(STRING_KEYS) > 25 and {"model_dir", "image", "weights_dir", "recipe_repo", "extra_args",
                                      "hf_revision", "chat_template", "cache_dir"} <= set(STRING_KEYS)


def _scripts(profile) -> list[tuple[str, str]]:
    """(what, shell text) of every command and generated script rendered from the profile."""
    names = [n.name for n in profile.nodes]
    facts = {n: NodeFacts(home="/home/spark", packed_engram=True) for n in names}
    out: list[tuple[str, str]] = []
    plan = launch_render.render(profile, facts, api_key_set=True)
    for r in plan.ranks:
        out.append((f"{r.node} start_command", r.start_command()))
        if r.entry_script:
            out.append((f"{r.node} entrypoint", r.entry_script))
    # the Engram pack and read probe (per node), what diagnose collects (per node), the checkout probe
    out += [(f"{n} engram pack", c) for n, cmds in plan_pack(profile).items() for c in cmds]
    out += [(f"{n} engram probe", c) for n, c in plan_probe(profile).items()]
    out += [(f"{n} diagnose {c.name}", c.cmd) for n, cmds in collect_commands(profile).items() for c in cmds]
    if profile.recipe_dir:
        out.append(("checkout probe", checkout_probe_cmd(profile.recipe_dir, ["start.sh"])))
    weights = profile.weights_dir.replace("~", "/home/spark", 1) or "/w"
    for what, build in (
            ("node download", lambda: sharing.render_node_download(
                "/tmp/t/node_download.py", profile.hf_model_repo, profile.hf_revision, weights,
                endpoint=profile.hf_endpoint or None, token_file="/tmp/t/token")),
            ("rsync", lambda: sharing.render_rsync(weights, weights, f"root@{profile.worker_ip}")),
            ("nfs", lambda: "\n".join(c for cmds in sharing.render_nfs(
                weights, profile.head_ip or "10.0.0.1", profile.worker_ip or "10.0.0.2", weights).values()
                for c in cmds))):
        try:
            out.append((what, build()))
        except RunbookError:
            pass           # the builder refuses the value (e.g. an unpinned revision): nothing runs
    return out


def _base(name: str):
    return load_profile(REPO / "env" / name, environ={})


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_renders_without_markers(name):
    """The oracle's control: with the shipped values nothing is flagged (the lexer parses every script)."""
    scripts = _scripts(_base(name))
    assert len(scripts) >= 3
    for what, text in scripts:
        assert marker_reaches_shell(text) == [], what


CASES = [(name, key) for name in SHIPPED for key in STRING_KEYS]


@pytest.mark.parametrize("name,key", CASES, ids=[f"{n}:{k.upper()}" for n, k in CASES])
def test_hostile_string_never_reaches_a_shell_unquoted(name, key):
    base = _base(name)
    rendered_any = []
    for prefix in ("", "/", "~/"):          # node paths: a relative value is refused, an absolute one renders
        hostile = base.model_copy(update={key: prefix + PAYLOAD})
        try:
            scripts = _scripts(hostile)
        except (RunbookError, ValueError):   # refused by a renderer: nothing runs
            continue
        rendered_any.append(prefix)
        _check(key, scripts)
    if not rendered_any:
        pytest.skip("refused by every renderer in every form")


def _check(key: str, scripts: list[tuple[str, str]]) -> None:
    rendered = "\n".join(t for _, t in scripts)
    for what, text in scripts:
        hits = marker_reaches_shell(text)
        assert hits == [], f"{key.upper()} reaches the shell in {what}: {hits[:3]}"
    # every key either reaches a rendered command or does not take part in them at all: both are safe;
    # the count below keeps the test honest (most keys do reach one)
    if MARK in rendered:
        _REACHED.add(key)


_REACHED: set[str] = set()


def test_zz_many_keys_reach_a_rendered_command():
    """Runs after the cases (pytest keeps file order): the payload reached the scripts for many keys."""
    if not _REACHED:
        pytest.skip("run with the cases above")
    assert len(_REACHED) >= 12, sorted(_REACHED)


def test_validation_refuses_what_the_quoting_test_renders():
    """Belt and braces: the hostile value is refused by validation too, for the keys that reach a node path
    or a URL (quoting is the second line)."""
    from runbook.errors import ProfileError
    for key in ("MODEL_DIR", "WEIGHTS_DIR", "CACHE_DIR", "RECIPE_DIR", "HF_ENDPOINT", "RECIPE_REPO", "IMAGE",
                "CHAT_TEMPLATE", "HF_REVISION", "CONTAINER_HEAD", "SHM_SIZE"):
        with pytest.raises(ProfileError) as ei:
            load_profile(REPO / "env" / "exl3-v41.env", {key: PAYLOAD.replace("\n", " ")}, environ={})
        assert any(i.key == key for i in ei.value.issues), key


