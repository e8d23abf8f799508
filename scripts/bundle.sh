#!/usr/bin/env bash
# Writes a relocatable ringtrain into DEST, for a machine that has PyTorch 2.11 but no Rust
# (a cluster node, a GPU machine without network):
#
#   scripts/bundle.sh DEST [REFERENCE_DIR]      # then, on that machine: DEST/ringtrain --version
#
# DEST/ringtrain       the launcher: finds libtorch (RINGTRAIN_LIBTORCH, else the torch of
#                      $RINGTRAIN_PYTHON or python3), sets the library path, runs bin/ringtrain
# DEST/bin/ringtrain   the release binary, with no path of the build machine left in it
# DEST/recipes/        the recipes
# DEST/bench/          the benchmark scripts and PyTorch references (bench/gpu.sh: the GPU battery);
#                      in bench/shared/, the *.py of REFERENCE_DIR (other reference scripts, such
#                      as the anchor figures' bench_loader.py, which the battery runs when present)
# DEST/kernels/        the fused kernels' Triton source (bench/fused_tiles.py times their tiles)
# DEST/BUILD           what it was built from and against
#
# RINGTRAIN_BIN=PATH bundles that binary instead of building one. DEST is replaced when it holds
# an earlier bundle, and refused when it holds anything else.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
die() { echo "error: $*" >&2; exit 2; }
[ $# -eq 1 ] || [ $# -eq 2 ] || die "usage: scripts/bundle.sh DEST [REFERENCE_DIR]"
dest="${1%/}"
refs="${2:-}"
[ -z "$refs" ] || [ -d "$refs" ] || die "reference scripts folder $refs: no such folder"
if [ -e "$dest" ] && [ ! -f "$dest/BUILD" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
  die "$dest exists and is not a ringtrain bundle; give a new or empty folder"
fi

source "$here/build.sh"   # sets $bin (RINGTRAIN_BIN: that binary, no build)
[ -x "$bin" ] || die "no ringtrain binary at $bin"

tmp="$dest.tmp-$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp/bin"
cp "$bin" "$tmp/bin/ringtrain"
# The build embeds its libtorch folder as the binary's run path. Overwrite it in place with
# $ORIGIN (the bin/ folder, which holds no library), so the bundle can only load the libtorch
# its launcher finds, on any machine. The string to overwrite is the one in .dynstr: the same
# path also appears in libtorch's assertion messages.
runpath="$(readelf -d "$tmp/bin/ringtrain" | sed -n 's/.*Library runpath: \[\(.*\)\]$/\1/p')"
if [ -n "$runpath" ]; then
  read -r start size < <(readelf -S -W "$tmp/bin/ringtrain" |
    sed -n 's/.* \.dynstr  *STRTAB  *[0-9a-f]*  *\([0-9a-f]*\)  *\([0-9a-f]*\) .*/\1 \2/p')
  start=$((16#$start)) size=$((16#$size))
  at=""
  for o in $(grep -obUaF -- "$runpath" "$tmp/bin/ringtrain" | cut -d: -f1); do
    if [ "$o" -ge "$start" ] && [ "$o" -lt $((start + size)) ]; then at="$o"; fi
  done
  [ -n "$at" ] || die "cannot find the run path $runpath in the dynamic strings of $bin"
  { printf '%s' '$ORIGIN'; head -c $((${#runpath} - 7)) /dev/zero; } |
    dd of="$tmp/bin/ringtrain" bs=1 seek="$at" conv=notrunc status=none
fi
cp "$here/bundled-ringtrain" "$tmp/ringtrain"
cp -r "$root/recipes" "$tmp/recipes"
mkdir -p "$tmp/bench"
cp -r "$root/bench/." "$tmp/bench/"
mkdir -p "$tmp/kernels"
cp "$root"/kernels/*.py "$tmp/kernels/"
find "$tmp/bench" -name __pycache__ -prune -exec rm -rf {} +
if [ -n "$refs" ]; then
  mkdir -p "$tmp/bench/shared"
  cp "$refs"/*.py "$tmp/bench/shared/"
fi

py="${RINGTRAIN_PYTHON:-python3}"
version="$("$bin" --version)"
{
  echo "ringtrain=$(echo "$version" | sed -n 's/^ringtrain //p')"
  echo "libtorch=$(echo "$version" | sed -n 's/^libtorch //p')"
  echo "torch=$("$py" -c 'import torch; print(torch.__version__)')"
  echo "commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | sed -n '1s/.* //p')"
} >"$tmp/BUILD"
sync -f "$tmp" 2>/dev/null || sync
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "bundle: $dest ($(du -sh "$dest" | cut -f1)); run $dest/ringtrain --version"
