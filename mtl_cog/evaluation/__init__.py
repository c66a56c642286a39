"""Evaluation: prediction over a split, per-task metrics, truth metrics, post-hoc calibration."""
