#!/usr/bin/env bash
# Sets everything up on first use, then runs the whole test suite (unit tests, the tests
# against PyTorch/torchvision references, CPU training on the shared data sets, the demo).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/setup.sh"
source "$here/env.sh"
cd "$here/.."
# The tests run two at a time, each starting ringtrain or a PyTorch reference with as many
# OpenMP threads as cores. libgomp's threads spin 300,000 times before sleeping, so on a small
# machine they spend the cores spinning against each other: a spin count of 2,000 took the suite
# from 36 to 30 minutes on 2 cores, and a lone training run (the demo) is as fast as before.
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-2000}"
cargo test --release "$@"
