import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture
def tiny_overrides(tmp_path):
    """Overrides that make a training run take seconds on the CPU."""
    return [
        f"output_dir={tmp_path / 'runs'}",
        "tracking=none",
        "train.epochs=2",
        "train.batch_size=32",
        "train.eval_batch_size=64",
        "model.backbone=cog_cnn_tiny",
        "data.synthetic.num_attributes=5",
        "data.synthetic.train_size=96",
        "data.synthetic.val_size=50",
        "data.synthetic.test_size=37",
    ]


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate keeps one process-wide state whose mixed precision cannot change once set: start
    and leave each test without one, so tests creating bf16 and fp32 accelerators can share a process."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
