#!/usr/bin/env bash
# Writes ringtrain's wheel, for a machine with Python and pip but no Rust:
#
#   scripts/wheel.sh [DEST_DIR [REFERENCE_DIR]]   # default dist/; then: pip install DEST_DIR/ringtrain-*.whl
#
# REFERENCE_DIR: as for scripts/bundle.sh, its *.py go into the package's bench/shared/.
#
# DEST_DIR/ringtrain-<version>-py3-none-manylinux_2_<Y>_x86_64.whl holds a bundle's binary,
# recipes and bench scripts (scripts/bundle.sh) in the package ringtrain/, and a `ringtrain`
# command (also `python -m ringtrain`) that runs the binary with the libtorch of the installed
# torch package, which the wheel requires (torch==2.11.*), as torch extensions' wheels do. The
# man page and the shells' completions are the command's own (ringtrain man, ringtrain
# completions SHELL), not files: pip uninstall would leave their share/ folders behind.
#
# The wheel is zipped by scripts/wheel/assemble.py (Python's standard library), not by maturin:
# the bundle already makes the relocatable binary, and a 100-line script needs nothing downloaded.
# The platform tag is the lowest manylinux policy that allows every GLIBC, GLIBCXX, CXXABI and
# GCC symbol version the binary needs; the last line says which and why.
#
# RINGTRAIN_BIN=PATH packs that binary instead of building one.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
die() { echo "error: $*" >&2; exit 2; }
[ $# -le 2 ] || die "usage: scripts/wheel.sh [DEST_DIR [REFERENCE_DIR]]"
dest="${1:-$root/dist}"
refs="${2:-}"
[ ! -e "$dest" ] || [ -d "$dest" ] || die "$dest exists and is not a folder"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bash "$here/bundle.sh" "$tmp/bundle" ${refs:+"$refs"} >/dev/null
source "$here/env.sh"
"${RINGTRAIN_PYTHON:-python3}" "$here/wheel/assemble.py" "$tmp/bundle" "$root/Cargo.toml" "$dest" >"$tmp/out"
wheel="$(sed -n 1p "$tmp/out")"
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1))"
sed -n '2,$p' "$tmp/out"
