#!/usr/bin/env bash
# The device check (mtl_cog/benchmarks/device_check.py): what a short accelerator loan measures, in one call.
# COG-FC on 40 binary tasks at 32 px, batch 256, bf16 + channels_last, the images on the device, through the
# real training loop: images/s and share of the bf16 peak for ResNet-18/50/101 (one run each); options tried
# on ResNet-101 side by side with it (images on the host, batch 512, torch.compile); the exact aggregator's
# step ratio at 40 tasks (baseline+upgrad:parameters, vmapped per-task gradients); K = 2, 4, 8 ResNet-18 runs
# side by side and K = 4 ResNet-101 runs (aggregate images/s); peak device memory of each. One JSON, rewritten
# after every stage (docs/guides/benchmarks.md).
#
#   bash scripts/gpu_check.sh [OUT.json]            # CUDA: the full check (planned 395 s), killed after 8 minutes
#   bash scripts/gpu_check.sh --tiny [OUT.json]     # any machine: every case at 8 px, one step each (CPU test)
#
# Time budget (the arithmetic is in device_check.py's docstring): stage 1 (single runs and options, one
# process) 210 s + stage 2 (2, 4, 8 ResNet-18 runs side by side) 140 s + stage 3 (4 ResNet-101 runs) 45 s
# = 395 s planned of the 480 s limit; a stage that would not fit in what is left of 450 s is skipped and
# recorded as skipped. Extra arguments after OUT.json go to the check (e.g. --peak-tflops 989 --window 10).
# The interpreter: $PYTHON if set, else .venv/bin/python of this clone, else python on the PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

tiny=0
if [ "${1:-}" = "--tiny" ]; then tiny=1; shift; fi
out="${1:-device_check.json}"
shift || true

if [ "$tiny" = 1 ]; then
  exec "$PYTHON" -m mtl_cog.benchmarks.device_check --tiny --out "$out" "$@"
fi

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device visible; run with --tiny for the CPU check." >&2
  exit 3
fi
"$PYTHON" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
# 480 s = the 8-minute budget for everything after setup (the check plans 395 s and stops stages at 450 s).
exec timeout 480 "$PYTHON" -m mtl_cog.benchmarks.device_check --out "$out" "$@"
