"""Small step notebooks for the console's tests (tests/unit/test_console*.py): built like the shipped ones (a tagged
parameters cell, ``runbook.step.begin``, rows, ``step.finish()``), run for real by papermill in the ``runbook``
kernel, needing no node."""
from __future__ import annotations

from pathlib import Path

import nbformat

#: what the console must not show without -v (papermill's cell markers and framing, the kernel's transport
#: warning, the cells' own output)
CHATTER = ("Executing Cell", "Ending Cell", "without encryption", "chatter line", "Input Notebook")


def notebook(books: Path, name: str, *bodies: str) -> None:
    """A step notebook as the shipped ones are built: a tagged parameters cell, ``runbook.step.begin``, its rows,
    ``step.finish()``."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile_path = ""\nrun_dir = ""\ndry_run = False')
    params.metadata["tags"] = ["parameters"]
    begin = (f"import runbook.step\nfrom runbook.checks import check\n"
             f"step = runbook.step.begin({name!r}, profile_path, run_dir=run_dir, dry_run=dry_run)")
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}"), params, nbformat.v4.new_code_cell(begin)]
    nb.cells += [nbformat.v4.new_code_cell(b) for b in bodies]
    nb.metadata["kernelspec"] = {"name": "runbook", "display_name": "Python (runbook)", "language": "python"}
    books.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(books / f"{name}.ipynb"))


PASSING = [
    ("00_alpha", "for i in range(40):\n    print(f'chatter line {i}')",
     "import os\nos.write(2, b'kernel fd 2 says hello\\n')",       # the kernel's own stderr, not a cell stream
     "step.add(check('alpha ok', True, node='head', observed='fine'))\n"
     "step.add(check('alpha slow', False, node='worker', observed='3 s', expected='< 1 s', fix='give it time',"
     " warn_only=True))\nstep.finish()"),
    ("01_beta", "import sys\nprint('chatter line on stderr', file=sys.stderr)",
     "step.add(check('beta ok', True, node='head', observed='fine'))\nstep.finish()"),
]
