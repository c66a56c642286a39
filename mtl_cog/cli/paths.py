"""Where the shipped configs are: ``configs/`` of the clone (editable install) or ``$MTL_COG_CONFIGS``."""

from __future__ import annotations

import os
from pathlib import Path

# The package lives in <clone>/mtl_cog; configs/ sits beside it. An installed copy without the
# clone can point MTL_COG_CONFIGS at a configs folder.
CONFIGS = Path(os.environ.get("MTL_COG_CONFIGS", Path(__file__).resolve().parents[2] / "configs"))
