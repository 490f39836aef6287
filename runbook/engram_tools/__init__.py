"""The Engram node-side tools: stdlib-only scripts shipped side by side to each node (the table layout,
the packer, the checker, the read probe, the slim source) and the synthetic source the lab and the tests
generate; and the runbook-side shipping of them (``ship.py``, never shipped itself)."""
