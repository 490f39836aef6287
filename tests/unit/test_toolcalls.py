"""Tool-call battery (runbook.toolcalls): validation, every case's pass rule against recorded
responses (pass and fail), and the battery end to end against the fake server."""
from __future__ import annotations

import pytest
from support.fake_vllm import (
    RECORDED_FORCED_NAMED,
    RECORDED_TRUNCATED_REQUIRED,
    VALID_ARGS,
    FakeVllm,
    by_name,
    completion,
    make_step,
    tool_call,
)

from runbook.vision_tools.battery import CASES, run_battery
from runbook.checks import Status
from runbook.api.server_info import Archive, Exchange
from runbook.answers.toolcalls import (
    call_problems,
    rule_forced,
    rule_multi_turn_final,
    rule_nested,
    rule_parallel,
    rule_single,
    rule_thinking,
    rule_truncation,
    tool_defs,
    tool_map,
    validate_call,
    wellformed_problems,
)

SCHEMAS = tool_map(tool_defs())
BOUNDED = tool_map(tool_defs(bounded=True))


def ex_of(body, status=200) -> Exchange:
    return Exchange("POST", "/v1/chat/completions", {}, status, body, 0.1)


def calls_body(*calls, finish="tool_calls", reasoning=None):
    return completion(None, tool_calls=list(calls), finish=finish, reasoning=reasoning)


# ------------------------------------------------------------------------------------------------
# schemas and validation
# ------------------------------------------------------------------------------------------------

def test_four_tools_and_bounded_variant():
    names = [t["function"]["name"] for t in tool_defs()]
    assert names == ["get_weather", "search_web", "send_email", "complex_query"]
    b = tool_defs(bounded=True, strict=True)
    wp = b[0]["function"]["parameters"]["properties"]
    assert wp["city"]["maxLength"] == 24 and "maxLength" not in wp["unit"]       # enums stay enums
    dr = b[3]["function"]["parameters"]["properties"]["filters"]["properties"]["date_range"]["properties"]
    assert "maxLength" not in dr["start"]                                        # patterns stay patterns
    assert all(t["function"]["strict"] is True for t in b)
    assert "strict" not in tool_defs()[0]["function"]


@pytest.mark.parametrize("name", sorted(VALID_ARGS))
def test_valid_arguments_validate(name):
    args, problems = validate_call(tool_call(name, VALID_ARGS[name]), SCHEMAS)
    assert problems == [] and args == VALID_ARGS[name]


