"""The epoch check's FLOP count must leave ``--compile`` alone.

``flops_per_image`` runs under ``FlopCounterMode``, a TorchDispatchMode. Were it the first call of a
network compiled in place, dynamo would meet the mode on that call; torch 2.11 then ran the frame
eagerly and marked its code skipped for good, so the timed epoch was never compiled (GPU check:
``counters["frames"]`` stayed empty, warm-up 0.6 s). Newer torch skips the frame only once, so the
test looks at the cause, on any version: dynamo must not be handed a frame of the network during the
count, and the network's first call after it must be converted.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.convert_frame import input_codes  # every code object dynamo's frame callback was handed
from torch._dynamo.utils import counters

from mtl_cog.benchmarks.common import NUM_TASKS, Workload, method_config, random_split
from mtl_cog.benchmarks.epoch_check import flops_per_image
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.models.network import build_network
from mtl_cog.objectives.base import build_objective
from mtl_cog.training.step import batch_loss

TINY = Workload(backbone="cog_cnn_tiny", image_size=16, batch_size=4)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()  # forget what earlier tests compiled or skipped (input_codes starts empty)
    yield
    torch._dynamo.reset()


def _tiny_step(compiled: bool):
    """The epoch check's network and loss (COG-FC, tiny CNN), compiled in place as ``train.compile`` does
    (``backend="eager"``: dynamo traces, no code generation, so the test takes seconds), and one batch."""
    cfg = method_config(CONFIGS / "methods", "cog_fc", TINY)
    layout = LogitLayout((2,) * NUM_TASKS)
    torch.manual_seed(0)
    network = build_network(cfg.model, cfg.method, layout)
    if compiled:
        network.compile(backend="eager")
    split = random_split(TINY.batch_size, TINY.image_size, NUM_TASKS, seed=0)
    return network, build_objective(layout, cfg.method), split.images.float() / 255, split.labels


def test_flop_count_leaves_the_first_compiled_call_to_training(fresh_dynamo):
    network, objective, images, labels = _tiny_step(compiled=True)
    forward = type(network).forward.__code__
    flops = flops_per_image(network, objective, images, labels)
    assert flops > 0
    assert forward not in input_codes, "the FLOP count handed the compiled network to dynamo"
    assert network._compiled_call_impl is not None  # still compiled after the count
    converted = counters["frames"]["ok"]
    batch_loss(network, objective, images, labels).backward()  # the training step's first call
    assert forward in input_codes and counters["frames"]["ok"] > converted, "the network was not compiled"


def test_flop_count_is_the_same_with_and_without_compile(fresh_dynamo):
    counts = [flops_per_image(*_tiny_step(compiled)) for compiled in (False, True)]
    assert counts[0] > 0 and counts[1] == counts[0]
