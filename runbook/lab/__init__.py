"""runbook.lab"""
