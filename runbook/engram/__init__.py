"""runbook.engram"""
