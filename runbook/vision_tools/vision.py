"""Step 06 (vision): images through the OpenAI chat API, as the recipes document them
(seeds-repos.md §A.11 operator test, §B.7 Vision-Exp).

    rows = runbook.vision_tools.vision.run_vision(client, profile, rec, dry_run=dry_run, image_path_on_server="")

Images are generated here (Pillow), so their answer is known on real weights:
- ``two_colour_png()``  64x32, left half blue, right half yellow (seed A's operator test: answered
  correctly with 239 prompt tokens, wrong without the image);
- ``solid_jpeg()``      64x64 red;
- ``two_frame_gif()``   frame 1 green, frame 2 magenta -- a GIF is read as a still (its first frame).

Cases (check names; VISION=1):
- ``vision.png_data_url`` / ``vision.jpeg_data_url`` / ``vision.gif_still``: ``image_url`` with a data
  URL in a user message: HTTP 200, and the image really reached the model: ``usage.prompt_tokens`` is
  larger than the same request without the image (image tokens); on real weights the colour(s) must be
  named;
- ``vision.local_path``: seed B's ``<image>/path</image>`` form (dspark-v4 only; needs a file readable by
  the server: parameter ``image_path_on_server``);
- ``vision.non_user_role.<role>``: an image part in a system / assistant / tool message -> HTTP 400
  (seed B Vision-Exp rule; issue #178 -- such a turn must never stay in a conversation). Judged on
  dspark-v4; elsewhere recorded and N/A;
- ``vision.limit_mm``: LIMIT_MM's image cap: cap + 1 images -> 400; the cap itself accepted when it is
  small (<= 8 images).
With VISION=0: ``vision.disabled`` (an image request is refused with 400 -- the server really is
text-only, not silently dropping images) and the cases above N/A.
"""
from __future__ import annotations

import base64
import io
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable
from ..api.server_info import (
    ApiClient,
    Archive,
    Exchange,
    archive,
    content_of,
    finish_of,
    usage_problems,
)
from ..api.guards import check_refused, guard, precheck, reachable
from ..answers.recipes import LAB_REASON, recipe_spec

__all__ = [
    "AT_LIMIT_MAX",
    "IMAGES",
    "ROLE_RULE_RECIPES",
    "check_image_answer",
    "data_url",
    "image_part",
    "run_vision",
    "solid_jpeg",
    "two_colour_png",
    "two_frame_gif",
]

