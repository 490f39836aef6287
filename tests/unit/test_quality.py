"""Quality gate (runbook.answers.quality, its set in quality_set, its garble detector in garble) against the
reference server's answer modes, run in-process: answering correctly (the gate must pass), plausible garbage
(it must fail, naming the cases), broken text (the garble detector must fail, naming the answers), and the lab
(never PASS). Plus the judges, the set's validation and the garble rules on recorded and written texts."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import runbook.step
from runbook.api.prompts import corpus
from runbook.benchmark.refserver import ANSWER_MODES, RefConfig, serve_in_thread
from runbook.checks import Status
from runbook.errors import RunbookError
from runbook.profile import load_profile
from runbook.answers import garble, quality, quality_set
from runbook.api.server_info import ApiClient, Archive, Exchange, ServerInfo, archive
from runbook.smoke.cases import chat_checks
from runbook.answers.toolcalls import tool_defs, tool_map

# some cases time the reference server's answers: on the lab's xdist worker in `make test`, never niced
pytestmark = pytest.mark.timed

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "runbook" / "answers" / quality_set.SET_FILE
#: the lab's tiny model, recorded in results/20261202-023443-lab/raw/05_smoke/chat.probe.json
RECORDED_TINY = '")' * 32


def make_step(tmp_path: Path, recipe: str = "exl3-v41", dry_run: bool = False):
    return runbook.step.begin("05_smoke", ROOT / "env" / f"{recipe}.env", results_root=tmp_path, dry_run=dry_run)


def client_for(step, srv) -> ApiClient:
    return ApiClient(ServerInfo(srv.base_url, step.profile.served_model_name, step.profile.max_model_len,
                                "parameters"), timeout=30)


def gate(tmp_path: Path, recipe: str, **ref) -> tuple[object, dict]:
    """Run the gate against the reference server and record what it kept as step 05's run() does; returns
    the step and its rows by name."""
    step = make_step(tmp_path, recipe)
    cfg = RefConfig(model=step.profile.served_model_name, ttft_s=0.0, interval_s=0.0,
                    max_model_len=step.profile.max_model_len, **ref)
    rec = Archive(f"raw/{step.name}")
    with serve_in_thread(cfg) as srv:
        rows = quality.run_gate(client_for(step, srv), step.profile, rec)
    step.archive(rec.files)
    step.data.update(rec.data)
    return step, {c.name: c for c in rows}


def case_rows(rows: dict) -> dict:
    names = quality_set.load_quality_set().row_names()
    assert len(names) == 14
    return {n: rows[n] for n in names}


def ex_of(content: str | None, finish: str = "stop", tool_calls: list | None = None) -> Exchange:
    msg = {"role": "assistant", "content": content}
    if tool_calls is not None:
        msg["tool_calls"] = tool_calls
    body = {"choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}
    return Exchange("POST", "/v1/chat/completions", {}, 200, body, 0.01)


# ------------------------------------------------------------------------------------------------
# the set
# ------------------------------------------------------------------------------------------------

def test_shipped_set_loads_with_both_recipes_and_the_lab():
    qs = quality_set.load_quality_set()
    assert {c.kind for c in qs.cases} == set(quality_set.KINDS)
    assert set(qs.recipes) == {"exl3-v41", "dspark-v4", "lab"}
    assert qs.recipes["lab"].min_score is None
    for r in ("exl3-v41", "dspark-v4"):
        t = qs.recipes[r]
        assert 0 < t.min_score < 1 and "needle" in t.required and t.needle_tokens >= 8192
    # dspark-v4 (DeepSeek's own weights) is held to a stricter score than the 2.9 bpw re-quantisation
    assert qs.recipes["dspark-v4"].min_score > qs.recipes["exl3-v41"].min_score


def test_every_reference_passes_its_own_judge_and_a_near_miss_fails():
    qs = quality_set.load_quality_set()
    schemas = tool_map(tool_defs())
    checked = 0
    for case in qs.cases:
        ref = case.reference
        if case.kind == "number":
            assert quality.judge_number(ex_of(ref["content"]), ref["content"]) == []
            assert quality.judge_number(ex_of(str(int(ref["content"]) + 1)), ref["content"])
        elif case.kind == "json":
            assert quality.judge_json(ex_of(ref["content"]), case.schema) == []
            wrong = json.loads(ref["content"])
            wrong["total"] += 1
            assert quality.judge_json(ex_of(json.dumps(wrong)), case.schema)
        elif case.kind == "needle":
            code = quality.needle_code(case.depths[0])
            assert quality.judge_needle(ex_of(code), code) == []
            assert quality.judge_needle(ex_of(code[:-1] + "0" if code[-1] != "0" else code[:-1] + "1"), code)
        else:
            call = ref["tool_calls"][0]
            good = [{"id": "c0", "type": "function", "function": {"name": call["name"],
                                                                  "arguments": json.dumps(call["arguments"])}}]
            assert quality.judge_tool(ex_of(None, "tool_calls", good), case, schemas) == []
            assert quality.judge_tool(ex_of("I cannot call tools.", "stop"), case, schemas)
        checked += 1
    assert checked == len(qs.cases) == 12


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["cases"][0].update(kind="essay"), "cases[0] (arith.mul).kind"),
    (lambda d: d["cases"][0].update(reference={"content": "twelve"}), "cases[0] (arith.mul).reference.content"),
    (lambda d: d["cases"][8]["reference"].update(content='{"items": 5, "total": 25, "currency": "USD"}'),
     "cases[8] (json.order).reference.content"),
    (lambda d: d["cases"][10]["reference"]["tool_calls"][0]["arguments"].update(unit="kelvin"),
     "cases[10] (tool.single).reference.tool_calls[0].arguments"),
    (lambda d: d["recipes"]["exl3-v41"].update(required=["needle", "no.such.case"]), "recipes.exl3-v41.required"),
    (lambda d: d["recipes"]["dspark-v4"].update(min_score=1.5), "recipes.dspark-v4.min_score"),
    (lambda d: d["recipes"]["lab"].update(min_score=0.5), "recipes.lab.min_score"),
    (lambda d: d["cases"].append(dict(d["cases"][0])), "cases[].id"),
])
def test_bad_set_is_refused_naming_file_and_key(tmp_path, mutate, key):
    doc = json.loads(SHIPPED.read_text())
    mutate(doc)
    path = tmp_path / "set.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(RunbookError) as err:
        quality_set.load_quality_set(path)
    assert str(path) in str(err.value) and key in str(err.value), str(err.value)
    assert err.value.fix


# ------------------------------------------------------------------------------------------------
# judges
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, finish, ok", [
    ("1296", "stop", True),
    ("48 * 27 = 1,296.", "stop", True),             # restating the question first is fine: last number counts
    ("1296", "length", False),                      # ran to max_tokens
    ("1296 1296 1296", "length", False),
    ("1269", "stop", False),
    ("The answer is 1296, or maybe 1300.", "stop", False),
    ("", "stop", False),
])
def test_number_judge(content, finish, ok):
    assert (quality.judge_number(ex_of(content, finish), "1296") == []) is ok


def test_json_judge_is_exact_format():
    schema = next(c.schema for c in quality_set.load_quality_set().cases if c.kind == "json")
    assert quality.judge_json(ex_of('  {"currency": "USD", "total": 26, "items": 5}\n'), schema) == []
    fenced = quality.judge_json(ex_of('```json\n{"items": 5, "total": 26, "currency": "USD"}\n```'), schema)
    assert fenced and "not exactly JSON" in fenced[0]
    extra = quality.judge_json(ex_of('{"items": 5, "total": 26, "currency": "USD", "note": "ok"}'), schema)
    assert extra and "note" in extra[0]
    assert quality.judge_json(ex_of('{"items": "5", "total": 26, "currency": "USD"}'), schema)


def test_args_mismatch_ignores_order_and_case_but_not_values():
    ref = {"filters": {"categories": ["tech", "finance"]}, "city": "Paris", "limit": 5}
    assert quality.args_mismatch(ref, {"filters": {"categories": ["finance", "tech"]}, "city": " paris",
                                       "limit": 5, "unit": "celsius"}) == []
    got = quality.args_mismatch(ref, {"filters": {"categories": ["tech"]}, "limit": 6})
    assert [g.split(":")[0] for g in got] == ["filters/categories", "city", "limit"]


# ------------------------------------------------------------------------------------------------
# garble detector
# ------------------------------------------------------------------------------------------------

HEALTHY = [
    "1296",
    "copper-4821",
    "OK 3",
    '{"items": 5, "total": 26, "currency": "USD"}',
    '{"filters": {"date_range": {"start": "2026-01-01", "end": "2026-01-31"}, "categories": ["tech", "finance"]}, '
    '"sort": {"field": "date", "order": "desc"}, "limit": 5}',
    ", ".join(str(i) for i in range(1, 121)),                        # spec_decode's "Count from 1 to 120"
    "It is 18 °C and sunny in Paris, with a light breeze from the west and no rain expected today.",
    "Ana pays 12 dollars for 18 pencils (6 groups of 3 at 2 dollars each), so her change from the 20-dollar "
    "note is 8 dollars.",
    "| city | temperature |\n|------|-------------|\n| Paris | 18 |\n| Tokyo (東京) | 22 |",
    "def add(a, b):\n    \"\"\"Return the sum.\"\"\"\n    return a + b\n",
    "東京は日本の首都です。人口は約千四百万人です。",
    "Wait...... let me think. The total is 1,000,000,000 (one billion).",
    corpus()["prose"][0][:1500],
    corpus()["prose"][3],
]

#: one text per rule, each flagged by that rule
GARBLED = {
    "repeat.token": "The answer is the the the the the the the the.",
    "repeat.ngram": "I think that I think that I think that I think that I think that.",
    "repeat.chars": RECORDED_TINY,
    "repeat.distinct": " ".join(["I am sorry, I cannot help with that.", "Is there anything else?",
                                 "I am sorry, I cannot help with that.", "Let me know.",
                                 "I am sorry, I cannot help with that.", "Thanks.",
                                 "I am sorry, I cannot help with that.", "Is there anything else?",
                                 "I am sorry, I cannot help with that.", "Is there anything else?",
                                 "I am sorry, I cannot help with that."]),
    "charset.replacement": "The answer is 12\ufffd9.",
    "charset.control": "The answer\x07 is 1296.",
    "charset.scripts": "The ответ is 数据 and λόγος here.",
    "charset.special_tokens": "1296<|im_end|><|im_start|>assistant",
    "shape.words": "x$# @@q 3#$ %%a ^^z ~q@ ##w $$e &&r",
    "shape.vowels": "grdfvxnhqcn cdttsmpdxcp gvjtdpkjlwxpt rqxwvggtrnlm vbbhhtl trrtctdvtq tlwghggwmj nrwhj",
    "shape.word_length": "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic "
                         "floccinaucinihilipilification hippopotomonstrosesquippedaliophobia "
                         "pseudopseudohypoparathyroidism thyroparathyroidectomized dichlorodifluoromethane",
}


@pytest.mark.parametrize("text", HEALTHY, ids=range(len(HEALTHY)))
def test_healthy_text_is_not_flagged(text):
    assert text.strip()
    assert garble.detect_garble(text) == []


def test_every_rule_has_a_garbled_example_it_flags():
    assert set(GARBLED) == set(garble.GARBLE_RULES)
    for rule, text in GARBLED.items():
        found = {f.rule for f in garble.detect_garble(text)}
        assert rule in found, (rule, found)


def test_recorded_tiny_model_output_is_garble_with_excerpt():
    (f,) = garble.detect_garble(RECORDED_TINY)
    assert f.rule == "repeat.chars" and f.value == 32 and f.excerpt.startswith('")")')
    assert "repeat.chars 32" in f.describe()


def test_archived_answers_read_back_every_part_and_skip_the_clip_marker():
    prose = " ".join(corpus()["prose"][:6])
    assert len(prose) > 2500                       # archive() clips strings over 2000 characters
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    rec = Archive("raw/05_smoke")
    archive(rec, "long", [ex_of(prose), ex_of(None, "tool_calls", [call]),
                           Exchange("POST", "/v1/chat/completions", {}, 400, {"error": {"message": "x"}}, 0.01)])
    answers = garble.archived_answers(rec)
    assert [a.source for a in answers] == ["long#0", "long#1.tool_calls[0]"]
    assert "chars clipped" in answers[0].text
    row = garble.garble_check(rec, judged=True)
    assert row.status is Status.PASS, row.observed
    assert row.data["answers"] == 2
    # its report is one more raw file for the step, named in the row; its data goes to the step's quality
    assert row.evidence == ["raw/05_smoke/quality.garble.json"] and "quality.garble.json" in rec.files
    assert rec.data["quality"]["garble"]["answers"] == 2


# ------------------------------------------------------------------------------------------------
# the gate against the reference server
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe", ["exl3-v41", "dspark-v4"])
def test_correct_server_passes_the_gate(tmp_path, recipe):
    step, rows = gate(tmp_path, recipe, answer_mode="correct")
    cases = case_rows(rows)
    bad = {n: c.observed for n, c in cases.items() if c.status is not Status.PASS}
    assert not bad, bad
    assert rows["quality.score"].status is Status.PASS and rows["quality.score"].data["score"] == 1.0
    assert rows["quality.garble"].status is Status.PASS and rows["quality.garble"].data["answers"] == 14
    needle = cases["quality.needle.50"]
    assert needle.data["prompt_tokens"] == 16384 and needle.data["code"] in needle.observed
    for c in cases.values():
        assert c.evidence and (step.run.path / c.evidence[0]).is_file()
    sent = json.loads((step.run.path / cases["quality.arith.mul"].evidence[0]).read_text())
    body = sent["exchanges"][0]["request"]["body"]
    assert body["temperature"] == 0 and body["chat_template_kwargs"] == quality.recipe_spec(step.profile).thinking_off


def test_plausible_garbage_fails_naming_every_case(tmp_path):
    _, rows = gate(tmp_path, "exl3-v41", answer_mode="garbage")
    cases = case_rows(rows)
    assert all(c.status is Status.FAIL for c in cases.values()), {n: c.status for n, c in cases.items()}
    score = rows["quality.score"]
    assert score.failed and score.data["score"] == 0.0
    for name in cases:
        assert name in score.observed
    # fluent near-misses: wrong values, not broken text -- the detector has nothing to say, the score does
    assert "answer 1296" not in cases["quality.arith.mul"].observed
    assert "city" in cases["quality.tool.single"].observed
    assert rows["quality.garble"].status is Status.PASS


def test_garbled_server_fails_the_detector_naming_answers_and_rules(tmp_path):
    _, rows = gate(tmp_path, "dspark-v4", answer_mode="garble")
    g = rows["quality.garble"]
    assert g.failed and g.data["flagged"] == g.data["answers"] == 14
    families = {r.split(".")[0] for r in g.data["by_rule"]}
    assert families == {"repeat", "charset", "shape"}, g.data["by_rule"]
    assert "quality.arith.mul#0" in g.observed and "\")\")" in g.observed
    assert rows["quality.score"].failed


def test_one_tolerated_miss_warns_and_a_required_miss_fails(tmp_path):
    doc = json.loads(SHIPPED.read_text())
    doc["cases"][0]["reference"]["content"] = "1297"             # the server now gets arith.mul wrong
    key = tmp_path / "key.json"
    key.write_text(json.dumps(doc))
    _, rows = gate(tmp_path / "a", "exl3-v41", answer_mode="correct", answer_key=str(key))
    assert rows["quality.arith.mul"].status is Status.WARN and "tolerated" in rows["quality.arith.mul"].observed
    assert rows["quality.score"].status is Status.PASS and "quality.arith.mul" in rows["quality.score"].observed
    doc["cases"][8]["reference"]["content"] = '{"items": 5, "total": 26}'     # and json.order (required)
    key.write_text(json.dumps(doc))
    _, rows = gate(tmp_path / "b", "exl3-v41", answer_mode="correct", answer_key=str(key))
    # 12/14 clears exl3-v41's 0.85, but json.order is required: the gate fails, and then no miss is tolerated
    assert rows["quality.json.order"].failed and rows["quality.arith.mul"].failed
    assert rows["quality.score"].failed and "required cases missed: quality.json.order" in rows["quality.score"].observed


def test_lab_is_never_pass_even_when_answers_are_right(tmp_path):
    step, rows = gate(tmp_path, "lab", answer_mode="correct")
    quality_rows = [c for c in rows.values() if c.name.startswith("quality.")]
    assert len(quality_rows) == 16
    assert [c.name for c in quality_rows if c.status is not Status.NA] == []
    assert "the rule would say: right" in rows["quality.arith.mul"].observed
    assert rows["quality.needle.10"].data["prompt_tokens"] == 1024
    assert rows["quality.arith.mul"].data["max_tokens"] == 16          # the lab's cap
    assert step.data["quality"]["judged"] is False


def test_lab_garble_row_is_na_and_shows_the_detectors_findings(tmp_path):
    _, rows = gate(tmp_path, "lab", answer_mode="garble")
    g = rows["quality.garble"]
    assert g.status is Status.NA and "garble by construction" in g.observed
    assert g.data["flagged"] == 14 and "14 of 14 answers flagged" in g.observed


def test_lab_failed_requests_are_fail_not_na(tmp_path):
    _, rows = gate(tmp_path, "lab", answer_mode="correct", fail_every=1)
    cases = case_rows(rows)
    assert all(c.failed for c in cases.values())
    assert "HTTP 500" in cases["quality.arith.mul"].observed
    assert rows["quality.score"].status is Status.NA and "requests failed" in rows["quality.score"].observed


def test_garble_row_covers_the_smoke_answers_too(tmp_path):
    step = make_step(tmp_path, "dspark-v4")
    cfg = RefConfig(model=step.profile.served_model_name, ttft_s=0.0, interval_s=0.0, answer_mode="garble",
                    max_model_len=step.profile.max_model_len)
    with serve_in_thread(cfg) as srv:
        cl = client_for(step, srv)
        rec = Archive("raw/05_smoke")                              # one step's archive, as in smoke.run
        smoke_rows = {c.name: c for c in chat_checks(cl, step.profile, rec)}
        assert smoke_rows["chat.answer"].failed                    # 17*19 is not 323 in garble
        rows = {c.name: c for c in quality.run_gate(cl, step.profile, rec)}
    flagged = rows["quality.garble"].data["flagged_sources"]
    assert "chat.probe#0" in flagged and "chat.stream#0" in flagged


def test_answers_are_judged_on_recipe_weights_only():
    judged = {name: quality.judged(load_profile(ROOT / "env" / f"{name}.env"))
              for name in ("lab", "exl3-v41", "dspark-v4")}
    assert judged == {"lab": False, "exl3-v41": True, "dspark-v4": True}
    rehearsal = load_profile(ROOT / "env" / "exl3-v41.env", overrides={"REHEARSAL": "1", "LAB": "1"})
    assert not quality.judged(rehearsal)              # a rehearsal serves the lab's tiny model


def test_dry_run_and_unreachable_server(tmp_path):
    step = make_step(tmp_path / "dry", dry_run=True)
    (row,) = quality.run_gate(None, step.profile, Archive("raw/05_smoke"), dry_run=True)
    assert row.status is Status.NA and row.name == "quality"
    step = make_step(tmp_path / "down")
    (row,) = quality.run_gate(ApiClient(ServerInfo("http://127.0.0.1:9", "m", 4096, "parameters"), timeout=2),
                              step.profile, Archive("raw/05_smoke"))
    assert row.name == "quality.server.reachable" and row.failed


# ------------------------------------------------------------------------------------------------
# the reference server's answer modes
# ------------------------------------------------------------------------------------------------

def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _chat(prompt: str, **extra) -> dict:
    return {"model": "ref-model", "messages": [{"role": "user", "content": prompt}], "max_tokens": 64, **extra}


def test_refserver_modes_are_deterministic_and_refuse_what_they_do_not_know():
    assert ANSWER_MODES == ("filler", "correct", "garbage", "garble")
    q = "What is 48 * 27? Reply with the integer only."
    with serve_in_thread(RefConfig(ttft_s=0.0, interval_s=0.0, answer_mode="garbage")) as srv:
        a = _post(srv.base_url, _chat(q))
        b = _post(srv.base_url, _chat(q))
        assert a[0] == 200 and a[1]["choices"] == b[1]["choices"]
        assert a[1]["choices"][0]["message"]["content"] not in ("1296", "tok ")
        status, body = _post(srv.base_url, _chat("What is the meaning of life?"))
        assert status == 400 and "no reference answer" in body["error"]["message"]
        status, body = _post(srv.base_url, _chat("What is the weather in Paris right now? Use the get_weather tool."))
        assert status == 400 and "does not offer" in body["error"]["message"]
        status, body = _post(srv.base_url, _chat("What is the weather in Paris right now? Use the get_weather tool.",
                                                 tools=tool_defs(), stream=True))
        assert status == 400 and "streamed tool calls" in body["error"]["message"]


def test_refserver_streams_the_same_answer_it_returns():
    q = "What is 1000 - 387 + 56? Reply with the integer only."
    with serve_in_thread(RefConfig(ttft_s=0.0, interval_s=0.0, answer_mode="correct", tokens_per_chunk=1)) as srv:
        cl = ApiClient(ServerInfo(srv.base_url, "ref-model", 0, "parameters"), timeout=10)
        plain = cl.chat({"messages": [{"role": "user", "content": q}], "max_tokens": 8})
        streamed = cl.stream_chat({"messages": [{"role": "user", "content": q}], "max_tokens": 8})
    assert plain.json["choices"][0]["message"]["content"] == "669" == streamed.json["choices"][0]["message"]["content"]
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert streamed.json["usage"][k] == plain.json["usage"][k], k
    assert plain.json["usage"]["completion_tokens"] == 1
    assert plain.json["choices"][0]["finish_reason"] == "stop" == streamed.json["choices"][0]["finish_reason"]


def test_refserver_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="answer_mode='wise'"):
        RefConfig(answer_mode="wise")
    with pytest.raises(ValueError, match="answer_key=.*nope.json"):
        RefConfig(answer_mode="correct", answer_key=str(tmp_path / "nope.json"))
    assert RefConfig(answer_mode="garble", answer_key=str(tmp_path / "nope.json"))   # garble needs no key
