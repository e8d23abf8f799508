//! Helpers shared by the integration tests.
#![allow(dead_code)]
pub mod http;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tch::{Kind, Tensor};

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
    python_output(&[&[script.to_str().unwrap()], args].concat())
}

/// Python lines (after `import os`) that set `src` (plant seedlings' training folder), `out`,
/// `classes` (its first 3 classes) and `items` (the first 6 images of each, (path, class) in
/// ImageFolder order), and link those images into `out/tree`, an ImageFolder: the start of a
/// script that writes the same images in another format, to compare with the folder.
pub fn first_seedlings_py(out: &Path) -> String {
    format!(
        r#"src, out = {src:?}, {out:?}
classes = sorted(os.listdir(src))[:3]
items = [(f"{{src}}/{{c}}/{{f}}", i) for i, c in enumerate(classes) for f in sorted(os.listdir(f"{{src}}/{{c}}"))[:6]]
for p, c in items:
    os.makedirs(f"{{out}}/tree/{{classes[c]}}", exist_ok=True)
    os.symlink(p, f"{{out}}/tree/{{classes[c]}}/{{os.path.basename(p)}}")
"#,
        src = shared_data("plant-seedlings/train").to_str().unwrap(),
        out = out.to_str().unwrap()
    )
}

/// A finished command's standard output and error, one after the other, for messages.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Runs `python -c CODE` and returns its standard output.
pub fn run_python_code(code: &str) -> String {
    python_output(&["-c", code])
}

