#!/usr/bin/env bash
# One-time, idempotent set-up of everything ringtrain needs to build, run and test.
#
# - Debian packages: a C++ compiler, and libgloo-dev (Gloo headers for the c10d shim; the Gloo
#   code itself is the copy inside libtorch_cpu); for the tests of the pictures and the report
#   page: fontconfig with a font that has Chinese characters, and Chromium (headless).
# - A Python virtual environment OUTSIDE the clone (default ~/.cache/ringtrain/venv, override with
#   RINGTRAIN_CACHE) holding libtorch 2.11.0 (the torch wheel: CPU + CUDA 13.0, cuDNN, NCCL),
#   the CUDA headers the NCCL part of the shim compiles against, and the Python packages the tests
#   use as independent references (torchvision, timm, webdataset, datasets, safetensors, scikit-learn,
#   tensorboard, onnx, onnxruntime, moto and boto3). torch brings Triton, which compiles
#   ringtrain's fused kernels when it is built.
#
# Re-running it is cheap: each step checks a stamp first.
set -euo pipefail

CACHE="${RINGTRAIN_CACHE:-$HOME/.cache/ringtrain}"
VENV="$CACHE/venv"
STAMP="$VENV/.ringtrain-setup-v7"
PY_PACKAGES=(
  "torch==2.11.0"
  "torchvision==0.26.0"
  "timm==1.0.31"
  "webdataset==1.0.2"
  "datasets==5.2.0"
  "cuda-toolkit[cccl,crt]==13.0.2"
  "safetensors"
  "scikit-learn"
  "tensorboard"
  "auditwheel==6.8.2"
  # Triton's interpreter (the fused kernels' CPU tests) converts 1-element arrays to ints, which
  # numpy 2.4 refuses.
  "numpy<2.4"
  "pillow"
  # The ONNX export's independent references: the checker and ONNX Runtime.
  "onnx==1.23.2"
  "onnxruntime==1.32.0"
  # Remote data's tests: a real S3-compatible server on loopback (moto's server mode) and the
  # provider's own client to upload to it.
  "moto[s3,server]==5.2.5"
  "boto3==1.44.8"
)

log() { echo "[setup] $*" >&2; }

need_apt=()
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
[ -f /usr/include/gloo/allreduce.h ] || need_apt+=(libgloo-dev)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-venv)
command -v fc-match >/dev/null 2>&1 || need_apt+=(fontconfig)
[ -f /usr/share/fonts/truetype/wqy/wqy-microhei.ttc ] || need_apt+=(fonts-wqy-microhei)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    log "missing Debian packages: ${need_apt[*]} (run as root, or install them first)"; exit 1
  fi
  log "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  log "python environment ready at $VENV"
  exit 0
fi

mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  python3 -m venv "$VENV" || {
    log "python3 -m venv failed; installing python3-venv"
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$VENV"
  }
fi
log "installing ${PY_PACKAGES[*]} (about 5 GB, a few minutes the first time)"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "${PY_PACKAGES[@]}"
"$VENV/bin/python" - <<'PY'
import torch, torchvision
assert torch.__version__.startswith("2.11.0"), torch.__version__
print(f"[setup] torch {torch.__version__}, torchvision {torchvision.__version__}")
PY
touch "$STAMP"
log "done"
