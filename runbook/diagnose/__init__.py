"""Diagnose a failed or stuck bring-up: a catalogue of known multi-node failures matched over a
support bundle collected from every node (see docs/diagnose.md).

    from runbook.diagnose import collect_commands, write_bundle, match, read_bundle, Context
"""
from .archive import page_paths, read_bundle, write_bundle
from .bundle import LOCAL, Bundle, Command, Context, NodeInfo, collect_commands
from .catalogue import BY_ID, ENTRIES
from .catalogue.entry import Entry, Hit
from .match import Finding, catalogue_markdown, match

__all__ = ["LOCAL", "BY_ID", "Bundle", "Command", "Context", "ENTRIES", "Entry", "Finding", "Hit", "NodeInfo",
           "catalogue_markdown", "collect_commands", "match", "page_paths", "read_bundle", "write_bundle"]
