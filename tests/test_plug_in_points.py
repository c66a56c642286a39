"""The two plug-in points of evaluation: an add-on in ``evaluation.assess.ADD_ONS`` and a post-hoc method in
``evaluation.posthoc.POSTHOC`` each reach every command through one entry, with known answers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mtl_cog.cli import evaluate
from mtl_cog.config import Config, save_config
from mtl_cog.evaluation import assess, posthoc
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS
from mtl_cog.evaluation.predictions import Predictions, save_predictions
from mtl_cog.evaluation.scoring import score
from mtl_cog.reporting.posthoc_run import posthoc_method_names


def _predictions(n: int, seed: int) -> Predictions:
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2, (n, 2)).astype(np.float32)
    y = (rng.random((n, 2)) < 1 / (1 + np.exp(-z))).astype(np.int64)
    return Predictions(["a", "b"], [z[:, 0], z[:, 1]], [y[:, 0], y[:, 1]])


def test_an_add_on_reaches_the_evaluate_json_beside_the_scores(tmp_path, monkeypatch):
    def positives(context: assess.SplitContext) -> None:  # the share of positive labels: a known answer
        for name, labels in zip(context.predictions.task_names, context.predictions.labels):
            context.metrics["tasks"][name]["positives"] = float(np.mean(labels))
        context.metrics["mean"]["positives"] = float(np.mean(context.predictions.labels))

    monkeypatch.setattr(assess, "ADD_ONS", (*assess.ADD_ONS, positives))
    predictions = _predictions(200, 0)
    save_predictions(tmp_path / "p.npz", predictions)
    out = tmp_path / "m.json"
    metrics = evaluate.main(["--predictions", str(tmp_path / "p.npz"), "--bins", "15", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["tasks"]["b"]["positives"] == pytest.approx(predictions.labels[1].mean())
    assert written["mean"]["positives"] == pytest.approx(np.mean(predictions.labels))
    plain = score(predictions, [15], DEFAULT_PAIRS)  # every other number is score's, unchanged
    assert {k: v for k, v in metrics["mean"].items() if k != "positives"} == plain["mean"]


def test_certified_accuracy_needs_a_network_with_a_bound():
    predictions = _predictions(50, 1)
    settings = assess.AssessSettings([15], 10, [0.1])
    assert not any(k.startswith("cert_acc") for k in assess.assess(predictions, settings).metrics["mean"])


def test_post_hoc_methods_are_listed_once_in_the_order_their_rows_appear():
    assert posthoc_method_names() == ["ts", "ts_guo", "vs", "ms", "svs", "sms", "isotonic", "histogram", "stability"]
    assert posthoc.POSTHOC_METHODS == tuple(m for m in posthoc_method_names() if m != "stability")


def test_a_post_hoc_method_is_one_class_and_one_registry_entry(tmp_path, monkeypatch):
    class Halve(posthoc.PosthocCalibrator):  # logits / 2, whatever the validation set: a known answer
        def fit(self, val, images=None):
            return self

        def apply(self, predictions, images=None):
            return posthoc._with_logits(predictions, [z / 2 for z in predictions.logits])

    monkeypatch.setitem(posthoc.POSTHOC._items, "halve", Halve)  # what @POSTHOC.register("halve") does
    val, test = _predictions(300, 2), _predictions(200, 3)
    save_config(Config(), tmp_path / "config.yaml")
    save_predictions(tmp_path / "predictions_val.npz", val)
    save_predictions(tmp_path / "predictions_test.npz", test)
    (tmp_path / "DONE").write_text("best_epoch=1\n")  # a finished run (from before digests): readers need DONE
    results = evaluate.main(["--run", str(tmp_path), "--posthoc", "ts", "halve"])
    frame = pd.read_csv(tmp_path / "posthoc_metrics.csv")
    assert list(frame["method"].unique()) == ["none", "ts", "halve"]
    halved = Predictions(test.task_names, [z / 2 for z in test.logits], test.labels)
    assert results["halve"]["mean"]["nll"] == pytest.approx(score(halved, Config().eval.bins)["mean"]["nll"])
