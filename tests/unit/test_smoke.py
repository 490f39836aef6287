"""Smoke step (runbook.smoke, runbook.server_info): every pass rule against recorded responses, and
the whole step against a fake vLLM server, including the failures it must catch."""
from __future__ import annotations

import json
import time

import pytest
from support.fake_vllm import (
    RECORDED_PAST_MAX_400,
    RECORDED_PROBE_LAB,
    FakeVllm,
    by_name,
    completion,
    make_step,
    serve_http,
)

from runbook.smoke import cases as smoke
from runbook.checks import Status
from runbook.errors import RunbookError
from runbook.records import LaunchRecord, RecordError, SmokeRecord, VisionToolsRecord
from runbook.api.server_info import (
    ApiClient,
    Archive,
    Exchange,
    ServerInfo,
    archive,
    assemble_stream,
    clip,
    connect,
    find_server,
    usage_problems,
)
from runbook.smoke.cases import (
    exact_prompt,
    check_answer,
    check_chat_response,
    check_refused,
    check_stream,
    context_lengths_for,
    parse_metrics,
    recipe_spec,
    run_smoke,
)


def ex_of(body, status=200, **kw) -> Exchange:
    return Exchange("POST", "/v1/chat/completions", {}, status, body, 0.05, **kw)


# ------------------------------------------------------------------------------------------------
# usage / chat response
# ------------------------------------------------------------------------------------------------

def test_recorded_lab_probe_passes_the_response_rule():
    c = check_chat_response("chat.response", ex_of(RECORDED_PROBE_LAB), max_tokens=32)
    assert c.status is Status.PASS, c.observed
    assert c.data["usage"]["completion_tokens"] == 32


@pytest.mark.parametrize("body,needle", [
    (completion("", finish="stop"), "empty content"),
    (completion("hi", finish="abort"), "finish_reason"),
    (completion("hi", usage=False), "usage missing"),
    ({**completion("hi"), "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 9}}, "total_tokens=9"),
    (completion("hi", completion_tokens=40), "completion_tokens=40 > max_tokens=32"),
    ({"object": "chat.completion", "choices": []}, "no choices"),
])
def test_chat_response_failures(body, needle):
    c = check_chat_response("chat.response", ex_of(body), max_tokens=32)
    assert c.status is Status.FAIL and needle in c.observed


def test_chat_response_http_error_and_transport_error():
    c = check_chat_response("x", ex_of({"error": {"message": "boom"}}, 500))
    assert c.failed and "HTTP 500" in c.observed and "boom" in c.observed
    c = check_chat_response("x", Exchange("POST", "/v1/chat/completions", error="timeout after 5 s"))
    assert c.failed and "timeout" in c.observed


def test_usage_problems():
    assert usage_problems({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}) == []
    assert usage_problems(None) == ["usage missing"]
    assert "prompt_tokens=4 != 3" in usage_problems({"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4},
                                                    prompt_tokens=3)[0]


# ------------------------------------------------------------------------------------------------
# the answer (real weights only)
# ------------------------------------------------------------------------------------------------

def test_answer_on_hardware_pass_and_wrong_answer_fails():
    ok = check_answer("chat.answer", ex_of(completion("323")), "323", hardware=True)
    assert ok.status is Status.PASS
    wrong = check_answer("chat.answer", ex_of(completion("324")), "323", hardware=True)
    assert wrong.status is Status.FAIL and "324" in wrong.observed
    assert check_answer("a", ex_of(completion("3230")), "323", hardware=True).failed
    assert check_answer("a", ex_of(completion("The answer is 323.")), "323", hardware=True).status is Status.PASS
    # a right answer that ran out of tokens is not a clean stop
    assert check_answer("a", ex_of(completion("323", finish="length")), "323", hardware=True).failed


def test_answer_on_the_lab_is_never_pass():
    c = check_answer("chat.answer", ex_of(completion("323")), "323", hardware=False)
    assert c.status is Status.NA and "random-weight" in c.observed


# ------------------------------------------------------------------------------------------------
# streaming
# ------------------------------------------------------------------------------------------------

def _stream_pair(fake: FakeVllm):
    cl = fake.client()
    payload = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8, "temperature": 0}
    return cl.stream_chat(payload), cl.chat(payload)


def test_stream_consistent_passes():
    st, ref = _stream_pair(FakeVllm())
    c = check_stream("chat.stream", st, ref, strict_text=True, max_tokens=8)
    assert c.status is Status.PASS, c.observed
    assert st.json["usage_in_last_chunk"] and st.ttft_s is not None


def test_stream_missing_usage_fails():
    fake = FakeVllm()
    fake.stream_usage = False
    st, ref = _stream_pair(fake)
    c = check_stream("chat.stream", st, ref, strict_text=True)
    assert c.failed and "no usage chunk" in c.observed


def test_stream_usage_not_last_fails():
    fake = FakeVllm()
    fake.stream_usage_last = False
    st, ref = _stream_pair(fake)
    assert "not in the last chunk" in check_stream("s", st, ref, strict_text=True).observed


def test_stream_count_mismatch_fail_on_lab_warn_on_hardware():
    fake = FakeVllm()
    fake.stream_completion_delta = 1
    st, ref = _stream_pair(fake)
    assert check_stream("s", st, ref, strict_text=True).status is Status.FAIL
    assert check_stream("s", st, ref, strict_text=False).status is Status.WARN


def test_stream_without_done_fails():
    fake = FakeVllm()
    fake.stream_done = False
    st, ref = _stream_pair(fake)
    c = check_stream("s", st, ref, strict_text=True)
    assert c.failed and "[DONE]" in c.observed


def test_assemble_stream_joins_tool_call_deltas():
    evs = [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function":
                                                                {"name": "get_weather", "arguments": "{\"ci"}}]}}]},
           {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "ty\": \"P\"}"}}]},
                         "finish_reason": "tool_calls"}]},
           {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}]
    body = assemble_stream(evs)
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": "{\"city\": \"P\"}"}
    assert body["usage_in_last_chunk"] and body["choices"][0]["finish_reason"] == "tool_calls"


