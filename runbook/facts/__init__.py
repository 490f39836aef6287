"""Read-only facts about the nodes: the commands to run and the pure parsers of their output (text in, typed value out)."""
