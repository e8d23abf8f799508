#!/usr/bin/env bash
# Accuracy parity with PyTorch on both data sets, each with its recipe: plant seedlings (PNG,
# seedlings-resnet18-48px.toml) and a class-balanced subset of CIFAR-10's JPEG files (500
# training and 300 test images per class, cifar10-resnet18-32px.toml), SEEDS each. About 25
# minutes a seed on 2 cores.
#     bench/parity/all.sh [SHARED_DATA] [SEEDS]
#     e.g. bench/parity/all.sh ../shared/data "1 2 3"
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${1:-$here/../../../shared/data}"
seeds="${2:-1 2 3}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
OUT="$out/seedlings" "$here/run.sh" "$data/plant-seedlings" "$seeds" "$here/seedlings-resnet18-48px.toml"
source "$here/../../scripts/env.sh"  # set up by run.sh
"$RINGTRAIN_PYTHON" "$here/subset.py" "$data/cifar10" "$out/cifar10-subset" train=500 test=300
OUT="$out/cifar10" "$here/run.sh" "$out/cifar10-subset" "$seeds" "$here/cifar10-resnet18-32px.toml"
