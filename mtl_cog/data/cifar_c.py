"""CIFAR-10-C's 15 corruptions at CIFAR-10-C's own severities (Hendrycks & Dietterich, ICLR 2019).

``imagecorruptions`` (mtl_cog.data.shift's ``imagenetc`` suite) hard-codes ImageNet-C's parameters,
made for 224 px pictures; CIFAR-10-C was made by the authors' ``make_cifar_c.py`` with milder
parameters and 32 px versions of some steps (zoom crop, frost scale, elastic affine). Those are
the facts written out here, per corruption and severity (``PARAMETERS``), in our own code:

- numpy / scipy / scikit-image / OpenCV / Pillow steps as the script uses them, on one HxWx3
  uint8 picture, the result truncated to uint8 as the script's ``np.uint8(...)`` does;
- motion blur (also inside snow): the script calls ImageMagick's ``MotionBlurImage`` through Wand.
  ``motion_blur`` here is that filter written out (ImageMagick's ``effect.c``): a one-sided
  Gaussian kernel of width 2 ceil(radius) + 1 over the pixels at offsets
  (ceil(i sin(a) - 0.5), ceil(i cos(a) - 0.5)) along the angle, edge pixels repeated (ImageMagick's
  default virtual pixels). It needs no ImageMagick; what it does not reproduce is ImageMagick's
  PNG round trip (none: the input is uint8 already) and its quantum rounding (a uint8 result);
- frost: the frost pictures are those shipped with ``imagecorruptions`` (the ImageNet-C files;
  the CIFAR script picks among the first five, scaled by 0.2);
- the random draws come from numpy's global generator, which the caller seeds per picture
  (mtl_cog.data.shift.image_seed), as the script's draws do.

Sides other than 32 px: the steps that the script writes for 32 px (glass blur's loop, fog's
plasma map, frost's crop, the elastic affine's scale) use the picture's side; the caller pads
pictures below 32 px to 32 (mtl_cog.data.shift).
"""

from __future__ import annotations

import functools
import importlib.resources
import math
from io import BytesIO

import cv2
import numpy as np
import skimage as sk
from PIL import Image
from scipy.ndimage import map_coordinates
from scipy.ndimage import zoom as scizoom
from skimage.filters import gaussian

