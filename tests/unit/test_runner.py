from pathlib import Path

import pytest

from runbook.errors import RunbookError
from runbook.runner import discover_steps, select_steps
from support.doubles import NoLock

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["00_preflight", "01_network", "02_weights", "03_engram", "04_launch"]


def test_discover_steps_in_order():
    steps = discover_steps()
    assert steps == sorted(steps) and steps[0] == "00_preflight"


def test_select_by_number_name_and_stem():
    assert select_steps(STEPS, start="01", stop="weights") == ["01_network", "02_weights"]
    assert select_steps(STEPS, only=["04_launch", "network"]) == ["04_launch", "01_network"]
    assert select_steps(STEPS, start="03") == ["03_engram", "04_launch"]
    assert select_steps(STEPS) == STEPS


def test_unknown_step_is_named():
    with pytest.raises(RunbookError) as err:
        select_steps(STEPS, only=["99"])
    assert "'99'" in str(err.value) and "00_preflight" in str(err.value)


def test_bad_profile_is_rejected_before_anything_runs(tmp_path):
    from runbook.errors import ProfileError
    from runbook.runner import run
    bad = tmp_path / "bad.env"
    bad.write_text((ROOT / "env/lab.env").read_text() + "\nMAX_MODL_LEN=4096\n")
    results = tmp_path / "results"
    calls = []
    with pytest.raises(ProfileError) as err:
        run(bad, results_root=results, lab_up=lambda p: calls.append(p))
    assert "MAX_MODL_LEN" in str(err.value) and "MAX_MODEL_LEN" in str(err.value)
    assert not results.exists() and not calls     # no run folder, no lab, no connection


def test_step_timeout_covers_a_first_download_of_the_recipe():
    from runbook.profile import load_profile
    from runbook.runner import DEFAULT_STEP_TIMEOUT, default_step_timeout
    lab = load_profile("env/lab.env")
    assert default_step_timeout(lab) < DEFAULT_STEP_TIMEOUT + 60
    exl3 = load_profile("env/exl3-v41.env")
    # ~197 GiB weights + ~189 GiB Engram source at 50 MB/s is about 2.3 h: more than the old 3600 s
    seconds = (exl3.weights_gib + exl3.engram_gib) * 1024 ** 3 / 50e6
    assert seconds > 3600
    assert default_step_timeout(exl3) >= seconds + DEFAULT_STEP_TIMEOUT - 1


def test_step_timeout_counts_both_downloads_of_download_both():
    """Issue #22 risk: WEIGHT_SYNC=download-both downloads on the head, then on the worker (as recipe B's prepare
    script does); 02's time limit counted one 157 GiB download, so it timed out below ~52 MB/s."""
    from runbook.profile import load_profile
    from runbook.runner import DEFAULT_STEP_TIMEOUT, DOWNLOAD_MB_S, default_step_timeout
    dspark = load_profile("env/dspark-v4.env")
    assert dspark.weight_sync == "download-both" and len(dspark.nodes) == 2
    both = 2 * dspark.weights_gib * 1024 ** 3 / (DOWNLOAD_MB_S * 1e6)
    assert default_step_timeout(dspark) >= both + DEFAULT_STEP_TIMEOUT - 1
    rsync = load_profile("env/dspark-v4.env", {"WEIGHT_SYNC": "rsync"})
    assert default_step_timeout(rsync) < both + DEFAULT_STEP_TIMEOUT - 1       # one download only


