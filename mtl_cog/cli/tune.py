"""Tuning worker: trains trials of one Optuna study until it holds its budget (the fair protocol runs these).

    python -m mtl_cog.cli.tune --storage sqlite:///OUT/tuning/optuna.db --study digits-cog_fc \\
        --config configs/digits/cog_fc.yaml --base-follower-lr 1e-3 --budget 8 [--prune] \\
        [--trial-seeds 1000 1001 1002] [--campaign NAME --bundle-out OUT] -- key=value ...

``scripts/reproduce.py --protocol fair`` starts one or more of these per study, locally or as
Slurm jobs (the same launchers as every run); several workers may share a study. The worker is
``mtl_cog.experiments.fair_tuning.work``: each trial is one training run per tuning seed, recorded
in the campaign's results bundle as it ends; exit code 0 when the study has its budget of trials.
"""

from __future__ import annotations

from mtl_cog.errors import run_cli
from mtl_cog.experiments.fair_tuning import work


def main(argv: list[str] | None = None) -> int:
    return work(argv)


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
