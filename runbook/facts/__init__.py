"""runbook.facts"""
