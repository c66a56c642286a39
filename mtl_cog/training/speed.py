"""Speed options of ``TrainConfig`` that Accelerate does not apply itself: channels_last, compile.

Mixed precision goes through Accelerate (``create_accelerator(precision=...)``); the training
split can live on the GPU (``mtl_cog.data.batches.place_split``). What is left is here:

- ``train.channels_last``: parameters and every input batch in NHWC, the layout cuDNN's tensor
  core convolutions want (no transposes inside each conv). A forward pre-hook converts the
  batch, so training and evaluation get it without touching the step code.
- ``train.compile``: ``nn.Module.compile`` compiles the network *in place*. We do not use
  Accelerate's ``dynamo_backend``: it wraps the model in an ``OptimizedModule`` whose
  ``state_dict`` keys gain an ``_orig_mod.`` prefix and which ``unwrap_model`` keeps by default,
  so checkpoints would no longer load into an uncompiled network (``scripts/evaluate.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from mtl_cog.config import TrainConfig


def apply_speed_options(network: nn.Module, train_cfg: TrainConfig) -> nn.Module:
    """The same network, in channels_last and/or compiled as the config asks (call before prepare).

    Asking for either also lets cuDNN autotune its convolution algorithms: the input size is fixed
    within a run, so the one-off search pays back; it trades bitwise run-to-run determinism for speed.
    """
    if train_cfg.channels_last or train_cfg.compile:
        torch.backends.cudnn.benchmark = True
    if train_cfg.channels_last:
        network = network.to(memory_format=torch.channels_last)
        network.register_forward_pre_hook(_to_channels_last)
    if train_cfg.compile:
        network.compile()  # in place: the module, its class and its state_dict keys stay the same
    return network


def _to_channels_last(module: nn.Module, args: tuple) -> tuple:
    images, *rest = args
    if images.dim() == 4:
        images = images.contiguous(memory_format=torch.channels_last)
    return (images, *rest)