# ------------------------------------------------------------------------------------------------
# chat goes through the openai SDK: its headers, the key or none, no retries, vLLM fields in the body
# ------------------------------------------------------------------------------------------------

def test_chat_and_stream_are_sent_by_the_openai_sdk():
    fake = FakeVllm()
    cl = fake.client()
    payload = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
               "chat_template_kwargs": {"enable_thinking": False}}
    assert cl.chat(payload).ok and cl.stream_chat(payload).ok
    assert len(fake.headers) == 2
    for headers in fake.headers:
        assert headers["user-agent"].startswith("OpenAI/Python") and headers["x-stainless-retry-count"] == "0"
        assert "authorization" not in headers                       # no key: no Authorization header at all
    plain, streamed = (p for _, p in fake.requests)
    assert plain["chat_template_kwargs"] == {"enable_thinking": False} and plain["model"] == "tiny"
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}


def test_sdk_sends_the_key_and_leaves_it_out_when_asked():
    fake = FakeVllm(api_key="sk-key-4242")
    cl = fake.client()
    msg = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert cl.chat(msg).ok and fake.headers[-1]["authorization"] == "Bearer sk-key-4242"
    refused = cl.chat(msg, auth=False)
    assert refused.status == 401 and "authorization" not in fake.headers[-1] and not refused.auth


def test_sdk_does_not_retry_a_failed_request():
    fake = FakeVllm()
    fake.chat = lambda p: fake._json(503, {"error": {"message": "overloaded", "code": 503}})
    ex = fake.client().chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert ex.status == 503 and "overloaded" in ex.error_message()
    assert [path for path, _ in fake.requests] == ["/v1/chat/completions"]      # one try, no retry


def test_sdk_timeout_is_an_error_with_the_limit():
    import httpx2

    def slow(request):
        raise httpx2.ReadTimeout("read timed out", request=request)
    cl = ApiClient(ServerInfo("http://fake:8000", "tiny", 4096, "parameters"), timeout=3,
                   sdk_transport=httpx2.MockTransport(slow))
    ex = cl.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert ex.status is None and ex.error == "timeout after 3 s"


# ------------------------------------------------------------------------------------------------
# refusals (400 expected)
# ------------------------------------------------------------------------------------------------

def test_refused_recorded_400_passes():
    c = check_refused("context.past_max", ex_of(RECORDED_PAST_MAX_400, 400))
    assert c.status is Status.PASS and "maximum context length" in c.observed


def test_200_where_400_expected_fails():
    assert check_refused("p", ex_of(completion("ok"))).failed


