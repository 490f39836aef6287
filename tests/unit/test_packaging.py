"""pyproject.toml (pip) and environment.yml (conda) must agree."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_deps = {_name(d): d for d in project["dependencies"] + project["optional-dependencies"]["test"]}
    text = (ROOT / "environment.yml").read_text()
    pip_section = text.split("- pip:", 1)[1]    # the conda part above holds python and pip only
    conda = {}
    for line in pip_section.splitlines():
        m = re.match(r"^\s+- ([A-Za-z0-9_.\-\[\]]+[<>=!~].*)$", line)
        if m:
            conda[_name(m.group(1))] = m.group(1).strip()
    assert set(pip_deps) == set(conda), (set(pip_deps) ^ set(conda))
    for name, spec in pip_deps.items():
        assert spec.replace(" ", "") == conda[name].replace(" ", ""), f"{name}: {spec} vs {conda[name]}"


def test_design_card_packages_present():
    deps = {_name(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    for pkg in ("jupyterlab", "papermill", "ipywidgets", "fabric", "huggingface-hub", "openai", "pandas", "nbmake"):
        assert pkg in deps
