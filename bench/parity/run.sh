#!/usr/bin/env bash
# Accuracy parity: the recipe RECIPE (default: seedlings-resnet18-48px.toml) trained by ringtrain
# and by torch_train.py (PyTorch + torchvision) on the same train/ and test/ folders, for each
# seed, the two alternating so that machine drift hits both. Prints the last epoch's test top-1
# and macro-F1 of every run, mean ± std per side, and wall times.
#     bench/parity/run.sh [DATA_ROOT] [SEEDS] [RECIPE]
#     e.g. bench/parity/run.sh ../shared/data/plant-seedlings "1 2 3"
# SIDES="ringtrain" (or "pytorch") runs one side only; RINGTRAIN_BIN=path uses that binary
# instead of building one; OUT=dir keeps the runs there. bench/parity/all.sh runs both data sets.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${1:-$here/../../../shared/data/plant-seedlings}"
seeds="${2:-1 2 3}"
recipe="${3:-$here/seedlings-resnet18-48px.toml}"
workers="${WORKERS:-$(nproc)}"
source "$here/../../scripts/build.sh"   # sets $bin (RINGTRAIN_BIN: that binary, no build)
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
echo "runs in $out"
results="$out/results.jsonl"
: > "$results"
# One results row: SIDE SEED WALL_S and the run's last epoch, read from ringtrain's metrics.csv
# (fractions) or torch_train.py's last JSON line (percentages).
row() {
  "$RINGTRAIN_PYTHON" - "$@" >> "$results" <<'PY'
import csv, json, sys
side, seed, wall, source = sys.argv[1:]
if side == "ringtrain":
    last = list(csv.DictReader(open(source)))[-1]
    top1, f1 = 100 * float(last["val_top1"]), 100 * float(last["val_macro_f1"])
else:
    last = json.loads(open(source).read().splitlines()[-1])
    top1, f1 = last["val_top1"], last["val_macro_f1"]
print(json.dumps({"side": side, "seed": int(seed), "val_top1": top1, "val_macro_f1": f1, "wall_s": float(wall)}))
PY
}
sides="${SIDES:-ringtrain pytorch}"
for seed in $seeds; do
  for side in $sides; do
    t0=$SECONDS
    case "$side" in
      ringtrain)
        "$bin" train --config "$recipe" --data "$root/train" --val "$root/test" --seed "$seed" \
            --workers "$workers" --out "$out/ringtrain-$seed" > "$out/ringtrain-$seed.log"
        row ringtrain "$seed" $((SECONDS - t0)) "$out/ringtrain-$seed/metrics.csv" ;;
      pytorch)
        "$RINGTRAIN_PYTHON" "$here/torch_train.py" "$recipe" "$root/train" "$root/test" "$seed" "$workers" \
            > "$out/pytorch-$seed.log"
        row pytorch "$seed" $((SECONDS - t0)) "$out/pytorch-$seed.log" ;;
      *) echo "SIDES: unknown side $side (ringtrain, pytorch)" >&2; exit 2 ;;
    esac
    tail -1 "$results"
  done
done
"$RINGTRAIN_PYTHON" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for side in ("ringtrain", "pytorch"):
    r = [x for x in rows if x["side"] == side]
    if not r:
        continue
    f = lambda k: f"{statistics.mean(x[k] for x in r):.2f} ± {statistics.stdev(x[k] for x in r) if len(r) > 1 else 0:.2f}"
    print(f"{side:10s} test top-1 {f('val_top1')} %, macro-F1 {f('val_macro_f1')} %, wall {f('wall_s')} s ({len(r)} seeds)")
PY