def test_hang_and_500_fail():
    hang = Exchange("POST", "/v1/chat/completions", error="timeout after 120 s", latency_s=120)
    c = check_refused("p", hang)
    assert c.failed and "hang" in c.observed
    assert check_refused("p", ex_of({"error": {"message": "x"}}, 500)).failed
    slow = ex_of(RECORDED_PAST_MAX_400, 400)
    slow.latency_s = 90
    assert check_refused("p", slow, max_latency_s=60).failed


# ------------------------------------------------------------------------------------------------
# exact-length prompts
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", [40, 97, 512, 1000, 4095])
def test_exact_prompt_hits_exact_lengths(target):
    fake = FakeVllm()
    b = exact_prompt(fake.client(), target, needle="The secret passphrase is river-1234." if target > 60 else "")
    assert b.exact and b.tokens == target, (b.tokens, target)
    assert b.tokenize_calls <= 40
    n, _ = fake.count(b.prompt)
    assert n == target
    if target > 60:
        assert "river-1234" in b.prompt[-1]["content"]


def test_exact_prompt_below_fixed_part_raises():
    with pytest.raises(RunbookError, match="shorter than its fixed part"):
        exact_prompt(FakeVllm().client(), 5)


def test_context_lengths_per_recipe(tmp_path):
    lab = make_step(tmp_path, "lab").profile
    assert context_lengths_for(lab) == [512, 1024, 2048, 4032]
    exl3 = make_step(tmp_path, "exl3-v41").profile
    assert context_lengths_for(exl3) == [8192, 32768, 131072, 262144]
    ds = make_step(tmp_path, "dspark-v4").profile
    assert context_lengths_for(ds)[-1] == 1_000_000
    assert context_lengths_for(ds, max_model_len=200_000) == [8192, 32768, 131072, 199_936]


def test_recipe_specs_probe_and_thinking_switches(tmp_path):
    a = recipe_spec(make_step(tmp_path, "exl3-v41").profile)
    assert a.expected == "323" and "17*19" in a.probe and a.thinking_off == {"enable_thinking": False}
    b = recipe_spec(make_step(tmp_path, "dspark-v4").profile)
    assert b.thinking_off == {"thinking": False} and b.concurrency == 6
    assert not recipe_spec(make_step(tmp_path, "lab").profile).hardware


# ------------------------------------------------------------------------------------------------
# metrics
# ------------------------------------------------------------------------------------------------

def test_parse_metrics_sums_and_positions():
    text = ('# HELP x\nvllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 12.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 4.0\n'
            'garbage line\n')
    m = parse_metrics(text)
    assert m["vllm:spec_decode_num_draft_tokens_total"] == 42.0
    assert m["vllm:spec_decode_num_accepted_tokens_per_pos_total{position=2}"] == 4.0


# ------------------------------------------------------------------------------------------------
# finding the server
# ------------------------------------------------------------------------------------------------

def test_find_server_from_launch_sidecar(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "none.env"))
    # the sidecar names the head's API; the route to it comes from the profile (API_HOST=0.0.0.0: direct)
    step = make_step(tmp_path, overrides={"API_HOST": "0.0.0.0", "HEAD_SSH": "root@10.77.0.11", "SSH_CONFIG": ""})
    step.run.write_sidecar("04_launch", [], {}, "passed", LaunchRecord(
        fingerprint="f" * 64, ranks=(), served_model_name="tiny", max_model_len=4096,
        base_url="http://10.77.0.11:8000"))
    s = find_server(step.profile, step.run.path)
    assert (s.base_url, s.model, s.max_model_len, s.source) == ("http://10.77.0.11:8000", "tiny", 4096,
                                                                "steps/04_launch.json")
    # without a profile (a run folder read on its own) the sidecar's address is used as written
    plain = find_server(run_dir=step.run.path)
    assert plain.base_url.startswith("http://10.77.0.11:8000")


def test_find_server_parameters_win_and_key_is_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-secret-9876")
    step = make_step(tmp_path)
    s = find_server(step.profile, step.run.path, base_url="127.0.0.1:8019", model="m2")
    assert s.base_url == "http://127.0.0.1:8019" and s.model == "m2" and s.max_model_len == 4096
    assert s.api_key == "sk-secret-9876" and "sk-secret" not in repr(s) and "***" in repr(s)


def test_find_server_without_sidecar_or_parameter_raises(tmp_path):
    step = make_step(tmp_path)
    with pytest.raises(RunbookError, match="no server"):
        find_server(step.profile, step.run.path)
    # a 04 that made no start (action stop or status) records no base_url: said, not guessed
    step.run.write_sidecar("04_launch", [], {"fingerprint": "x"}, "passed", LaunchRecord(
        fingerprint="x", ranks=(), served_model_name="tiny", max_model_len=4096))
    with pytest.raises(RunbookError, match="04_launch of this run made no start") as err:
        find_server(step.profile, step.run.path)
    assert "action='start'" in err.value.fix


