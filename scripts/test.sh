#!/usr/bin/env bash
# Sets everything up on first use, then runs the whole test suite (unit tests, the tests
# against PyTorch/torchvision references, CPU training on the shared data sets, the demo).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/setup.sh"
source "$here/env.sh"
cd "$here/.."
cargo test --release "$@"
