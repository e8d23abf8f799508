//! The wheel for machines with Python and pip but no Rust (scripts/wheel.sh): its platform tag
//! is the one auditwheel computes, its RECORD matches its members, and pip installs it into a
//! fresh virtual environment (torch from the set-up one, nothing downloaded), where its
//! `ringtrain` command finds libtorch by itself and trains; pip uninstall leaves nothing behind.
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::text;

/// libtorch's libraries: the binary needs them, the torch dependency brings them.
const TORCH_LIBS: [&str; 5] = ["libtorch_cpu.so", "libtorch_cuda.so", "libtorch.so", "libc10.so", "libc10_cuda.so"];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}


/// `scripts/wheel.sh DIR/dist` with the binary under test; the wheel's path.
fn wheel(dir: &Path) -> PathBuf {
    let dist = dir.join("dist");
    let o = Command::new("bash")
        .arg(repo().join("scripts/wheel.sh"))
        .arg(&dist)
        .env("RINGTRAIN_BIN", env!("CARGO_BIN_EXE_ringtrain"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let wheels: Vec<PathBuf> = std::fs::read_dir(&dist).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(wheels.len(), 1, "{wheels:?}");
    // The last line names the tag and the symbol versions that chose it.
    let out = String::from_utf8_lossy(&o.stdout);
    let name = wheels[0].file_name().unwrap().to_str().unwrap();
    let tag = name.rsplit('-').next().unwrap().trim_end_matches(".whl");
    assert!(out.trim_end().lines().last().unwrap().starts_with(&format!("{tag}: ")) && out.contains("GLIBCXX_"), "{out}");
    wheels[0].clone()
}

#[test]
fn the_wheel_carries_the_tag_auditwheel_computes() {
    let d = tempfile::tempdir().unwrap();
    let whl = wheel(d.path());
    let name = whl.file_name().unwrap().to_str().unwrap();
    let version = common::ringtrain(&["--version"]);
    let version = String::from_utf8_lossy(&version.stdout).lines().next().unwrap().replace("ringtrain ", "");
    let prefix = format!("ringtrain-{version}-py3-none-manylinux_2_");
    assert!(name.starts_with(&prefix) && name.ends_with("_x86_64.whl"), "{name}");
    let tag = name.strip_prefix("ringtrain-").unwrap().splitn(4, '-').nth(3).unwrap().trim_end_matches(".whl");

    // auditwheel, the independent check. `auditwheel show` alone says linux_x86_64: it counts
    // libtorch's libraries as ones the wheel would have to bundle, as for every torch extension.
    // So: (1) show names exactly libtorch's libraries as external, and its symbol-version tag is
    // the wheel's; (2) analyze_wheel_abi with libtorch's libraries excluded, as `auditwheel
    // repair --exclude` does, computes as the overall policy (symbol versions, libraries,
    // instruction set) the wheel's tag, and not linux_x86_64.
    let check = format!(
        r#"
import json, subprocess, sys
from pathlib import Path
from auditwheel.wheel_abi import analyze_wheel_abi
from auditwheel.wheeltools import get_wheel_architecture, get_wheel_libc
w = Path({whl:?})
show = json.loads(subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(w)],
                                 check=True, capture_output=True, text=True).stdout)
info = analyze_wheel_abi(get_wheel_libc(w.name), get_wheel_architecture(w.name), w, frozenset({libs:?}),
                         disable_isa_ext_check=False, allow_graft=False)
print(json.dumps(dict(show=show["overall_tag"], sym=show["sym_tag"], external=sorted(show["external_libs"]),
                      excluded=info.overall_policy.name)))
"#,
        whl = whl.to_str().unwrap(),
        libs = TORCH_LIBS.map(String::from).to_vec(),
    );
    let audit: serde_json::Value = serde_json::from_str(&common::run_python_code(&check)).unwrap();
    let mut torch_libs = TORCH_LIBS.to_vec();
    torch_libs.sort();
    assert_eq!(audit["show"], "linux_x86_64", "{audit}");
    assert_eq!(audit["sym"], tag, "{audit}");
    assert_eq!(audit["external"], serde_json::json!(torch_libs), "{audit}");
    assert_eq!(audit["excluded"], tag, "{audit}");

    // The metadata, and a RECORD row per member whose hash and size are the member's
    // (recomputed from the zip with hashlib), RECORD's own row empty.
    let check = format!(
        r#"
import base64, csv, hashlib, io, json, zipfile
z = zipfile.ZipFile({whl:?})
info = "ringtrain-{version}.dist-info/"
rows = list(csv.reader(io.StringIO(z.read(info + "RECORD").decode())))
bad = []
for path, digest, size in rows:
    data = z.read(path)
    want = "" if path == info + "RECORD" else "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if digest != want or size != ("" if path == info + "RECORD" else str(len(data))):
        bad.append(path)
print(json.dumps(dict(
    bad=bad, unrecorded=sorted(set(z.namelist()) ^ {{r[0] for r in rows}}),
    metadata=z.read(info + "METADATA").decode(), wheel=z.read(info + "WHEEL").decode(),
    entry_points=z.read(info + "entry_points.txt").decode(),
    binary_mode=oct(z.getinfo("ringtrain/bin/ringtrain").external_attr >> 16 & 0o777),
    names=z.namelist())))
"#,
        whl = whl.to_str().unwrap(),
    );
    let w: serde_json::Value = serde_json::from_str(&common::run_python_code(&check)).unwrap();
    assert_eq!(w["bad"], serde_json::json!([]), "RECORD rows that do not match their members");
    assert_eq!(w["unrecorded"], serde_json::json!([]), "members and RECORD rows differ");
    let metadata = w["metadata"].as_str().unwrap();
    for line in ["Metadata-Version: 2.1", "Name: ringtrain", &format!("Version: {version}"), "Requires-Dist: torch==2.11.*", "Requires-Python: >=3.9"] {
        assert!(metadata.lines().any(|l| l == line), "METADATA lacks {line:?}:\n{metadata}");
    }
    let wheel_file = w["wheel"].as_str().unwrap();
    assert!(wheel_file.contains("Root-Is-Purelib: false\n") && wheel_file.contains(&format!("Tag: py3-none-{tag}\n")), "{wheel_file}");
    assert!(w["entry_points"].as_str().unwrap().contains("ringtrain = ringtrain.__main__:main"), "{w}");
    assert_eq!(w["binary_mode"], "0o755");
    let names: Vec<&str> = w["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    for f in ["ringtrain/__init__.py", "ringtrain/__main__.py", "ringtrain/recipes/demo.toml", "ringtrain/bench/gpu.sh", "ringtrain/bench/gpu_battery.py"] {
        assert!(names.contains(&f), "the wheel lacks {f}");
    }
}