def test_a_step_that_raised_gets_a_sidecar_saying_why(tmp_path):
    import json
    from runbook.evidence import RunDir
    from runbook.runner import write_failure_sidecar
    run = RunDir.create("lab", tmp_path)
    write_failure_sidecar(run, "02_weights", "ConnectError: [Errno 111] Connection refused",
                          profile_path="env/lab.env", overrides=None, dry_run=False, seconds=1.5)
    sidecar = json.loads((run.path / "steps" / "02_weights.json").read_text())
    assert sidecar["status"] == "failed"
    rows = sidecar["checks"]
    assert [r["name"] for r in rows] == ["step completed"]      # before the launch: the error alone
    assert rows[0]["status"] == "FAIL" and "Connection refused" in rows[0]["observed"] and rows[0]["fix"]


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_dry_run_goes_past_a_failing_step_and_says_it_connects(tmp_path, monkeypatch, dry_run):
    """Issue #22 item 4: `run --dry-run` stopped at the first failing step (a read-only check that found nothing on
    uncabled nodes), so the README's "review every command first" showed only the first step. A dry run now
    runs every step and says that it connects (and how to review without connecting); a real run still stops."""
    from runbook import runner
    monkeypatch.setattr(runner, "check_kernel", lambda kernel: None)
    ran = []

    def fake_step(name, run_dir, **kw):
        ran.append(name)
        return runner.StepRun(name, "failed" if name == "00_preflight" else "passed", 0.0, "a check failed")

    monkeypatch.setattr(runner, "execute_step", fake_step)
    lines = []
    _, outcomes = runner.run(ROOT / "env/exl3-v41.env", dry_run=dry_run, results_root=tmp_path / "results",
                             echo=lines.append, lab_up=None)
    steps = runner.discover_steps(runner.NOTEBOOKS_DIR)
    assert steps and ran == (steps if dry_run else steps[:1])
    said = "\n".join(lines)
    assert ("connects to the nodes over SSH" in said and "python -m runbook render --profile env/exl3-v41.env" in said) \
        == dry_run


def _notebook(path: Path, body: str) -> None:
    import nbformat
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile_path = ""\nrun_dir = ""\ndry_run = False')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "runbook", "display_name": "Python (runbook)", "language": "python"}
    nbformat.write(nb, str(path))


def test_resume_keeps_the_range_the_run_was_started_with(tmp_path, monkeypatch):
    """A run of --to 01 whose 01 failed resumes 01 alone, not every step that has not passed (here 02). The
    cluster lock is not taken: it would be the real lab head's, held by a lab test running beside this one."""
    import json
    from runbook import runner
    from runbook.runner import run
    monkeypatch.setattr(runner, "ClusterLock", NoLock)
    books = tmp_path / "notebooks"
    books.mkdir()
    flag = tmp_path / "fixed"
    _notebook(books / "00_alpha.ipynb", "print('alpha')")
    _notebook(books / "01_beta.ipynb", f"import pathlib\nassert pathlib.Path({str(flag)!r}).exists(), 'not fixed yet'")
    _notebook(books / "02_gamma.ipynb", "print('gamma')")
    results = tmp_path / "results"
    run_dir, outcomes = run(ROOT / "env/lab.env", stop="01", results_root=results, notebooks_dir=books,
                            echo=lambda _: None)
    assert [(o.name, o.status) for o in outcomes] == [("00_alpha", "passed"), ("01_beta", "failed")]
    flag.write_text("yes")
    said = []
    _, resumed = run(ROOT / "env/lab.env", resume=str(run_dir.path), results_root=results, notebooks_dir=books,
                     echo=said.append)
    assert [(o.name, o.status) for o in resumed] == [("01_beta", "passed")]
    assert any("its own range" in line for line in said), said
    manifest = json.loads((run_dir.path / "manifest.json").read_text())
    assert manifest["selection"] == {"start": "", "stop": "01", "only": []}
    assert "02_gamma" not in manifest["steps"]


