#!/usr/bin/env bash
# Accuracy parity: the recipe RECIPE (default: seedlings-resnet18-48px.toml) trained by ringtrain
# and by torch_train.py (PyTorch + torchvision) on the same train/ and test/ folders, for each
# seed, the two alternating so that machine drift hits both. Prints the last epoch's test top-1
# and macro-F1 of every run, mean ± std per side, and wall times.
#     bench/parity/run.sh [DATA_ROOT] [SEEDS] [RECIPE]
#     e.g. bench/parity/run.sh ../shared/data/plant-seedlings "1 2 3"
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${1:-$here/../../../shared/data/plant-seedlings}"
seeds="${2:-1 2 3}"
recipe="${3:-$here/seedlings-resnet18-48px.toml}"
workers="${WORKERS:-$(nproc)}"
source "$here/../../scripts/build.sh"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
echo "runs in $out"
results="$out/results.jsonl"
: > "$results"
for seed in $seeds; do
  t0=$SECONDS
  "$bin" train --config "$recipe" --data "$root/train" --val "$root/test" --seed "$seed" \
      --workers "$workers" --out "$out/ringtrain-$seed" > "$out/ringtrain-$seed.log"
    tail -1 "$out/ringtrain-$seed/metrics.csv" | awk -F, -v s="$seed" -v w="$((SECONDS - t0))" \
      '{printf "{\"side\":\"ringtrain\",\"seed\":%s,\"val_top1\":%s,\"val_macro_f1\":%s,\"wall_s\":%s}\n", s, 100*$5, 100*$11, w}' >> "$results"
  t0=$SECONDS
  "$RINGTRAIN_PYTHON" "$here/torch_train.py" "$recipe" "$root/train" "$root/test" "$seed" "$workers" > "$out/pytorch-$seed.log"
    tail -1 "$out/pytorch-$seed.log" | "$RINGTRAIN_PYTHON" -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"side":"pytorch","seed":int(sys.argv[1]),"val_top1":r["val_top1"],"val_macro_f1":r["val_macro_f1"],"wall_s":float(sys.argv[2])}))' "$seed" "$((SECONDS - t0))" >> "$results"
  tail -2 "$results"
done
"$RINGTRAIN_PYTHON" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for side in ("ringtrain", "pytorch"):
    r = [x for x in rows if x["side"] == side]
    f = lambda k: f"{statistics.mean(x[k] for x in r):.2f} ± {statistics.stdev(x[k] for x in r) if len(r) > 1 else 0:.2f}"
    print(f"{side:10s} test top-1 {f('val_top1')} %, macro-F1 {f('val_macro_f1')} %, wall {f('wall_s')} s ({len(r)} seeds)")
PY
