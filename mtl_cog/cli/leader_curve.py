"""Leader-rate curve: one COG method at a fixed follower rate, the leader/follower ratio from 1e-3 to 1.

    mtl-cog leader-curve --config configs/digits/cog_fc.yaml --follower-lr 2e-3 --seeds 0 1 2
    mtl-cog leader-curve --config configs/fashion_mnist/cog_ls.yaml --protocol-dir runs/fair   # tuned settings
    mtl-cog leader-curve ... --ratios 0.01 0.1 1 --launcher slurm --partition gpu    # one Slurm job per run
    mtl-cog leader-curve ... --dry-run                                               # the runs and their time
    mtl-cog leader-curve ... --report-only                       # the curve of the runs finished so far

Every run keeps the follower rate and all other settings fixed and sets the leader's rate to
ratio x follower (ratio 1: no hierarchy, allowed here; for COG-FC it is the baseline, step for
step). The follower rate and the other settings come from ``--protocol-dir`` (the fair protocol's
final run of this data set and method: its tuned settings, scale and epochs), else from
``--follower-lr`` and the config. Reference runs, drawn as horizontal bands: the baseline
(tuned, from the protocol folder, else the config's sibling ``baseline.yaml`` with the same
overrides and follower rate), post-hoc TS fitted on its validation predictions (``baseline+ts``),
and the method's own counterpart when it is another trained method (``method.counterpart``,
e.g. LS for COG+LS). With ``--protocol-dir``, a reference run whose twin the protocol's bundle holds (a draw-1
final run with the same settings, seed, threads and versions: ``experiments/leader_curve.protocol_matches``) is
recorded from there instead of trained again (``--retrain-references`` trains it anyway).

Written to ``--out`` (default ``runs/leader-curve-<dataset>-<method>``): ``runs/`` (one folder per
run), ``curve.csv`` (arm, ratio, metric: mean over seeds of the task mean, 95 % t interval over
seeds), ``paired.csv`` (the method minus its counterpart per ratio, and minus itself at ratio 1,
paired by seed, with a verdict), ``curve.md`` (both, and the best ratio on validation NLL), ``curve.png``. The same
command again reuses finished runs and resumes unfinished ones (``train --resume``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pandas as pd
import torch

from mtl_cog.analysis.leader_curve import CURVE_METRICS, best_ratio, curve_table, paired_to_reference
from mtl_cog.bundles.bundle import bundle_dir, read_bundle, wide_scores
from mtl_cog.cli.config_args import combination_file
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config import Config, load_config
from mtl_cog.config.arguments import Parser, distinct, real_number, whole_number
from mtl_cog.config.schema import MAX_LEARNING_RATE, MAX_SEED
from mtl_cog.errors import UserError, run_cli
from mtl_cog.experiments import campaign, estimates, gpu_time
from mtl_cog.experiments import leader_curve as curve
from mtl_cog.experiments.launcher import (
    add_launcher_arguments,
    make_launcher,
    processes_per_run,
    thread_env,
    threads_of,
)
from mtl_cog.experiments.sweep import DONE
from mtl_cog.io import atomic_write, atomic_write_text, check_writable
from mtl_cog.reporting import plots
from mtl_cog.reporting.curve_figures import curve_figure
from mtl_cog.reporting.tables import markdown_table

BASELINE, TS = "baseline", "ts"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help="a COG method config (configs/<ds>/cog_fc.yaml)")
    parser.add_argument("--data", default=None, metavar="NAME", help="with --method: configs/<NAME>/<method>.yaml")
    parser.add_argument("--method", default=None, metavar="NAME", help="with --data: configs/<data>/<NAME>.yaml")
    parser.add_argument("--ratios", type=real_number(0, 1, low_open=True, what="a leader/follower ratio"),
                        nargs="+", default=list(curve.RATIOS),
                        help="leader/follower ratios in (0, 1] (default: 1e-3 3e-3 ... 0.3 1)")
    parser.add_argument("--seeds", type=whole_number(0, MAX_SEED, "a seed"), nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--follower-lr", type=real_number(0, MAX_LEARNING_RATE, low_open=True, what="a learning rate"),
                        default=None, help="the fixed follower rate (default: the "
                        "protocol's tuned one with --protocol-dir, else the config's)")
    parser.add_argument("--protocol-dir", type=Path, default=None,
                        help="a fair-protocol folder (reproduce --protocol fair --out DIR): tuned settings from there, "
                        "and the reference arms from its bundle's draw-1 final runs where they are the same runs")
    parser.add_argument("--retrain-references", action="store_true",
                        help="with --protocol-dir: train the reference arms here even where its bundle holds them")
    parser.add_argument("--out", type=Path, default=None, help="default runs/leader-curve-<dataset>-<method>")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their estimated time; run nothing")
    parser.add_argument("--report-only", action="store_true",
                        help="write the curve from the runs finished so far (e.g. while another process trains)")
    parser.add_argument("--gpu-check", type=Path, default=None, metavar="JSON",
                        help="throughput measured by scripts/gpu_check.sh (default ./gpu_check.json if present)")
    add_launcher_arguments(parser)
    campaign.add_campaign_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="overrides for every run, e.g. train.epochs=10")
    args = parser.parse_args(argv)
    if args.data or args.method:
        if args.config is not None or not (args.data and args.method):
            raise UserError("--method and --data name the config together, instead of --config.")
        args.config = combination_file(args.data, args.method)
    elif args.config is None:
        raise UserError("give --method and --data (or --config configs/<data>/<method>.yaml).")
    args.ratios = curve.check_ratios(args.ratios)
    distinct(args.seeds, "--seeds")  # one folder per (ratio, seed)
    return args


def references(args: argparse.Namespace, cfg: Config, dataset: str) -> dict[str, curve.Source]:
    """{name: config files} of the reference arms: the baseline, and the method's trained counterpart if another."""
    names = [BASELINE]
    counterpart = (cfg.method.counterpart or "").split("+")[0]
    if counterpart and counterpart not in names:
        names.append(counterpart)
    if args.protocol_dir is not None:
        return {name: curve.protocol_run_source(args.protocol_dir, dataset, name) for name in names}
    paths = {name: args.config.parent / f"{name}.yaml" for name in names}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise UserError(f"the reference config(s) {', '.join(missing)} are missing (they sit next to --config).")
    return {name: ((path,), ()) for name, path in paths.items()}


