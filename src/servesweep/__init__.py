"""servesweep: run and analyse LLM-serving benchmark matrices reproducibly."""

__version__ = "0.1.0"
