# Sourced by scripts/ringtrain and the bench scripts: sets everything up on first use
# (scripts/setup.sh), loads the environment (scripts/env.sh: $RINGTRAIN_PYTHON, cargo's target
# directory), builds ringtrain in release mode if the sources changed, and sets $bin to it.
# RINGTRAIN_BIN=path: that binary, nothing set up or built (a binary kept for a comparison
# across source changes, or one built elsewhere).
_ringtrain_scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -n "${RINGTRAIN_BIN:-}" ]; then
  source "$_ringtrain_scripts/env.sh"
  bin="$RINGTRAIN_BIN"
  unset _ringtrain_scripts
  return 0
fi
bash "$_ringtrain_scripts/setup.sh"
source "$_ringtrain_scripts/env.sh"
bin="$CARGO_TARGET_DIR/release/ringtrain"
# A build that will take a while says so, and shows cargo's progress on a terminal; an
# up-to-date build stays silent (cargo still checks, in well under a second).
_ringtrain_root="$_ringtrain_scripts/.."
_ringtrain_quiet=--quiet
if [ ! -x "$bin" ]; then
  echo "[build] first build: compiling ringtrain, its C++ shim and $(grep -c '^name = ' "$_ringtrain_root/Cargo.lock") crates in release mode (about 5 minutes on 2 cores; later builds take seconds)" >&2
  [ -t 2 ] && _ringtrain_quiet=
elif [ -n "$(cd "$_ringtrain_root" && find src csrc kernels build.rs build_support Cargo.toml Cargo.lock -newer "$bin" -print -quit 2>/dev/null)" ]; then
  echo "[build] the sources changed: rebuilding ringtrain (about half a minute on 2 cores)" >&2
  [ -t 2 ] && _ringtrain_quiet=
fi
cargo build --release $_ringtrain_quiet --manifest-path "$_ringtrain_root/Cargo.toml" >&2
unset _ringtrain_root _ringtrain_quiet
