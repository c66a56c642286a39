"""Comparison tables from run folders: mean ± std over seeds, average ranks, per-task tables.

A run folder (written by scripts/train_mtl.py) is recognised by its ``config.yaml`` next to
``test_metrics.csv`` or ``predictions_test.npz``. From it we read the data set (``data.task``),
the method (``method.name``) and the seed, and score every *variant* of the run on its test set:

- the run itself (method ``<method>``): ``predictions_test.npz``, else ``test_metrics.csv``;
- post-hoc calibrators fitted on the run (method ``<method>+<posthoc>``): a prediction file
  ``predictions_test_<posthoc>.npz``, else the rows of ``posthoc_metrics.csv`` (long format, as
  ``scripts/evaluate.py --posthoc`` writes it: a column ``method`` (or ``posthoc``) naming the
  calibrator, ``none`` for the uncalibrated rows, a column ``task``, then metric columns named as
  in test_metrics.csv).

Prediction files are preferred because they are re-scored at the bin counts the report asks for
and, when they hold ``true_probs/<t>``, also against the truth (mtl_cog/evaluation/truth.py); metric CSVs
only give what they contain (missing bin counts stay empty).

The summary follows the paper (Sec. 4): per data set, one row per method, every metric as mean
and standard deviation over seeds (sample std, ddof=1; 0 for one seed), and the unweighted
**average rank** over accuracy, NLL and Brier (Javaloy et al., 2025): each metric's mean over
seeds is ranked across the data set's methods (1 = best; ties share the average of the ranks
they span, as ``scipy.stats.rankdata(method="average")``), and the three ranks are averaged. The
method(s) with the lowest average rank are marked *top-ranked*.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from mtl_cog.config.loader import load_yaml
from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.errors import ConfigError, ReportError
from mtl_cog.evaluation.groups import score_with_groups
from mtl_cog.evaluation.metrics import (
    BASE_METRICS,
    BINNED_FAMILIES,
    NORMS,
    lower_is_better,
    metrics_frame,
    only_some_tasks,
)
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS, is_multitask_metric
from mtl_cog.evaluation.predictions import Predictions, load_predictions
from mtl_cog.evaluation.truth import truth_metrics
from mtl_cog.progress import track
from mtl_cog.runs import rundir
from mtl_cog.runs.task_spec import load_task_spec

RANK_METRICS = ("accuracy", "nll", "brier")
POSTHOC_PREFIX = rundir.posthoc_predictions_file("test", "")[: -len(".npz")]  # "predictions_test_"
ID_COLUMNS = ["dataset", "method", "seed", "run", "task"]
# Keys that do not change what a run computes; differences elsewhere between runs grouped together warn.
_IRRELEVANT_KEYS = {"seed", "run_name", "output_dir", "tracking", "wandb_project", "wandb_group",
                    "wandb_job_type", "data.root", "data.cache_dir",
                    "data.download", "data.use_cache", "train.eval_batch_size", "train.log_every_steps"}
# Besides every data option: settings every method of a comparison must share (the protocol).
# Runs that differ in one of them are ranked separately, never together. Learning rates and the
# method's own knobs are not here: they are tuned per method.
PROTOCOL_KEYS = ("train.epochs", "model.backbone", "model.cifar_stem", "model.pretrained", "model.timm_kwargs")


@dataclass
class Variant:
    """One row source of a run: the run itself or a post-hoc calibrator fitted on it."""

    method: str
    predictions: Path | None = None
    metrics: pd.DataFrame | None = None  # one row per task (+ optional "mean"), when no predictions


@dataclass
class RunRecord:
    run_dir: Path
    dataset: str
    method: str
    seed: int
    config: dict
    variants: list[Variant] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Finding and reading run folders


def _is_run_dir(path: Path) -> bool:
    return (path / rundir.CONFIG).is_file() and (
        (path / rundir.TEST_METRICS).is_file() or (path / rundir.predictions_file("test")).is_file()
    )


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run folders among ``paths``: each path is a run folder or a folder holding run folders (any depth).

    We do not descend into a run folder (its ``wandb/`` subfolder holds a ``config.yaml`` too).
    A folder with ``config.yaml`` but no test results (unfinished run) is skipped with a warning.
    """
    found: list[Path] = []
    for start in map(Path, paths):
        if not start.is_dir():
            raise ReportError(f"{start} is not a folder (expected a run folder or a folder of runs).")
        stack = [start]
        while stack:
            folder = stack.pop()
            if _is_run_dir(folder):
                found.append(folder)
                continue
            if (folder / rundir.CONFIG).is_file() and folder.name != "files":  # wandb keeps files/config.yaml
                warnings.warn(f"skipping {folder}: it has {rundir.CONFIG} but no test results (unfinished run?)",
                              stacklevel=2)
                continue
            stack.extend(sorted((p for p in folder.iterdir() if p.is_dir()), reverse=True))
    unique = sorted(set(found))
    if not unique:
        raise ReportError(f"no run folders (config.yaml + {rundir.TEST_METRICS}) under: {', '.join(map(str, paths))}")
    return unique


