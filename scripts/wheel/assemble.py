"""Writes ringtrain's wheel from a bundle (scripts/bundle.sh), with the standard library only:

    python assemble.py BUNDLE CARGO_TOML DEST_DIR

Prints the wheel's path, then the platform tag and what chose it. See scripts/wheel.sh.
"""
import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import tomllib
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
# The newest version of each symbol family that each manylinux policy allows on x86_64 (the
# policy file of auditwheel 6.8: the toolchains of the manylinux images). GLIBC's is the policy's
# own; GLIBC_ABI_DT_RELR needs 2.36.
POLICIES = [  # (glibc minor, GLIBCXX, CXXABI, GCC)
    (5, "3.4.8", "1.3.1", "4.2.0"),
    (12, "3.4.13", "1.3.3", "4.3.0"),
    (17, "3.4.19", "1.3.7", "4.8.0"),
    (24, "3.4.22", "1.3.10", "4.8.0"),
    (26, "3.4.22", "1.3.10", "4.8.0"),
    (27, "3.4.24", "1.3.11", "7.0.0"),
    (28, "3.4.24", "1.3.11", "7.0.0"),
    (31, "3.4.28", "1.3.12", "7.0.0"),
    (34, "3.4.29", "1.3.13", "7.0.0"),
    (35, "3.4.30", "1.3.13", "12.0.0"),
    (36, "3.4.30", "1.3.13", "12.0.0"),
    (37, "3.4.30", "1.3.13", "12.0.0"),
    (38, "3.4.30", "1.3.13", "12.0.0"),
    (39, "3.4.33", "1.3.15", "14.0.0"),
    (40, "3.4.33", "1.3.15", "14.0.0"),
    (41, "3.4.33", "1.3.15", "14.0.0"),
]
# libtorch's libraries, which the torch dependency brings at run time.
TORCH_LIBS = {"libtorch_cpu.so", "libtorch_cuda.so", "libtorch.so", "libc10.so", "libc10_cuda.so"}
# The libraries every manylinux policy from 2_24 allows (and the dynamic loader).
WHITELIST = {"libatomic.so.1", "libgcc_s.so.1", "libstdc++.so.6", "libm.so.6", "libmvec.so.1", "libanl.so.1",
             "libdl.so.2", "librt.so.1", "libc.so.6", "libnsl.so.1", "libutil.so.1", "libpthread.so.0",
             "libresolv.so.2", "libexpat.so.1", "libz.so.1", "ld-linux-x86-64.so.2"}


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def version(text):
    return tuple(int(x) for x in text.split("."))


def platform_tag(binary):
    """The lowest manylinux policy allowing every symbol version the binary needs, and why."""
    elf = subprocess.run(["readelf", "-d", "-V", "--wide", binary], check=True, capture_output=True, text=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", elf))
    if needed - TORCH_LIBS - WHITELIST:
        die(f"the binary needs {', '.join(sorted(needed - TORCH_LIBS - WHITELIST))}, which neither a manylinux system nor torch provides")
    newest = {}
    for family, v in re.findall(r"Name: (GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)\s", elf):
        newest[family] = max(newest.get(family, (0,)), version(v))
    relr = "GLIBC_ABI_DT_RELR" in elf
    for minor, *allowed in POLICIES:
        limits = dict(zip(["GLIBCXX", "CXXABI", "GCC"], map(version, allowed)), GLIBC=(2, minor))
        if all(v <= limits[f] for f, v in newest.items()) and (minor >= 36 or not relr):
            why = ", ".join(f"{f}_{'.'.join(map(str, newest[f]))}" for f in ["GLIBC", "GLIBCXX", "CXXABI", "GCC"] if f in newest)
            return f"manylinux_2_{minor}_x86_64", f"newest symbol versions needed: {why}"
    die(f"the binary needs symbol versions newer than any manylinux policy allows: {newest}")


def main():
    bundle, cargo_toml, dest = sys.argv[1:]
    build = dict(line.split("=", 1) for line in open(os.path.join(bundle, "BUILD")).read().splitlines() if "=" in line)
    package = tomllib.load(open(cargo_toml, "rb"))["package"]
    name, ver = "ringtrain", build["ringtrain"]
    tag, why = platform_tag(os.path.join(bundle, "bin", "ringtrain"))
    dist_info = f"{name}-{ver}.dist-info"
    wheel = os.path.join(dest, f"{name}-{ver}-py3-none-{tag}.whl")

    members = []  # (name in the wheel, bytes, unix mode)
    for f in ["__init__.py", "__main__.py"]:
        members.append((f"ringtrain/{f}", open(os.path.join(HERE, "ringtrain", f), "rb").read(), 0o644))
    members.append(("ringtrain/_build.py", f"BUILD = {build!r}\n".encode(), 0o644))
    for sub in ["bin", "recipes", "bench"]:
        for top, dirs, files in os.walk(os.path.join(bundle, sub)):
            dirs.sort()
            for f in sorted(files):
                path = os.path.join(top, f)
                mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
                members.append((f"ringtrain/{os.path.relpath(path, bundle)}", open(path, "rb").read(), mode))
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {ver}",
        f"Summary: {package['description']}",
        f"License: {package['license']}",
        "Requires-Python: >=3.9",
        f"Requires-Dist: torch=={'.'.join(build['libtorch'].split('.')[:2])}.*",
        # `ringtrain predict` on an exported .onnx file loads ONNX Runtime's library from here.
        "Provides-Extra: onnx",
        'Requires-Dist: onnxruntime>=1.20; extra == "onnx"',
    ]
    members += [
        (f"{dist_info}/METADATA", ("\n".join(meta) + "\n").encode(), 0o644),
        (f"{dist_info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: ringtrain scripts/wheel/assemble.py\n"
                                f"Root-Is-Purelib: false\nTag: py3-none-{tag}\n").encode(), 0o644),
        (f"{dist_info}/entry_points.txt", b"[console_scripts]\nringtrain = ringtrain.__main__:main\n", 0o644),
    ]

    record = io.StringIO()
    rows = csv.writer(record, lineterminator="\n")
    os.makedirs(dest, exist_ok=True)
    tmp = wheel + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        def add(arcname, data, mode):
            # A fixed time keeps the wheel's bytes a function of its contents.
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16  # pip keeps the executable bit
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
        for arcname, data, mode in members:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.writerow([arcname, f"sha256={digest}", len(data)])
            add(arcname, data, mode)
        rows.writerow([f"{dist_info}/RECORD", "", ""])
        add(f"{dist_info}/RECORD", record.getvalue().encode(), 0o644)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, wheel)
    print(wheel)
    print(f"{tag}: {why}; libtorch's libraries come from the torch dependency")


if __name__ == "__main__":
    main()
