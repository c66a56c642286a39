#!/usr/bin/env bash
# One training epoch of ResNet-101 (CIFAR stem) at 32x32 on CelebA-sized synthetic tensors
# (202,599 images, 40 binary tasks, COG-FC) with bf16 autocast and channels_last, through the real
# training loop (mtl_cog.training.step.train_one_epoch, via mtl_cog/benchmarks/epoch_check.py) with the
# uint8 images kept on the GPU. Reports images/s, achieved TFLOP/s against the card's dense bf16 peak,
# and the epoch time (docs/guides/benchmarks.md).
#
#   bash scripts/gpu_check.sh [OUT.json]            # CUDA: the full check, killed after 8 minutes
#   bash scripts/gpu_check.sh --tiny [OUT.json]     # any machine: same code path, tiny sizes (CPU test)
#
# Extra arguments after OUT.json go to scripts/benchmark.py (e.g. --peak-tflops 989 --compile).
# The interpreter: $PYTHON if set, else .venv/bin/python of this clone, else python on the PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}"

tiny=0
if [ "${1:-}" = "--tiny" ]; then tiny=1; shift; fi
out="${1:-gpu_check.json}"
shift || true

if [ "$tiny" = 1 ]; then
  # Same flags, tiny sizes: ResNet-101 at 8x8 on 32 images, batch 16 (seconds on a CPU).
  exec "$PYTHON" scripts/benchmark.py --epoch-check --backbone resnet101 --cifar-stem --precision bf16 \
    --channels-last --image-size 8 --num-images 32 --batch-size 16 --warmup-steps 1 --out "$out" "$@"
fi

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible; run with --tiny for the CPU check." >&2
  exit 3
fi
"$PYTHON" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
# 480 s = the 8-minute budget for everything (start-up, data, warm-up, one epoch).
exec timeout 480 "$PYTHON" scripts/benchmark.py --epoch-check --backbone resnet101 --cifar-stem --precision bf16 \
  --channels-last --image-size 32 --num-images 202599 --batch-size 256 --out "$out" "$@"
