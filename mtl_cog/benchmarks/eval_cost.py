"""Seconds to compute every metric of a CelebA-sized evaluation, and the cost of the extra evaluations.

    OMP_NUM_THREADS=1 python -m mtl_cog.benchmarks.eval_cost [--samples 20000] [--repeats 5]

(``scripts/benchmark.py`` runs it as its ``eval`` section and writes JSON with ``--out``.)

40 binary tasks x ``samples`` predictions, every calibration error at the five default bin
counts (``mtl_cog.constants.DEFAULT_BINS``): what each validation epoch and the final scoring
of a run pay. Side by side, in the same process on the same data:

- ``eval_seconds``: ``compute_metrics`` as before selective prediction (``selective=False``);
- ``eval_all_on_seconds``: ``compute_metrics`` with ``aurc``/``eaurc`` plus the subgroup metrics
  and multicalibration of ``eval.groups: [Male, Young]`` (two binary group tasks, four groups);
- ``eval_all_on_ratio``: their ratio of CPU time (``time.process_time``, which a busy shared
  machine disturbs far less than wall time); target <= 2. ``eval_all_on_wall_ratio``:
  the same in wall time;
- ``eval_cpu_seconds``: where the CPU time goes — ``before``, ``selective`` (``compute_metrics``
  with ``aurc``/``eaurc``) and ``all_on``; the subgroup metrics cost ``all_on − selective``.

The median of ``REPEATS`` repeats each, the three measured in turn so that load on the machine
hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from mtl_cog.benchmarks.common import NUM_TASKS
from mtl_cog.config.arguments import Parser, whole_number
from mtl_cog.constants import DEFAULT_BINS
from mtl_cog.errors import run_cli
from mtl_cog.evaluation.groups import score_with_groups
from mtl_cog.evaluation.metrics import compute_metrics
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS

REPEATS = 5
ALL_ON_TARGET = 2.0
GROUPS = ("attr20", "attr39")  # CelebA's Male and Young are attributes 20 and 39


def measure_eval(samples: int, repeats: int = REPEATS) -> dict:
    rng = np.random.default_rng(0)
    logits = [rng.normal(0, 2, samples).astype(np.float32) for _ in range(NUM_TASKS)]
    labels = [(rng.random(samples) < 1 / (1 + np.exp(-z))).astype(np.int64) for z in logits]
    names = [f"attr{t:02d}" for t in range(NUM_TASKS)]
    bins = list(DEFAULT_BINS)

    def before() -> None:
        compute_metrics(names, logits, labels, bins, DEFAULT_PAIRS, selective=False)

    def selective() -> None:
        compute_metrics(names, logits, labels, bins, DEFAULT_PAIRS, selective=True)

    def all_on() -> None:
        score_with_groups(names, logits, labels, bins, DEFAULT_PAIRS, GROUPS)  # what score(..., groups=) runs

    parts = (before, selective, all_on)
    wall: dict = {work: [] for work in parts}
    cpu: dict = {work: [] for work in parts}
    for _ in range(repeats):
        for work in parts:
            start, start_cpu = time.perf_counter(), time.process_time()
            work()
            wall[work].append(time.perf_counter() - start)
            cpu[work].append(time.process_time() - start_cpu)
    seconds, all_on_seconds = statistics.median(wall[before]), statistics.median(wall[all_on])
    cpu_seconds = {work.__name__: statistics.median(cpu[work]) for work in parts}
    return {"eval_seconds": seconds, "eval_all_on_seconds": all_on_seconds,
            "eval_all_on_ratio": cpu_seconds["all_on"] / cpu_seconds["before"],
            "eval_all_on_wall_ratio": all_on_seconds / seconds, "eval_all_on_target": ALL_ON_TARGET,
            "eval_cpu_seconds": cpu_seconds, "tasks": NUM_TASKS, "samples": samples, "bins": bins,
            "groups": list(GROUPS), "repeats": repeats}


def main(argv: list[str] | None = None) -> dict:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=whole_number(), default=20_000, help="predictions per task (default 20,000)")
    parser.add_argument("--repeats", type=whole_number(), default=REPEATS, help="timings of each (median)")
    args = parser.parse_args(argv)
    result = measure_eval(args.samples, args.repeats)
    cpu = result["eval_cpu_seconds"]
    print(f"{NUM_TASKS} tasks x {args.samples} samples, bins {result['bins']}, groups {result['groups']}, "
          f"median of {args.repeats} (CPU seconds)")
    print(f"  compute_metrics (before)         {cpu['before']:.4f}")
    print(f"  + aurc/eaurc                     {cpu['selective'] - cpu['before']:+.4f}")
    print(f"  + eval.groups + multicalibration {cpu['all_on'] - cpu['selective']:+.4f}")
    print(f"  all on                           {cpu['all_on']:.4f}")
    verdict = "met" if result["eval_all_on_ratio"] <= ALL_ON_TARGET else "MISSED"
    print(f"eval_all_on_ratio {result['eval_all_on_ratio']:.3f} (CPU; target <= {ALL_ON_TARGET}: {verdict}), "
          f"wall {result['eval_all_on_wall_ratio']:.3f}")
    return result


if __name__ == "__main__":
    run_cli(main)
