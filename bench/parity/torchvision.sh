#!/usr/bin/env bash
# Accuracy parity with torchvision's own reference script: the same train.py command run by
# torchvision's references/classification/train.py (unchanged, from a checkout of
# pytorch/vision) and by ringtrain through `ringtrain recipe from-torchvision`, RUNS times each,
# alternating so that machine drift hits both. Prints each run's last-epoch test top-1 (train.py's
# "Test: Acc@1", ringtrain's metrics.csv), mean ± std per side and the difference of the means.
#     bench/parity/torchvision.sh REFERENCES DATA_ROOT RUNS -- TRAIN_PY_ARGS...
#     e.g. bench/parity/torchvision.sh ~/vision/references/classification ../shared/data/plant-seedlings 3 \
#            -- --model resnet18 --epochs 10 -b 64 -j 2 --auto-augment ta_wide ...
# DATA_ROOT holds train/ and val/ (or test/, then linked as val/ in a temporary folder).
# train.py has no seed: its runs differ by its unseeded draws; ringtrain's runs take --seed 1..RUNS.
# Distributed, train.py's samplers shuffle with torch.randperm seeded 0 + epoch in every run; the
# converted configuration does the same (torch_sampler_seed = 0), so with NPROC > 1 both sides
# read the same batches in every run and differ by initialisation and augmentation.
# Both run on the CPU. NPROC=N (default 1) runs each side as N processes on Gloo: train.py under
# torchrun (with cpu_distributed/ on PYTHONPATH, which points its GPU-only distributed mode at Gloo
# and CPU tensors; the script is unchanged), ringtrain with --nproc-per-node N. train.py takes
# --ra-sampler only when distributed, so a run with it needs NPROC > 1; -b is per process.
# RINGTRAIN_BIN=path uses that binary instead of building one; OUT=dir keeps the runs there;
# FIRST=k numbers the runs (and ringtrain's seeds) k, k+1, ... to add runs to an earlier sitting.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 4 ] && [ "$4" = "--" ] || { echo "usage: $0 REFERENCES DATA_ROOT RUNS -- TRAIN_PY_ARGS..." >&2; exit 2; }
refs="$(cd "$1" && pwd)"; root="$(cd "$2" && pwd)"; runs="$3"; shift 4
[ -f "$refs/train.py" ] || { echo "$refs has no train.py (torchvision's references/classification)" >&2; exit 2; }
source "$here/../../scripts/build.sh"   # sets $bin (RINGTRAIN_BIN: that binary, no build)
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
echo "runs in $out"
data="$root"
if [ ! -d "$root/val" ]; then
  data="$out/data"
  mkdir -p "$data"
  ln -sfn "$root/train" "$data/train"
  ln -sfn "$root/test" "$data/val"
fi
nproc="${NPROC:-1}"
launch=(python)
ringtrain_procs=()
torchvision_env=()
if [ "$nproc" -gt 1 ]; then
  launch=(torchrun --standalone --nproc_per_node "$nproc")
  ringtrain_procs=(--nproc-per-node "$nproc")
  torchvision_env=(PYTHONPATH="$here/cpu_distributed${PYTHONPATH:+:$PYTHONPATH}")
fi
# The same command for both sides; ringtrain reads its configuration from the converter.
"$bin" recipe from-torchvision --out "$out/recipe.toml" -- "${launch[@]}" train.py --data-path "$data" "$@" \
  2> "$out/recipe.stderr"
cat "$out/recipe.stderr"
results="$out/results.jsonl"
: > "$results"
first="${FIRST:-1}"
for run in $(seq "$first" $((first + runs - 1))); do
  t0=$SECONDS
  if [ "$nproc" -gt 1 ]; then
    (cd "$refs" && env "${torchvision_env[@]}" "$RINGTRAIN_PYTHON" -m torch.distributed.run --standalone \
      --nproc_per_node "$nproc" train.py --data-path "$data" --device cpu --output-dir "" "$@")
  else
    (cd "$refs" && "$RINGTRAIN_PYTHON" train.py --data-path "$data" --device cpu --output-dir "" "$@")
  fi \
    > "$out/torchvision-$run.log" 2>&1
  top1="$(grep -E '^Test: +Acc@1' "$out/torchvision-$run.log" | tail -1 | awk '{print $3}')"
  echo "{\"side\": \"torchvision\", \"run\": $run, \"val_top1\": $top1, \"wall_s\": $((SECONDS - t0))}" \
    | tee -a "$results"
  t0=$SECONDS
  "$bin" train --config "$out/recipe.toml" --device cpu --seed "$run" --out "$out/ringtrain-$run" "${ringtrain_procs[@]}" \
    > "$out/ringtrain-$run.log" 2>&1
  top1="$("$RINGTRAIN_PYTHON" -c 'import csv, sys
print(round(100 * float(list(csv.DictReader(open(sys.argv[1])))[-1]["val_top1"]), 4))' "$out/ringtrain-$run/metrics.csv")"
  echo "{\"side\": \"ringtrain\", \"run\": $run, \"val_top1\": $top1, \"wall_s\": $((SECONDS - t0))}" \
    | tee -a "$results"
done
"$RINGTRAIN_PYTHON" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
means = {}
for side in ("ringtrain", "torchvision"):
    r = [x["val_top1"] for x in rows if x["side"] == side]
    sd = statistics.stdev(r) if len(r) > 1 else 0.0
    means[side] = (statistics.mean(r), sd, len(r))
    wall = statistics.mean(x["wall_s"] for x in rows if x["side"] == side)
    print(f"{side:11s} test top-1 {means[side][0]:.2f} ± {sd:.2f} % ({', '.join(f'{v:.2f}' for v in r)}), "
          f"{wall:.0f} s a run")
(a, sa, n), (b, sb, m) = means["ringtrain"], means["torchvision"]
se = (sa * sa / n + sb * sb / m) ** 0.5
print(f"ringtrain - torchvision: {a - b:+.2f} points (standard error of the difference {se:.2f})")
PY
