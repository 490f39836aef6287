"""Imported by Python at start-up in every process that has the lab recipe's overlay on PYTHONPATH."""
import spark_lab_patch

spark_lab_patch.install()
