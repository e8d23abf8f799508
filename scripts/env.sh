# Sourced by the project's scripts: points cargo (torch-sys) at the libtorch of the set-up
# environment and exposes that environment's Python to the tests as RINGTRAIN_PYTHON.
RINGTRAIN_CACHE="${RINGTRAIN_CACHE:-$HOME/.cache/ringtrain}"
export RINGTRAIN_PYTHON="$RINGTRAIN_CACHE/venv/bin/python"
export PATH="$RINGTRAIN_CACHE/venv/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
# Keep cargo's build outputs outside the clone too, so a fresh clone reuses the built torch-sys.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$RINGTRAIN_CACHE/target}"
# Which checkout builds. Cargo names ringtrain's own outputs the same in every checkout and keeps
# them while their sources look older than the build, so another checkout's binaries and tests
# (with its paths compiled in) would be run here; build.rs reruns when this changes, and
# ringtrain is then rebuilt from this checkout's sources.
export RINGTRAIN_CHECKOUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
