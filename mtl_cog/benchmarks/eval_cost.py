"""Seconds to compute every metric of a CelebA-sized evaluation with ``compute_metrics``.

40 binary tasks x ``samples`` predictions, every calibration error at the five default bin
counts (``mtl_cog.constants.DEFAULT_BINS``): what each validation epoch and the final scoring
of a run pay. The median of three repeats.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from mtl_cog.benchmarks.common import NUM_TASKS
from mtl_cog.constants import DEFAULT_BINS
from mtl_cog.evaluation.metrics import compute_metrics

REPEATS = 3


def measure_eval(samples: int) -> dict:
    rng = np.random.default_rng(0)
    logits = [rng.normal(0, 2, samples).astype(np.float32) for _ in range(NUM_TASKS)]
    labels = [(rng.random(samples) < 1 / (1 + np.exp(-z))).astype(np.int64) for z in logits]
    names = [f"attr{t:02d}" for t in range(NUM_TASKS)]
    bins = list(DEFAULT_BINS)
    durations = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        compute_metrics(names, logits, labels, bins)
        durations.append(time.perf_counter() - start)
    return {"eval_seconds": statistics.median(durations), "tasks": NUM_TASKS, "samples": samples, "bins": bins}
