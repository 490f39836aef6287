"""What a good answer from the server is, shared by steps 05 and 06: what each recipe sends and expects
(``recipes.py``), the quality gate over a shipped evaluation set (``quality.py``, ``quality_set.py``), the
garble detector (``garble.py``), and the tool definitions with their schema checks and per-case rules
(``toolcalls.py``).
"""
