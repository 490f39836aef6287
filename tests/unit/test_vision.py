"""Vision step (runbook.vision): generated images, the answer rule on real weights (recorded
responses), role and LIMIT_MM refusals, VISION=0, and the step against the fake server."""
from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from support.fake_vllm import (
    RECORDED_NOT_MULTIMODAL_400,
    FakeVllm,
    by_name,
    completion,
    make_step,
)

from runbook.vision_tools import vision
from runbook.checks import Status
from runbook.api.server_info import Archive, Exchange
from runbook.vision_tools.vision import (
    check_image_answer,
    data_url,
    run_vision,
    solid_jpeg,
    two_colour_png,
    two_frame_gif,
)

DS_MODEL = "deepseek-v4-flash-vision-exp"


def ex_of(body, status=200) -> Exchange:
    return Exchange("POST", "/v1/chat/completions", {}, status, body, 0.2)


# ------------------------------------------------------------------------------------------------
# images
# ------------------------------------------------------------------------------------------------

def test_two_colour_png_halves():
    img = Image.open(io.BytesIO(two_colour_png()))
    assert img.format == "PNG" and img.size == (64, 32)
    assert img.convert("RGB").getpixel((5, 5)) == (0, 0, 255)
    assert img.convert("RGB").getpixel((60, 30)) == (255, 255, 0)


def test_jpeg_is_red_and_gif_first_frame_green():
    j = Image.open(io.BytesIO(solid_jpeg())).convert("RGB").getpixel((32, 32))
    assert j[0] > 240 and j[1] < 15 and j[2] < 15
    g = Image.open(io.BytesIO(two_frame_gif()))
    assert g.format == "GIF" and g.n_frames == 2
    r, gg, b = g.convert("RGB").getpixel((1, 1))
    assert gg > 150 and r < 50 and b < 50
    g.seek(1)
    assert g.convert("RGB").getpixel((1, 1)) == (255, 0, 255)


def test_data_url_round_trip():
    url = data_url(b"\x89PNG", "image/png")
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == b"\x89PNG"


# ------------------------------------------------------------------------------------------------
# the answer rule
# ------------------------------------------------------------------------------------------------

def test_image_answer_on_hardware():
    ref = ex_of(completion("I see no image.", prompt=20))
    good = ex_of(completion("Blue and yellow.", prompt=259))    # seed A: ~239 prompt tokens for this image
    c = check_image_answer("vision.png_data_url", good, ref, ("blue", "yellow"), hardware=True)
    assert c.status is Status.PASS and c.data["image_tokens"] == 239
    wrong = ex_of(completion("Green and red.", prompt=259))
    c = check_image_answer("vision.png_data_url", wrong, ref, ("blue", "yellow"), hardware=True)
    assert c.failed and "does not name ['blue', 'yellow']" in c.observed


def test_image_dropped_silently_fails():
    ref = ex_of(completion("x", prompt=20))
    same = ex_of(completion("Blue and yellow.", prompt=20))
    c = check_image_answer("v", same, ref, ("blue",), hardware=True)
    assert c.failed and "did not reach the model" in c.observed


def test_image_answer_lab_not_judged_but_path_checked():
    ref = ex_of(completion("noise", prompt=20))
    c = check_image_answer("v", ex_of(completion("noise", prompt=36)), ref, ("blue",), hardware=False)
    assert c.status is Status.PASS and "not judged" in c.observed and c.data["judged"] is False
    c = check_image_answer("v", ex_of(RECORDED_NOT_MULTIMODAL_400, 400), ref, ("blue",), hardware=False)
    assert c.failed and "not a multimodal model" in c.observed


# ------------------------------------------------------------------------------------------------
# the step
# ------------------------------------------------------------------------------------------------

def test_lab_vision_off_refuses_images(tmp_path):
    step = make_step(tmp_path, name="06_vision_tools")
    rows = by_name(run_vision(FakeVllm().client(), step.profile, Archive("raw/06_vision_tools")))
    assert rows["vision.disabled"].status is Status.PASS
    assert "not a multimodal model" in rows["vision.disabled"].observed
    others = [c for n, c in rows.items() if n != "vision.disabled"]
    assert others and all(c.status is Status.NA and "VISION=0" in c.observed for c in others)


def test_vision_off_but_server_takes_images_fails(tmp_path):
    step = make_step(tmp_path, name="06_vision_tools")
    fake = FakeVllm(vision=True)
    assert by_name(run_vision(fake.client(), step.profile, Archive("raw/06_vision_tools")))["vision.disabled"].failed