def build_plan(args: argparse.Namespace) -> tuple[campaign.Campaign, str, str]:
    """(the curve as a campaign, method, dataset); every run's config resolves before anything runs."""
    cfg = load_config(args.config, args.overrides)
    method, dataset = cfg.method.name, args.config.parent.name
    if not cfg.method.leader:
        raise UserError(f"{args.config}: method {method!r} has no leader (method.leader is empty): a leader-rate "
                        "curve needs a COG method.")
    base, extra = args.config, list(args.overrides)
    source: curve.Source = ((base,), ())
    if args.protocol_dir is not None:
        source = curve.protocol_run_source(args.protocol_dir, dataset, args.config.stem)
        cfg = load_config(list(source[0]), [*source[1], *extra])
    follower = args.follower_lr or cfg.optim.follower_lr
    out = args.out or Path("runs") / f"leader-curve-{dataset}-{method}"
    refs = references(args, cfg, dataset)
    shared_rate = args.protocol_dir is None and args.follower_lr is not None  # the references share the given rate
    counterpart = cfg.method.counterpart or BASELINE
    specs = curve.plan(method, dataset, source, refs, follower, args.ratios, args.seeds, out / "runs", extra,
                       shared_rate, counterpart, draw=curve.PROTOCOL_DRAW if args.protocol_dir is not None else "")
    return campaign.Campaign(f"leader-curve-{dataset}-{method}", out, specs,
                             counterparts={method: counterpart}), method, dataset


def curve_scores(out: Path) -> pd.DataFrame:
    """The curve's per-task scores (arm, ratio, seed, split, task, metrics) from its results bundle alone."""
    bundle = read_bundle(bundle_dir(out))
    if bundle is None:
        return pd.DataFrame()
    wide = wide_scores(bundle)
    wide = wide[wide["task"] != "mean"].rename(columns={"method": "arm"})
    return wide[["arm", "ratio", "seed", "split", "task", *[m for m in CURVE_METRICS if m in wide]]]


