"""``protocol.md`` beside a reproduction's report: which protocol ran, what was tuned, and what the choices were.

Written by ``reproduce`` (``mtl_cog/cli/reproduce.py``) after its report, from its arguments and the chosen settings
(``chosen_settings.csv/md`` beside it when a protocol tuned anything).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mtl_cog.experiments import protocol, tuning
from mtl_cog.io import atomic_write, atomic_write_text
from mtl_cog.reporting.tables import markdown_table

# --protocol configs only: the head-leader methods (cog_fc, cog_ls, cog_tst) update their whole
# classifier at the leader rate; in short CPU runs the configs' 1e-4 leaves them underconfident.
# These rates came from a sweep of cog_fc alone, so this protocol favours those methods; the fair
# protocol tunes every method instead. The real-image data sets have no such sweep: their head
# leaders keep the configs' rates under --protocol configs.
HEAD_LEADER_LRS = {
    "digits": ["optim.leader_lr=1e-3", "optim.follower_lr=4e-3"],
    "synthetic": ["optim.leader_lr=1e-3", "optim.follower_lr=4e-3"],
}
CHOSEN = "chosen_settings"


def write_protocol_note(report_dir: Path, args: argparse.Namespace, chosen: pd.DataFrame | None,
                        seeds_by_draw: list[list[int]]) -> None:
    """protocol.md beside the report (and chosen_settings.csv/md for a protocol with tuning); ``seeds_by_draw``: the
    final runs' seeds of each tuning draw."""
    lines = [f"# Protocol: {args.protocol} (scale {args.scale})", ""]
    if args.protocol == "paper":
        lines += ["The COG paper's procedure (App. B): the COG variants' leader and follower rates tuned on validation "
                  "NLL with its step schedule (÷10 every 1/30 of the epochs, 3/100 with several tasks), the baseline "
                  f"at Adam {protocol.PAPER_BASELINE_LR:g} and label smoothing {protocol.PAPER_LABEL_SMOOTHING:g} "
                  "not tuned, at a constant rate. This is **not** an equal-budget comparison: it is the paper's, run "
                  "beside the fair protocol to measure what its asymmetry contributes "
                  "(mtl_cog/experiments/protocol.py).", ""]
    if chosen is None and args.protocol == "configs":
        lines += ["Every method ran with its shipped config. This is **not** an equal-budget comparison"
                  + (": at CPU scale the head-leader COG variants (cog_fc, cog_ls, cog_tst) use learning rates "
                     f"tuned for them ({' '.join(HEAD_LEADER_LRS[args.data[0]])}), no other method was tuned"
                     if args.scale == "cpu" and args.data[0] in HEAD_LEADER_LRS else "")
                  + ". Use --protocol fair for that.", ""]
    elif chosen is not None:
        atomic_write(report_dir / f"{CHOSEN}.csv", lambda tmp: chosen.to_csv(tmp, index=False))
        atomic_write_text(report_dir / f"{CHOSEN}.md", markdown_table(chosen))
        lines += [f"{'Every COG variant' if args.protocol == 'paper' else 'Every method'} had an Optuna study of "
                  f"{args.budget} trials (each trial trained with seed(s) "
                  f"{' '.join(map(str, args.tuning_seeds))}, valued by the mean; "
                  f"{tuning.start_count(args.budget)} Halton start points, then TPE"
                  + (", successive halving" if args.prune else "") + ") on validation NLL"
                  + (f", in each of {args.draws} independent draws" if args.draws > 1 else "") + "; failed trials "
                  "count toward the budget. The chosen settings (chosen_settings.csv) were then run with seeds "
                  + "; ".join(f"{' '.join(map(str, seeds))} (draw {d})" for d, seeds in enumerate(seeds_by_draw, 1))
                  + ". See docs/explanation/protocol.md.", "", markdown_table(chosen)]
        if args.prune:
            share = (chosen["epoch_share"] * chosen["trials"]).sum() / chosen["trials"].sum()
            lines += ["", f"Pruning: {int(chosen['pruned'].sum())} of {int(chosen['trials'].sum())} trials stopped "
                      f"early; the tuning trained {share:.0%} of the epochs it would have without pruning."]
        in_sample = chosen[chosen["val_in_sample"]]
        if len(in_sample):
            lines += ["", f"`val_in_sample`: {', '.join(sorted(set(in_sample['method'])))} fit part of the network on "
                      "the validation split while training (LiST's L), so their validation NLL, which chose their "
                      "setting and checkpoint, is in-sample and optimistic; their test metrics are not."]
        edges = chosen[chosen["at_edge"] != ""]
        if len(edges):
            lines += ["", f"**{len(edges)} of {len(chosen)} choices lie at the edge of their search range** "
                      f"(`at_edge`: in its outer {protocol.EDGE_SHARE:.0%}; a leader ratio at its top, 1, means no "
                      "hierarchy): their best setting may lie outside it (mtl_cog/experiments/protocol.py)."]
    atomic_write_text(report_dir / "protocol.md", "\n".join(lines) + "\n")
    print(report_dir / "protocol.md")
