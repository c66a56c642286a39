"""mtl_cog: accurate and calibrated (multi-task) networks in one training run (COG).

``load_run(run_dir)`` opens a finished run for prediction (``mtl_cog.runs.trained``); training
is ``mtl_cog.training.fit(cfg)``; the commands are ``mtl_cog.cli``. The layers are described
in ``docs/explanation/architecture.md``.

The root imports nothing: ``load_run`` and ``TrainedRun`` are loaded on first access (PEP 562's
module ``__getattr__``), so ``import mtl_cog.errors`` or ``mtl_cog.config`` costs neither torch's
model zoo (timm) nor the data sets, and the root sits in no layer of its own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it; read by ``__getattr__`` and by tests/test_architecture.py
LAZY_EXPORTS = {"TrainedRun": "mtl_cog.runs.trained", "load_run": "mtl_cog.runs.trained"}
__all__ = ["TrainedRun", "__version__", "load_run"]

if TYPE_CHECKING:  # static checkers and IDEs see the real names; nothing is imported at run time
    from mtl_cog.runs.trained import TrainedRun, load_run


def __getattr__(name: str) -> object:
    if name not in LAZY_EXPORTS:
        raise AttributeError(f"module 'mtl_cog' has no attribute {name!r}")
    value = getattr(importlib.import_module(LAZY_EXPORTS[name]), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY_EXPORTS])
