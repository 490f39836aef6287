"""``python -m runbook.bench ...`` = ``python -m runbook bench ...``."""
from .cli import main

raise SystemExit(main())
