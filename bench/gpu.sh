#!/usr/bin/env bash
# The GPU battery: every CUDA path of ringtrain checked, then the speed figures against PyTorch
# (ResNet-50 b256 224 px and ResNet-18-cifar b512 32 px in bf16 and fp16, ringtrain's defaults,
# torch.compile, the input pipeline end to end), into one log and one JSON file. On one H200 the
# correctness part takes about 5 minutes and the speed part about 12 (name its checks with --only
# to fit a 10-minute call; docs/BENCHMARKS.md has the first run). From a repository, a bundle
# (scripts/bundle.sh) or the wheel (scripts/wheel.sh; 9.3 MB against the bundle's 24 MB folder):
#
#   bench/gpu.sh [--data DIR] [--out DIR] [--bin RINGTRAIN] [--only NAME,...] [--dry-run]
#
# With the wheel, on a machine whose Python has torch 2.11 and no network:
#   python -m venv --system-site-packages rt && rt/bin/pip install --no-index ringtrain-*.whl
#   bench/gpu.sh --bin rt/bin/ringtrain --data DIR ...
#
# --dry-run runs the same sequence on the CPU at tiny sizes (the test suite does). Needs a Python
# with torch and torchvision: $RINGTRAIN_PYTHON, else python3. bench/gpu_battery.py says more.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${RINGTRAIN_PYTHON:-python3}" "$here/gpu_battery.py" "$@"
