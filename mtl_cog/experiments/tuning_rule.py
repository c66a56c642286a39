"""How a tuning study spends its budget beyond its trial count, and how a bundle records it.

Counted trials alone are no equal budget: under asynchronous successive halving with one worker, the first trial ran
all its epochs unopposed and later ones were pruned against it, so two studies of 8 trials trained 159 and 84 epochs
(the overconfident campaign, docs/results/overconfident.md). A rule fixes two things:

- ``min_trials_per_rung``: successive halving judges a trial at a rung only against at least that many other
  trials holding a value there (``halving.RetryAwareHalving``); set to the study's start-point count, no start point
  is pruned by an earlier one (with one worker each runs its whole length) and every later trial is judged against
  all of them;
- ``epoch_budget``: the epochs the study's counted trials may train together; once spent no trial is asked and a
  running one is stopped (``fair_tuning.pruning_hook``), so every study of a comparison costs at most the same.

Studies tuned before 2026-12-06 hold the legacy rule (Optuna's halving, no epoch budget); they resume under it
(``study_rules.recorded_rules``), and their trials.csv rows, which have no rule columns, read as it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TuningRule:
    min_trials_per_rung: int = 0  # other trials at a rung before one is judged there; 0: Optuna's own rule
    epoch_budget: int | None = None  # None: the trial count alone bounds the study

    @property
    def text(self) -> str:
        cap = "no epoch budget" if self.epoch_budget is None else f"epoch budget {self.epoch_budget}"
        return f"halving judges a trial against >= {self.min_trials_per_rung} others per rung; {cap}"


LEGACY_RULE = TuningRule()
RULE_COLUMNS = ("min_trials_per_rung", "epoch_budget")  # trials.csv's record of a non-legacy rule


def rule_columns(rule: TuningRule) -> dict:
    """trials.csv's rule columns of a study: none for the legacy rule, so that bundles written before the rule
    existed stay byte for byte what they were."""
    if rule == LEGACY_RULE:
        return {}
    return {"min_trials_per_rung": rule.min_trials_per_rung, "epoch_budget": rule.epoch_budget or ""}


def rule_of_row(row: dict) -> TuningRule:
    """The rule a trials.csv row records (no rule columns, or empty ones: the legacy rule)."""
    def number(key: str) -> int | None:
        value = row.get(key)
        if value is None or value == "" or isinstance(value, float) and math.isnan(value):
            return None
        return int(float(value))
    return TuningRule(number("min_trials_per_rung") or 0, number("epoch_budget"))