def _read_config(run_dir: Path) -> dict:
    # Read the YAML as data rather than through mtl_cog.config: a report must still open runs
    # written by an older or newer version of the config schema.
    path = run_dir / rundir.CONFIG
    try:
        config = load_yaml(path.read_text(), str(path))  # refuses alias bombs (mtl_cog.config.loader)
    except (ConfigError, OSError, UnicodeDecodeError) as err:
        raise ReportError(str(err) if isinstance(err, ConfigError) else f"{path} cannot be read: {err}") from None
    for key in ("data.task", "method.name", "seed"):
        node = config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ReportError(f"{path}: missing key {key!r}; is this a run folder of scripts/train_mtl.py?")
            node = node[part]
    return config


def _read_metrics_csv(path: Path, expected_tasks: list[str] | None = None) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
        complete = path.read_bytes().endswith(b"\n")
    except Exception as err:  # noqa: BLE001  (pandas raises many parser error types)
        raise ReportError(f"{path} is not a readable CSV: {err}") from None
    if "task" not in frame.columns:
        raise ReportError(f"{path}: missing column 'task' (columns: {', '.join(frame.columns)}).")
    if not complete:  # every CSV we write ends with a newline: this one was cut short (a partial copy)
        raise ReportError(f"{path} does not end with a newline: it was cut short. Copy it again, or re-evaluate.")
    if expected_tasks is not None:
        _check_complete_run_metrics(path, frame, expected_tasks)
    return frame


def _check_complete_run_metrics(path: Path, frame: pd.DataFrame, expected_tasks: list[str]) -> None:
    """A run's test_metrics.csv: one row per task of its task_spec.json, whose mean is its ``mean`` row.

    Multi-task metrics (``is_multitask_metric``) are one value in the ``mean`` row; a metric only
    some tasks have (``classwise_ece@B``) is empty on the other rows and averaged over the rest.
    """
    tasks = [str(t) for t in frame["task"] if t != "mean"]
    numeric = frame.drop(columns=["task"]).select_dtypes("number")
    is_mean = (frame["task"] == "mean").to_numpy()
    per_task = numeric[[c for c in numeric.columns if not is_multitask_metric(c)]]
    task_rows, mean_row = per_task[~is_mean], per_task[is_mean]
    every_task = [c for c in per_task.columns if not only_some_tasks(c)]
    multitask = [c for c in numeric.columns if is_multitask_metric(c)]
    problem = None
    if sorted(tasks) != sorted(expected_tasks) or "mean" not in set(frame["task"]):
        problem = f"it has rows for {len(tasks)} of the run's {len(expected_tasks)} tasks (and the mean)"
    elif (per_task[every_task].isna().any(axis=None) or numeric.loc[is_mean, multitask].isna().any(axis=None)
          or (mean_row.iloc[0].isna() != task_rows.isna().all()).any()):  # a partial metric: a mean iff some task
        problem = "it has empty cells"
    elif not np.allclose(mean_row.iloc[0], task_rows.mean(), rtol=1e-6, atol=1e-9, equal_nan=True):
        problem = "its mean row is not the mean of its task rows"
    if problem:
        raise ReportError(f"{path} is incomplete or damaged: {problem}. Re-create it with scripts/evaluate.py "
                          f"--run {path.parent}, or copy the run again.")


