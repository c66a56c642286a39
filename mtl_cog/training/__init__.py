"""Training: objectives meet optimiser groups; ``fit(cfg)`` is the one training loop."""

from mtl_cog.training.loop import EpochEnd, Hooks, RunResult, fit

__all__ = ["EpochEnd", "Hooks", "RunResult", "fit"]
