"""Assessing one split: predict -> score -> add-ons (subgroups, certified accuracy), the same for every caller.

``fit`` (through ``mtl_cog.reporting.end_of_run``), ``evaluate --run``, ``evaluate --predictions``
and ``list-front`` all go through ``assess`` (predictions in hand) or ``assess_split`` (predict
first), so a number reported at the end of training and the same number re-computed later come
from one sequence.

Where evaluation add-ons plug in: ``ADD_ONS``. An add-on is a function ``(SplitContext) -> None``
that adds its metrics to ``context.metrics`` in the ``score`` layout: per task into
``metrics["tasks"][task]`` and their mean into ``metrics["mean"]`` (these become columns of
``test_metrics.csv``, the comparison tables and the console), or a top-level key of its own
(kept in the metrics JSON). It reads the predictions, and, where it needs them and they exist,
the network (``context.model``, None when only a prediction file is scored), the split's images
and labels (``context.split``, None without data) and the data set's ``TaskSpec``. An add-on that
lacks what it needs does nothing. Adding one = its own module under ``evaluation/`` + one adapter
function and one entry in ``ADD_ONS`` here; add-ons run in the order listed, after ``score``.

What plugs in where (the whole truth):

- subgroup metrics and multicalibration (``eval.groups``, mtl_cog.evaluation.groups): an add-on
  here, ``subgroup_metrics``; their cells also go to ``group_metrics.csv`` (the callers write it);
- certified accuracy (LiST): an add-on here, ``certified_accuracy``;
- selective prediction (``aurc``, ``eaurc``, mtl_cog.evaluation.selective): metrics of ``score``
  itself, not an add-on, since they reuse ``compute_metrics``' per-task sort of the logits;
- calibration under corruption shift (mtl_cog.evaluation.shift): not an add-on. It scores other
  splits (75 corrupted copies of the test split) into a table of its own (``shift_metrics.csv``),
  so it runs beside the assessment: ``fit`` passes it to ``finish_run`` as its ``shift`` job, and
  ``evaluate --run RUN --shift`` runs it on a finished run; its W&B summary keys are added there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from accelerate import Accelerator
from torch import nn

from mtl_cog.config import Config
from mtl_cog.constants import DEFAULT_BINS
from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.evaluation.groups import add_group_summary, group_metrics
from mtl_cog.evaluation.inference import predict_split
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.robustness import add_certified_accuracy
from mtl_cog.evaluation.scoring import score
from mtl_cog.models.lipschitz import network_lipschitz


@dataclass(frozen=True)
class AssessSettings:
    """What a split is scored with: bin counts, attribute pairs, certified-accuracy radii."""

    bins: list[int] = field(default_factory=lambda: list(DEFAULT_BINS))
    pairs: int = DEFAULT_PAIRS
    certify_eps: list[float] = field(default_factory=list)
    groups: tuple[str, ...] = ()  # eval.groups: subgroup metrics and multicalibration (mtl_cog.evaluation.groups)

    @classmethod
    def of_run(cls, cfg: Config, bins: list[int] | None = None, pairs: int | None = None,
               certify_eps: list[float] | None = None, groups: list[str] | None = None) -> AssessSettings:
        """A run's ``eval`` and ``method.certify_eps`` settings, each replaced where a command line gives one."""
        return cls(list(bins or cfg.eval.bins), cfg.eval.joint_pairs if pairs is None else pairs,
                   list(cfg.method.certify_eps if certify_eps is None else certify_eps),
                   tuple(cfg.eval.groups if groups is None else groups))


@dataclass
class SplitContext:
    """What an add-on sees; it writes only into ``metrics``."""

    predictions: Predictions
    metrics: dict  # score(...) so far
    settings: AssessSettings
    model: nn.Module | None = None  # the unwrapped network that made the predictions, if known
    spec: TaskSpec | None = None
    split: SplitData | None = None  # the images and labels predicted, if at hand


def certified_accuracy(context: SplitContext) -> None:
    """LiST networks (those that report a Lipschitz bound): ``cert_acc@eps`` per task and mean."""
    if context.model is None or context.spec is None or not context.settings.certify_eps:
        return
    lipschitz = network_lipschitz(context.model)
    if lipschitz is not None:
        add_certified_accuracy(context.metrics, context.predictions, lipschitz.numpy(),
                               context.settings.certify_eps, context.spec.std)


def subgroup_metrics(context: SplitContext) -> None:
    """``eval.groups``: every group's cells under ``metrics["groups"]``, each task's worst-group, gap and
    multicalibration values beside its metrics (and their means beside the task means)."""
    if not context.settings.groups:
        return
    p = context.predictions
    report = group_metrics(p.task_names, p.logits, p.labels, list(context.settings.groups))
    add_group_summary(context.metrics, report)
    context.metrics["groups"] = report


# Every evaluation add-on, in the order they run (see the module docstring).
ADD_ONS: tuple[Callable[[SplitContext], None], ...] = (subgroup_metrics, certified_accuracy)


@dataclass
class SplitAssessment:
    predictions: Predictions
    metrics: dict  # score(...) + every add-on's metrics


def assess(predictions: Predictions, settings: AssessSettings, model: nn.Module | None = None,
           spec: TaskSpec | None = None, split: SplitData | None = None) -> SplitAssessment:
    """``score`` then every add-on, on predictions in hand (``model``/``spec``/``split`` where known)."""
    metrics = score(predictions, settings.bins, settings.pairs)
    context = SplitContext(predictions, metrics, settings, model, spec, split)
    for add_on in ADD_ONS:
        add_on(context)
    return SplitAssessment(predictions, context.metrics)


def assess_split(accelerator: Accelerator, network: nn.Module, spec: TaskSpec, split: SplitData, batch_size: int,
                 settings: AssessSettings) -> SplitAssessment:
    """Predict ``split`` with ``network`` (prepared or not; every process takes part), then ``assess``."""
    predictions = predict_split(accelerator, network, spec, split, batch_size)
    return assess(predictions, settings, accelerator.unwrap_model(network), spec, split)
