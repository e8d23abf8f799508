"""The `ringtrain` command of the wheel: finds libtorch 2.11, puts it on the library path and
runs bin/ringtrain with the given arguments (the rules of a bundle's launcher,
scripts/bundled-ringtrain).

libtorch is $RINGTRAIN_LIBTORCH (a folder holding libtorch_cpu.so), else the lib/ folder of the
torch package this Python would import. torch is located, not imported: importing it would load
the same libraries once more, and take seconds, before every command.
"""
import importlib.util
import os
import re
import sys

from . import BINARY
from ._build import BUILD


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def torch_lib(want):
    """(lib folder, how it was found: ringtrain doctor prints it after "found by")."""
    lib = os.environ.get("RINGTRAIN_LIBTORCH")
    if lib:
        return lib, "the pip wheel's launcher: RINGTRAIN_LIBTORCH"
    hint = f"install torch=={want} for it, or set RINGTRAIN_LIBTORCH to libtorch's lib folder"
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    places = list(spec.submodule_search_locations or []) if spec else []
    if spec and not places and spec.origin:
        places = [os.path.dirname(spec.origin)]
    if not places:
        die(f"cannot find libtorch: {sys.executable} has no torch package; {hint}")
    return os.path.join(places[0], "lib"), f"the pip wheel's launcher: torch package at {places[0]}"


def installed_version(lib):
    """The version of the libtorch in lib (2.11.0+cu130): torch/version.py beside an installed
    torch's lib/, or build-version in a libtorch archive; "" when neither says."""
    try:
        with open(os.path.join(lib, "..", "version.py"), encoding="utf-8") as f:
            m = re.search(r"^__version__ = '([^']*)'", f.read(), re.M)
            return m.group(1) if m else ""
    except OSError:
        pass
    try:
        with open(os.path.join(lib, "..", "build-version"), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def main():
    want, built = BUILD["libtorch"], BUILD["torch"]
    lib, found = torch_lib(want)
    if not os.path.isfile(os.path.join(lib, "libtorch_cpu.so")):
        die(f"libtorch folder {lib} holds no libtorch_cpu.so (RINGTRAIN_LIBTORCH names libtorch's lib folder)")
    # The binary needs libtorch_cuda.so even on the CPU: a CPU-only torch cannot run it.
    if not os.path.isfile(os.path.join(lib, "libtorch_cuda.so")):
        die(f"libtorch in {lib} is a CPU-only build; ringtrain needs the CUDA build of torch=={want} (the default wheel)")
    have = installed_version(lib)
    if have and have.split("+")[0] != want:
        die(f"libtorch in {lib} is {have.split('+')[0]}; this ringtrain was built against {want}")
    if have and have != built:
        print(f"warning: libtorch in {lib} is {have}, this ringtrain was built against {built} "
              "(another CUDA build: NCCL may differ)", file=sys.stderr)

    env = os.environ
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    # The Python that runs the PyTorch references (--vs-pytorch): this one, which has the torch.
    env.setdefault("RINGTRAIN_PYTHON", sys.executable)
    env["RINGTRAIN_LIBTORCH_FOUND"] = found
    try:
        os.execv(BINARY, ["ringtrain", *sys.argv[1:]])
    except OSError as e:
        die(f"cannot run {BINARY}: {e.strerror}")


if __name__ == "__main__":
    main()
