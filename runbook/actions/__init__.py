"""runbook.actions"""
