"""replayproxy: record anonymized LLM request shapes in production, replay them against candidates."""

__version__ = "0.1.0"