def write_results(scores: pd.DataFrame, method: str, counterpart: str, ratios: list[float], dataset: str, out: Path,
                  edges: str, partial: str = "") -> Path:
    table = curve_table(scores)
    paired = paired_to_reference(scores, method, counterpart, ratios)
    # what the hierarchy itself does: each ratio against ratio 1 at the same follower rate
    no_hierarchy = paired_to_reference(scores, method, method, [r for r in ratios if r < 1], reference_ratio=1.0)
    best, val_nll = best_ratio(scores, method)
    atomic_write(out / "curve.csv", lambda tmp: table.to_csv(tmp, index=False))
    atomic_write(out / "paired.csv", lambda tmp: pd.concat([paired, no_hierarchy]).to_csv(tmp, index=False))
    lines = [f"# Leader-rate curve: {dataset} / {method}", "",
             "Mean over seeds of the task-averaged test metric, 95% t interval over seeds "
             "(mtl_cog/analysis/leader_curve.py). Ratio = leader / follower learning rate; 1 = no hierarchy.", ""]
    lines += [partial, ""] if partial else []
    if best is not None:
        lines += [f"**Best ratio on validation NLL: {best:g}** (validation NLL per ratio: "
                  + ", ".join(f"{r:g}: {v:.4f}" for r, v in val_nll.items()) + ").", ""]
    if edges:
        lines += [f"The fair protocol's choice for {method} sat at the edge of its range: {edges}.", ""]
    wide = table.assign(value=[f"{m:.4f}" + ("" if pd.isna(lo) else f" [{lo:.4f}, {hi:.4f}]")
                               for m, lo, hi in zip(table["mean"], table["ci_low"], table["ci_high"])],
                        ratio=["reference" if pd.isna(r) else f"{r:g}" for r in table["ratio"]])
    wide = wide.pivot(index=["arm", "ratio"], columns="metric", values="value")[list(CURVE_METRICS)]
    lines += [markdown_table(wide.reset_index()), "", f"## {method} minus {counterpart}, paired by seed", "",
              markdown_table(paired), ""]
    if not no_hierarchy.empty:
        lines += [f"## {method} minus {method} at ratio 1 (no hierarchy, the same follower rate), paired by seed", "",
                  "What the hierarchy itself does: the counterpart above was tuned on its own, often to another "
                  "follower rate.", "", markdown_table(no_hierarchy), ""]
    atomic_write_text(out / "curve.md", "\n".join(lines))
    plots.save_figure(curve_figure(table, method, f"{dataset} / {method}"), out / "curve.png")
    print("\n".join(lines))
    return out / "curve.md"


def _say_reused(reused: dict[str, str], verb: str) -> None:
    if reused:
        print(f"{len(reused)} reference run(s) are the protocol's final runs (the same settings and seed): they {verb} "
              f"from its bundle, not trained again ({', '.join(sorted(reused.values()))})", flush=True)


def main(argv: list[str] | None = None, executor=None) -> Path:
    """``executor``: a submitit executor to use instead of Slurm's (the tests pass the local one)."""
    args = parse_args(argv)
    plan, method, dataset = build_plan(args)
    planned = campaign.plan(plan)
    arms = dict.fromkeys(s.labels.method for s in plan.specs if s.labels.ratio is None)
    print(f"leader curve of {dataset}/{method}: ratios {' '.join(f'{r:g}' for r in args.ratios)} × "
          f"{len(args.seeds)} seeds, plus {', '.join(arms)}; "
          f"follower rate {planned[0].config.optim.follower_lr:g}; in {plan.out}", flush=True)
    parallel = args.parallel or 1
    env = thread_env(parallel, args.threads, gpus=torch.cuda.is_available())
    reuse = args.protocol_dir is not None and not args.retrain_references and not args.report_only
    protocol = curve.read_protocol_bundle(args.protocol_dir) if reuse else None
    twins = curve.protocol_matches(planned, protocol, threads_of(env))
    if args.dry_run:
        measured = gpu_time.find_gpu_check(args.gpu_check, CONFIGS.parent, args.runs_per_device)
        _say_reused(twins, "would be recorded")
        left = [dataclasses.replace(p, state=campaign.BUNDLED) if p.spec.run in twins else p for p in planned]
        estimates.print_estimate(left, measured, parallel, "leader curve", out=plan.out)
        return plan.out / "curve.md"
    check_writable(plan.out, "--out", folder=True)
    if twins:
        curve.reuse_protocol_runs(planned, protocol, twins, campaign.Collector(plan, planned))
        _say_reused(twins, "are recorded")
    if args.report_only:
        campaign.Collector(plan, planned).collect([p.spec.run for p in planned if p.state == DONE])
        failed = []
    else:
        runner = make_launcher(args, plan.out / "slurm_logs", default_parallel=1, executor=executor)
        failed = campaign.run(plan, planned, runner, env, "the same command", processes_per_run(args),
                              "leader curve")
    scores = curve_scores(plan.out)
    if scores.empty:
        raise UserError(f"no run of the curve finished; see the .log files in {plan.out / 'runs'}.")
    counterpart = plan.counterparts[method]
    edges = curve.chosen_edges(args.protocol_dir, dataset, args.config.stem) if args.protocol_dir else ""
    done = set(read_bundle(bundle_dir(plan.out)).done()["run"])
    finished = sum(p.spec.run in done for p in planned)  # of this plan's runs (the bundle may hold others)
    partial = "" if finished == len(planned) else f"**Partial: {finished} of {len(planned)} runs finished.**"
    path = write_results(scores, method, counterpart, args.ratios, dataset, plan.out, edges, partial)
    if failed:
        raise UserError(f"{len(failed)} run(s) failed, so the curve lacks them: "
                        + ", ".join(str(p.spec.run_dir) for p in failed) + ". Run the same command again to continue.")
    return path


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
