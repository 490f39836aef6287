"""runbook.weights"""
