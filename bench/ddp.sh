#!/usr/bin/env bash
# Data-parallel overhead on one machine: the same training (resnet18, 64 px, global batch 64,
# 2 epochs on half of the data) as (a) one process without DDP, (b) DDP at world size 1,
# (c) 2 Gloo ranks. (a) and (b) alternate three times and the medians are compared, since this
# machine's run-to-run noise is several percent. Prints the second epoch's images/s and the share
# of rank 0's time spent in the gradient all-reduce.      bench/ddp.sh [DATA_DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${1:-$here/../../shared/data/plant-seedlings/train}"
bash "$here/../scripts/setup.sh"
source "$here/../scripts/env.sh"
cargo build --release --quiet --manifest-path "$here/../Cargo.toml"
bin="$CARGO_TARGET_DIR/release/ringtrain"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(train --data "$data" --model resnet18 --img-size 64 --epochs 2 --batch-size 64 --device cpu
        --log-every 0 --val-split 0.5 --seed 0)
epoch2() { sed -n 3p "$1/metrics.csv" | cut -d, -f9; }
share() { grep -o 'all-reduce [0-9.]*%' "$1" | tail -1 || true; }

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
plain=(); ddp1=()
for i in 1 2 3; do
  "$bin" "${common[@]}" --out "$out/plain$i" > "$out/plain$i.log"
  plain+=("$(epoch2 "$out/plain$i")")
  RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(port) "$bin" "${common[@]}" --out "$out/ddp1_$i" > "$out/ddp1_$i.log"
  ddp1+=("$(epoch2 "$out/ddp1_$i")")
done
echo "one process, no DDP:      ${plain[*]} img/s"
echo "DDP, world size 1:        ${ddp1[*]} img/s ($(share "$out/ddp1_1.log"))"
"$bin" "${common[@]}" --out "$out/ddp2" --nproc-per-node 2 > "$out/ddp2.log"
echo "DDP, 2 Gloo ranks:        $(epoch2 "$out/ddp2") img/s ($(share "$out/ddp2.log"))"
python3 - "${plain[*]}" "${ddp1[*]}" <<'PY'
import statistics, sys
plain, ddp1 = (statistics.median(map(float, a.split())) for a in sys.argv[1:])
print(f"medians: {plain:.1f} vs {ddp1:.1f} img/s; DDP overhead at world size 1: {100 * (plain / ddp1 - 1):+.1f}%")
PY
