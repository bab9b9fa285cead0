"""tuner: an auto-tuner for LLM serving settings.

One trial boots a real engine server, drives a real workload over its OpenAI-compatible streaming
API, and records TTFT and throughput in an Optuna study. The tuner's own process imports no engine:
each engine runs from its own Python environment.
"""

__version__ = "0.1.0"