fn python_output(args: &[&str]) -> String {
    let out = Command::new(python())
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

/// Links the first `n` images (in name order) of each of `classes` of `src` into `dst`, an
/// ImageFolder tree (the shared data is never copied).
pub fn link_first(src: &Path, dst: &Path, classes: &[&str], n: usize) {
    for c in classes {
        std::fs::create_dir_all(dst.join(c)).unwrap();
        let mut files: Vec<_> = std::fs::read_dir(src.join(c)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files.into_iter().take(n) {
            std::os::unix::fs::symlink(&f, dst.join(c).join(f.file_name().unwrap())).unwrap();
        }
    }
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

/// ringtrain started with `args`, its standard output and error piped (to read as it runs, and
/// after it ends).
pub fn spawn_ringtrain<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting ringtrain")
}

/// Every batch of an in-order pass over `spec` at 48 px (the evaluation transform): (pixels,
/// labels). Two sources of the same images in the same order give the same batches.
pub fn eval_batches(spec: impl Into<ringtrain::data::source::DataSpec>) -> Vec<(Vec<u8>, Vec<i64>)> {
    use ringtrain::data::load::loader::{Loader, LoaderOptions};
    let set = ringtrain::data::source::Dataset::open(spec, "--data").unwrap();
    let t = ringtrain::data::augment::transform::Transform::eval(48, 56, Default::default());
    let l = Loader::new(set.samples, t, LoaderOptions::in_order(5, 2)).unwrap();
    l.epoch(0)
        .map(|b| {
            let b = b.unwrap();
            (Vec::<u8>::try_from(b.images.flatten(0, -1)).unwrap(), Vec::<i64>::try_from(&b.labels).unwrap())
        })
        .collect()
}

/// The samples of two training epochs over `spec` in the order a shuffled training loader gives
/// them (seed 5, RandomResizedCrop 40 + flip): (pixels, label) each. A source listing the same
/// images in the same order gives the same sequence; a sharded one, the same multiset per epoch.
pub fn train_samples(spec: impl Into<ringtrain::data::source::DataSpec>) -> Vec<Vec<(Vec<u8>, i64)>> {
    use ringtrain::data::load::loader::{Loader, LoaderOptions};
    let set = ringtrain::data::source::Dataset::open(spec, "--data").unwrap();
    let t = ringtrain::data::augment::transform::Transform::random_resized_crop(40, Default::default());
    let o = LoaderOptions {
        shuffle: true,
        seed: 5,
        ..LoaderOptions::in_order(4, 2)
    };
    let l = Loader::new(set.samples, t, o).unwrap();
    (0..2)
        .map(|e| {
            l.epoch(e)
                .flat_map(|b| {
                    let b = b.unwrap();
                    let px = Vec::<u8>::try_from(b.images.flatten(0, -1)).unwrap();
                    let labels = Vec::<i64>::try_from(&b.labels).unwrap();
                    let per = px.len() / labels.len();
                    px.chunks(per).map(<[u8]>::to_vec).zip(labels).collect::<Vec<_>>()
                })
                .collect()
        })
        .collect()
}

/// Each epoch of `train_samples` sorted: what a sharded source must hold per epoch in common
/// with the folder of the same images.
pub fn sorted_epochs(epochs: Vec<Vec<(Vec<u8>, i64)>>) -> Vec<Vec<(Vec<u8>, i64)>> {
    epochs
        .into_iter()
        .map(|mut e| {
            e.sort();
            e
        })
        .collect()
}

/// The SHA-256 (hex) of sample `i`'s bytes as stored.
pub fn sample_sha256(samples: &ringtrain::data::source::Samples, i: usize) -> String {
    use sha2::Digest;
    let ringtrain::data::source::Stored::Encoded(bytes) = samples.read(i).unwrap() else {
        panic!("sample {i} is not stored encoded")
    };
    format!("{:x}", sha2::Sha256::digest(&bytes))
}

/// Runs ringtrain with `args` and expects a user error: exit code 2, one line starting
/// "error: " that mentions `needle`, no panic.
pub fn expect_user_error<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S], needle: &str) {
    let out = ringtrain(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: expected exit 2, stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: expected one line, got: {stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains(needle),
        "{args:?}: {stderr:?} lacks {needle:?}"
    );
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
}

/// An ImageFolder tree of the demo's procedural shapes (36 px): `per_class` PNGs per class.
pub fn make_folder(root: &Path, classes: &[&str], per_class: usize) {
    Shapes { size: 36, seed: 3, first: 0 }.write(root, classes, per_class);
}

/// Images of the demo's procedural shapes, `size` px: class `c` is the demo's `c`-th shape, its
/// images are the demo's `first`, `first + 1`, ... of stream `seed` (so two folders with other
/// `first`s share no image).
pub struct Shapes {
    pub size: u32,
    pub seed: u64,
    pub first: u64,
}

impl Shapes {
    /// `root/<class>/<i>.png` for each of `classes` and `i` in `0..per_class`.
    pub fn write(&self, root: &Path, classes: &[&str], per_class: usize) {
        for (c, name) in classes.iter().enumerate() {
            std::fs::create_dir_all(root.join(name)).unwrap();
            for i in 0..per_class {
                ringtrain::data::tools::demo::render(c, self.size, self.seed, self.first + i as u64)
                    .save(root.join(name).join(format!("{i}.png")))
                    .unwrap();
            }
        }
    }
}

/// A command line as a test states it: the words of `line`, each `{}` replaced by the next of
/// `paths` (kept whole, spaces and all):
/// `argv("eval --checkpoint {} --data {} --device cpu", &[&ckpt, &test])`.
pub fn argv(line: &str, paths: &[&Path]) -> Vec<OsString> {
    let mut paths = paths.iter();
    let v = line
        .split_whitespace()
        .map(|w| match w {
            "{}" => paths.next().expect("a path for each {}").as_os_str().to_owned(),
            w => OsString::from(w),
        })
        .collect();
    assert!(paths.next().is_none(), "more paths than {{}} in {line:?}");
    v
}

/// metrics.csv of a run as numbers, one row per epoch (header left out); an empty cell
/// (ema_val_top1 without --ema) reads as NaN.
pub fn metrics_rows(run: &Path) -> Vec<Vec<f64>> {
    std::fs::read_to_string(run.join("metrics.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|x| x.parse().unwrap_or(f64::NAN)).collect())
        .collect()
}

/// `torchrun --nproc-per-node N --master-port <free> --no-python ringtrain`: add ringtrain's
/// arguments (the environment's torchrun, beside its Python).
pub fn torchrun(nproc: usize) -> Command {
    let mut c = Command::new(Path::new(&python()).with_file_name("torchrun"));
    let port = ringtrain::dist::launcher::free_port().unwrap().to_string();
    c.args(["--nproc-per-node", &nproc.to_string(), "--master-port", &port, "--no-python"]);
    c.arg(env!("CARGO_BIN_EXE_ringtrain"));
    c
}

/// Event files TensorBoard would read in `dir`.
pub fn event_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("events.out"))
        .count()
}

/// metrics.csv of a run without its timing columns (seconds, images/s and after): what a rerun
/// or a resumed run must reproduce.
pub fn metrics_without_timing(run: &Path) -> Vec<String> {
    std::fs::read_to_string(run.join("metrics.csv"))
        .unwrap()
        .lines()
        .map(|l| l.split(',').take(7).collect::<Vec<_>>().join(","))
        .collect()
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

/// `train_args` with `--val VAL` after the flags.
pub fn train_val_args(data: &Path, val: &Path, out: &Path, flags: &str) -> Vec<String> {
    let mut v = train_args(data, out, flags);
    v.extend(["--val".into(), val.to_string_lossy().into_owned()]);
    v
}

/// CRC-32 (IEEE) as PNG chunks use it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

/// A small valid image file whose header claims `w`×`h` pixels (a decompression bomb as a
/// decoder first sees it): PNG with a re-computed IHDR CRC, or baseline JPEG with a patched SOF0.
pub fn image_claiming(path: &Path, w: u32, h: u32) {
    let img = image::RgbImage::from_pixel(16, 16, image::Rgb([200, 10, 10]));
    img.save(path).unwrap();
    let mut b = std::fs::read(path).unwrap();
    if b.starts_with(b"\x89PNG") {
        // signature (8) | length (4) | "IHDR" | width | height | ... | CRC over type + data
        b[16..20].copy_from_slice(&w.to_be_bytes());
        b[20..24].copy_from_slice(&h.to_be_bytes());
        let crc = crc32(&b[12..29]);
        b[29..33].copy_from_slice(&crc.to_be_bytes());
    } else {
        let sof = b.windows(2).position(|m| m == [0xFF, 0xC0]).expect("baseline JPEG");
        // FF C0 | length (2) | precision (1) | height (2) | width (2)
        b[sof + 5..sof + 7].copy_from_slice(&(h as u16).to_be_bytes());
        b[sof + 7..sof + 9].copy_from_slice(&(w as u16).to_be_bytes());
    }
    std::fs::write(path, b).unwrap();
}

/// `ringtrain models`: its output, and its table's rows by model name (the whitespace-separated
/// columns of each row, the name first).
pub fn models_table() -> (String, HashMap<String, Vec<String>>) {
    let o = ringtrain(&["models"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let rows = out
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty()) // notes and torchvision's weights follow, after a blank line
        .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
        .map(|c| (c[0].clone(), c))
        .collect();
    (out, rows)
}

/// The weights a run ended with (`last/model.safetensors` of its run directory), by name.
pub fn weights(run_dir: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(run_dir.join("last/model.safetensors"))
        .unwrap()
        .into_iter()
        .collect()
}

/// The largest absolute difference between two tensors, computed in double precision.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// The largest absolute value of a tensor.
pub fn max_abs(t: &Tensor) -> f64 {
    t.to_kind(Kind::Double).abs().max().double_value(&[])
}

/// The largest difference between `got` and `want`, relative to the largest value of `want`:
/// the agreement of two float computations of the same quantity, on the scale of that quantity.
pub fn rel_max_diff(got: &Tensor, want: &Tensor) -> f64 {
    let scale = max_abs(want);
    assert!(scale > 0.0, "the reference is all zero: nothing to compare with");
    max_abs_diff(got, want) / scale
}

/// The largest difference between two sets of weights, over every tensor but the integer batch
/// counters.
pub fn max_diff(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .filter(|(k, _)| !k.ends_with("num_batches_tracked"))
        .map(|(k, t)| max_abs_diff(t, &b[k]))
        .fold(0.0, f64::max)
}

/// The largest difference between runs `a` and `b` (any tensor), relative to the largest change
/// the reference run made to a parameter from the initial weights: the size of the update being
/// compared. Float agreement depends on the CPU's kernels (oneDNN and ATen pick them by
/// instruction set, and their summation order with them); the size of an update does not.
pub fn rel_diff(
    a: &HashMap<String, Tensor>,
    b: &HashMap<String, Tensor>,
    reference: &HashMap<String, Tensor>,
    init: &HashMap<String, Tensor>,
) -> f64 {
    let is_param = |k: &str| !k.contains("running_") && !k.ends_with("num_batches_tracked");
    let update = reference
        .iter()
        .filter(|(k, _)| is_param(k))
        .map(|(k, t)| max_abs_diff(t, &init[k]))
        .fold(0.0, f64::max);
    assert!(update > 0.0, "the reference run changed no parameter");
    max_diff(a, b) / update
}

/// Run `a` against run `b`, tensor by tensor, each relative to the change the reference run made
/// to that tensor from the initial weights (its own update): the worst ratio and its tensor.
/// Tensors whose update is below `1e-3` of the largest are set apart: their gradient is zero in
/// exact arithmetic (a bias followed by a BatchNorm, which removes any shift), so their update is
/// rounding noise and a ratio to it means nothing; they are compared with the largest update.
pub struct PerTensor {
    pub worst: f64,
    pub tensor: String,
    /// The worst difference among the set-apart tensors, relative to the largest update.
    pub zero_grad_worst: f64,
}

pub fn rel_diff_per_tensor(
    a: &HashMap<String, Tensor>,
    b: &HashMap<String, Tensor>,
    reference: &HashMap<String, Tensor>,
    init: &HashMap<String, Tensor>,
) -> PerTensor {
    let is_param = |k: &str| !k.contains("running_") && !k.ends_with("num_batches_tracked");
    let updates: Vec<(&String, f64)> = reference
        .iter()
        .filter(|(k, _)| is_param(k))
        .map(|(k, t)| (k, max_abs_diff(t, &init[k])))
        .collect();
    let largest = updates.iter().map(|u| u.1).fold(0.0, f64::max);
    assert!(largest > 0.0, "the reference run changed no parameter");
    let mut out = PerTensor {
        worst: 0.0,
        tensor: String::new(),
        zero_grad_worst: 0.0,
    };
    for (k, update) in updates {
        let d = max_abs_diff(&a[k], &b[k]);
        if update < 1e-3 * largest {
            out.zero_grad_worst = out.zero_grad_worst.max(d / largest);
        } else if d / update >= out.worst {
            (out.worst, out.tensor) = (d / update, k.clone());
        }
    }
    out
}