def _posthoc_variants(run_dir: Path, method: str) -> list[Variant]:
    variants = {}
    for path in sorted(run_dir.glob(f"{POSTHOC_PREFIX}*.npz")):
        name = path.stem[len(POSTHOC_PREFIX):]
        variants[name] = Variant(f"{method}+{name}", predictions=path)
    csv = run_dir / rundir.POSTHOC_METRICS
    if csv.is_file():
        frame = _read_metrics_csv(csv)
        column = next((c for c in ("posthoc", "calibrator", "method") if c in frame.columns), None)
        if column is None:
            raise ReportError(f"{csv}: needs a column 'method' (or 'posthoc') naming the calibrator of each row.")
        for name, rows in frame.groupby(column, sort=True):
            # "none" repeats the uncalibrated run; a prediction file of the same calibrator wins
            if str(name) not in variants and str(name) != "none":
                variants[str(name)] = Variant(f"{method}+{name}", metrics=rows.drop(columns=[column]))
    return list(variants.values())


def load_run_record(run_dir: str | Path) -> RunRecord:
    run_dir = Path(run_dir)
    config = _read_config(run_dir)
    method = str(config["method"]["name"])
    record = RunRecord(run_dir, str(config["data"]["task"]), method, int(config["seed"]), config)
    test_predictions = run_dir / rundir.predictions_file("test")
    if test_predictions.is_file():
        record.variants.append(Variant(method, predictions=test_predictions))
    else:
        spec = run_dir / rundir.TASK_SPEC  # runs before task_spec.json existed are checked less
        tasks = list(load_task_spec(spec).task_names) if spec.is_file() else None
        record.variants.append(Variant(method, metrics=_read_metrics_csv(run_dir / rundir.TEST_METRICS, tasks)))
    record.variants.extend(_posthoc_variants(run_dir, method))
    return record


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and key != "timm_kwargs":
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True, default=str)
    return out


def protocol_settings(config: dict) -> dict[str, str]:
    """The settings that must agree for runs to be ranked together: data options and ``PROTOCOL_KEYS``."""
    flat = _flatten(config)
    return {k: v for k, v in flat.items()
            if (k.startswith("data.") or k in PROTOCOL_KEYS) and k not in _IRRELEVANT_KEYS}


def label_datasets(records: list[RunRecord]) -> list[str]:
    """Split runs of one task that followed different protocols; -> one note per split, saying why.

    Runs of the same ``data.task`` whose data options, epochs, backbone or image size differ
    (``protocol_settings``) are not comparable: averaging or ranking them together would credit
    a method with its longer training or bigger images. Each distinct protocol is labelled
    ``<task>[key=value,...]`` with the keys that differ (at most three, else a short hash of the
    setting) and ranked on its own. The notes name the runs set apart from the largest group.
    """
    by_task: dict[str, list[RunRecord]] = {}
    for record in records:
        by_task.setdefault(record.dataset, []).append(record)
    notes = []
    for task, members in by_task.items():
        settings = [protocol_settings(r.config) for r in members]
        differing = sorted({k for s in settings for k in s if len({t.get(k) for t in settings}) > 1})
        if not differing:
            continue
        for record, mine in zip(members, settings):
            if len(differing) <= 3:
                tag = ",".join(f"{k.rsplit('.', 1)[-1]}={json.loads(mine.get(k, 'null'))}" for k in differing)
            else:
                tag = hashlib.sha1(json.dumps(mine, sort_keys=True).encode()).hexdigest()[:6]
            record.dataset = f"{task}[{tag}]"
        groups: dict[str, list[RunRecord]] = {}
        for record in members:
            groups.setdefault(record.dataset, []).append(record)
        main = max(groups, key=lambda label: (len(groups[label]), len({r.method for r in groups[label]}), label))
        for label, group in groups.items():
            if label == main:
                continue
            names = ", ".join(r.run_dir.name for r in group[:6]) + (" ..." if len(group) > 6 else "")
            notes.append(f"{task}: {len(group)} run(s) set apart from the {len(groups[main])} of {main} "
                         f"(they differ in {', '.join(differing)}); ranked separately as {label}: {names}")
    return notes