def test_dspark_vision_all_pass(tmp_path):
    step = make_step(tmp_path, "dspark-v4", name="06_vision_tools")
    fake = FakeVllm(model=DS_MODEL, max_model_len=1048576, mode="hw", vision=True, image_limit=8)
    rows = by_name(run_vision(fake.client(), step.profile, Archive("raw/06_vision_tools"), image_path_on_server="/cache/huggingface/probe.png"))
    bad = {n: (c.status.value, c.observed) for n, c in rows.items() if c.status is not Status.PASS}
    assert not bad, bad
    assert {"vision.png_data_url", "vision.jpeg_data_url", "vision.gif_still", "vision.local_path",
            "vision.non_user_role.system", "vision.non_user_role.assistant", "vision.non_user_role.tool",
            "vision.limit_mm", "vision.limit_mm.at_cap"} <= set(rows)
    sent = [p for path, p in fake.requests if path == "/v1/chat/completions"]
    assert any(len([x for x in p["messages"][-1]["content"] if isinstance(x, dict) and x.get("type") == "image_url"]) == 9
               for p in sent if isinstance(p["messages"][-1]["content"], list))
    assert any("<image>/cache/huggingface/probe.png</image>" in str(p["messages"][-1]["content"]) for p in sent)


def test_dspark_image_on_system_role_accepted_fails(tmp_path):
    step = make_step(tmp_path, "dspark-v4", name="06_vision_tools")
    fake = FakeVllm(model=DS_MODEL, max_model_len=1048576, mode="hw", vision=True, image_limit=8, role_rule=False)
    rows = by_name(run_vision(fake.client(), step.profile, Archive("raw/06_vision_tools")))
    for role in ("system", "assistant", "tool"):
        assert rows[f"vision.non_user_role.{role}"].failed, role
    assert rows["vision.local_path"].status is Status.NA and "image_path_on_server" in rows["vision.local_path"].observed


def test_dspark_limit_not_enforced_fails(tmp_path):
    step = make_step(tmp_path, "dspark-v4", name="06_vision_tools")
    fake = FakeVllm(model=DS_MODEL, max_model_len=1048576, mode="hw", vision=True, image_limit=None)
    rows = by_name(run_vision(fake.client(), step.profile, Archive("raw/06_vision_tools")))
    assert rows["vision.limit_mm"].failed and "HTTP 200" in rows["vision.limit_mm"].observed


def test_dspark_wrong_colour_fails(tmp_path):
    step = make_step(tmp_path, "dspark-v4", name="06_vision_tools")
    fake = FakeVllm(model=DS_MODEL, max_model_len=1048576, mode="hw", vision=True, image_limit=8)
    fake.answer_override = "Purple."
    rows = by_name(run_vision(fake.client(), step.profile, Archive("raw/06_vision_tools")))
    for n in ("vision.png_data_url", "vision.jpeg_data_url", "vision.gif_still"):
        assert rows[n].failed, n


def test_exl3_roles_recorded_not_judged_and_big_cap_skipped(tmp_path):
    step = make_step(tmp_path, "exl3-v41", name="06_vision_tools")
    fake = FakeVllm(model="DeepSeek-v4.1-Flash-EXL3", max_model_len=600000, mode="hw", vision=True, image_limit=100,
                    role_rule=False)
    rows = by_name(run_vision(fake.client(), step.profile, Archive("raw/06_vision_tools")))
    role = rows["vision.non_user_role.system"]
    assert role.status is Status.NA and "HTTP 200" in role.observed and role.evidence
    assert rows["vision.limit_mm"].status is Status.PASS
    assert rows["vision.limit_mm.at_cap"].status is Status.NA
    assert rows["vision.local_path"].status is Status.NA and "exl3-v41" in rows["vision.local_path"].observed
    assert rows["vision.png_data_url"].status is Status.PASS


def test_lab_with_a_multimodal_model_checks_the_path(tmp_path):
    step = make_step(tmp_path, name="06_vision_tools", overrides={"VISION": "1", "LIMIT_MM": '{"image": 2}'})
    fake = FakeVllm(vision=True, image_limit=2, role_rule=False)
    rows = by_name(run_vision(fake.client(), step.profile, Archive("raw/06_vision_tools")))
    for n in ("vision.png_data_url", "vision.jpeg_data_url", "vision.gif_still"):
        assert rows[n].status is Status.PASS and "not judged" in rows[n].observed
        assert rows[n].data["image_tokens"] == 16
    assert rows["vision.limit_mm"].status is Status.PASS and rows["vision.limit_mm.at_cap"].status is Status.PASS
    assert rows["vision.non_user_role.tool"].status is Status.NA


def test_unreachable_and_dry_run(tmp_path):
    from runbook.api.server_info import ApiClient, ServerInfo
    step = make_step(tmp_path, name="06_vision_tools")
    rows = run_vision(ApiClient(ServerInfo("http://127.0.0.1:9", "tiny", 4096), timeout=2), step.profile, Archive("raw/06_vision_tools"))
    assert len(rows) == 1 and rows[0].failed and rows[0].name == "vision.server.reachable"
    dry = make_step(tmp_path, name="06_vision_tools", dry_run=True)
    assert [c.status for c in run_vision(None, dry.profile, Archive("raw/06_vision_tools"), dry_run=True)] == [Status.NA]


@pytest.mark.parametrize("recipe", ["lab", "exl3-v41", "dspark-v4"])
def test_constants_cover_recipes(recipe):
    assert (recipe in vision.ROLE_RULE_RECIPES) == (recipe == "dspark-v4")
