#!/usr/bin/env bash
# Input pipeline: ringtrain's loader against torchvision's ImageFolder + DataLoader, same data,
# same transforms, same machine, in one run; prints both and the ratio.
#   bench/loader.sh [DIR] [SIZE] [WORKERS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:-$here/../../shared/data/plant-seedlings/train}"
size="${2:-128}"
workers="${3:-$(nproc)}"
bash "$here/../scripts/setup.sh"
source "$here/../scripts/env.sh"
cargo build --release --quiet --example loader_throughput --manifest-path "$here/../Cargo.toml"
ours=$("$CARGO_TARGET_DIR/release/examples/loader_throughput" "$dir" "$size" "$workers")
theirs=$("$RINGTRAIN_PYTHON" "$here/torch_loader_cpu.py" "$dir" "$size" "$workers")
echo "$ours"
echo "$theirs"
a=$(echo "$ours" | sed -E 's/.*: ([0-9.]+) img\/s/\1/')
b=$(echo "$theirs" | sed -E 's/.*: ([0-9.]+) img\/s/\1/')
python3 -c "print(f'ratio ringtrain / torchvision: {$a / $b:.2f}x')"
