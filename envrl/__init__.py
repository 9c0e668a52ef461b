"""envrl: text environments, agents, evaluation runs and trainers for LLM-agent research."""

__version__ = "0.1.0"

from envrl import envs as _envs  # noqa: E402,F401  (registers the Gymnasium ids)
