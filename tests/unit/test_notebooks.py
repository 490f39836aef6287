"""Every step notebook follows the pattern and is stored without outputs."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_step_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_follows_the_step_pattern(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in code]
    assert "parameters" in code[0]["metadata"].get("tags", []), "first code cell must be tagged parameters"
    params = sources[0]
    for name in ("profile_path", "run_dir", "dry_run"):
        assert f"{name} =" in params, f"parameters cell lacks {name}"
    assert "runbook.step.begin(" in sources[1], "second code cell must validate via runbook.step.begin"
    assert sources[-1].strip().startswith("step.finish("), "last code cell must be the summary step.finish()"
    stem = path.stem
    assert f'begin("{stem}"' in sources[1], f"begin() must name the step {stem}"
    for src in sources:
        assert "\ndef " not in "\n" + src and "\nclass " not in "\n" + src, "no functions/classes in notebooks"
        for secret in ("HF_TOKEN", "VLLM_API_KEY", "hf_"):
            assert secret + " =" not in src, "secrets never pass as notebook parameters"
    assert nb["metadata"]["kernelspec"]["name"] == "runbook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_keeps_the_steps_outcome_and_shows_it(path):
    """Every step's ``run`` returns a ``StepOutcome``: the notebook keeps it as ``outcome`` (one call, one name)
    and shows ``outcome.shown``, whatever the step shows."""
    from runbook.records import step_info
    nb = json.loads(path.read_text())
    sources = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    package = step_info(path.stem).package
    calls = [line for line in sources.splitlines() if f"runbook.{package}.run(" in line]
    assert len(calls) == 1 and calls[0].startswith(f"outcome = runbook.{package}.run(step"), calls
    assert "outcome.shown" in sources
