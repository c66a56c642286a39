"""mtl_cog: accurate and calibrated (multi-task) networks in one training run (COG).

``load_run(run_dir)`` opens a finished run for prediction (``mtl_cog.runs.trained``); training
is ``mtl_cog.training.fit(cfg)``; the commands are ``mtl_cog.cli``. The layers are described
in ``docs/architecture.md``.
"""

from mtl_cog.runs.trained import TrainedRun, load_run

__version__ = "0.1.0"
__all__ = ["TrainedRun", "__version__", "load_run"]