# make_cifar_c.py's parameters, severity 1..5 (tuples as the script's ``c``)
PARAMETERS: dict[str, list] = {
    "gaussian_noise": [0.04, 0.06, 0.08, 0.09, 0.10],
    "shot_noise": [500, 250, 100, 75, 50],
    "impulse_noise": [0.01, 0.02, 0.03, 0.05, 0.07],
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
    "zoom_blur": [(1.0, 1.06, 0.01), (1.0, 1.11, 0.01), (1.0, 1.16, 0.01), (1.0, 1.21, 0.01), (1.0, 1.26, 0.01)],
    "snow": [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9), (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
             (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85), (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
    "fog": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
    "brightness": [0.05, 0.1, 0.15, 0.2, 0.3],
    "contrast": [0.75, 0.5, 0.4, 0.3, 0.15],
    # elastic: (alpha, sigma, affine) as fractions of the side (the script's IMSIZE * ...)
    "elastic_transform": [(0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03)],
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],
    "jpeg_compression": [80, 65, 58, 50, 40],
}
FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg")  # the script's randint(5)


def corrupt_cifar(image: np.ndarray, name: str, severity: int) -> np.ndarray:
    """One HxWx3 uint8 picture under ``name`` at CIFAR-10-C's ``severity`` (1..5) -> HxWx3 uint8."""
    c = PARAMETERS[name][severity - 1]
    out = CORRUPTIONS[name](image, c)
    return np.uint8(np.clip(out, 0, 255))  # the script's np.uint8: truncation


def _unit(image: np.ndarray) -> np.ndarray:
    return np.asarray(image, dtype=np.float64) / 255.0


def gaussian_noise(x, c):
    x = _unit(x)
    return np.clip(x + np.random.normal(size=x.shape, scale=c), 0, 1) * 255


def shot_noise(x, c):
    x = _unit(x)
    return np.clip(np.random.poisson(x * c) / c, 0, 1) * 255


def impulse_noise(x, c):
    # scikit-image's salt & pepper draws from its own generator: seeded from numpy's (seeded per picture)
    noisy = sk.util.random_noise(_unit(x), mode="s&p", amount=c, rng=int(np.random.randint(2**31)))
    return np.clip(noisy, 0, 1) * 255


def gaussian_blur_sigma(x, sigma):
    return gaussian(x, sigma=sigma, channel_axis=-1)


def defocus_blur(x, c):
    from imagecorruptions.corruptions import disk  # here: the package loads numba (seconds) on import

    kernel = disk(radius=c[0], alias_blur=c[1])
    x = _unit(x)
    channels = [cv2.filter2D(x[:, :, d], -1, kernel) for d in range(3)]
    return np.clip(np.stack(channels, axis=2), 0, 1) * 255


def glass_blur(x, c):
    sigma, delta, iterations = c
    x = np.uint8(gaussian_blur_sigma(_unit(x), sigma) * 255)
    side = x.shape[0]
    span = np.arange(side - delta, delta, -1)  # bottom-right to top-left, as the script's loops
    h, w = (np.tile(np.repeat(span, len(span)), iterations), np.tile(np.tile(span, len(span)), iterations))
    # the script's (dx, dy) pairs, drawn in one call: the same sequence as one randint(size=2) per spot
    moves = np.random.randint(-delta, delta, size=(len(h), 2))
    _swap_pixels(x.reshape(side * side, -1), h * side + w, (h + moves[:, 1]) * side + w + moves[:, 0])
    return np.clip(gaussian_blur_sigma(x / 255.0, sigma), 0, 1) * 255


def _swap_pixels_python(pixels: np.ndarray, here: np.ndarray, there: np.ndarray) -> None:
    """Swap rows here[i] and there[i] of ``pixels`` in order (the local shuffle of glass blur), in place."""
    for i in range(len(here)):
        for k in range(pixels.shape[1]):
            pixels[here[i], k], pixels[there[i], k] = pixels[there[i], k], pixels[here[i], k]


try:  # numba (installed with imagecorruptions) compiles the sequential swaps: ~100x the Python loop
    from numba import njit

    _swap_pixels = njit(cache=False)(_swap_pixels_python)
except ImportError:  # pragma: no cover - the same swaps, slower
    _swap_pixels = _swap_pixels_python


def motion_kernel(radius: float, sigma: float, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """ImageMagick's MotionBlurImage: weights (width,) and integer (dy, dx) offsets (width, 2) along ``angle``."""
    width = 2 * math.ceil(radius) + 1  # GetOptimalKernelWidth1D for radius > 0
    weights = np.exp(-(np.arange(width) ** 2) / (2.0 * sigma**2))
    weights /= weights.sum()
    y, x = width * math.sin(math.radians(angle)), width * math.cos(math.radians(angle))
    hypotenuse = math.hypot(x, y)
    offsets = np.array([[math.ceil(i * y / hypotenuse - 0.5), math.ceil(i * x / hypotenuse - 0.5)]
                        for i in range(width)], dtype=np.int64)
    return weights, offsets


def motion_blur_image(x: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """HxW(xC) float -> the same, blurred; pixels outside the picture repeat its edge."""
    weights, offsets = motion_kernel(radius, sigma, angle)
    rows, cols = np.arange(x.shape[0]), np.arange(x.shape[1])
    out = np.zeros_like(x, dtype=np.float64)
    for weight, (dy, dx) in zip(weights, offsets):
        out += weight * x[np.clip(rows + dy, 0, len(rows) - 1)][:, np.clip(cols + dx, 0, len(cols) - 1)]
    return out


def motion_blur(x, c):
    return motion_blur_image(np.asarray(x, dtype=np.float64), c[0], c[1], np.random.uniform(-45, 45))


def clipped_zoom(img: np.ndarray, factor: float) -> np.ndarray:
    """The script's 32 px zoom: the centre ceil(h / factor) square, zoomed (linear), its centre h kept."""
    h = img.shape[0]
    ch = int(np.ceil(h / factor))
    top = (h - ch) // 2
    img = scizoom(img[top:top + ch, top:top + ch], (factor, factor, 1), order=1)
    trim = (img.shape[0] - h) // 2
    return img[trim:trim + h, trim:trim + h]


def zoom_blur(x, c):
    factors = np.arange(*c)
    x = _unit(x).astype(np.float32)
    out = np.zeros_like(x)
    for factor in factors:
        out += clipped_zoom(x, factor)
    return np.clip((x + out) / (len(factors) + 1), 0, 1) * 255


def snow(x, c):
    x = _unit(x).astype(np.float32)
    layer = np.random.normal(size=x.shape[:2], loc=c[0], scale=c[1])
    layer = clipped_zoom(layer[..., np.newaxis], c[2])
    layer[layer < c[3]] = 0
    layer = (np.clip(layer.squeeze(), 0, 1) * 255).astype(np.uint8)  # the script's 8-bit grey picture
    layer = motion_blur_image(layer.astype(np.float64), c[4], c[5], np.random.uniform(-135, -45))
    layer = np.uint8(np.clip(layer, 0, 255))[..., np.newaxis] / 255.0  # ImageMagick returns 8 bits
    grey = cv2.cvtColor(x, cv2.COLOR_RGB2GRAY).reshape(*x.shape[:2], 1)
    x = c[6] * x + (1 - c[6]) * np.maximum(x, grey * 1.5 + 0.5)
    return np.clip(x + layer + np.rot90(layer, k=2), 0, 1) * 255


@functools.cache
def _frost_picture(index: int) -> np.ndarray:
    """Frost picture ``index``, scaled by 0.2 as the script does (read once per process)."""
    ref = importlib.resources.files("imagecorruptions") / "frost" / FROST_FILES[index]
    with importlib.resources.as_file(ref) as path:
        return cv2.resize(cv2.imread(str(path)), (0, 0), fx=0.2, fy=0.2)


def frost(x, c):
    picture = _frost_picture(np.random.randint(len(FROST_FILES)))
    side = x.shape[0]
    top, left = np.random.randint(0, picture.shape[0] - side), np.random.randint(0, picture.shape[1] - side)
    crop = picture[top:top + side, left:left + side][..., [2, 1, 0]]  # BGR -> RGB
    return np.clip(c[0] * np.asarray(x, dtype=np.float64) + c[1] * crop, 0, 255)


def fog(x, c):
    from imagecorruptions.corruptions import plasma_fractal  # here: the package loads numba (seconds) on import

    x = _unit(x)
    side = x.shape[0]
    mapsize = 1 << max(side - 1, 1).bit_length()  # the script's 32 for 32 px
    peak = x.max()
    x = x + c[0] * plasma_fractal(mapsize=mapsize, wibbledecay=c[1])[:side, :side][..., np.newaxis]
    return np.clip(x * peak / (peak + c[0]), 0, 1) * 255


def brightness(x, c):
    hsv = sk.color.rgb2hsv(_unit(x))
    hsv[:, :, 2] = np.clip(hsv[:, :, 2] + c, 0, 1)
    return np.clip(sk.color.hsv2rgb(hsv), 0, 1) * 255


def contrast(x, c):
    x = _unit(x)
    means = np.mean(x, axis=(0, 1), keepdims=True)
    return np.clip((x - means) * c + means, 0, 1) * 255


def elastic_transform(x, c):
    side = x.shape[0]
    alpha, sigma, affine = (v * side for v in c)
    image = _unit(x).astype(np.float32)
    shape = image.shape
    centre = np.float32(shape[:2]) // 2
    square = min(shape[:2]) // 3
    pts1 = np.float32([centre + square, [centre[0] + square, centre[1] - square], centre - square])
    pts2 = pts1 + np.random.uniform(-affine, affine, size=pts1.shape).astype(np.float32)
    image = cv2.warpAffine(image, cv2.getAffineTransform(pts1, pts2), shape[1::-1],
                           borderMode=cv2.BORDER_REFLECT_101)
    dx = (gaussian(np.random.uniform(-1, 1, size=shape[:2]), sigma, mode="reflect", truncate=3) * alpha)
    dy = (gaussian(np.random.uniform(-1, 1, size=shape[:2]), sigma, mode="reflect", truncate=3) * alpha)
    dx, dy = dx.astype(np.float32)[..., np.newaxis], dy.astype(np.float32)[..., np.newaxis]
    xs, ys, zs = np.meshgrid(np.arange(shape[1]), np.arange(shape[0]), np.arange(shape[2]))
    indices = np.reshape(ys + dy, (-1, 1)), np.reshape(xs + dx, (-1, 1)), np.reshape(zs, (-1, 1))
    return np.clip(map_coordinates(image, indices, order=1, mode="reflect").reshape(shape), 0, 1) * 255


def pixelate(x, c):
    side = x.shape[0]
    picture = Image.fromarray(np.asarray(x, dtype=np.uint8))
    small = picture.resize((int(side * c), int(side * c)), Image.BOX)
    return np.asarray(small.resize((side, side), Image.BOX), dtype=np.float64)


def jpeg_compression(x, c):
    output = BytesIO()
    Image.fromarray(np.asarray(x, dtype=np.uint8)).save(output, "JPEG", quality=c)
    return np.asarray(Image.open(output), dtype=np.float64)


CORRUPTIONS = {
    "gaussian_noise": gaussian_noise, "shot_noise": shot_noise, "impulse_noise": impulse_noise,
    "defocus_blur": defocus_blur, "glass_blur": glass_blur, "motion_blur": motion_blur, "zoom_blur": zoom_blur,
    "snow": snow, "frost": frost, "fog": fog, "brightness": brightness, "contrast": contrast,
    "elastic_transform": elastic_transform, "pixelate": pixelate, "jpeg_compression": jpeg_compression,
}
