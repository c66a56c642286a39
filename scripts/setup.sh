#!/usr/bin/env bash
# Create .venv (if missing) and install mtl_cog with its test tools. Idempotent; used by the README
# commands and by .ci/run. PYTHON may name the interpreter (default python3, >= 3.10).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch/torchvision first, pinned to versions that exist as CPU-usable wheels on this platform;
# users with other CUDA needs can pre-install torch in .venv and this step is then a no-op.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch>=2.4" "torchvision>=0.19"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
bash scripts/get_fashion_mnist.sh  # never fails; prints one line when it cannot install
echo "setup done: .venv/bin/mtl-cog --help lists the commands (or source .venv/bin/activate, then mtl-cog)"
