"""Checks that need the registries (higher layers than ``mtl_cog.config``), run before anything trains.

``mtl_cog.config`` validates values that make sense on their own; whether ``model.head``,
``two_stage.head``, ``method.calibrator``, ``method.loss`` and ``data.task`` name something
registered is only known once the models, objectives and tasks are imported. Checking them
here, first, means a misspelt second-stage head fails at once, not after stage one trained.

A head that only the two-stage network can run (``supports_one_stage = False``: V-TST's
variational head, whose KL term and sample averaging only stage two applies) is refused as the
one-stage ``model.head``: the run would silently drop the KL term and evaluate single random draws.
"""

from __future__ import annotations

from pathlib import Path

from mtl_cog.config import Config, method_identity
from mtl_cog.data.task_api import TASKS
from mtl_cog.errors import ConfigError, UnknownNameError
from mtl_cog.evaluation.posthoc import POSTHOC_METHODS
from mtl_cog.io import check_writable
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.heads import HEADS
from mtl_cog.objectives import OBJECTIVES
from mtl_cog.objectives.aggregators import AGGREGATORS, EQUAL
from mtl_cog.registry import Registry
from mtl_cog.runs import rundir
from mtl_cog.training import resume_settings


def check_registered_names(cfg: Config) -> None:
    """Raise ``ConfigError`` naming the key if a config names an unregistered part, or a
    second-stage-only head as ``model.head``."""
    checks: list[tuple[str, str, Registry]] = [
        ("data.task", cfg.data.task, TASKS),
        ("model.head", cfg.model.head, HEADS),
        ("method.calibrator", cfg.method.calibrator, CALIBRATORS),
        ("method.loss", cfg.method.loss, OBJECTIVES),
        ("two_stage.head", cfg.two_stage.head, HEADS),
    ]
    if cfg.mtl.aggregator != EQUAL:  # equal weights is plain training: no registered object
        checks.append(("mtl.aggregator", cfg.mtl.aggregator, AGGREGATORS))
    for key, name, registry in checks:
        try:
            registry.get(name)
        except UnknownNameError as err:  # its message suggests close matches and lists the options
            extra = f" Or {EQUAL} (the mean of the task losses)." if key == "mtl.aggregator" else ""
            raise ConfigError(f"{key}: {err}{extra}") from None
    if cfg.mtl.aggregate_on != "features":  # where the Gramian is taken: only an aggregator that uses one reads it
        uses_gramian = cfg.mtl.aggregator != EQUAL and AGGREGATORS.get(cfg.mtl.aggregator).needs_gramian
        if not uses_gramian:
            what = ("equal weights (the mean of the task losses) take no Gramian" if cfg.mtl.aggregator == EQUAL
                    else f"{cfg.mtl.aggregator} weights the task losses without a Gramian")
            raise ConfigError(f"mtl.aggregate_on={cfg.mtl.aggregate_on} has no effect with "
                              f"mtl.aggregator={cfg.mtl.aggregator}: {what}. Leave mtl.aggregate_on at features, or "
                              "choose an aggregator that uses it (upgrad, mgda, imtl_g, aligned_mtl, ...).")
    for name in cfg.eval.shift_posthoc:  # fitted on the clean validation predictions, applied under shift
        if name not in POSTHOC_METHODS:
            raise ConfigError(f"eval.shift_posthoc: unknown post-hoc method {name!r}. "
                              f"Available: {', '.join(POSTHOC_METHODS)}.")
    if cfg.eval.shift_posthoc and not cfg.eval.shift:
        raise ConfigError("eval.shift_posthoc is set but eval.shift names no corruption: set eval.shift=[all] "
                          "(or some corruptions), or leave eval.shift_posthoc empty.")
    if not HEADS.get(cfg.model.head).supports_one_stage:
        raise ConfigError(
            f"model.head={cfg.model.head!r} only works as a second-stage head: one-stage training would drop "
            f"its loss term and evaluate a single random draw. Use two_stage.head={cfg.model.head} with "
            f"two_stage.enabled=true (as configs/<dataset>/vtst.yaml does) and keep model.head=linear, "
            f"or a one-stage head (model.head=linear or mlp)."
        )


def check_before_writing(cfg: Config, resume_dir: Path | None, overwrite: bool, saved: Config | None = None) -> Path:
    """Every check of ``fit`` that needs no data and no network, for the run ``cfg`` describes; -> its folder.

    What ``train --dry-run`` runs, so that a dry run approves only what the real command would
    start: registered names, a writable ``output_dir`` and a free (or ``--overwrite``-able) run
    folder for a new run; for ``--resume``, a resumable folder with a writable ``config.yaml`` and
    the resume plan's checks (``resume_settings.plan_resume``: only changes the resume applies,
    ``train.epochs`` not below the epochs already trained, a readable state). Reads only.
    """
    check_registered_names(cfg)
    if resume_dir is None:
        name = cfg.run_name or rundir.default_run_name(cfg.data.task, method_identity(cfg.to_dict()), cfg.seed)
        run_dir = Path(cfg.output_dir) / name
        rundir.check_output_dir(Path(cfg.output_dir))
        rundir.check_new_run(run_dir, overwrite)
        return run_dir
    rundir.check_resumable(resume_dir)
    check_writable(resume_dir / rundir.CONFIG, f"--resume {resume_dir}")
    resume_settings.plan_resume(resume_dir, cfg, saved)
    return resume_dir
