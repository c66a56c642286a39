"""``synthetic``: the built-in multi-attribute data set, generated in seconds from its seed.

Each image is rendered from a latent vector u ~ N(0, I_m): every latent scales one fixed, smooth
random RGB pattern, plus pixel noise. Attribute t is drawn as y_t ~ Bernoulli(p_t(u)) with

    p_t(u) = sigmoid(s * (w_t . u + a_t * u_i u_j + b_t)),

a noisy logistic function of the latents with one pairwise interaction, so the labels carry
irreducible noise and the task keeps the true probabilities p_t (``SplitData.true_probs``). A model
can therefore be scored against the truth, not only against noisy labels. The training set is
small on purpose: long cross-entropy training memorises the label noise and becomes
overconfident, which is what calibration methods must fix.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from mtl_cog.data.task_api import (
    TASKS,
    ReadBlocks,
    SplitSource,
    TaskSource,
    TaskSpec,
    block_length,
    capped_sizes,
    check_generation_memory,
)


def _patterns(num_latents: int, size: int, rng: np.random.Generator) -> torch.Tensor:
    """One smooth RGB pattern per latent: random 4x4 fields upsampled bicubically, unit RMS."""
    coarse = torch.from_numpy(rng.standard_normal((num_latents, 3, 4, 4)).astype(np.float32))
    fine = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    return fine / fine.pow(2).mean(dim=(1, 2, 3), keepdim=True).sqrt()


def _render(latents: np.ndarray, patterns: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    mix = torch.einsum("nm,mchw->nchw", torch.from_numpy(latents.astype(np.float32)), patterns)
    noise = torch.from_numpy(rng.standard_normal(mix.shape).astype(np.float32))
    image = 0.5 + 0.09 * mix + 0.04 * noise
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


def _render_blocks(latents: np.ndarray, patterns: torch.Tensor, noise_state: dict, size: int) -> ReadBlocks:
    """``read_blocks`` rendering whole blocks in order, each drawing its pixel noise next from one stream.

    The noise generator restarts from ``noise_state`` on every call, and a block is always rendered
    whole (a short ``stop`` only trims the last one), so image i is the same for every ``stop``.
    """

    def read_blocks(stop: int) -> Iterator[np.ndarray]:
        rng = np.random.default_rng()
        rng.bit_generator.state = noise_state
        step = block_length(size)
        for start in range(0, min(stop, len(latents)), step):
            block = _render(latents[start : start + step], patterns, rng).numpy()
            yield block[: stop - start]

    return read_blocks


def _check_memory(cfg, data_cfg) -> None:
    """Each split's latents, logits, probabilities and labels are generated at once, as float64 and int64:
    about (num_latents + 4 * num_attributes) * 8 bytes per sample."""
    samples = cfg.train_size + cfg.val_size + cfg.test_size
    check_generation_memory(samples, (cfg.num_latents + 4 * cfg.num_attributes) * 8, data_cfg.image_size,
                            data_cfg.use_cache, "data.synthetic")


class SyntheticTask:
    def open(self, data_cfg) -> TaskSource:
        cfg = data_cfg.synthetic
        m, T = cfg.num_latents, cfg.num_attributes
        _check_memory(cfg, data_cfg)
        rng = np.random.default_rng(cfg.seed)
        patterns = _patterns(m, data_cfg.image_size, rng)
        weights = rng.standard_normal((T, m)) / np.sqrt(m) * 1.3
        pair = rng.integers(0, m, size=(T, 2))
        pair_scale = rng.uniform(-0.6, 0.6, size=T)
        bias = rng.uniform(-1.0, 1.0, size=T)

        splits = {}
        for name, size in (("train", cfg.train_size), ("val", cfg.val_size), ("test", cfg.test_size)):
            split_rng = np.random.default_rng([cfg.seed, {"train": 0, "val": 1, "test": 2}[name]])
            latents = split_rng.standard_normal((size, m))
            logits = latents @ weights.T + pair_scale * latents[:, pair[:, 0]] * latents[:, pair[:, 1]] + bias
            probs = 1.0 / (1.0 + np.exp(-cfg.label_sharpness * logits))
            labels = (split_rng.random(probs.shape) < probs).astype(np.int64)
            # The pixel noise continues split_rng's stream, as when all images were rendered at once.
            noise_state = split_rng.bit_generator.state
            splits[name] = SplitSource(
                labels=labels,
                read_blocks=_render_blocks(latents, patterns, noise_state, data_cfg.image_size),
                true_probs=probs.astype(np.float32),
            )
        spec = TaskSpec(
            dataset="synthetic",
            task_names=tuple(f"attr{t:02d}" for t in range(T)),
            num_classes=(2,) * T,
            mean=(0.5, 0.5, 0.5),
            std=(0.12, 0.12, 0.12),
            pad_crop=0,  # the latents are position-bound patterns: shifting would change them
            hflip=False,
        )
        return TaskSource(spec, data_cfg.image_size, splits)

    def split_sizes(self, data_cfg) -> dict[str, int]:
        s = data_cfg.synthetic
        return capped_sizes({"train": s.train_size, "val": s.val_size, "test": s.test_size}, data_cfg.max_samples)

    def num_tasks(self, data_cfg) -> int:
        return data_cfg.synthetic.num_attributes

    def source_files(self, data_cfg) -> list:
        return []


TASKS.register("synthetic")(SyntheticTask())
