"""Decoded images -> the uint8 (S, S, 3) arrays every task stores: torchvision's Resize(S) + CenterCrop(S).

Written against PIL directly (no torchvision transform objects) so that a reader and
``mtl_cog.runs.trained.TrainedRun.predict_proba`` produce byte-identical pixels.
"""

from __future__ import annotations

import numpy as np
from PIL import Image


def resize_center_crop(img: Image.Image, size: int) -> np.ndarray:
    """RGB, shorter side to ``size`` (bilinear), centre crop to ``size`` x ``size`` -> (size, size, 3) uint8."""
    img = img.convert("RGB")  # forces a full decode: truncated files fail here
    w, h = img.size
    # Resize(int): the shorter side becomes `size`, the longer one int(size * long / short).
    if w <= h:
        new_w, new_h = size, int(size * h / w)
    else:
        new_w, new_h = int(size * w / h), size
    if (new_w, new_h) != (w, h):
        img = img.resize((new_w, new_h), Image.BILINEAR)
    # CenterCrop: Python's round(), as torchvision uses, for the top/left offsets.
    top = round((new_h - size) / 2.0)
    left = round((new_w - size) / 2.0)
    img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8)
