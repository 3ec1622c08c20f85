"""Simulated SGLang-compatible engine: `python -m servesweep.sim <launch_server flags>`."""