def warn_on_mixed_groups(records: list[RunRecord]) -> None:
    """Runs averaged together should differ only by seed; say which other keys differ."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        groups.setdefault((record.dataset, record.method), []).append(record)
    for (dataset, method), members in groups.items():
        flats = [{k: v for k, v in _flatten(r.config).items() if k not in _IRRELEVANT_KEYS} for r in members]
        differing = sorted({k for f in flats for k in f if len({g.get(k) for g in flats}) > 1})
        if differing:
            warnings.warn(f"{dataset}/{method}: runs averaged over seeds also differ in {', '.join(differing[:8])}",
                          stacklevel=2)
        seeds = [r.seed for r in members]
        if len(set(seeds)) < len(seeds):
            warnings.warn(f"{dataset}/{method}: several runs share a seed ({sorted(seeds)}); all are averaged.",
                          stacklevel=2)


def load_runs(paths: list[str | Path], notes: list[str] | None = None) -> list[RunRecord]:
    """Every run under ``paths``, labelled by protocol; ``notes`` (if given) receives what was set apart and why."""
    records = [load_run_record(path) for path in find_run_dirs(paths)]
    set_apart = label_datasets(records)
    if notes is not None:
        notes.extend(set_apart)
    warn_on_mixed_groups(records)
    return records


# ---------------------------------------------------------------------------------------------
# Scoring: one long frame, one row per (run, variant, task) plus the task mean


def score_variant(variant: Variant, bins: list[int], groups: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """Rows per task + "mean": every metric at ``bins``, and truth metrics where p* is known; with ``groups``
    (the run's eval.groups) the worst-group, gap and multicalibration columns too."""
    if variant.predictions is None:
        # keep the task and the numeric metric columns (a CSV may carry labels such as a split name)
        numeric = variant.metrics.drop(columns=["task"]).select_dtypes("number").columns
        frame = variant.metrics[["task", *numeric]].copy()
        if "mean" not in set(frame["task"]):
            numeric = frame.drop(columns=["task"]).mean(numeric_only=True)
            frame = pd.concat([frame, pd.DataFrame([{"task": "mean", **numeric}])], ignore_index=True)
        return frame
    predictions = load_predictions(variant.predictions)
    scores = score_with_groups(predictions.task_names, predictions.logits, predictions.labels, bins, DEFAULT_PAIRS,
                               groups)
    scores.pop("groups", None)  # the cells stay in the run's group_metrics.csv
    if predictions.true_probs is not None:
        truth = truth_metrics(predictions.task_names, predictions.logits, predictions.labels,
                              predictions.true_probs, bins)
        for task in scores["tasks"]:
            scores["tasks"][task].update(truth["tasks"][task])
        scores["mean"].update(truth["mean"])
        scores.setdefault("multitask", {}).update(truth.get("multitask", {}))
    return metrics_frame(scores)  # the multi-task metrics are columns of the "mean" row


def score_runs(records: list[RunRecord], bins: list[int]) -> pd.DataFrame:
    frames = []
    for record in track(records, "compare: scoring runs"):
        for variant in record.variants:
            frame = score_variant(variant, bins, (record.config.get("eval") or {}).get("groups") or ())
            frame.insert(0, "run", str(record.run_dir))
            frame.insert(0, "seed", record.seed)
            frame.insert(0, "method", variant.method)
            frame.insert(0, "dataset", record.dataset)
            frames.append(frame)
    scores = pd.concat(frames, ignore_index=True)
    return scores[ID_COLUMNS + [c for c in scores.columns if c not in ID_COLUMNS]]


def metric_columns(scores: pd.DataFrame) -> list[str]:
    return [c for c in scores.columns if c not in ID_COLUMNS]


# ---------------------------------------------------------------------------------------------
# Tables


def average_ranks(means: pd.DataFrame, metrics: tuple[str, ...] = RANK_METRICS) -> pd.DataFrame:
    """Rank the rows (methods) of ``means`` on each metric (1 = best, ties averaged) and average.

    Returns ``rank_<metric>`` columns, ``avg_rank`` and ``top_ranked`` (True for every method
    sharing the lowest average rank). Accuracy is ranked high-to-low, the others low-to-high.
    """
    out = pd.DataFrame(index=means.index)
    for metric in metrics:
        values = means[metric].to_numpy(dtype=float)
        if np.isnan(values).any():
            raise ReportError(f"cannot rank on {metric}: no value for {', '.join(means.index[np.isnan(values)])}.")
        out[f"rank_{metric}"] = rankdata(values if lower_is_better(metric) else -values, method="average")
    out["avg_rank"] = out[[f"rank_{m}" for m in metrics]].mean(axis=1)
    out["top_ranked"] = np.isclose(out["avg_rank"], out["avg_rank"].min())
    return out


def _mean_std(frame: pd.DataFrame, keys: list[str], columns: list[str]) -> pd.DataFrame:
    grouped = frame.groupby(keys, sort=False)
    means = grouped[columns].mean()
    # A spread over seeds needs two distinct seeds: runs repeating one seed measure nothing but
    # nondeterminism, so their std is left empty (NaN) rather than shown as a seed spread.
    counts = grouped["seed"].agg(n_seeds="nunique", n_runs="count",
                                 seeds=lambda s: " ".join(str(v) for v in sorted(set(s))))
    stds = grouped[columns].std(ddof=1)
    stds = stds.where((counts["n_seeds"] >= 2).to_numpy()[:, None] & means.notna().to_numpy())
    stds.columns = [f"{c}_std" for c in columns]
    return pd.concat([counts, means, stds], axis=1)


def summary_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Per data set and method: every metric (mean and ``_std`` over seeds), ranks, top-ranked."""
    task_mean = scores[scores["task"] == "mean"]
    columns = [c for c in metric_columns(scores) if task_mean[c].notna().any()]
    summary = _mean_std(task_mean, ["dataset", "method"], columns)
    ranked = [average_ranks(group.droplevel(0)).assign(dataset=dataset).set_index("dataset", append=True)
              .swaplevel() for dataset, group in summary.groupby(level="dataset", sort=False)]
    return pd.concat([summary, pd.concat(ranked)], axis=1).reset_index()


def calibration_error_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Long table: data set, method, norm, bins, mean, std, rank.

    ``norm`` is every binned error family (ece, rmsce, mce, adaece, classwise_ece, the multi-task
    pooled_ece, worst_task_ece, p90_task_ece, and their nf_* noise-free versions where known).

    ``rank`` orders the data set's methods for that norm and bin count (1 = lowest error), so a
    reader sees how rankings move with the number of bins (paper, App. C.3).
    """
    task_mean = scores[scores["task"] == "mean"]
    rows = []
    for column in metric_columns(scores):
        norm, _, bins = column.partition("@")
        if not bins or norm.removeprefix("nf_") not in BINNED_FAMILIES or task_mean[column].isna().all():
            continue
        for (dataset, method), group in task_mean.groupby(["dataset", "method"], sort=False):
            values = group[column].dropna()
            if values.empty:  # e.g. noise-free errors of a data set without true probabilities
                continue
            n_seeds = group.loc[values.index, "seed"].nunique()
            rows.append({"dataset": dataset, "method": method, "norm": norm, "bins": int(bins),
                         "mean": values.mean(), "std": values.std(ddof=1) if n_seeds >= 2 else np.nan,
                         "n_seeds": n_seeds})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table["rank"] = table.groupby(["dataset", "norm", "bins"])["mean"].rank(method="average")
    return table.sort_values(["dataset", "norm", "bins", "rank"], kind="stable").reset_index(drop=True)


def per_task_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Multi-task data sets only: every metric of every task and method, mean and ``_std`` over seeds."""
    tasks = scores[scores["task"] != "mean"]
    multi = tasks.groupby("dataset")["task"].nunique()
    tasks = tasks[tasks["dataset"].isin(multi[multi > 1].index)]
    if tasks.empty:
        return pd.DataFrame(columns=["dataset", "method", "task"])
    columns = [c for c in metric_columns(scores) if tasks[c].notna().any()]
    return _mean_std(tasks, ["dataset", "method", "task"], columns).reset_index()


# ---------------------------------------------------------------------------------------------
# Markdown


def _cell(mean: float, std: float, digits: int = 4) -> str:
    """``mean ± std``; the ± only where a std exists (at least two distinct seeds)."""
    if pd.isna(mean):
        return "–"
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _seeds_cell(row: pd.Series) -> str:
    """Distinct seeds, and the run count when runs repeat a seed (``1 (3 runs)``)."""
    runs = row.get("n_runs", row["n_seeds"])
    return str(row["n_seeds"]) if pd.isna(runs) or runs == row["n_seeds"] else f"{row['n_seeds']} ({runs} runs)"


def summary_markdown(summary: pd.DataFrame, bins: int, truth_bins: int | None = None) -> str:
    """One table per data set: accuracy, NLL, Brier, ECE/RMSCE/MCE@bins, average rank; top-ranked in bold."""
    columns = [*BASE_METRICS, *(f"{n}@{bins}" for n in NORMS)]
    headers = ["method", "seeds", "accuracy ↑", "NLL ↓", "Brier ↓", f"ECE@{bins} ↓", f"RMSCE@{bins} ↓",
               f"MCE@{bins} ↓", "avg rank ↓"]
    lines = ["# Comparison of methods", "",
             "Test-set metrics, mean ± std over distinct seeds (no ± with a single seed; unweighted mean over "
             "tasks for multi-task data sets). Only runs of the same protocol (data options, epochs, backbone, "
             "image size) are ranked together. "
             "Average rank over accuracy, NLL and Brier (1 = best; ties share the average rank); "
             "**bold ★** = top-ranked.", ""]
    for dataset, group in summary.groupby("dataset", sort=False):
        lines += [f"## {dataset}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        for _, row in group.sort_values("avg_rank", kind="stable").iterrows():
            cells = [_cell(row.get(c, np.nan), row.get(f"{c}_std", np.nan)) for c in columns]
            name, rank = str(row["method"]), f"{row['avg_rank']:.2f}"
            if row["top_ranked"]:
                name, rank = f"**{name} ★**", f"**{rank}**"
            lines.append("| " + " | ".join([name, _seeds_cell(row), *cells, rank]) + " |")
        lines.append("")
        if truth_bins is not None and f"nf_ece@{truth_bins}" in group and group[f"nf_ece@{truth_bins}"].notna().any():
            lines += truth_markdown(group, truth_bins)
    return "\n".join(lines)


def truth_markdown(group: pd.DataFrame, bins: int) -> list[str]:
    """Against the true probabilities: label-based ECE next to its noise-free counterpart and |p̂ − p*|."""
    lines = ["Against the true probabilities p* (mtl_cog/evaluation/truth.py): label-based ECE, the noise-free "
             "calibration error (same bins, mean p* instead of labels), mean |p̂ − p*|, KL(p*‖p̂).", "",
             f"| method | ECE@{bins} (labels) | noise-free CE@{bins} | mean abs(p̂ − p*) | KL(p*‖p̂) |",
             "|---|---|---|---|---|"]
    for _, row in group.iterrows():
        if pd.isna(row.get(f"nf_ece@{bins}")):
            continue
        cells = [_cell(row[c], row[f"{c}_std"]) for c in (f"ece@{bins}", f"nf_ece@{bins}", "prob_error", "kl_true")]
        lines.append("| " + " | ".join([str(row["method"]), *cells]) + " |")
    first = group[group["bayes_nll"].notna()].iloc[0]
    lines += ["", "Bayes floors (the scores of p* itself): on this test set's labels accuracy "
              f"{first['bayes_accuracy']:.4f}, NLL {first['bayes_nll']:.4f}, Brier {first['bayes_brier']:.4f}; "
              f"in expectation over labels accuracy {first['bayes_accuracy_exp']:.4f}, NLL "
              f"{first['bayes_nll_exp']:.4f}, Brier {first['bayes_brier_exp']:.4f}.", ""]
    return lines


# ---------------------------------------------------------------------------------------------
# LaTeX (booktabs), the worst-calibrated tasks

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(char, char) for char in str(text))


def _latex_cell(mean: float, std: float, digits: int = 4) -> str:
    if pd.isna(mean):
        return "--"
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} $\\pm$ {std:.{digits}f}"


def summary_latex(summary: pd.DataFrame, bins: int) -> str:
    """summary.md's tables as LaTeX, one ``table`` per data set (booktabs rules; top-ranked in bold).

    ``\\input`` it in a document that loads ``booktabs``. Cells are joined by pandas' Styler.to_latex.
    """
    columns = [*BASE_METRICS, f"ece@{bins}"]
    headers = ["Method", "Seeds", "Acc. $\\uparrow$", "NLL $\\downarrow$", "Brier $\\downarrow$",
               f"ECE@{bins} $\\downarrow$", "Avg. rank $\\downarrow$"]
    parts = ["% Written by scripts/compare.py; needs \\usepackage{booktabs}. Mean $\\pm$ std over distinct seeds."]
    for dataset, group in summary.groupby("dataset", sort=False):
        rows = []
        for _, row in group.sort_values("avg_rank", kind="stable").iterrows():
            cells = [latex_escape(row["method"]), latex_escape(_seeds_cell(row)),
                     *(_latex_cell(row.get(c, np.nan), row.get(f"{c}_std", np.nan)) for c in columns),
                     f"{row['avg_rank']:.2f}"]
            if row["top_ranked"]:
                cells = [f"\\textbf{{{c}}}" for c in cells]
            rows.append(cells)
        body = pd.DataFrame(rows, columns=headers).style.hide(axis="index").to_latex(
            hrules=True, column_format="l" + "r" * (len(headers) - 1))
        parts += ["\\begin{table}[t]", "\\centering", f"\\caption{{{latex_escape(dataset)}: test metrics "
                  f"(mean over tasks), average rank over accuracy, NLL and Brier; bold: top-ranked.}}",
                  body.rstrip(), "\\end{table}", ""]
    return "\n".join(parts)


WORST_TASKS_SHOWN = 5


def worst_tasks_line(task_metrics: dict[str, dict[str, float]], bins: list[int], k: int = WORST_TASKS_SHOWN) -> str:
    """The console line after training: the ``k`` worst-calibrated tasks by ECE; "" for a single task."""
    if len(task_metrics) < 2:
        return ""
    n_bins = SUMMARY_BINS if SUMMARY_BINS in bins else bins[0]
    worst = worst_tasks(task_metrics, f"ece@{n_bins}", k)
    return f"worst-calibrated tasks (test ECE@{n_bins}): " + ", ".join(f"{task} {value:.4f}" for task, value in worst)


def worst_tasks(task_metrics: dict[str, dict[str, float]], metric: str, k: int) -> list[tuple[str, float]]:
    """The ``k`` tasks with the largest ``metric`` (e.g. ece@15), worst first; tasks without a value skipped."""
    values = [(task, float(m[metric])) for task, m in task_metrics.items()
              if metric in m and m[metric] is not None and np.isfinite(m[metric])]
    return sorted(values, key=lambda item: (-item[1], item[0]))[:k]


# ---------------------------------------------------------------------------------------------
# Predictions for figures


def pooled_predictions(records: list[RunRecord]) -> dict[tuple[str, str], list[Predictions]]:
    """(data set, method) -> the test predictions of every seed (variants without a prediction file skipped)."""
    pooled: dict[tuple[str, str], list[Predictions]] = {}
    for record in records:
        for variant in record.variants:
            if variant.predictions is not None:
                pooled.setdefault((record.dataset, variant.method), []).append(load_predictions(variant.predictions))
    return pooled


def markdown_table(table: pd.DataFrame) -> str:
    """A Markdown table (pandas' to_markdown needs the tabulate package, which we do not require)."""
    def cell(value: object) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"
