"""The benchmark engine, shared by step 07 (``runbook.bench``) and the report: the timed stream client,
the runner, the metrics, the typed results and their tables, and the reference server it is tested
against."""