@pytest.mark.parametrize("call,needle", [
    (tool_call("get_weather", '{"city": "Par'), "not valid JSON"),
    (tool_call("get_weather", "[1, 2]"), "not an object"),
    (tool_call("get_weather", "{}"), "'city' is a required property"),
    (tool_call("get_weather", {"city": "Paris", "unit": "kelvin"}), "is not one of"),
    (tool_call("get_weather", {"city": "Paris", "country": "FR"}), "Additional properties"),
    (tool_call("teleport", {}), "unknown function"),
    ({"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "P"}}},
     "not a JSON string"),
    (tool_call("complex_query", {**VALID_ARGS["complex_query"], "filters": {
        "date_range": {"start": "Jan 1", "end": "2026-01-31"}, "categories": ["tech"]}}), "filters/date_range/start"),
    (tool_call("complex_query", {**VALID_ARGS["complex_query"], "limit": 500}), "limit"),
])
def test_invalid_arguments_are_named(call, needle):
    _, problems = validate_call(call, SCHEMAS)
    assert problems and needle in " ".join(problems), problems


def test_bounded_schema_limits_strings():
    _, p = validate_call(tool_call("get_weather", {"city": "x" * 30}), BOUNDED)
    assert p and "too long" in p[0]


# ------------------------------------------------------------------------------------------------
# per-case pass rules (real-weights shapes and recorded lab responses)
# ------------------------------------------------------------------------------------------------

def test_single_call_rule():
    good = ex_of(calls_body(tool_call("get_weather", {"city": "Paris"})))
    assert rule_single(good, SCHEMAS) == []
    assert "expected 'get_weather'" in rule_single(ex_of(calls_body(tool_call("search_web", {"query": "Paris"}))),
                                                   SCHEMAS)[0]
    two = ex_of(calls_body(tool_call("get_weather", {"city": "Paris"}), tool_call("get_weather", {"city": "Paris"}, 1)))
    assert "2 calls" in rule_single(two, SCHEMAS)[0]
    assert "no tool call" in rule_single(ex_of(completion("It is sunny.")), SCHEMAS)[0]
    assert "do not name Paris" in rule_single(ex_of(calls_body(tool_call("get_weather", {"city": "Rome"}))), SCHEMAS)[0]
    assert any("finish_reason" in p for p in rule_single(
        ex_of(calls_body(tool_call("get_weather", {"city": "Paris"}), finish="stop")), SCHEMAS))
    assert "HTTP 500" in rule_single(ex_of({"error": {"message": "x"}}, 500), SCHEMAS)[0]


def test_broken_json_reported_as_tool_call_fails_every_rule():
    broken = ex_of(calls_body(tool_call("get_weather", '{"city": "Pa')))
    assert any("not valid JSON" in p for p in rule_single(broken, SCHEMAS))
    assert any("not valid JSON" in p for p in rule_forced(broken, SCHEMAS, function=None))
    assert any("not valid JSON" in p for p in wellformed_problems(broken, SCHEMAS))


def test_nested_rule():
    assert rule_nested(ex_of(calls_body(tool_call("complex_query", VALID_ARGS["complex_query"]))), SCHEMAS) == []
    bad = {**VALID_ARGS["complex_query"], "sort": {"field": "date"}}
    assert any("'order' is a required property" in p for p in rule_nested(
        ex_of(calls_body(tool_call("complex_query", bad))), SCHEMAS))
    assert "no call to complex_query" in rule_nested(ex_of(completion("sure")), SCHEMAS)[0]


def test_multi_turn_final_rule():
    assert rule_multi_turn_final(ex_of(completion("It is 18 °C in Paris.")), SCHEMAS, mention="18") == []
    again = ex_of(calls_body(tool_call("get_weather", {"city": "Paris"})))
    assert "a further tool call" in rule_multi_turn_final(again, SCHEMAS)[0]
    assert "empty final answer" in rule_multi_turn_final(ex_of(completion("")), SCHEMAS)[0]
    assert any("18" in p for p in rule_multi_turn_final(ex_of(completion("It is warm.")), SCHEMAS, mention="18"))


def test_parallel_rule():
    two = ex_of(calls_body(tool_call("get_weather", {"city": "Paris"}), tool_call("get_weather", {"city": "Tokyo"}, 1)))
    assert rule_parallel(two, SCHEMAS) == []
    one = ex_of(calls_body(tool_call("get_weather", {"city": "Paris"})))
    probs = rule_parallel(one, SCHEMAS)
    assert "1 call(s), expected >= 2" in probs[0] and "Tokyo" in probs[1]
    assert rule_parallel(one, SCHEMAS, cities=(), min_calls=1) == []


def test_thinking_rule_reasoning_is_soft():
    with_r = ex_of(calls_body(tool_call("get_weather", {"city": "Paris"}), reasoning="Need the weather."))
    assert rule_thinking(with_r, SCHEMAS) == ([], [])
    no_r = ex_of(calls_body(tool_call("get_weather", {"city": "Paris"})))
    hard, soft = rule_thinking(no_r, SCHEMAS)
    assert hard == [] and "no reasoning" in soft[0]
    # thinking ate the budget: content null, finish length, no call
    starved = ex_of(completion(None, finish="length", reasoning="Let me think " * 50))
    assert "no call to get_weather" in rule_thinking(starved, SCHEMAS)[0][0]


def test_truncation_rule_recorded_lab_response_passes():
    assert rule_truncation(ex_of(RECORDED_TRUNCATED_REQUIRED), BOUNDED) == []


def test_truncation_rule_issue_55_broken_call_fails():
    issue55 = ex_of(calls_body(tool_call("send_email", '{"to": "alice@example.com", "subject": "Quar'), finish="length"))
    probs = rule_truncation(issue55, SCHEMAS)
    assert probs and "broken tool call reported" in probs[0]


def test_truncation_rule_requires_length():
    done = ex_of(calls_body(tool_call("send_email", VALID_ARGS["send_email"])))
    assert "expected length" in rule_truncation(done, SCHEMAS)[0]


def test_forced_rules_recorded_named_call_passes():
    assert rule_forced(ex_of(RECORDED_FORCED_NAMED), BOUNDED, function="get_weather") == []
    assert rule_forced(ex_of(RECORDED_FORCED_NAMED), BOUNDED, function=None) == []
    wrong = ex_of(calls_body(tool_call("search_web", {"query": "x"}), finish="stop"))
    assert "expected only get_weather" in rule_forced(wrong, SCHEMAS, function="get_weather")[0]
    assert "no tool call despite tool_choice" in rule_forced(ex_of(completion("Hello!")), SCHEMAS, function=None)[0]


def test_wellformed_rule():
    assert wellformed_problems(ex_of(completion("noise", finish="length")), SCHEMAS) == []
    lie = ex_of(completion("noise", finish="tool_calls"))
    assert "finish_reason=tool_calls but no tool_calls" in wellformed_problems(lie, SCHEMAS)
    assert wellformed_problems(ex_of(completion("x", usage=False)), SCHEMAS) == ["usage missing"]


def test_call_problems_collects_every_call():
    body = calls_body(tool_call("get_weather", {"city": "Paris"}), tool_call("get_weather", "nope", 1))
    parsed, problems = call_problems(body, SCHEMAS)
    assert [n for n, _ in parsed] == ["get_weather", "get_weather"] and len(problems) == 1


# ------------------------------------------------------------------------------------------------
# the battery end to end (fake server)
# ------------------------------------------------------------------------------------------------

def test_battery_lab_passes_and_labels_relaxed_rows(tmp_path):
    step = make_step(tmp_path, name="06_vision_tools")
    fake = FakeVllm()
    rows = run_battery(fake.client(), step.profile, Archive("raw/06_vision_tools"))
    assert [c.name for c in rows] == list(CASES)
    assert all(c.status is Status.PASS for c in rows), [(c.name, c.observed) for c in rows]
    r = by_name(rows)
    for name in ("tools.single", "tools.multi_turn", "tools.parallel"):
        assert r[name].data["rule"] == "relaxed" and "relaxed" in r[name].expected
    for name in ("tools.nested", "tools.forced_named", "tools.forced_required", "tools.truncation"):
        assert r[name].data["rule"] == "strict"
    # lab requests: strict, bounded tools
    sent = [p for path, p in fake.requests if path == "/v1/chat/completions"]
    fn = sent[0]["tools"][0]["function"]
    assert fn["strict"] is True and fn["parameters"]["properties"]["city"]["maxLength"] == 24
    assert all(len(r[c].evidence) == 1 for c in CASES)


def test_battery_lab_broken_arguments_fail(tmp_path):
    step = make_step(tmp_path, name="06_vision_tools")
    fake = FakeVllm()
    fake.tool_args = lambda name: '{"city": '
    r = by_name(run_battery(fake.client(), step.profile, Archive("raw/06_vision_tools")))
    assert r["tools.forced_named"].failed and "not valid JSON" in r["tools.forced_named"].observed
    assert r["tools.nested"].failed


def test_battery_hardware_passes(tmp_path):
    step = make_step(tmp_path, "dspark-v4", name="06_vision_tools")
    fake = FakeVllm(model="deepseek-v4-flash-vision-exp", max_model_len=1048576, mode="hw")
    rows = run_battery(fake.client(), step.profile, Archive("raw/06_vision_tools"))
    bad = [(c.name, c.status.value, c.observed) for c in rows if c.status is not Status.PASS]
    assert not bad, bad
    sent = [p for path, p in fake.requests if path == "/v1/chat/completions"]
    assert sent and all("strict" not in p["tools"][0]["function"] for p in sent)
    thinking = [p for p in sent if p["chat_template_kwargs"].get("thinking")]
    assert thinking and thinking[0]["chat_template_kwargs"]["reasoning_effort"] == "low"


def test_battery_hardware_issue55_and_missed_call_fail(tmp_path):
    step = make_step(tmp_path, "exl3-v41", name="06_vision_tools")
    fake = FakeVllm(model="DeepSeek-v4.1-Flash-EXL3", max_model_len=600000, mode="hw")
    original = fake.hw_auto

    def auto(p):
        text = p["messages"][-1].get("content") or ""
        if p.get("max_tokens") == 40:   # issue #55: truncated call reported as a tool call
            return completion(None, tool_calls=[tool_call("send_email", '{"to": "alice@exa')], finish="tool_calls")
        if "Paris and in Tokyo" in text:
            return completion("I can only check one city.", finish="stop")
        return original(p, 50, p.get("max_tokens") or 800)

    fake.auto_tools = auto
    r = by_name(run_battery(fake.client(), step.profile, Archive("raw/06_vision_tools")))
    assert r["tools.truncation"].failed and "broken tool call" in r["tools.truncation"].observed
    assert r["tools.parallel"].failed
    assert r["tools.single"].status is Status.PASS


def test_battery_dry_run(tmp_path):
    step = make_step(tmp_path, name="06_vision_tools", dry_run=True)
    rows = run_battery(None, step.profile, Archive("raw/06_vision_tools"), dry_run=True)
    assert len(rows) == 1 and rows[0].status is Status.NA
