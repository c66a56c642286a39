"""Issue 58, family 4: a resume compares every split and table it reuses with the run folder, or refuses: the learned
calibrator, the curves, the reliability histograms, the last epoch's and the post-hoc splits, not only val/test.
Each edit below is sealed anew as the project's own writer seals it, so the run folder is what must catch it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from mtl_cog.bundles import bundle as bundles
from mtl_cog.cli import sweep
from mtl_cog.errors import UserError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-run COG-TS sweep that scored its last epoch and fitted post-hoc TS (one epoch, tiny data)."""
    out = tmp_path_factory.mktemp("sweep6") / "s"
    tiny = ["tracking=none", "train.epochs=2", "train.batch_size=32", "train.eval_batch_size=64",
            "model.backbone=cog_cnn_tiny", "data.synthetic.num_attributes=3", "data.synthetic.train_size=64",
            "data.synthetic.val_size=40", "data.synthetic.test_size=30", "eval.score_last_epoch=true"]
    sweep.main(["--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), *tiny, "--out", str(out),
                "--threads", "1", "--posthoc", "ts", "--grid", "optim.follower_lr=1e-3"])
    return out


@pytest.fixture
def copy(finished, tmp_path):
    shutil.copytree(finished, tmp_path / "s")
    return tmp_path / "s"


def rewrite(out: Path, table: str, rows, column: str, value) -> None:
    """Change ``column`` of the ``rows`` of one bundle table and write the bundle back, sealed as a campaign seals."""
    folder = out / "bundle"
    bundle = bundles.read_bundle(folder)
    frame = getattr(bundle, table).copy()
    chosen = rows(frame)
    assert chosen.any(), f"no {table} row to edit"
    first = frame.index[chosen][0]
    frame.loc[first, column] = value(frame.loc[first, column])
    setattr(bundle, table, frame)
    bundles.write_bundle(folder, bundle)


def test_an_untouched_bundle_resumes(copy):
    assert sweep.main(["--resume", str(copy)]).name == "best_config.yaml"


EDITS = {
    "calibrator": ("results", lambda f: f["split"] == "calibrator", "value", lambda v: float(v) * 1.5),
    "last epoch + ts": ("results", lambda f: (f["split"] == "test@last+ts") & (f["task"] == "mean")
                        & (f["metric"] == "nll"), "value", lambda v: float(v) - 0.1),
    "post-hoc": ("results", lambda f: (f["split"] == "test+ts") & (f["metric"] == "accuracy"), "value",
                 lambda v: 0.99),
    "curve": ("curves", lambda f: (f["split"] == "val") & (f["metric"] == "nll"), "value", lambda v: float(v) - 0.2),
    "reliability": ("reliability", lambda f: f["split"] == "test", "count",
                    lambda v: " ".join(str(int(c) + 1) for c in str(v).split())),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_a_resume_refuses_a_reused_table_its_run_folder_contradicts(copy, what):
    table, rows, column, value = EDITS[what]
    rewrite(copy, table, rows, column, value)
    with pytest.raises(UserError, match="run_00.*(differs from|is missing from|not what)"):
        sweep.main(["--resume", str(copy)])


def test_a_resume_refuses_a_row_the_run_folder_does_not_have(copy):
    folder = copy / "bundle"
    bundle = bundles.read_bundle(folder)
    extra = bundle.results[bundle.results["split"] == "calibrator"].head(1).assign(metric="bias", value=0.5)
    bundle.results = pd.concat([bundle.results, extra], ignore_index=True)
    bundles.write_bundle(folder, bundle)
    with pytest.raises(UserError, match="run_00"):
        sweep.main(["--resume", str(copy)])
