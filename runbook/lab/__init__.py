"""The embedded lab: network-namespace nodes, the local Hub, the tiny model, the CPU vLLM build, rehearsal mapping and simulators.

Steps never import it: what they need of it reaches them as ``step.site``, built by :mod:`runbook.lab.site`.
"""
