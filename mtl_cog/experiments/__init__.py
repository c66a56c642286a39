"""Experiments: many runs at once (learning-rate sweeps, the paper grid)."""
