"""`python -m runbook render` shows every command each step runs, in the order it runs (issue #34 item 6, #35 items 3
and 8): the recipe checkout, the image pull / `docker save --platform` / ship / load, the Engram pack, check and
probe, every sudo probe, the plan after the probes that precede its start commands; two renders byte-identical with
no path or temporary name of this machine; `--step N`, `--diff OTHER`; the SSH options in force; a refused secrets
file exits 2. Golden files of the three recipe profiles (UPDATE_GOLDEN=1 rewrites them, on request only)."""
from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path

import pytest

from runbook import cli, review
from runbook.profile import REPO_ROOT, load_profile
from runbook.weights_tools.nfs import sudo_argvs
from support.golden import check_golden

RECIPES = ["exl3-v41", "dspark-v4", "tp3-dspark"]
GOLDEN = Path(__file__).parent / "golden" / "render"
HOME = "/home/spark"


@pytest.fixture(autouse=True)
def no_secrets(monkeypatch, tmp_path):
    """No secret of this machine's environment or secrets file enters a render here."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "absent-secrets.env"))


def render(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["render", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def section(text: str, name: str) -> str:
    part = text.split(f"\n## {name}\n", 1)[1]
    return re.split(r"\n## \d\d_", part, maxsplit=1)[0]          # the plan's "## rank N" lines stay in 04


def entries(text: str) -> list[str]:
    """The command lines of a section (a command may span lines: its first line starts with [node] [kind])."""
    return [e for e in re.split(r"\n(?=\[\w+\] \[(?:read|run)\] |# \[\w+\] )", text) if re.match(r"\[\w+\] \[", e)]


@pytest.mark.parametrize("name", RECIPES)
def test_render_shows_the_checkout_the_image_ship_and_the_engram_pack(name, capsys):
    code, text, _ = render(capsys, "--profile", f"env/{name}.env", "--home", HOME)
    assert code == 0
    p = load_profile(REPO_ROOT / "env" / f"{name}.env")
    launch = entries(section(text, "04_launch"))
    workers = [n for n in p.nodes if not n.is_head]
    assert workers
    checkout = f"{HOME}/{p.recipe_dir.removeprefix('~/')}"
    # the checkout: the probe, the clone at the pinned commit on the head, the copy to each worker, then the verify
    clone = [i for i, e in enumerate(launch) if e.startswith("[head] [run] ") and
             f"git clone --quiet {p.recipe_repo} {checkout}" in e and
             f"checkout --quiet --detach {p.recipe_commit}" in e]
    assert len(clone) == 1
    for w in workers:
        copy = [i for i, e in enumerate(launch) if e.startswith("[head] [run] rsync -a --delete ")
                and f"{w.fabric_ip}:{checkout}/" in e]
        assert len(copy) == 1 and copy[0] > clone[0], w.name
        probes = [i for i, e in enumerate(launch) if e.startswith(f"[{w.name}] [read] d={checkout};")]
        assert len(probes) == 2 and probes[0] < clone[0] < copy[0] < probes[1], w.name     # probe, act, verify
    # the image: pulled on the head, saved for the worker's platform, copied, loaded on every worker
    assert any(e.startswith("[head] [run] docker pull ") for e in launch)
    for w in workers:
        tar = f"{HOME}/{p.cache_dir.removeprefix('~/')}/image-ship-{w.name}/"
        load = [i for i, e in enumerate(launch) if e.startswith(f"[{w.name}] [run] set -o pipefail; dd if={tar}")
                and e.endswith(" | docker load")]
        copy = [i for i, e in enumerate(launch) if e.startswith("[head] [run] rsync -a --partial --inplace ")
                and f"{w.fabric_ip}:{tar}" in e]
        save = [i for i, e in enumerate(launch)
                if e.startswith("[head] [run] set -o pipefail; docker save --platform linux/arm64 ")
                and " | dd of=" in e and i < copy[0]]
        assert load and copy and save and copy[0] < load[0], w.name
    # the Engram pack, its verify and the read probe on every rank's node (recipe A)
    engram = entries(section(text, "03_engram"))
    if p.engram:
        for n in p.nodes:
            tools = f"\"$HOME\"/.cache/spark-runbook/engram-tools/{n.name}"
            pack = [i for i, e in enumerate(engram) if e.startswith(f"[{n.name}] [run] python3 {tools}/pack.py ")]
            check = [i for i, e in enumerate(engram) if e.startswith(f"[{n.name}] [run] python3 {tools}/check.py ")]
            probe = [i for i, e in enumerate(engram) if e.startswith(f"[{n.name}] [read] python3 {tools}/probe.py ")]
            assert len(pack) == len(check) == len(probe) == 1 and pack[0] < check[0] < probe[0], n.name
            assert f"--rank {n.rank}" in engram[pack[0]]
    else:
        assert not any("pack.py" in e for e in engram)


@pytest.mark.parametrize("name", RECIPES)
def test_the_plan_comes_after_the_probes_its_start_commands_follow(name, capsys):
    _, text, _ = render(capsys, "--profile", f"env/{name}.env", "--home", HOME, "--step", "4")
    above, below = section(text, "04_launch").split("\n# the rendered plan of the start commands below:\n", 1)
    # the first command after the plan is the last rank's start (workers first), its docker run in it
    p = load_profile(REPO_ROOT / "env" / f"{name}.env")
    first = entries("\n" + below)[0]
    assert first.startswith(f"[{p.nodes[-1].name}] [run] ") and "docker run -d --label" in first
    assert below.index("## rank 0 on head") < below.index(first)       # the plan's blocks, then the commands
    # the probes that run before the start (image, checkout, identity) print above the plan
    assert "docker image inspect" in above and "SPARK-RUNBOOK-STACK" in above and "git clone" in above
    assert "docker run -d --label" not in above


def test_every_sudo_command_is_probed_not_only_the_first(capsys):
    _, text, _ = render(capsys, "--profile", "env/exl3-v41.env", "--home", HOME)
    weights = entries(section(text, "02_weights"))
    for node in ("head", "worker"):
        ran = [e.split("] ", 2)[2] for e in weights if e.startswith(f"[{node}] [run] ")]
        argvs = sudo_argvs(ran)
        assert len(argvs) >= 3, node                          # the export (head) / the mount (worker) need root
        probes = [e.split("] ", 2)[2] for e in weights if e.startswith(f"[{node}] [read] sudo -n -l ")]
        for argv in argvs:
            assert "sudo -n -l " + shlex.join(argv) in probes, (node, argv)


def test_two_renders_are_byte_identical_and_name_nothing_of_this_machine(capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_renderdeterminism0123456789")     # the token file gets a name too
    first = render(capsys, "--profile", "env/exl3-v41.env", "--home", HOME)[1]
    second = render(capsys, "--profile", "env/exl3-v41.env", "--home", HOME)[1]
    assert first == second
    assert str(REPO_ROOT) not in first and tempfile.gettempdir() + "/" not in first
    assert "put <runbook>/runbook/engram_tools/pack.py -> " in first
    assert re.search(r"put <tmp> -> \S+/files-head-[0-9a-f]{8}\.json", first)
    assert re.search(r"put <tmp> -> \S+/\.tok-files-head-[0-9a-f]{8}", first)
    assert "hf_renderdeterminism" not in first


def test_step_shows_that_steps_section_only(capsys):
    _, full, _ = render(capsys, "--profile", "env/dspark-v4.env", "--home", HOME)
    for arg in ("2", "02", "02_weights", "weights"):
        code, one, _ = render(capsys, "--profile", "env/dspark-v4.env", "--home", HOME, "--step", arg)
        assert code == 0
        assert re.findall(r"^## \d\d_.*$", one, re.M) == ["## 02_weights"]
        head = full.split("\n## 00_", 1)[0]
        assert one == head + "\n## 02_weights\n" + section(full, "02_weights")
    code, _, err = render(capsys, "--profile", "env/dspark-v4.env", "--step", "5")
    assert code == 2 and "no such step" in err and "04_launch" in err


def test_diff_shows_what_a_profile_change_does_to_the_commands(capsys, tmp_path):
    src = (REPO_ROOT / "env" / "dspark-v4.env").read_text()
    assert "\nMASTER_PORT=" in src
    other = tmp_path / "dspark-v4-port.env"
    other.write_text(re.sub(r"(?m)^MASTER_PORT=.*$", "MASTER_PORT=29777", src))
    code, diff, _ = render(capsys, "--profile", "env/dspark-v4.env", "--home", HOME, "--diff", str(other),
                           "--step", "04")
    assert code == 0
    assert diff.startswith("--- env/dspark-v4.env\n+++ ")
    minus = [l for l in diff.splitlines() if l.startswith("-") and not l.startswith("---")]
    plus = [l for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
    assert minus and plus
    assert any("--master-port 29777" in l or "MASTER_PORT=29777" in l for l in plus)
    assert not any("29777" in l for l in minus)
    code, same, _ = render(capsys, "--profile", "env/dspark-v4.env", "--diff", "env/dspark-v4.env")
    assert code == 0 and same == "# env/dspark-v4.env and env/dspark-v4.env run the same commands\n"


def test_the_ssh_options_in_force_head_the_render(capsys):
    _, text, _ = render(capsys, "--profile", "env/dspark-v4.env", "--home", HOME,
                        "-p", "SSH_CONNECT_TIMEOUT=7")
    top = text.split("\n## 00_", 1)[0]
    assert "#   SSH_CONFIG unset: fabric reads ~/.ssh/config" in top
    assert "#   SSH_KEY unset:" in top and "#   KNOWN_HOSTS unset:" in top
    assert "an unknown or changed key is refused (SSH_ACCEPT_NEW_HOST_KEYS=0)" in top
    assert "#   connect timeout 7 s (SSH_CONNECT_TIMEOUT)" in top
    lab = render(capsys, "--profile", "env/lab.env", "--home", HOME, "--step", "0")[1].split("\n## 00_", 1)[0]
    assert "#   SSH_CONFIG=.lab/ssh_config" in lab and "#   SSH_KEY=.lab/id_ed25519" in lab


def test_a_refused_secrets_file_stops_the_render_with_exit_2(capsys, monkeypatch, tmp_path):
    secrets = tmp_path / "secrets.env"
    secrets.write_text("HF_TOKEN=hf_refusedfile0123456789abcdef\n")
    secrets.chmod(0o644)
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(secrets))
    code, out, err = render(capsys, "--profile", "env/dspark-v4.env", "--home", HOME)
    assert code == 2 and out == ""
    assert "mode 0644" in err and f"chmod 600 {secrets}" in err and "hf_refusedfile" not in err


@pytest.mark.parametrize("name", RECIPES)
def test_golden(name, capsys):
    """The whole render of each recipe profile, kept for review: a change to any command shows in the diff."""
    code, text, _ = render(capsys, "--profile", f"env/{name}.env", "--home", HOME)
    assert code == 0 and len(re.findall(r"^## \d\d_", text, re.M)) == len(review.STEPS)
    check_golden(GOLDEN / f"{name}.txt", text)


def test_a_missing_golden_file_fails(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="missing"):
        check_golden(tmp_path / "absent.txt", "text", environ={})
    assert not (tmp_path / "absent.txt").exists()
    check_golden(tmp_path / "absent.txt", "text", environ={"UPDATE_GOLDEN": "1"})
    assert (tmp_path / "absent.txt").read_text() == "text"
    with pytest.raises(pytest.fail.Exception, match="changed"):
        check_golden(tmp_path / "absent.txt", "other", environ={})


def test_the_render_asks_no_server_not_even_the_hub(capsys, monkeypatch):
    """With a token in the environment and a network up, the render still sends nothing anywhere: the Hub's file list
    is not read (its absence is the dry run's way), so the text is the same with or without a network."""
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda *a, **k: asked.append(a) or 1 / 0)
    monkeypatch.setenv("HF_TOKEN", "hf_nohubplease0123456789abcdef")
    code, text, _ = render(capsys, "--profile", "env/exl3-v41.env", "--home", HOME)
    assert code == 0 and asked == []
    assert "node_download.py --repo " in text
