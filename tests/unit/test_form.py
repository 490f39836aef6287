"""The ipywidgets profile form (runbook.form): typed widgets, the CLI's validation shown per key,
saving a new profile that keeps the comments, never overwriting shipped profiles, never a secret."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")

from runbook import form as rform  # noqa: E402
from runbook.errors import ProfileError  # noqa: E402
from runbook.profile import load_profile, parse_env_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "env").glob("*.env"))
TOKEN = "hf_" + "Ab1" * 11


@pytest.fixture
def env_dir(tmp_path):
    d = tmp_path / "env"
    d.mkdir()
    for p in SHIPPED:
        shutil.copy(p, d)
    return d


def make(env_dir, name="lab.env") -> rform.ProfileForm:
    return rform.ProfileForm(env_dir / name, env_dir=env_dir)


def test_shipped_profiles_are_the_three():
    assert sorted(p.name for p in SHIPPED) == sorted(rform.SHIPPED_PROFILES)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_builds_from_each_shipped_profile(path):
    f = rform.ProfileForm(path)
    assert f.valid and f.issues == [] and not f.errors
    entries, _ = parse_env_text(path.read_text())
    assert [r.doc.key for r in f.rows] == [e.key for e in entries]
    kinds = {r.doc.key: r.kind for r in f.rows}
    assert kinds["PORT"] == "int" and kinds["GPU_MEM_UTIL"] == "float" and kinds["ENFORCE_EAGER"] == "bool"
    assert kinds["RECIPE"] == "choice" and kinds["HEAD_IP"] == "text" and kinds["LIMIT_MM"] == "text"
    port = f.row("PORT")
    assert port.widget.value == load_profile(path).port
    # the comment above each key is its tooltip and its visible description
    assert all(r.doc.comment and r.widget.tooltip == r.doc.comment for r in f.rows)
    assert "API port" in port.doc.comment or "port" in port.doc.comment.lower()
    assert port.doc.comment in port.note.value
    # grouped as in the file
    headers = [ln.strip("# -") for ln in path.read_text().splitlines() if ln.startswith("# ----")]
    assert [s.title for s in f.sections] == headers == list(f.accordion.titles)
    assert sum(len(s.keys) for s in f.sections) == len(f.rows)
    assert f.edited_text() == path.read_text()                     # untouched form = same text


@pytest.mark.slow
def test_choosing_another_profile_reloads(env_dir):
    f = make(env_dir)
    f.chooser.value = str(env_dir / "exl3-v41.env")
    assert f.path == env_dir / "exl3-v41.env" and f.row("RECIPE").widget.value == "exl3-v41"
    assert f.valid


def test_invalid_value_shows_error_on_that_key(env_dir):
    f = make(env_dir)
    f.set_value("MAX_NUM_SEQS", 0)
    assert list(f.errors) == ["MAX_NUM_SEQS"]
    msg = f.errors["MAX_NUM_SEQS"][0]
    assert "out of range" in msg and "fix:" in msg
    row = f.row("MAX_NUM_SEQS")
    assert row.message.layout.display != "none" and "out of range" in row.message.value
    assert "problem" in f.status.value and "1 problem(s)" in f.accordion.titles[2]
    f.set_value("HEAD_IP", "10.0.0.300")
    assert "expected an IPv4 address" in f.errors["HEAD_IP"][0]
    f.set_value("MAX_NUM_SEQS", 8)
    f.set_value("HEAD_IP", "169.254.77.1")
    assert f.valid and not f.errors and row.message.layout.display == "none"


def test_messages_are_the_cli_validation(env_dir, tmp_path):
    f = make(env_dir)
    f.set_value("MAX_NUM_SEQS", 0)
    f.set_value("RECIPE", "exl3-v41")
    cli = tmp_path / "env2"
    cli.mkdir()
    (cli / "x.env").write_text(f.edited_text())
    with pytest.raises(ProfileError) as exc:
        load_profile(cli / "x.env")
    expected = sorted((i.key, i.line, i.message) for i in exc.value.issues)
    assert sorted((i.key, i.line, i.message) for i in f.issues) == expected
    assert set(f.errors) == {i.key for i in exc.value.issues}


def test_cross_field_conflict_shows_on_the_right_key(env_dir):
    f = make(env_dir)
    f.set_value("MASTER_PORT", 8000)                             # PORT=8000 too; MASTER_PORT is set later
    assert list(f.errors) == ["MASTER_PORT"] and "PORT and MASTER_PORT are both 8000" in f.errors["MASTER_PORT"][0]
    f.set_value("MASTER_PORT", 29501)
    f.set_value("EXPECT_RDMA", True)                             # needs every node's RoCE HCA
    assert set(f.errors) == {"HEAD_CX7_IB", "WORKER_CX7_IB"}
    assert "EXPECT_RDMA=1 but HEAD_CX7_IB is empty" in f.errors["HEAD_CX7_IB"][0]
    f.set_value("HEAD_CX7_IB", "rocep1s0f1")
    f.set_value("WORKER_CX7_IB", "rocep1s0f1")
    assert f.valid


def test_save_writes_a_loadable_profile_with_comments(env_dir):
    f = make(env_dir)
    original = (env_dir / "lab.env").read_text()
    f.set_value("MAX_MODEL_LEN", 8192)
    f.set_value("GPU_MEM_UTIL", 0.85)
    f.set_value("ENFORCE_EAGER", False)
    f.set_value("EXTRA_ARGS", "--foo 'a b'  # not a comment")
    f.set_value("PROFILE_NAME", "mine")
    dest = f.save("mine")
    assert dest == env_dir / "mine.env" and dest.is_file()
    p = load_profile(dest)
    assert (p.max_model_len, p.gpu_mem_util, p.enforce_eager, p.profile_name) == (8192, 0.85, False, "mine")
    assert p.extra_args == "--foo 'a b'  # not a comment"
    new = dest.read_text()
    old_lines, new_lines = original.splitlines(), new.splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
    assert [b for _, b in changed] == ["PROFILE_NAME=mine", "MAX_MODEL_LEN=8192", "GPU_MEM_UTIL=0.85",
                                       "ENFORCE_EAGER=0", "EXTRA_ARGS=\"--foo 'a b'  # not a comment\""]
    assert [ln for ln in old_lines if ln.startswith("#")] == [ln for ln in new_lines if ln.startswith("#")]
    assert (env_dir / "lab.env").read_text() == original               # the source is untouched
    assert not list(env_dir.glob(".*.tmp"))                             # atomic write left nothing behind


def test_save_button_reports_the_path(env_dir):
    f = make(env_dir)
    f.save_name.value = "button"
    f.save_button.click()
    assert (env_dir / "button.env").is_file()
    assert "saved" in f.save_result.value and "button.env" in f.save_result.value
    assert str(env_dir / "button.env") in [v for _, v in f.chooser.options]


@pytest.mark.parametrize("name", ["lab", "lab.env", "exl3-v41", "dspark-v4.env"])
def test_refuses_to_overwrite_shipped_profiles(env_dir, name):
    f = make(env_dir)
    before = {p.name: p.read_text() for p in env_dir.glob("*.env")}
    for overwrite in (False, True):
        with pytest.raises(rform.FormError, match="shipped profile"):
            f.save(name, overwrite=overwrite)
    assert {p.name: p.read_text() for p in env_dir.glob("*.env")} == before
    f.save_name.value = name
    f.save_button.click()
    assert "not saved" in f.save_result.value and "shipped" in f.save_result.value


def test_existing_file_needs_overwrite_and_bad_names_refused(env_dir):
    f = make(env_dir)
    f.save("mine")
    f.set_value("PORT", 8001)
    with pytest.raises(rform.FormError, match="already exists"):
        f.save("mine")
    f.save("mine", overwrite=True)
    assert load_profile(env_dir / "mine.env").port == 8001
    for bad in ("", "../evil", "a/b", "x y", ".hidden"):
        with pytest.raises(rform.FormError, match="invalid profile name"):
            f.save(bad)


def test_never_writes_a_secret_value(env_dir):
    f = make(env_dir)
    f.set_value("HF_MODEL_REPO", TOKEN)
    assert "Hugging Face token" in f.errors["HF_MODEL_REPO"][0]
    with pytest.raises(ProfileError):
        f.save("leak")
    f.save_name.value = "leak"
    f.save_button.click()
    assert "not saved" in f.save_result.value
    f.set_value("HF_MODEL_REPO", "spark-runbook/tiny")
    f.set_value("EXTRA_ARGS", "--api-key abc")
    assert "secrets never live in a profile" in f.errors["EXTRA_ARGS"][0]
    with pytest.raises(ProfileError):
        f.save("leak")
    assert not (env_dir / "leak.env").exists()


def test_never_writes_a_configured_secret(env_dir, monkeypatch):
    key = "sk-local-0123456789abcdef"
    monkeypatch.setenv("VLLM_API_KEY", key)
    f = make(env_dir)
    f.set_value("SERVED_MODEL_NAME", key)
    assert "contains a secret" in f.errors["SERVED_MODEL_NAME"][0]
    with pytest.raises(ProfileError):
        f.save("leak")
    assert not (env_dir / "leak.env").exists()


def test_secret_key_in_a_file_is_masked_and_must_be_removed(env_dir):
    text = (env_dir / "lab.env").read_text().replace(
        "# Name shown in reports", f"# my token\nHF_TOKEN={TOKEN}\n# Name shown in reports")
    (env_dir / "mine.env").write_text(text)
    f = make(env_dir, "mine.env")
    row = f.row("HF_TOKEN")
    assert row.widget.value == "***"
    states = json.dumps([w.get_state() for r in f.rows for w in (r.widget, r.note, r.message)], default=str)
    assert TOKEN not in states                                       # never sent to the browser
    assert "secrets never live in a profile" in f.errors["HF_TOKEN"][0]
    with pytest.raises(ProfileError):
        f.save("clean")
    f.remove_line("HF_TOKEN")
    assert f.valid
    out = f.save("clean").read_text()
    assert TOKEN not in out and "HF_TOKEN" not in out and "# my token" not in out
    assert out == (env_dir / "lab.env").read_text()


@pytest.mark.parametrize("value", ["", "plain", " lead", "a # b", "'q'", '"dq"', "it's \"x\" $HOME `y` \\n",
                                   "trail ", "#hash", "x#y"])
def test_format_value_round_trips(value):
    entries, issues = parse_env_text(f"K={rform.format_value(value)}\n")
    assert not issues and entries[0].value == value


def test_trailing_comment_kept_when_value_changes(env_dir):
    path = env_dir / "mine.env"
    path.write_text((env_dir / "lab.env").read_text().replace("PORT=8000", "PORT=8000  # my note"))
    f = make(env_dir, "mine.env")
    f.set_value("PORT", 8010)
    assert "PORT=8010  # my note\n" in f.edited_text()


def test_relative_profile_path_resolves_against_the_repo(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)                       # a notebook's kernel runs in notebooks/
    f = rform.ProfileForm("env/lab.env")
    assert f.path == ROOT / "env" / "lab.env"
    with pytest.raises(rform.FormError, match="profile not found"):
        rform.ProfileForm("env/nope.env")


def test_show_outside_a_kernel_prints_a_hint(capsys):
    assert rform.show("env/lab.env") is None
    assert "python -m runbook validate --profile env/lab.env" in capsys.readouterr().out


@pytest.mark.slow
def test_form_cell_is_harmless_headless(tmp_path):
    """papermill runs the form in a real kernel without a browser: widgets render, nothing fails."""
    nbformat = pytest.importorskip("nbformat")
    papermill = pytest.importorskip("papermill")
    from jupyter_client.kernelspec import KernelSpecManager
    if "runbook" not in KernelSpecManager().find_kernel_specs():
        pytest.skip("the runbook kernel is not installed (make install)")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('profile_path = "env/lab.env"\nrun_dir = ""', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("import runbook.form\nif not run_dir:\n    form = runbook.form.show(profile_path)\n"
                                          "print('valid', form.valid, len(form.rows))")]
    nb.metadata["kernelspec"] = {"name": "runbook", "display_name": "Python (runbook)", "language": "python"}
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    papermill.execute_notebook(str(src), str(out), kernel_name="runbook", cwd=str(tmp_path), progress_bar=False,
                               parameters={"profile_path": "env/lab.env"})
    done = nbformat.read(out, as_version=4)
    outputs = done.cells[-1].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    shown = len(load_profile(ROOT / "env" / "lab.env").key_lines)      # one row per line the file sets
    assert any(f"valid True {shown}" in o.get("text", "") for o in outputs)
