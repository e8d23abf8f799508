#!/usr/bin/env bash
# Data-parallel overhead on one machine: the same training (resnet18, 64 px, global batch 64,
# 2 epochs on half of the data) as (a) one process without DDP, (b) DDP at world size 1,
# (c) 2 Gloo ranks. (a) and (b) alternate PAIRS times (default 5) and the median of the pairs'
# ratios is the overhead, since this machine's run-to-run noise is several percent and drifts. Prints the second epoch's images/s and the share
# of rank 0's time spent in the gradient all-reduce.      bench/ddp.sh [DATA_DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${1:-$here/../../shared/data/plant-seedlings/train}"
pairs="${2:-5}"
source "$here/../scripts/build.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(train --data "$data" --model resnet18 --img-size 64 --epochs 2 --batch-size 64 --device cpu
        --log-every 0 --val-split 0.5 --seed 0)
epoch2() { sed -n 3p "$1/metrics.csv" | cut -d, -f9; }
share() { grep -o 'all-reduce [0-9.]*%' "$1" | tail -1 || true; }

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
plain=(); ddp1=()
for i in $(seq "$pairs"); do
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
plain, ddp1 = ([float(x) for x in a.split()] for a in sys.argv[1:])
ratios = [p / d - 1 for p, d in zip(plain, ddp1)]
print("per pair, DDP overhead at world size 1: " + ", ".join(f"{100 * r:+.1f}%" for r in ratios))
print(f"medians: {statistics.median(plain):.1f} vs {statistics.median(ddp1):.1f} img/s; "
      f"median of the pairs: {100 * statistics.median(ratios):+.1f}%")
PY
