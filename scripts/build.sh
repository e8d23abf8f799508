# Sourced by scripts/ringtrain and the bench scripts: sets everything up on first use
# (scripts/setup.sh), loads the environment (scripts/env.sh: $RINGTRAIN_PYTHON, cargo's target
# directory), builds ringtrain in release mode if the sources changed, and sets $bin to it.
_ringtrain_scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$_ringtrain_scripts/setup.sh"
source "$_ringtrain_scripts/env.sh"
cargo build --release --quiet --manifest-path "$_ringtrain_scripts/../Cargo.toml" >&2
bin="$CARGO_TARGET_DIR/release/ringtrain"
