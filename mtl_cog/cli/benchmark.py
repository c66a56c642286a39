"""benchmark: speed and memory, measured side by side in one process; JSON + a table with the targets.

    python scripts/benchmark.py --out bench.json                 # the full CPU/GPU benchmark
    python scripts/benchmark.py --quick --out bench.json         # seconds; what the test suite runs
    python scripts/benchmark.py --method baseline,cog_fc,cog_ts,cog_tst --skip loader,calibrated,eval,memory
    python scripts/benchmark.py --epoch-check --out epoch.json   # one epoch on CelebA-sized tensors
                                                                 # (scripts/gpu_check.sh calls this)

Sections (each one module of ``mtl_cog/benchmarks/``; ``--skip`` leaves some out):

- ``steps``: median training-step time of each ``--method`` config over the baseline's
  (``<method>_step_ratio``; target <= 1.03 for COG-FC / COG-TS, <= 1.10 for others, <= 1.30 for
  a method under a multi-task aggregator, ``--method baseline+upgrad,baseline+mgda``), and the
  baseline's training ``images_per_s``;
- ``speed_options``: the baseline's step under fp32 / bf16 (/ fp16 on CUDA) x NCHW / channels_last,
  side by side: each combination's ``speedup`` over fp32-NCHW on this machine;
- ``throughput``: training images/s of each ``--throughput-backbones`` backbone;
- ``loader``: the cached data pipeline's images/s over a torchvision + PIL DataLoader on a
  CelebA-format JPEG folder (``loader_speedup``; target >= 30);
- ``calibrated``: wall time to a calibrated 40-task model, COG-FC over baseline + post-hoc TS +
  TST second stage (``calibrated_model_time_ratio``);
- ``eval``: seconds for all metrics of 40 tasks x 20,000 predictions x 5 bin counts;
- ``memory``: peak RSS of a CelebA-sized cache read for a whole epoch, above the model's own
  (target <= 1 GiB).

docs/guides/benchmarks.md explains each measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mtl_cog.benchmarks.cache_memory import celeba_proportions, measure_cache_memory
from mtl_cog.benchmarks.calibrated_time import measure_calibrated_time
from mtl_cog.benchmarks.common import CELEBA_SPLITS, Workload, method_config, peak_rss_bytes
from mtl_cog.benchmarks.epoch_check import epoch_check
from mtl_cog.benchmarks.eval_cost import measure_eval
from mtl_cog.benchmarks.loader import MIN_JPEG_IMAGES, measure_loader
from mtl_cog.benchmarks.speed_options import measure_speed_options
from mtl_cog.benchmarks.step_ratio import DEFAULT_METHODS, measure_step_ratios, methods_to_time, ratio_key
from mtl_cog.benchmarks.throughput import measure_throughput
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config.arguments import Parser, add_deprecated_alias, real_number, whole_number
from mtl_cog.errors import ConfigError, run_cli
from mtl_cog.io import atomic_write_json
from mtl_cog.models.network import check_backbone

METHODS_DIR = CONFIGS / "methods"
SECTIONS = ("steps", "speed_options", "throughput", "loader", "calibrated", "eval", "memory")


@dataclass(frozen=True)
class Sizes:
    """How much work each section does: ``--quick`` (seconds, for the tests) or the full benchmark."""

    backbone: str
    batch_size: int
    steps: int
    warmup: int
    throughput_steps: int
    jpeg_images: int
    torchvision_epochs: int
    cached_seconds: float
    cal_train: int
    cal_val: int
    cal_epochs: int
    eval_samples: int
    cache_images: int


QUICK = Sizes(backbone="cog_cnn_tiny", batch_size=8, steps=2, warmup=1, throughput_steps=1, jpeg_images=20,
              torchvision_epochs=1, cached_seconds=0.1, cal_train=16, cal_val=16, cal_epochs=1, eval_samples=500,
              cache_images=300)
FULL = Sizes(backbone="cog_cnn_small", batch_size=128, steps=40, warmup=5, throughput_steps=3, jpeg_images=2000,
             torchvision_epochs=2, cached_seconds=3.0, cal_train=2048, cal_val=1024, cal_epochs=2,
             eval_samples=20_000, cache_images=sum(CELEBA_SPLITS.values()))


positive_int = whole_number(1, None, "a positive integer")
positive_float = real_number(0, None, low_open=True, what="a positive number")


def names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that everything runs (seconds)")
    parser.add_argument("--epoch-check", action="store_true", help="only the one-epoch throughput check")
    parser.add_argument("--method", type=names, default=list(DEFAULT_METHODS),
                        help="comma-separated configs/methods/ names whose step is timed against the baseline "
                        f"(default {','.join(DEFAULT_METHODS)})")
    add_deprecated_alias(parser, "--methods", "--method", type=names)
    parser.add_argument("--backbone", default=None, help="timm model (default cog_cnn_small; cog_cnn_tiny with "
                        "--quick; resnet101 for --epoch-check)")
    parser.add_argument("--cifar-stem", action="store_true", help="3x3 stride-1 ResNet stem (32x32 images)")
    parser.add_argument("--image-size", type=positive_int, default=32)
    parser.add_argument("--batch-size", type=positive_int, default=None)
    parser.add_argument("--precision", default="no", choices=["no", "bf16", "fp16"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--steps", type=positive_int, default=None, help="timed steps per method")
    parser.add_argument("--profile", type=whole_number(0, None, "steps >= 0"), default=0,
                        help="profile this many steps of COG-TS (or of the last --method name) with torch.profiler")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--throughput-backbones", type=names, default=None,
                        help="comma-separated extra backbones for images/s")
    parser.add_argument("--jpeg-images", type=positive_int, default=None, help="size of the CelebA-format JPEG folder")
    parser.add_argument("--cache-images", type=positive_int, default=None, help="images in the cache-memory check")
    parser.add_argument("--num-images", type=positive_int, default=sum(CELEBA_SPLITS.values()),
                        help="--epoch-check size")
    parser.add_argument("--warmup-steps", type=positive_int, default=10, help="--epoch-check: untimed steps first")
    parser.add_argument("--peak-tflops", type=positive_float, default=None,
                        help="the card's bf16 peak, if not in the table")
    parser.add_argument("--skip", type=names, default=[],
                        help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    return parser.parse_args(argv)


def workload_of(args: argparse.Namespace) -> Workload:
    if args.epoch_check:
        backbone, batch = args.backbone or "resnet101", args.batch_size or 256
    else:
        sizes = QUICK if args.quick else FULL
        backbone, batch = args.backbone or sizes.backbone, args.batch_size or sizes.batch_size
    return Workload(backbone=backbone, cifar_stem=args.cifar_stem, image_size=args.image_size, batch_size=batch,
                    precision=args.precision, channels_last=args.channels_last, compile=args.compile)


def check_request(args: argparse.Namespace, workload: Workload) -> None:
    """Refuse a bad request before minutes of measuring: unknown sections or methods, sizes, --out."""
    unknown = [s for s in args.skip if s not in SECTIONS]
    if unknown:
        raise ConfigError(f"--skip: unknown section(s) {', '.join(unknown)}. Sections: {', '.join(SECTIONS)}.")
    if not 8 <= args.image_size <= 512:
        raise ConfigError(f"--image-size must be in [8, 512]. Got {args.image_size}.")
    if args.jpeg_images is not None and args.jpeg_images < MIN_JPEG_IMAGES:
        raise ConfigError(f"--jpeg-images must be >= {MIN_JPEG_IMAGES} (80/10/10 partition). Got {args.jpeg_images}.")
    check_backbone(workload.backbone, "--backbone")
    if not args.epoch_check and "throughput" not in args.skip:
        for backbone in throughput_backbones(args):
            check_backbone(backbone, "--throughput-backbones")
    if args.cache_images is not None:
        celeba_proportions(args.cache_images)  # refuses fewer images than splits
    if not args.epoch_check and "steps" not in args.skip:
        for method in methods_to_time(args.method):
            method_config(METHODS_DIR, method, workload)  # unknown names and bad values fail now
    if args.out is not None:
        folder = args.out.resolve().parent
        if args.out.is_dir():
            raise ConfigError(f"--out {args.out} is a folder; name a JSON file.")
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise ConfigError(f"--out {args.out}: the folder {folder} does not exist or is not writable.")


def throughput_backbones(args: argparse.Namespace) -> list[str]:
    if args.throughput_backbones is not None:
        return args.throughput_backbones
    return ["cog_cnn_tiny"] if args.quick else ["resnet18"]


def sections(args: argparse.Namespace, workload: Workload, work: Path) -> dict[str, Callable[[], dict]]:
    sizes = QUICK if args.quick else FULL
    return {
        "steps": lambda: measure_step_ratios(workload, METHODS_DIR, args.method, args.steps or sizes.steps,
                                             sizes.warmup, args.profile),
        "speed_options": lambda: measure_speed_options(workload, METHODS_DIR, args.steps or sizes.steps, sizes.warmup),
        "throughput": lambda: {"throughput": [
            measure_throughput(workload.with_backbone(b), METHODS_DIR, sizes.throughput_steps)
            for b in throughput_backbones(args)]},
        "loader": lambda: measure_loader(work, args.jpeg_images or sizes.jpeg_images, workload.image_size,
                                         workload.batch_size, sizes.torchvision_epochs, sizes.cached_seconds),
        "calibrated": lambda: measure_calibrated_time(workload, METHODS_DIR, work / "calibrated", sizes.cal_train,
                                                      sizes.cal_val, sizes.cal_epochs),
        "eval": lambda: measure_eval(sizes.eval_samples),
        "memory": lambda: {"cache_memory": measure_cache_memory(workload, METHODS_DIR, work,
                                                                args.cache_images or sizes.cache_images)},
    }


def run_benchmark(args: argparse.Namespace, workload: Workload) -> dict:
    result: dict = {"quick": args.quick, "device": "cuda" if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "loadavg_start": os.getloadavg(), "section_seconds": {}}
    with tempfile.TemporaryDirectory(prefix="mtl_cog_bench_") as tmp:
        for name, section in sections(args, workload, Path(tmp)).items():
            if name in args.skip:
                continue
            print(f"[benchmark] {name} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            with contextlib.redirect_stdout(sys.stderr):  # training progress lines; stdout carries the table
                result.update(section())
            result["section_seconds"][name] = time.perf_counter() - start
    result["peak_rss_bytes"] = peak_rss_bytes()
    if torch.cuda.is_available():
        result["gpu_max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
    result["loadavg_end"] = os.getloadavg()
    return result


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def format_table(result: dict) -> str:
    rows = []
    for method, target in result.get("step_ratio_targets", {}).items():
        value = result[ratio_key(method)]
        judged = f"target <= {target:<6} {_verdict(value <= target)}" if target is not None else "(no target)"
        rows.append(f"{ratio_key(method):32s} {value:10.3f}   {judged}")
    if "eval_all_on_ratio" in result:
        value, target = result["eval_all_on_ratio"], result["eval_all_on_target"]
        rows.append(f"{'eval_all_on_ratio':32s} {value:10.3f}   target <= {target:<6} {_verdict(value <= target)}")
    if "loader_speedup" in result:
        value, target = result["loader_speedup"], result["loader_speedup_target"]
        rows.append(f"{'loader_speedup':32s} {value:10.3f}   target >= {target:<6} {_verdict(value >= target)}")
    for key in ("calibrated_model_time_ratio", "calibrated_model_cpu_time_ratio", "cog_vs_posthoc_ts_time_ratio",
                "cog_vs_tst_time_ratio", "eval_seconds", "cache_build_seconds"):
        if result.get(key) is not None:
            rows.append(f"{key:32s} {result[key]:10.3f}")
    if isinstance(result.get("images_per_s"), dict):
        ips = result["images_per_s"]
        rows.append(f"{'images_per_s':32s} {ips['value']:10.1f}   {ips['backbone']} @{ips['image_size']}px "
                    f"batch {ips['batch_size']} on {ips['device']}")
    if "speed_options" in result:
        so = result["speed_options"]
        for name, value in so["speedup"].items():
            if name == "fp32":  # the reference itself
                continue
            rows.append(f"{'speedup ' + name:32s} {value:10.3f}   over fp32, {so['backbone']} @{so['image_size']}px "
                        f"batch {so['batch_size']} on {so['device']}")
    for item in result.get("throughput", []):
        rows.append(f"{'images_per_s':32s} {item['value']:10.1f}   {item['backbone']} @{item['image_size']}px")
    if "cache_memory" in result:
        cm = result["cache_memory"]
        rows.append(f"{'cache_extra_rss_MiB':32s} {cm['cache_extra_rss_bytes'] / 2**20:10.1f}   "
                    f"{cm['images']} images ({cm['image_bytes'] / 2**20:.0f} MiB), target <= "
                    f"{cm['target_bytes'] / 2**20:.0f} {_verdict(cm['within_1GiB'])}")
    if "epoch_seconds" in result:
        frac = result["fraction_of_peak"]
        rows.append(f"{result['backbone']} @{result['image_size']}px, {result['images']} images on {result['device']}: "
                    f"epoch {result['epoch_seconds']:.1f} s, {result['images_per_s']:.0f} images/s, "
                    f"{result['achieved_tflops']:.2f} TFLOP/s"
                    + (f" = {frac:.1%} of {result['bf16_peak_tflops']} (bf16 peak)" if frac else ""))
    rows.append(f"{'peak_rss_MiB':32s} {result['peak_rss_bytes'] / 2**20:10.1f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    workload = workload_of(args)
    check_request(args, workload)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.epoch_check:
        result = epoch_check(workload, METHODS_DIR, args.num_images, args.warmup_steps, args.peak_tflops)
    else:
        result = run_benchmark(args, workload)
    print(format_table(result))
    if args.out:
        atomic_write_json(args.out, result)
        print(f"wrote {args.out}")
    return result


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
