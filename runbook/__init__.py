"""Spark Runbook: bring up DeepSeek-V4(.1)-Flash on two DGX Sparks with vLLM TP=2, with evidence."""
__version__ = "0.1.0"