@pytest.mark.parametrize("key", ["base_url", "url", "api_base", "openai_base_url"])
def test_find_server_refuses_an_old_sidecar_whatever_its_url_key(tmp_path, key):
    """The old reader guessed among four URL keys of 04's ``data``; a sidecar without the typed record now names
    the step to re-run instead (before: the server was found through whichever key was there)."""
    step = make_step(tmp_path)
    step.run.write_sidecar("04_launch", [], {key: "http://10.77.0.11:8000", "served_model_name": "tiny"}, "passed")
    with pytest.raises(RecordError, match="04_launch's sidecar holds no LaunchRecord") as err:
        find_server(step.profile, step.run.path)
    assert "older than typed records" in err.value.what and "re-run 04_launch" in err.value.fix


def test_connect_in_dry_run_sends_nothing(tmp_path):
    step = make_step(tmp_path, dry_run=True)
    assert connect(step.profile, step.run.path, dry_run=True) is None
    rec = Archive("raw/05_smoke")
    rows = run_smoke(None, step.profile, rec, dry_run=True)
    assert [c.status for c in rows] == [Status.NA] and not rec.files and not rec.data


# ------------------------------------------------------------------------------------------------
# archives never hold the key; long strings are clipped
# ------------------------------------------------------------------------------------------------

