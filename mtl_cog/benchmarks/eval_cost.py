"""Seconds to compute every metric of a CelebA-sized evaluation, and the cost of the extra evaluations.

40 binary tasks x ``samples`` predictions, every calibration error at the five default bin
counts (``mtl_cog.constants.DEFAULT_BINS``): what each validation epoch and the final scoring
of a run pay. Side by side, in the same process on the same data:

- ``eval_seconds``: ``compute_metrics`` as before selective prediction (``selective=False``);
- ``eval_all_on_seconds``: ``compute_metrics`` with ``aurc``/``eaurc`` plus the subgroup metrics
  and multicalibration of ``eval.groups: [Male, Young]`` (two binary group tasks, four groups);
- ``eval_all_on_ratio``: their ratio of CPU time (``time.process_time``, which a busy shared
  machine disturbs far less than wall time); target <= 2 (issue 20). ``eval_all_on_wall_ratio``:
  the same in wall time.

The median of ``REPEATS`` repeats each, the two measured alternately so that load on the machine
hits both alike.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from mtl_cog.benchmarks.common import NUM_TASKS
from mtl_cog.constants import DEFAULT_BINS
from mtl_cog.evaluation.groups import score_with_groups
from mtl_cog.evaluation.metrics import compute_metrics
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS

REPEATS = 5
ALL_ON_TARGET = 2.0
GROUPS = ("attr20", "attr39")  # CelebA's Male and Young are attributes 20 and 39


def measure_eval(samples: int) -> dict:
    rng = np.random.default_rng(0)
    logits = [rng.normal(0, 2, samples).astype(np.float32) for _ in range(NUM_TASKS)]
    labels = [(rng.random(samples) < 1 / (1 + np.exp(-z))).astype(np.int64) for z in logits]
    names = [f"attr{t:02d}" for t in range(NUM_TASKS)]
    bins = list(DEFAULT_BINS)

    def before() -> None:
        compute_metrics(names, logits, labels, bins, DEFAULT_PAIRS, selective=False)

    def all_on() -> None:
        score_with_groups(names, logits, labels, bins, DEFAULT_PAIRS, GROUPS)  # what score(..., groups=) runs

    wall = {before: [], all_on: []}
    cpu = {before: [], all_on: []}
    for _ in range(REPEATS):
        for work in (before, all_on):
            start, start_cpu = time.perf_counter(), time.process_time()
            work()
            wall[work].append(time.perf_counter() - start)
            cpu[work].append(time.process_time() - start_cpu)
    seconds, all_on_seconds = statistics.median(wall[before]), statistics.median(wall[all_on])
    ratio = statistics.median(cpu[all_on]) / statistics.median(cpu[before])
    return {"eval_seconds": seconds, "eval_all_on_seconds": all_on_seconds, "eval_all_on_ratio": ratio,
            "eval_all_on_wall_ratio": all_on_seconds / seconds, "eval_all_on_target": ALL_ON_TARGET,
            "tasks": NUM_TASKS, "samples": samples, "bins": bins, "groups": list(GROUPS)}
