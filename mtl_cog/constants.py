"""Constants shared by several layers, defined once."""

DEFAULT_BINS = (5, 10, 15, 20, 50)  # bin counts of every calibration error (eval.bins, --bins)
SUMMARY_BINS = 15  # the bin count shown in console tables, summary.md and figures
# A learned calibrator whose every parameter ends this close to its identity value did not calibrate
# (e.g. temperatures within 0.995-1.002 after a whole run); the values it is compared with, per parameter.
IDENTITY_TOLERANCE = 0.01
IDENTITY_VALUES = {"temperature": 1.0, "scale": 1.0, "bias": 0.0, "matrix": 1.0, "matrix (diagonal)": 1.0}
# A label that is not known (partly labelled multi-task data): PyTorch's ``ignore_index`` convention.
# Not -1: CelebA's own files write -1 for "no", so -1 must never mean "missing" anywhere.
MISSING_LABEL = -100
# The 15 corruptions of Hendrycks & Dietterich's benchmark (ICLR 2019; ImageNet-C, CIFAR-10-C), in their order:
# noise, blur, weather, digital. eval.shift and ``evaluate --shift`` name them (mtl_cog.data.shift).
CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)
SEVERITIES = (1, 2, 3, 4, 5)
# whose severity parameters a corruption uses (mtl_cog.data.shift): CIFAR-10-C's script (32 px pictures) or
# ImageNet-C's (224 px); "auto" picks cifar10c for pictures <= AUTO_SUITE_MAX_SIDE px, imagenetc above
SHIFT_SUITES = ("cifar10c", "imagenetc")
AUTO_SUITE_MAX_SIDE = 64
