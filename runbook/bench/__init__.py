"""runbook.bench"""
