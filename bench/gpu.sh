#!/usr/bin/env bash
# The GPU measurements of the mixed-precision and input-pipeline work, in one run on one machine,
# from the repository's root:   bench/gpu.sh [RINGTRAIN_BINARY] [IMAGE_FOLDER]
# - the training step (ringtrain bench --vs-pytorch): ResNet-50, batch 256, 224 px and
#   ResNet-18-cifar, batch 512, 32 px, channels_last, in bf16 and in fp16 with GradScaler; then
#   ringtrain's default precision, and PyTorch's torch.compile of the same step;
# - with IMAGE_FOLDER (an ImageFolder tree of JPEGs): the input pipeline feeding ResNet-50
#   (ringtrain bench-data --vs-pytorch), and the same step on synthetic data for comparison.
# Needs a CUDA GPU and a Python with torch and torchvision ($RINGTRAIN_PYTHON, else python3).
set -uo pipefail
bin="${1:-${CARGO_TARGET_DIR:-target}/release/ringtrain}"
data="${2:-}"
py="${RINGTRAIN_PYTHON:-python3}"
run() { echo "+ $*"; "$@"; echo; }
"$bin" --version
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
for amp in bf16 fp16; do
  run "$bin" bench --model resnet50 --batch-size 256 --img-size 224 --amp "$amp" --device cuda \
      --steps 50 --warmup 15 --vs-pytorch --python "$py"
  run "$bin" bench --model resnet18-cifar --batch-size 512 --img-size 32 --amp "$amp" --device cuda \
      --steps 200 --warmup 30 --vs-pytorch --python "$py"
done
run "$bin" bench --model resnet50 --batch-size 256 --img-size 224 --device cuda --steps 50 --warmup 15
run "$bin" bench --model resnet18-cifar --batch-size 512 --img-size 32 --device cuda --steps 200 --warmup 30
# PyTorch's best: torch.compile (arguments: model batch size amp channels_last device steps warmup window)
run env TORCH_STEP_COMPILE=1 "$py" bench/torch_step.py resnet50 256 224 bf16 1 cuda 50 15 10
run env TORCH_STEP_COMPILE=1 "$py" bench/torch_step.py resnet50 256 224 fp16 1 cuda 50 15 10
run env TORCH_STEP_COMPILE=1 "$py" bench/torch_step.py resnet18-cifar 512 32 bf16 1 cuda 200 30 10
if [ -n "$data" ]; then
  run "$bin" bench-data --data "$data" --model resnet50 --amp bf16 --device cuda --batch-size 256 \
      --img-size 224 --vs-pytorch --python "$py"
fi
