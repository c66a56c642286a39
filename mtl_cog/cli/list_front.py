"""LiST's calibrated accuracy-robustness front: accuracy, certified accuracy and ECE over the loss margin.

    python scripts/sweep.py --config configs/digits/list.yaml --grid method.list_margin=0,1,2,4 seed=0,1,2
    python scripts/list_front.py RUN_DIR_OR_PARENT [...] --out REPORT_DIR [--eps 0.1412] [--ece ece@15]

Reads every finished run of a Lipschitz network below the given paths (``list``, ``cog_list``),
computes its certified robust accuracy at ``--eps`` (pixel-scale l2 radius) from its test
predictions and its network's bound (``mtl_cog.evaluation.robustness``), groups the runs by data
set, method and ``method.list_margin``, averages over seeds (test mean over tasks) and writes
``REPORT_DIR/list_front.csv`` and ``REPORT_DIR/list_front_<dataset>.png``
(``mtl_cog.reporting.plots.lipschitz_front_figure``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mtl_cog.config.arguments import Parser, real_number
from mtl_cog.errors import ReportError, UserError, run_cli
from mtl_cog.evaluation.assess import AssessSettings, assess
from mtl_cog.evaluation.metrics import BINNED_FAMILIES
from mtl_cog.evaluation.robustness import metric_name
from mtl_cog.io import atomic_write, check_writable, output_folder
from mtl_cog.models.lipschitz import network_lipschitz
from mtl_cog.reporting import plots
from mtl_cog.runs import rundir
from mtl_cog.runs.finished import finished_predictions
from mtl_cog.runs.trained import load_run

UNBINNED_ERRORS = ("smece", "count_ece", "pair_joint_ece")


def calibration_error_name(text: str) -> str:
    """A calibration-error column of test_metrics.csv: ``<family>@<bins>`` of a binned ECE family, or smece."""
    family, _, bins = text.partition("@")
    if text in UNBINNED_ERRORS or (family in BINNED_FAMILIES and bins.isdigit() and int(bins) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"expected a calibration error such as ece@15 or smece "
                                     f"({', '.join(f + '@B' for f in BINNED_FAMILIES)}, "
                                     f"{', '.join(UNBINNED_ERRORS)}), got {text!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, or folders that hold run folders")
    parser.add_argument("--out", type=Path, required=True, help="report folder (created)")
    parser.add_argument("--eps", type=real_number(0, None, low_open=True, what="a radius > 0"),
                        default=36 / 255,
                        help="l2 radius (pixels in [0, 1]) of the certified accuracy shown (default 36/255)")
    parser.add_argument("--ece", type=calibration_error_name, default="ece@15",
                        help="calibration error shown (a test_metrics.csv column)")
    return parser.parse_args(argv)


def lipschitz_runs(paths: list[Path]) -> list[Path]:
    found = []
    for path in paths:
        if not path.exists():
            raise UserError(f"{path} does not exist.")
        if (path / rundir.CONFIG).is_file():  # a run named directly must be a finished one (load_run checks)
            found.append(path)
            continue
        candidates = sorted(p.parent for p in path.rglob(rundir.CONFIG))
        found += [run for run in candidates if (run / rundir.DONE).is_file() and (run / rundir.TEST_METRICS).is_file()]
    return found


def front_table(runs: list[Path], eps: float, ece: str) -> pd.DataFrame:
    """One row per (dataset, method, margin): mean and std over seeds of accuracy, certified accuracy at
    ``eps`` (from the run's test predictions and its network's Lipschitz bound) and ``ece``."""
    certified, rows = metric_name(eps), []
    for run in runs:
        trained = load_run(run)
        if network_lipschitz(trained.network) is None:
            continue  # not a Lipschitz network
        # the sequence fit ends with (mtl_cog.evaluation.assess), at --eps, on the run's saved test predictions
        predictions = finished_predictions(run, ("test",))["test"]  # the file the run wrote, its tasks
        mean = assess(predictions, AssessSettings.of_run(trained.config, certify_eps=[eps]), trained.network,
                      trained.spec).metrics["mean"]
        if ece not in mean:
            raise ReportError(f"{run / rundir.TEST_METRICS} has no column {ece!r}; choose --ece among "
                              f"{', '.join(c for c in mean if c.startswith('ece@'))}.")
        cfg = trained.config
        rows.append({"dataset": cfg.data.task, "method": cfg.method.name, "margin": cfg.method.list_margin,
                     "seed": cfg.seed, "accuracy": mean["accuracy"], certified: mean[certified], ece: mean[ece]})
    if not rows:
        raise ReportError("no finished run of a Lipschitz network (LiST: configs/<dataset>/list.yaml or cog_list.yaml) "
                          "was found under the given paths.")
    frame = pd.DataFrame(rows)
    grouped = frame.groupby(["dataset", "method", "margin"])
    out = grouped[["accuracy", certified, ece]].mean()
    std = grouped[["accuracy", certified, ece]].std(ddof=1).fillna(0.0).add_suffix("_std")
    return out.join(std).join(grouped.size().rename("n_seeds")).reset_index()


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    check_writable(args.out, "--out", folder=True)  # before the work, not after it
    certified = metric_name(args.eps)
    table = front_table(lipschitz_runs(args.runs), args.eps, args.ece)
    output_folder(args.out, "--out")
    atomic_write(args.out / "list_front.csv", lambda tmp: table.to_csv(tmp, index=False))
    for dataset, rows in table.groupby("dataset"):
        figure = plots.lipschitz_front_figure(rows, str(dataset), certified, args.ece)
        print(plots.save_figure(figure, args.out / f"list_front_{dataset}.png"))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return args.out


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
