#!/usr/bin/env bash
# Data-parallel costs on one machine, for the same training (resnet18, 64 px, global batch 64,
# 2 epochs on half of the data; the second epoch's images/s):
#  1. DDP at world size 1 against one process without DDP: the machinery's overhead;
#  2. 2 Gloo ranks with the gradient all-reduce overlapped with backward (the default) against
#     the all-reduce started after backward (--no-grad-overlap): the exposed all-reduce share of
#     rank 0's time, and images/s.
# Each comparison runs PAIRS pairs (default 4) and alternates which side goes first (A B, B A,
# ...), since this machine's run-to-run noise is several percent and drifts, and a side that
# always ran second would carry an order effect; the per-pair ratios are printed by order.
#      bench/ddp.sh [DATA_DIR] [PAIRS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${1:-$here/../../shared/data/plant-seedlings/train}"
pairs="${2:-4}"
source "$here/../scripts/build.sh"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(train --data "$data" --model resnet18 --img-size 64 --epochs 2 --batch-size 64 --device cpu
        --log-every 0 --val-split 0.5 --seed 0)
epoch2() { sed -n 3p "$1/metrics.csv" | cut -d, -f9; }
# The epoch-2 line's "(exposed all-reduce X% of rank 0's time)".
share() { grep -o 'all-reduce [0-9.]*%' "$1" | tail -1 | grep -o '[0-9.]*' || echo 0; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One run of a side; prints "images/s share".
side() {
  local name=$1 dir="$out/$1_$2"
  case $name in
    plain) "$bin" "${common[@]}" --out "$dir" > "$dir.log" ;;
    ddp1) RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(port) "$bin" "${common[@]}" --out "$dir" > "$dir.log" ;;
    overlap) "$bin" "${common[@]}" --out "$dir" --nproc-per-node 2 > "$dir.log" ;;
    after) "$bin" "${common[@]}" --out "$dir" --nproc-per-node 2 --no-grad-overlap > "$dir.log" ;;
  esac
  echo "$(epoch2 "$dir") $(share "$dir.log")"
}

# compare A B: PAIRS pairs, alternating order; one line per run to $out/A_B.txt.
compare() {
  local a=$1 b=$2
  for i in $(seq "$pairs"); do
    if (( i % 2 )); then first=$a; second=$b; else first=$b; second=$a; fi
    ra=$(side "$first" "$i"); rb=$(side "$second" "$i")
    echo "$i $first $ra $second $rb" | tee -a "$out/${a}_$b.txt"
  done
}

echo "== 1. DDP at world size 1 (ddp1) against one process without DDP (plain): pair, first, img/s, share, second, img/s, share"
compare plain ddp1
echo "== 2. two Gloo ranks: all-reduce during backward (overlap) against after it (after)"
compare overlap after
python3 - "$out/plain_ddp1.txt" "$out/overlap_after.txt" <<'PY'
import statistics, sys

def load(path):
    runs = []
    for line in open(path):
        f = line.split()
        first, second = {f[1]: (float(f[2]), float(f[3]))}, {f[4]: (float(f[5]), float(f[6]))}
        runs.append((f[1], {**first, **second}))
    return runs

def report(path, a, b, what):
    runs = load(path)
    ratios = [(first, r[b][0] / r[a][0] - 1) for first, r in runs]
    for first in (a, b):
        rs = [f"{100 * x:+.1f}%" for f, x in ratios if f == first]
        print(f"  {b} vs {a}, {first} first: {', '.join(rs)}")
    med = lambda k, j: statistics.median(r[k][j] for _, r in runs)
    print(f"  medians: {a} {med(a, 0):.1f}, {b} {med(b, 0):.1f} img/s; {what}: {100 * statistics.median(x for _, x in ratios):+.1f}%")
    return med

print("== summary")
report(sys.argv[1], "plain", "ddp1", "DDP at world size 1, median of the pairs")
med = report(sys.argv[2], "after", "overlap", "overlap's speed-up, median of the pairs")
print(f"  exposed all-reduce share of rank 0's time (medians): after backward {med('after', 1):.1f}%, "
      f"overlapped {med('overlap', 1):.1f}%")
PY