#: recipes that document "images only in user messages" (HTTP 400 otherwise)
ROLE_RULE_RECIPES = ("dspark-v4",)
#: recipes that document the ``<image>path</image>`` local-path form
LOCAL_PATH_RECIPES = ("dspark-v4",)
#: send exactly LIMIT_MM images only when the cap is at most this many (cost: image tokens each)
AT_LIMIT_MAX = 8


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def two_colour_png(width: int = 64, height: int = 32) -> bytes:
    from PIL import Image
    img = Image.new("RGB", (width, height), (0, 0, 255))
    img.paste((255, 255, 0), (width // 2, 0, width, height))
    return _png(img)


def solid_jpeg(size: int = 64, colour: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def two_frame_gif(size: int = 64) -> bytes:
    from PIL import Image
    frames = [Image.new("RGB", (size, size), (0, 200, 0)), Image.new("RGB", (size, size), (255, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=500, loop=0)
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


#: name -> (bytes factory, mime, question, words the answer must contain on real weights)
IMAGES: dict[str, tuple[Any, str, str, tuple[str, ...]]] = {
    "png": (two_colour_png, "image/png",
            "Which two colours does this image show? Answer with the two colour names only.", ("blue", "yellow")),
    "jpeg": (solid_jpeg, "image/jpeg", "What colour is this image? Answer with one word.", ("red",)),
    "gif": (two_frame_gif, "image/gif", "What colour is this image? Answer with one word.", ("green",)),
}


def check_image_answer(name: str, ex: Exchange, text_only: Exchange | None, words: tuple[str, ...], *,
                       hardware: bool, evidence: list[str] = (), request: str = "") -> Check:
    """HTTP 200, usage consistent, image tokens counted (prompt_tokens above the text-only request);
    on real weights the answer names every word in ``words``."""
    problems: list[str] = []
    soft: list[str] = []
    usage = ex.json.get("usage") if isinstance(ex.json.get("usage"), dict) else {}
    image_tokens = None
    if not ex.ok:
        problems.append(f"{ex.summary()}: {ex.error_message()[:200]}")
    else:
        problems += usage_problems(usage)
        if text_only is not None and text_only.ok:
            base = (text_only.json.get("usage") or {}).get("prompt_tokens")
            if isinstance(base, int) and isinstance(usage.get("prompt_tokens"), int):
                image_tokens = usage["prompt_tokens"] - base
                if image_tokens <= 0:
                    problems.append(f"prompt_tokens {usage['prompt_tokens']} not above the text-only {base}: "
                                    "the image did not reach the model")
        elif text_only is not None:
            soft.append(f"text-only reference failed ({text_only.summary()}); image tokens not measured")
        answer = content_of(ex.json).lower()
        if hardware:
            missing = [w for w in words if w not in answer]
            if missing:
                problems.append(f"answer {content_of(ex.json)[:80]!r} does not name {missing}")
    status = Status.FAIL if problems else (Status.WARN if soft else Status.PASS)
    observed = "; ".join(problems + soft) or (
        f"{ex.summary()}, prompt_tokens {usage.get('prompt_tokens')} ({image_tokens} image tokens), "
        f"finish={finish_of(ex.json)}, answer {content_of(ex.json)[:40]!r}"
        + ("" if hardware else " (not judged: " + LAB_REASON.split(': ', 1)[1] + ")"))
    return Check(name, node="head", status=status, observed=observed,
                 expected="HTTP 200, image tokens counted" + (f", answer names {list(words)}" if hardware else
                                                             f"; answer ({list(words)}) judged on real weights only"),
                 fix="" if status is Status.PASS else
                 "VISION=1 must start the server without --language-model-only; check LIMIT_MM and the "
                 "encoder budget (MAX_NUM_BATCHED_TOKENS >= 1025)", evidence=list(evidence),
                 data={"request": request, "latency_s": round(ex.latency_s, 4), "image_tokens": image_tokens,
                       "usage": usage, "judged": hardware})


def run_vision(client: ApiClient | None, profile, rec: Archive, *, dry_run: bool = False,
               image_path_on_server: str = "") -> CheckList:
    """Every vision case (see the module docstring). Stops with one FAIL row if the server does not answer.
    Raw exchanges go to ``rec`` for the step to record."""
    prof = profile
    spec = recipe_spec(prof)
    hw = spec.hardware
    early = precheck(client, dry_run, "vision")
    if early is not None:
        return early
    out = CheckList()
    first = reachable(client, rec, name="vision.server.reachable")
    if first.failed:
        return CheckList([first])
    kw = dict(spec.thinking_off)
    mt = 32 if hw else 4
    png = data_url(two_colour_png(), "image/png")

    def ask(content: Any, role_msgs: list[dict[str, Any]] | None = None, max_tokens: int = mt) -> Exchange:
        msgs = list(role_msgs or []) + ([{"role": "user", "content": content}] if content is not None else [])
        return client.chat({"messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                            "chat_template_kwargs": kw}, timeout=300)

    if not prof.vision:
        def disabled() -> Check:
            ex = ask([image_part(png), {"type": "text", "text": IMAGES["png"][2]}])
            return check_refused("vision.disabled", ex, evidence=archive(rec, "vision.disabled", ex),
                                 request="user message with a PNG data URL, VISION=0",
                                 expected_text="text-only server refuses images")
        out.add(guard("vision.disabled", disabled))
        for name in ("vision.png_data_url", "vision.jpeg_data_url", "vision.gif_still", "vision.local_path",
                     "vision.non_user_role", "vision.limit_mm"):
            out.add(not_applicable(name, "VISION=0: the server is text-only (--language-model-only / a text model)",
                                   node="head"))
        return out

    # -- data URLs: PNG, JPEG, GIF (still frame) ---------------------------------------------------------------
    for key, name in (("png", "vision.png_data_url"), ("jpeg", "vision.jpeg_data_url"), ("gif", "vision.gif_still")):
        factory, mime, question, words = IMAGES[key]

        def case(factory=factory, mime=mime, question=question, words=words, name=name) -> Check:
            url = data_url(factory(), mime)
            ex = ask([image_part(url), {"type": "text", "text": question}])
            ref = ask([{"type": "text", "text": question}])
            return check_image_answer(name, ex, ref, words, hardware=hw, evidence=archive(rec, name, [ex, ref]),
                                      request=f"user: [image_url {mime} data URL, text {question!r}], "
                                              f"max_tokens={mt}; reference without the image")
        out.add(guard(name, case))

    # -- the recipe's local-path form --------------------------------------------------------------------------
    if prof.recipe not in LOCAL_PATH_RECIPES:
        out.add(not_applicable("vision.local_path", f"RECIPE={prof.recipe} documents no local-path image form "
                               "(seed B Vision-Exp: <image>path</image>)", node="head"))
    elif not image_path_on_server:
        out.add(not_applicable("vision.local_path", "image_path_on_server not set: put two_colour_png() where "
                               "the server can read it and pass its path", node="head"))
    else:
        def local() -> Check:
            q = IMAGES["png"][2]
            ex = ask(f"<image>{image_path_on_server}</image>\n{q}")
            ref = ask(q)
            return check_image_answer("vision.local_path", ex, ref, IMAGES["png"][3], hardware=hw,
                                      evidence=archive(rec, "vision.local_path", [ex, ref]),
                                      request=f"user: '<image>{image_path_on_server}</image>' + question")
        out.add(guard("vision.local_path", local))

    # -- images on non-user roles: 400 ------------------------------------------------------------------------
    judged = prof.recipe in ROLE_RULE_RECIPES
    img_parts = [image_part(png), {"type": "text", "text": "An image."}]
    role_msgs = {
        "system": [{"role": "system", "content": img_parts}],
        "assistant": [{"role": "user", "content": "Describe something."}, {"role": "assistant", "content": img_parts}],
        "tool": [{"role": "user", "content": "Get the picture."},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "call_img", "type": "function",
                  "function": {"name": "get_picture", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "call_img", "content": img_parts}],
    }
    for role, msgs in role_msgs.items():
        name = f"vision.non_user_role.{role}"

        def role_case(role=role, msgs=msgs, name=name) -> Check:
            ex = ask("What is in the picture?" if role != "assistant" else "And now?", msgs)
            ev = archive(rec, name, ex)
            req = f"image part in a {role} message (independent request, never kept in history: issue #178)"
            if not judged:
                c = not_applicable(name, f"RECIPE={prof.recipe}: the images-only-in-user-messages rule is seed B's "
                                         f"(Vision-Exp); observed {ex.summary()} (recorded, not judged)",
                                   node="head", expected="HTTP 400 (dspark-v4)")
                c.evidence, c.data = ev, {"request": req, "status": ex.status}
                return c
            return check_refused(name, ex, evidence=ev, request=req, expected_text="images only in user messages")
        out.add(guard(name, role_case))

    # -- LIMIT_MM ----------------------------------------------------------------------------------------------
    cap = (prof.limit_mm or {}).get("image")
    if not cap:
        out.add(not_applicable("vision.limit_mm", "LIMIT_MM sets no image cap (vLLM's default applies)", node="head"))
    else:
        def limit() -> list[Check]:
            rows = []
            q = {"type": "text", "text": "How many images are there?"}
            over = ask([image_part(png)] * (cap + 1) + [q])
            rows.append(check_refused("vision.limit_mm", over, evidence=archive(rec, "vision.limit_mm", over),
                                      request=f"{cap + 1} images (LIMIT_MM image={cap} + 1)",
                                      expected_text=f"more than {cap} images refused"))
            if cap <= AT_LIMIT_MAX:
                at = ask([image_part(png)] * cap + [q])
                rows.append(check("vision.limit_mm.at_cap", at.ok, node="head",
                                  observed=f"{at.summary()}" + ("" if at.ok else f": {at.error_message()[:160]}"),
                                  expected=f"{cap} images accepted", fix="the image cap is lower than LIMIT_MM says",
                                  evidence=archive(rec, "vision.limit_mm.at_cap", at),
                                  data={"request": f"{cap} images", "latency_s": round(at.latency_s, 3),
                                        "usage": at.json.get("usage")}))
            else:
                rows.append(not_applicable("vision.limit_mm.at_cap", f"LIMIT_MM image={cap} > {AT_LIMIT_MAX}: "
                                           "sending the full cap is skipped (cost); the +1 refusal is checked",
                                           node="head"))
            return rows
        out.add(guard("vision.limit_mm", limit))
    return out
