"""Learning-rate sweeps: the grid, the runs' validation NLL, the choice (used by scripts/sweep.py).

COG adds one hyperparameter, the leader's learning rate; the paper tunes it together with the
follower's on the validation cross-entropy (App. B). A sweep runs every combination of a grid
and keeps the one whose best checkpoint has the lowest validation NLL (mean over tasks).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from mtl_cog.config import Config
from mtl_cog.errors import ConfigError, UserError
from mtl_cog.evaluation.scoring import score
from mtl_cog.runs import rundir
from mtl_cog.runs.finished import finished_predictions
from mtl_cog.training import resume_settings


@dataclass
class GridAxis:
    key: str
    values: list[str]  # the override texts, parsed by the config loader like any override


def split_values(text: str) -> list[str]:
    """``1e-5,3e-5`` -> [``1e-5``, ``3e-5``]; commas inside brackets stay (``[5,15],[10]``)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{"
        depth -= char in "]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts]


def parse_grid(items: list[str]) -> list[GridAxis]:
    axes = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid item {item!r} must look like key=v1,v2 (e.g. optim.leader_lr=1e-5,3e-5).")
        key, text = item.split("=", 1)
        values = split_values(text)
        if not key.strip() or any(v == "" for v in values):
            raise ConfigError(f"--grid item {item!r} has an empty key or value.")
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:  # the same run planned twice (two folders of one setting, or one folder trained twice)
            raise ConfigError(f"--grid item {item!r} lists {', '.join(twice)} more than once; give each value once.")
        if key.strip() in {a.key for a in axes}:
            raise ConfigError(f"--grid names {key.strip()!r} twice.")
        axes.append(GridAxis(key.strip(), values))
    return axes


def combinations(axes: list[GridAxis]) -> list[dict[str, str]]:
    """Every combination, in grid order (the last axis varies fastest)."""
    return [dict(zip([a.key for a in axes], values)) for values in itertools.product(*[a.values for a in axes])]


def validation_scores(run_dir: Path, bins: list[int]) -> dict[str, float]:
    """Mean-over-tasks validation metrics of a finished run's best checkpoint (predictions_val.npz)."""
    if not (run_dir / rundir.DONE).exists():
        return {"nll": math.nan}
    # tuning picks by these numbers: read only through the one check of a finished run (digests, task spec)
    return score(finished_predictions(run_dir, ("val",))["val"], bins)["mean"]


def best_index(nlls: list[float]) -> int | None:
    """Index of the lowest finite NLL (the first one on ties), None if no run finished."""
    finite = [(v, i) for i, v in enumerate(nlls) if not math.isnan(v)]
    return min(finite)[1] if finite else None


DONE, UNFINISHED, NEW = "done", "unfinished", "new"


TRACKING_KEYS = ("tracking", "wandb_project", "wandb_group", "wandb_job_type")  # where a run reports, not what it is
# Where the run folder lies is no setting either: a sweep or reproduction folder that was moved
# (or reached by another path) holds the same runs, and its runs resume from wherever they are.
LOCATION_KEYS = ("output_dir",)


def _settings(cfg: Config) -> dict:
    return {k: v for k, v in cfg.to_dict().items() if k not in (*TRACKING_KEYS, *LOCATION_KEYS)}


def run_state(run_dir: Path, resolved: Config) -> str:
    """What a re-run sweep or reproduction does with ``run_dir``: reuse it, resume it, or start it.

    ``done``: a finished run of exactly ``resolved`` (reused); ``unfinished``: a run of exactly
    ``resolved`` that was interrupted or failed (continued with ``train --resume``, never counted
    as failed before it had the chance); ``new``: no run there yet. A run of *other* settings is
    refused: the folder name would now mean something else.
    """
    if not (run_dir / rundir.CONFIG).is_file():
        return NEW
    if _settings(rundir.load_run_config(run_dir)) != _settings(resolved):
        changes = resume_settings.changed_settings(rundir.load_run_config(run_dir), resolved)
        changed = sorted(k for k in changes if k not in (*TRACKING_KEYS, *LOCATION_KEYS))
        raise UserError(f"{run_dir} holds a run with other settings than this one's ({', '.join(changed[:5])}); "
                        "choose another --out, or run with the settings that folder was made with.")
    return DONE if (run_dir / rundir.DONE).exists() else UNFINISHED
