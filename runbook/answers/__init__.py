"""Steps 05 and 06 — the launched server answering: smoke (``smoke.run``), then vision and tool calls
(``vision_tools.run``). ``server_info`` finds the server and holds the one synchronous API client
the runbook's steps talk to it with (the benchmark keeps its own timed stream reader).

Check names → code: ``server.*``, ``health``, ``models.*``, ``chat.*``, ``context.*``, ``spec_decode.*``,
``auth.*`` in ``smoke.py``; ``quality.*`` in ``quality.py``; ``vision.*`` in ``vision.py``; ``tools.*`` in
``toolcalls.py``; ``serving watchdog`` in ``launch/watchdog.py``. Shared: ``recipes.py`` (what each recipe
sends and expects), ``guards.py`` (reachability, early stop, refusals, case guard).
"""
