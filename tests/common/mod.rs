//! Helpers shared by the integration tests.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The Python with torch/torchvision/sklearn that serves as the independent reference
/// (set by scripts/test.sh; falls back to `python3`).
pub fn python() -> String {
    std::env::var("RINGTRAIN_PYTHON").unwrap_or_else(|_| "python3".into())
}

pub fn run_python(args: &[&str]) -> String {
    run_python_script("torchvision_reference.py", args)
}

/// Runs `tests/py/<script>` with `args` and returns its standard output.
pub fn run_python_script(script: &str, args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py").join(script);
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .expect("running the reference Python");
    assert!(
        out.status.success(),
        "reference Python failed (run the tests through scripts/test.sh so torch is available):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The shared real data sets, beside the repository.
pub fn shared_data(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data").join(rel);
    assert!(p.exists(), "shared data set missing: {}", p.display());
    p
}

pub fn ringtrain<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(args)
        .output()
        .expect("running ringtrain")
}

/// An ImageFolder tree of the demo's procedural shapes (36 px): `per_class` PNGs per class.
pub fn make_folder(root: &Path, classes: &[&str], per_class: usize) {
    for (c, name) in classes.iter().enumerate() {
        std::fs::create_dir_all(root.join(name)).unwrap();
        for i in 0..per_class {
            ringtrain::data::demo::render(c, 36, 3, i as u64)
                .save(root.join(name).join(format!("{i}.png")))
                .unwrap();
        }
    }
}

/// The arguments of `ringtrain train --data DATA --out OUT` followed by `flags`, written as one
/// string of space-separated words (values without spaces), so a test states only what matters:
/// `train_args(&data, &out, "--model resnet10-tiny --img-size 32 --epochs 2 --device cpu")`.
pub fn train_args(data: &Path, out: &Path, flags: &str) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "train".into(),
        "--data".into(),
        data.to_string_lossy().into_owned(),
        "--out".into(),
        out.to_string_lossy().into_owned(),
    ];
    v.extend(flags.split_whitespace().map(String::from));
    v
}