def test_archive_masks_key_and_clips(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-secret-9876")
    step = make_step(tmp_path)
    fake = FakeVllm(api_key="sk-secret-9876")
    cl = fake.client(api_key="sk-secret-9876")
    ex = cl.chat({"messages": [{"role": "user", "content": "x" * 10_000 + " sk-secret-9876"}], "max_tokens": 4})
    rec = Archive("raw/05_smoke")
    (path,) = archive(rec, "case one", ex)
    assert path == "raw/05_smoke/case_one.json" and list(rec.files) == ["case_one.json"]
    assert step.archive(rec.files) == [path]          # what the step's run() does with them: masked on write
    text = (step.run.path / path).read_text()
    assert "sk-secret-9876" not in text
    doc = json.loads(text)
    assert doc["exchanges"][0]["request"]["headers"] == {"Authorization": "Bearer ***"}
    assert "chars clipped" in doc["exchanges"][0]["request"]["body"]["messages"][0]["content"]
    assert clip(list(range(1000)))[20].startswith("…")


# ------------------------------------------------------------------------------------------------
# the whole step against the fake server
# ------------------------------------------------------------------------------------------------

def test_lab_smoke_all_applicable_checks_pass(tmp_path):
    step = make_step(tmp_path)
    fake = FakeVllm()
    rec = Archive(f"raw/{step.name}")
    rows = by_name(run_smoke(fake.client(), step.profile, rec))
    bad = {n: c.observed for n, c in rows.items() if c.status not in (Status.PASS, Status.NA)}
    assert not bad, bad
    assert rows["chat.answer"].status is Status.NA
    assert rows["spec_decode.acceptance"].status is Status.NA and rows["auth.api_key"].status is Status.NA
    for name in ("health", "version", "models.served_name", "models.max_model_len", "metrics", "chat.response",
                 "chat.stream", "concurrency", "context.near_max", "context.past_max", "context.needle.512",
                 "context.needle.4032"):
        assert rows[name].status is Status.PASS, (name, rows[name].observed)
        assert rows[name].evidence, name
    assert rows["concurrency"].data["n"] == 8        # lab: MAX_NUM_SEQS
    assert set(rec.data["ttft_by_length"]) == {"512", "1024", "2048", "4032"}
    assert rec.data["served_max_model_len"] == 4096 and rec.data["chat"]["usage"]
    # every row's evidence is a raw file the step writes: nothing on disk until it does
    named = {p for c in rows.values() for p in c.evidence}
    assert named and named == {f"raw/05_smoke/{n}" for n in rec.files}
    assert not step.raw_dir.exists()
    step.archive(rec.files)
    assert (step.run.path / rows["chat.response"].evidence[0]).is_file()


def test_unreachable_server_is_one_clear_failure(tmp_path):
    step = make_step(tmp_path)
    cl = ApiClient(ServerInfo("http://127.0.0.1:9", "tiny", 4096, "parameters"), timeout=2)
    rows = run_smoke(cl, step.profile, Archive("raw/05_smoke"))
    assert [c.name for c in rows] == ["server.reachable"] and rows[0].failed


def test_wrong_served_name_and_context_are_caught(tmp_path):
    step = make_step(tmp_path)
    fake = FakeVllm(model="other", max_model_len=2048)
    cl = fake.client()
    cl.model = "tiny"                     # what the profile / 04 says
    cl.server.model, cl.server.max_model_len = "tiny", 4096
    rows = by_name(smoke.endpoint_checks(cl, step.profile, Archive("raw/05_smoke")))
    assert rows["models.served_name"].failed and rows["models.max_model_len"].failed


def test_past_max_accepted_is_a_failure(tmp_path):
    step = make_step(tmp_path)
    fake = FakeVllm()
    fake.enforce_context = False
    rows = by_name(smoke.context_limit_checks(fake.client(), step.profile, Archive("raw/05_smoke")))
    assert rows["context.past_max"].failed and "HTTP 200" in rows["context.past_max"].observed


def test_api_key_rows(tmp_path):
    step = make_step(tmp_path)
    good = FakeVllm(api_key="k-abcdef")
    assert smoke.api_key_check(good.client(), step.profile, Archive("raw/05_smoke")).status is Status.PASS
    lax = FakeVllm(api_key="k-abcdef")
    lax.enforce_key = False
    c = smoke.api_key_check(lax.client(), step.profile, Archive("raw/05_smoke"))
    assert c.failed and "without key: HTTP 200" in c.observed


def hw_step(tmp_path, recipe="exl3-v41"):
    return make_step(tmp_path, recipe)


def test_hardware_smoke_right_answer_passes(tmp_path):
    step = hw_step(tmp_path)
    fake = FakeVllm(model="DeepSeek-v4.1-Flash-EXL3", max_model_len=600000, mode="hw", spec=True)
    rec = Archive("raw/05_smoke")
    rows = by_name(run_smoke(fake.client(), step.profile, rec, long_context=False))
    assert rows["chat.answer"].status is Status.PASS
    assert rows["spec_decode.acceptance"].status is Status.PASS
    assert rec.data["spec_decode"]["acceptance_rate"] == pytest.approx(0.7)
    assert rows["concurrency"].data["n"] == 6
    assert not [c for c in rows.values() if c.failed]


def test_hardware_wrong_answer_fails(tmp_path):
    step = hw_step(tmp_path)
    fake = FakeVllm(model="DeepSeek-v4.1-Flash-EXL3", max_model_len=600000, mode="hw")
    fake.answer_override = "324"
    rows = by_name(smoke.chat_checks(fake.client(), step.profile, Archive("raw/05_smoke")))
    assert rows["chat.answer"].failed and "324" in rows["chat.answer"].observed
    assert rows["chat.response"].status is Status.PASS


def test_hardware_needle_judged(tmp_path):
    step = hw_step(tmp_path, "dspark-v4")
    fake = FakeVllm(model="deepseek-v4-flash-vision-exp", max_model_len=1048576, mode="hw")
    rows = smoke.needle_checks(fake.client(), step.profile, Archive("raw/05_smoke"), lengths=[300, 900])
    assert rows and all(c.status is Status.PASS for c in rows), [c.observed for c in rows]
    fake.answer_override = "no idea"
    rows = smoke.needle_checks(fake.client(), step.profile, Archive("raw/05_smoke"), lengths=[300])
    assert rows[0].failed and "passphrase" in rows[0].observed


def test_spec_decode_without_drafts_fails(tmp_path):
    step = hw_step(tmp_path)
    fake = FakeVllm(model="DeepSeek-v4.1-Flash-EXL3", max_model_len=600000, mode="hw", spec=False)
    c = smoke.spec_decode_check(fake.client(), step.profile, Archive("raw/05_smoke"))
    assert c.failed and "draft tokens +0" in c.observed
    fake2 = FakeVllm(model="DeepSeek-v4.1-Flash-EXL3", max_model_len=600000, mode="hw", spec=True)
    fake2.accept_draft = False
    assert smoke.spec_decode_check(fake2.client(), step.profile, Archive("raw/05_smoke")).failed


def test_guard_turns_exceptions_into_fail_rows():
    rows = smoke.guard("x", lambda: 1 / 0)
    assert rows[0].failed and "ZeroDivisionError" in rows[0].observed


# ------------------------------------------------------------------------------------------------
# the steps' entries record what the cases return: rows, raw files, data
# ------------------------------------------------------------------------------------------------

def test_smoke_and_vision_tools_run_record_rows_raw_files_and_data(tmp_path, monkeypatch):
    import runbook.smoke
    import runbook.vision_tools
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "none.env"))
    step = make_step(tmp_path)
    fake = FakeVllm(model=step.profile.served_model_name, max_model_len=step.profile.max_model_len)
    with serve_http(fake) as url:
        outcome = runbook.smoke.run(step, base_url=url, long_context=False)
        vt = make_step(tmp_path, name="06_vision_tools")
        vt_outcome = runbook.vision_tools.run(vt, base_url=url)
    server = outcome.shown
    assert server is not None and server.base_url == url and step.data["server"]["base_url"] == url
    assert (outcome.step, outcome.status, outcome.record) == ("05_smoke", step.status(), step.record)
    assert vt_outcome.shown.base_url == url and vt_outcome.record == vt.record
    assert step.record == SmokeRecord(base_url=url, server_id="") and vt.record == VisionToolsRecord(base_url=url,
                                                                                                      server_id="")
    names = [c.name for c in step.checks]
    assert names[0] == "server.reachable" and names[-1] == "quality.garble" and "quality.score" in names
    assert {"server_version", "served_max_model_len", "chat", "quality"} <= set(step.data)
    assert step.data["quality"]["garble"]["answers"] > 0          # the smoke answers and the gate's
    evidence = {p for c in step.checks for p in c.evidence}
    assert evidence and all((step.run.path / p).is_file() for p in evidence), evidence
    assert (step.raw_dir / "chat.probe.json").is_file() and (step.raw_dir / "metrics.txt").is_file()
    vt_names = [c.name for c in vt.checks]
    assert vt_names[0].startswith("vision.") and vt_names[-1] == "quality.garble" and "tools.single" in vt_names
    assert all((vt.run.path / p).is_file() for c in vt.checks for p in c.evidence)
    assert vt.data["quality"]["garble"]["answers"] > 0