/// Every path under `dir`, symbolic links not followed (a venv's lib64 is one).
fn walk(dir: &Path, root: &Path, into: &mut BTreeSet<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        into.insert(e.path().strip_prefix(root).unwrap().to_string_lossy().into_owned());
        if e.file_type().unwrap().is_dir() {
            walk(&e.path(), root, into);
        }
    }
}

fn files(venv: &Path) -> BTreeSet<String> {
    let mut s = BTreeSet::new();
    walk(venv, venv, &mut s);
    s
}

/// A program of the venv, run as a user would: from `cwd`, with nothing on the library path
/// and neither of ringtrain's variables set (what it loads, the entry point found).
fn launch(program: &Path, args: &[&str], cwd: &Path, envs: &[(&str, &str)]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RINGTRAIN_PYTHON")
        .env_remove("RINGTRAIN_LIBTORCH")
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

/// `venv/bin/python -m pip args...`, with no pip configuration of this machine (no index, no
/// extra folders of wheels): what it finds, it finds in the venv.
fn pip(venv: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.args(["-m", "pip"]).args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PIP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("PIP_CONFIG_FILE", "/dev/null").env("PIP_DISABLE_PIP_VERSION_CHECK", "1").output().unwrap()
}

#[test]
fn pip_installs_the_wheel_whose_command_finds_torch_trains_and_uninstalls_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let whl = wheel(d.path());
    // A fresh venv over the set-up venv's base Python (ensurepip's own pip: offline). torch is
    // not downloaded again: a .pth file puts the set-up venv's site-packages at the end of the
    // new venv's sys.path, where pip's resolver sees the installed torch (and its requirements)
    // as it sees any installed distribution on sys.path.
    let venv = d.path().join("venv");
    let o = Command::new(common::python()).args(["-m", "venv"]).arg(&venv).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])";
    let setup_site = common::run_python_code(purelib).trim().to_string();
    let o = Command::new(venv.join("bin/python")).args(["-c", purelib]).output().unwrap();
    let site = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    assert!(site.starts_with(&venv), "{}", site.display());
    let pth = site.join("setup-torch.pth");
    std::fs::write(&pth, format!("{setup_site}\n")).unwrap();
    let before = files(&venv);

    // With the extra that `predict` on .onnx files needs (ONNX Runtime, also set up beside torch).
    let with_onnx = format!("{}[onnx]", whl.to_str().unwrap());
    let o = pip(&venv, &["install", "--no-index", "--no-cache-dir", &with_onnx]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains(&format!("Requirement already satisfied: torch==2.11.* in {setup_site}")), "{out}");
    assert!(out.contains(&format!("Requirement already satisfied: onnxruntime>=1.20 in {setup_site}")), "{out}");

    let cwd = d.path().join("elsewhere");
    std::fs::create_dir(&cwd).unwrap();
    let command = venv.join("bin/ringtrain");
    let python = venv.join("bin/python");
    for (program, args) in [(&command, &["--version"][..]), (&python, &["-m", "ringtrain", "--version"][..])] {
        let o = launch(program, args, &cwd, &[]);
        assert!(o.status.success() && text(&o).contains("libtorch 2.11.0"), "{args:?}: {}", text(&o));
        // The fused kernels were compiled into the wheel's binary.
        let fused = ringtrain::model::fused::describe();
        assert!(fused.contains("kernels for sm_80, sm_90, sm_100"), "{fused}");
        assert!(text(&o).contains(&format!("fused kernels (--fused-norm): {fused}")), "{}", text(&o));
    }
    // The binary alone cannot start: it loads only the libtorch the entry point found.
    let installed = site.join("ringtrain/bin/ringtrain");
    let bare = launch(&installed, &["--version"], &cwd, &[]);
    assert!(!bare.status.success() && text(&bare).contains("libtorch"), "{}", text(&bare));

    // doctor names the libtorch the entry point found, and how.
    let o = launch(&command, &["doctor"], &cwd, &[]);
    let found = format!("found by the pip wheel's launcher: torch package at {setup_site}/torch");
    assert!(o.status.success() && text(&o).contains(&found), "{found:?} not in:\n{}", text(&o));
    // and the ONNX Runtime library of the onnxruntime package beside that torch.
    let ort = format!("ONNX Runtime {setup_site}/onnxruntime/capi/libonnxruntime.so");
    assert!(text(&o).contains(&ort), "{ort:?} not in:\n{}", text(&o));
    // The man page and the completions come from the command (files under the venv's share/
    // would leave their folders behind after pip uninstall).
    for args in [&["man"][..], &["completions", "bash"][..]] {
        let o = launch(&command, args, &cwd, &[]);
        assert!(o.status.success() && !o.stdout.is_empty(), "{args:?}: {}", text(&o));
    }

    // The GPU battery inside the package runs the command pip installed (bench/gpu.sh --bin
    // names another).
    let battery = site.join("ringtrain/bench");
    let code = format!("import sys; sys.path.insert(0, {:?}); import gpu_battery; print(gpu_battery.default_binary())", battery.to_str().unwrap());
    let o = launch(&python, &["-c", &code], &cwd, &[]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), command.to_str().unwrap(), "{}", text(&o));

    // One epoch on the CPU, 3 CIFAR-10 classes of 20 images.
    let data = d.path().join("data");
    common::link_first(&common::shared_data("cifar10/train"), &data, &["airplane", "cat", "ship"], 20);
    let run = d.path().join("run");
    let args = common::train_args(&data, &run, "--epochs 1 --model resnet10-tiny --img-size 32 --batch-size 16 --device cpu");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = launch(&command, &args, &cwd, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(run.join("best/model.safetensors").is_file(), "{}", text(&o));

    // What it cannot find, it names, in one line, with exit code 2.
    let fake = d.path().join("fake-torch");
    std::fs::create_dir_all(fake.join("cpu-only/lib")).unwrap();
    std::fs::write(fake.join("cpu-only/lib/libtorch_cpu.so"), "").unwrap();
    std::fs::create_dir_all(fake.join("older/lib")).unwrap();
    for f in ["libtorch_cpu.so", "libtorch_cuda.so"] {
        std::fs::write(fake.join("older/lib").join(f), "").unwrap();
    }
    std::fs::write(fake.join("older/version.py"), "__version__ = '2.10.0+cu130'\n").unwrap();
    let nowhere = d.path().join("nowhere");
    let (cpu_only, older) = (fake.join("cpu-only/lib"), fake.join("older/lib"));
    for (lib, says) in [
        (&nowhere, "holds no libtorch_cpu.so"),
        (&cpu_only, "is a CPU-only build"),
        (&older, "is 2.10.0; this ringtrain was built against 2.11.0"),
    ] {
        let o = launch(&command, &["--version"], &cwd, &[("RINGTRAIN_LIBTORCH", lib.to_str().unwrap())]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.code() == Some(2) && err.starts_with("error: ") && err.contains(says) && err.trim().lines().count() == 1,
            "{}: {err}",
            lib.display()
        );
    }
    // Without the .pth, this Python has no torch.
    std::fs::rename(&pth, d.path().join("hidden.pth")).unwrap();
    let o = launch(&command, &["--version"], &cwd, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && err.contains("has no torch package") && err.trim().lines().count() == 1, "{err}");
    std::fs::rename(d.path().join("hidden.pth"), &pth).unwrap();

    // Uninstalling leaves the venv as it was before the install, file for file.
    let o = pip(&venv, &["uninstall", "-y", "ringtrain"]);
    assert!(o.status.success(), "{}", text(&o));
    let after = files(&venv);
    assert_eq!(
        before.symmetric_difference(&after).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "pip uninstall left the venv changed"
    );
    assert!(!after.iter().any(|p| p.contains("ringtrain")), "{after:?}");
}
