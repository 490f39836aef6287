"""The embedded lab: network-namespace nodes, the local Hub, the tiny model, the CPU vLLM build, rehearsal mapping and simulators."""
