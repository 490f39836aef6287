"""Recipe A's pre-launch image checks: the image's recipe stamp against the pinned checkout, and the GPU self-check
in a throwaway container.

    row = stamp_check(cluster, profile)       # PASS / WARN (stamp differs) / N/A (no stamped recipe)
    row = gpu_selfcheck(cluster, profile)     # PASS / FAIL (stops the start) / N/A (EXPECT_GPU=0, other recipes)

Seed A (``start.sh`` @ 503b482 ``ensure_image``) hashes ``Dockerfile`` and every file under ``overlay/ files/
tests/`` of its checkout (``overlay_recipe_hash``) and compares it with the image label ``dsv41.recipe.stamp``;
on a mismatch it pulls or rebuilds. The runbook does not build images: a moved ``:2.9bpw`` tag or a checkout at
another commit is a WARN row naming both stamps (operators found the published label differing while every
copied file was identical, so a mismatch alone does not mean a wrong image). Then seed A runs
``test_exl3_overlay.py`` and ``test_engram_dequant.py`` with ``EXL3_SELFCHECK_GPU=1`` in the image on the head's
GPU and aborts on a failure (the dequant test caught FP8 rows read as uint8: "every boot up to 2026-09-12 spoke
garbage"); so does the runbook when EXPECT_GPU=1.
"""
from __future__ import annotations

from ..checks import Check, Status, check, not_applicable
from ..remote import Cluster, expand_home, quote

__all__ = [
    "SELFCHECK_TIMEOUT_S",
    "STAMP_LABEL",
    "gpu_selfcheck",
    "selfcheck_command",
    "stamp_check",
    "stamp_command",
]

STAMP_LABEL = "dsv41.recipe.stamp"
SELFCHECK_TIMEOUT_S = 900
SELFCHECK_TESTS = ("/opt/dsv41/test_exl3_overlay.py", "/opt/dsv41/test_engram_dequant.py")


def _applies(profile) -> bool:
    return profile.recipe == "exl3-v41" and not profile.lab and bool(profile.recipe_repo)


def stamp_command(checkout: str) -> str:
    """Seed A's ``overlay_recipe_hash``: sha256 over ``sha256sum`` of Dockerfile + overlay/ files/ tests/ (relative
    paths, C-sorted, no __pycache__/*.pyc/*.so)."""
    return (f"cd {quote(checkout)} && {{ printf '%s\\n' Dockerfile; find overlay files tests -type f "
            "! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.so' 2>/dev/null; } | LC_ALL=C sort | "
            "xargs -d '\\n' -r sha256sum | sha256sum | awk '{print $1}'")


def label_command(image: str) -> str:
    return f"docker image inspect -f '{{{{ index .Config.Labels \"{STAMP_LABEL}\" }}}}' {quote(image)}"


def selfcheck_command(image: str) -> str:
    tests = " && ".join(f"python3 {t}" for t in SELFCHECK_TESTS)
    return (f"timeout {SELFCHECK_TIMEOUT_S} docker run --rm --gpus all -e EXL3_SELFCHECK_GPU=1 --entrypoint bash "
            f"{quote(image)} -c {quote(tests)} 2>&1 | tail -n 30")


def stamp_check(cluster: Cluster, profile) -> Check:
    name = "image recipe stamp matches the pinned checkout"
    if not _applies(profile):
        return not_applicable(name, f"recipe {profile.recipe} stamps no image", node="head")
    head = cluster.head
    home = head.read("printf %s \"$HOME\"").stdout.strip() or "/root"
    checkout = expand_home(profile.recipe_dir, home, key="RECIPE_DIR")
    ours = head.read(stamp_command(checkout), timeout=120).stdout.strip()
    label = head.read(label_command(profile.image)).stdout.strip()
    if label in ("", "<no value>") or not ours:
        return check(name, False, node="head", warn_only=True,
                     observed=f"checkout stamp {ours[:16] or '?'}, image label {STAMP_LABEL}={label or 'absent'}",
                     expected="both present and equal", fix="pull the recipe's image (IMAGE) and place the checkout "
                     "(the recipe checkout rows) before comparing; nothing else is affected")
    return check(name, ours == label, node="head", warn_only=True,
                 observed=f"checkout {profile.recipe_commit[:12]}: {ours[:16]}; {profile.image}: {label[:16]}",
                 expected=f"the image's {STAMP_LABEL} label equal to the pinned checkout's stamp",
                 fix="the image was built from other recipe files than the pinned commit (a moved tag, or files "
                     "that never enter the image): seed A would rebuild here. Build it from the checkout "
                     f"(docker build --build-arg DSV41_RECIPE_STAMP={ours} -t <tag> {checkout}) and set IMAGE, or "
                     "keep it: the GPU self-check row says whether its overlay works",
                 data={"checkout_stamp": ours, "image_stamp": label})


def gpu_selfcheck(cluster: Cluster, profile) -> Check:
    name = "image GPU self-check (EXL3 overlay, Engram dequant)"
    if not _applies(profile):
        return not_applicable(name, f"recipe {profile.recipe} has no GPU self-check", node="head")
    if not profile.expect_gpu:
        return not_applicable(name, "not applicable on this profile (EXPECT_GPU=0)", node="head")
    head = cluster.head
    res = head.run(f"set -o pipefail; {selfcheck_command(profile.image)}", timeout=SELFCHECK_TIMEOUT_S + 60,
                   warn=True)
    if head.dry_run:
        return Check(name, node="head", status=Status.NA, observed="dry run: recorded, not run",
                     expected="both self-tests pass in the image on the head's GPU")
    tail = " | ".join((res.stdout or res.stderr or "").strip().splitlines()[-4:])[:800]
    return check(name, res.ok, node="head", observed=f"exit {res.exit_code}: {tail}",
                 expected="exit 0: the overlay's EXL3 kernels and the Engram dequant match their references on GPU",
                 fix="the image's overlay does not work on this GPU/driver: the server would serve garbage. Use the "
                     "image the pinned recipe was tested with (IMAGE), or rebuild it from the checkout")