def test_a_failed_resume_never_lets_the_next_resume_pass_on_stale_steps(tmp_path, monkeypatch):
    """Issue 37 item 1, the field case in small: 03 fails; resume #1 finds 01's state gone (the server 04 launched
    was killed) and re-runs from 01, which fails; resume #2 must re-run 02 as well (it passed against the state 01
    replaces), not print 'skipping 02' and pass the run on it. The manifest says 02 is stale as soon as resume #1
    announces it."""
    import json
    from runbook import runner
    from runbook.runner import run
    monkeypatch.setattr(runner, "ClusterLock", NoLock)
    books = tmp_path / "notebooks"
    books.mkdir()
    log, broken = tmp_path / "ran.log", tmp_path / "broken"
    broken.mkdir()
    for name in ("00_alpha", "01_server", "02_smoke", "03_bench"):
        _notebook(books / f"{name}.ipynb",
                  "import pathlib\n"
                  f"pathlib.Path({str(log)!r}).open('a').write({name!r} + '\\n')\n"
                  f"assert not pathlib.Path({str(broken / name)!r}).exists(), 'broken'")
    results = tmp_path / "results"
    (broken / "03_bench").touch()
    run_dir, outcomes = run(ROOT / "env/lab.env", results_root=results, notebooks_dir=books, echo=lambda _: None)
    assert [o.status for o in outcomes] == ["passed", "passed", "passed", "failed"]

    # resume #1: 01's state is gone, and 01 fails when it runs again
    monkeypatch.setattr(runner, "first_state_gone",
                        lambda profile, rd, passed, dry_run=False: ("01_server", "the server is gone")
                        if "01_server" in passed else None)
    (broken / "01_server").touch()
    said: list[str] = []
    _, resumed = run(ROOT / "env/lab.env", resume=str(run_dir.path), results_root=results, notebooks_dir=books,
                     echo=said.append)
    assert [(o.name, o.status) for o in resumed] == [("01_server", "failed")]
    steps = json.loads((run_dir.path / "manifest.json").read_text())["steps"]
    assert steps["02_smoke"]["status"] == "stale" and steps["02_smoke"]["stale_since"] == "01_server"

    # resume #2: everything fixed; 02 must run again before 03, and the run passes only then
    (broken / "01_server").unlink()
    (broken / "03_bench").unlink()
    log.write_text("")
    said.clear()
    _, resumed = run(ROOT / "env/lab.env", resume=str(run_dir.path), results_root=results, notebooks_dir=books,
                     echo=said.append)
    assert [(o.name, o.status) for o in resumed] == [("01_server", "passed"), ("02_smoke", "passed"),
                                                     ("03_bench", "passed")]
    assert log.read_text().split() == ["01_server", "02_smoke", "03_bench"]
    assert not any("skipping ['00_alpha', '02_smoke']" in line for line in said), said
    manifest = json.loads((run_dir.path / "manifest.json").read_text())
    assert manifest["status"] == "passed" and all(e["status"] == "passed" for e in manifest["steps"].values())


def test_a_resume_reruns_every_passed_step_after_the_first_one_it_runs(tmp_path, monkeypatch):
    """Without any state check: a manifest whose 02 passed after a failed 01 (left so by an older runbook) resumes
    01 and 02, never 01 alone then 03 on 02's old evidence."""
    from runbook import runner
    from runbook.evidence import RunDir
    from runbook.runner import run
    monkeypatch.setattr(runner, "ClusterLock", NoLock)
    monkeypatch.setattr(runner, "first_state_gone", lambda *a, **kw: None)
    books = tmp_path / "notebooks"
    books.mkdir()
    for name in ("00_alpha", "01_server", "02_smoke"):
        _notebook(books / f"{name}.ipynb", "print('ok')")
    results = tmp_path / "results"
    rd = RunDir.create("lab", results)
    rd.update_manifest(status="failed", selection={"start": "", "stop": "", "only": []})
    rd.record_step("00_alpha", status="passed")
    rd.record_step("01_server", status="failed")
    rd.record_step("02_smoke", status="passed")
    said: list[str] = []
    _, resumed = run(ROOT / "env/lab.env", resume=str(rd.path), results_root=results, notebooks_dir=books,
                     echo=said.append)
    assert [o.name for o in resumed] == ["01_server", "02_smoke"]
    assert any("02_smoke passed after 01_server, which runs again" in line for line in said), said