# ------------------------------------------------------------------------------------------------
# 05/06 share one client session that the step closes (api/session.step_session), over real HTTP
# ------------------------------------------------------------------------------------------------

def _all_closed(conns: set) -> bool:
    """The fake sees a kept-alive connection end once the client closes it (its handler thread reads EOF)."""
    deadline = time.monotonic() + 20
    while conns and time.monotonic() < deadline:
        time.sleep(0.05)
    return not conns


def test_smoke_and_vision_tools_close_their_client_when_they_return(tmp_path, monkeypatch):
    import runbook.smoke
    import runbook.vision_tools
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "none.env"))
    step = make_step(tmp_path)
    fake = FakeVllm(model=step.profile.served_model_name, max_model_len=step.profile.max_model_len)
    conns: set = set()
    with serve_http(fake, open_connections=conns) as url:
        kept = runbook.smoke.run(step, base_url=url, long_context=False)    # what the notebook holds after the cell
        assert fake.requests and _all_closed(conns), f"{len(conns)} connections still open after 05"
        asked = len(fake.requests)
        vt = make_step(tmp_path, name="06_vision_tools")
        kept_vt = runbook.vision_tools.run(vt, base_url=url)
        assert len(fake.requests) > asked and _all_closed(conns), f"{len(conns)} connections still open after 06"
    assert kept.shown is not None and kept_vt.shown is not None


def test_the_session_closes_its_client_and_keeps_the_archive_when_a_case_raises(tmp_path, monkeypatch):
    from runbook.api.session import step_session
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "none.env"))
    step = make_step(tmp_path)
    fake = FakeVllm(model=step.profile.served_model_name, max_model_len=step.profile.max_model_len)
    conns: set = set()
    with serve_http(fake, open_connections=conns) as url:
        with pytest.raises(RuntimeError, match="a case crashed"):
            with step_session(step.profile, step.run.path, f"raw/{step.name}", add=step.add, keep=step.keep,
                              base_url=url) as (client, rec):
                ex = client.get("/health")
                archive(rec, "server.reachable", ex)
                assert ex.status == 200 and conns          # kept alive while the step runs
                raise RuntimeError("a case crashed")
        assert _all_closed(conns), f"{len(conns)} connections still open after the step failed"
    assert (step.raw_dir / "server.reachable.json").is_file()      # what was asked before the crash is kept
