//! `ringtrain lr-find` on a small subset of plant seedlings (4 classes × 40 images, 48 px,
//! resnet10-tiny, CPU): the CSV's LRs rise exponentially, its smoothed loss is the bias-corrected
//! moving average of its losses (recomputed in numpy), the test stopped at the end or at the
//! first divergence, the suggestion is where the smoothed loss falls fastest (numpy.gradient's
//! steepest point) and below the LR of the minimum, the printed train command runs; a run
//! directory is never touched, and refused as --out; the PNG is a picture with ink.
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

const CLASSES: &[&str] = &["Charlock", "Common_Chickweed", "Loose_Silky-bent", "Sugar_beet"];
const FLAGS: &str = "--model resnet10-tiny --img-size 48 --batch-size 16 --device cpu --seed 3";
/// The default ramp and step count (not given on the command line).
const START: f64 = 1e-7;
const END: f64 = 10.0;
const STEPS: usize = 100;

/// Every file under `dir` with its bytes and modification time.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
                files.insert(p.strip_prefix(dir).unwrap().display().to_string(), (std::fs::read(&p).unwrap(), mtime));
            }
        }
    }
    files
}

/// ringtrain with one libtorch thread: on 2 cores shared with other work, libtorch's spinning
/// threads starve the data workers (60 steps: 18 s instead of 2.6 s, measured under load).
fn ringtrain<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("running ringtrain")
}

fn lr_find(data: &Path, out: &Path, more: &str) -> std::process::Output {
    let line = format!("lr-find --data {{}} --out {{}} {FLAGS} {more}");
    ringtrain(&common::argv(&line, &[data, out]))
}

/// lr_find.csv as numbers, after checking its header.
fn csv_rows(csv: &Path) -> Vec<[f64; 4]> {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("step,lr,loss,smoothed_loss"));
    lines
        .map(|l| {
            let v: Vec<f64> = l.split(',').map(|x| x.parse().unwrap()).collect();
            [v[0], v[1], v[2], v[3]]
        })
        .collect()
}

/// What numpy finds in lr_find.csv, as JSON: the smoothing recomputed from the raw losses
/// (fastai's: beta 0.98, bias-corrected), the steepest point as Lightning finds it
/// (np.gradient against log(lr) over the points from the first tenth of the steps to the last
/// 5), and the LR of the minimum smoothed loss.
fn numpy_view(csv: &Path) -> serde_json::Value {
    let code = format!(
        r#"
import json, numpy as np
d = np.genfromtxt({csv:?}, delimiter=",", names=True)
lr, loss, sm = d["lr"], d["loss"], d["smoothed_loss"]
avg, ref = 0.0, []
for i, l in enumerate(loss):
    avg = 0.98 * avg + 0.02 * l
    ref.append(avg / (1 - 0.98 ** (i + 1)))
ref = np.array(ref)
fin = np.isfinite(ref) & np.isfinite(sm)
lo, hi = {steps} // 10, len(lr) - 5
g = np.gradient(sm[lo:hi], np.log(lr[lo:hi]))
steep = lo + int(np.argmin(g))
print(json.dumps({{
    "same_nonfinite": bool((np.isfinite(ref) == np.isfinite(sm)).all()),
    "smoothing_rel_err": float(np.max(np.abs(ref[fin] - sm[fin]) / np.abs(sm[fin]))),
    "steepest_lr": float(lr[steep]),
    "min_lr": float(lr[np.nanargmin(np.where(np.isfinite(sm), sm, np.nan))]),
}}))
"#,
        csv = csv.to_str().unwrap(),
        steps = STEPS
    );
    serde_json::from_str(&common::run_python_code(&code)).unwrap()
}

#[test]
fn lr_find_suggests_the_steepest_fall_and_leaves_runs_alone() {
    let d = tempfile::tempdir().unwrap();
    let (data, found, run) = (d.path().join("data"), d.path().join("found"), d.path().join("run"));
    common::link_first(&common::shared_data("plant-seedlings/train"), &data, CLASSES, 40);

    // --lr is given to be replaced in the suggested command, not repeated.
    let o = lr_find(&data, &found, "--lr 0.5");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", common::text(&o));
    let mut entries: Vec<String> =
        std::fs::read_dir(&found).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    entries.sort();
    assert_eq!(entries, ["lr_find.csv", "lr_find.png"], "lr-find writes these two files only");

    // The CSV: columns, the exponential ramp, the smoothing, where it stopped.
    let csv_path = found.join("lr_find.csv");
    let rows = csv_rows(&csv_path);
    let ratio = (END / START).powf(1.0 / (STEPS - 1) as f64);
    assert!((rows[0][1] / START - 1.0).abs() < 1e-12, "first lr {}", rows[0][1]);
    for (i, w) in rows.windows(2).enumerate() {
        assert_eq!(w[1][0], (i + 1) as f64, "steps are numbered 0, 1, ...");
        assert!((w[1][1] / w[0][1] / ratio - 1.0).abs() < 1e-9, "lr {i}→{}: {} → {}", i + 1, w[0][1], w[1][1]);
    }
    let np = numpy_view(&csv_path);
    assert_eq!(np["same_nonfinite"], true, "{np}");
    let err = np["smoothing_rel_err"].as_f64().unwrap();
    assert!(err < 1e-12, "the smoothed loss differs from numpy's by {err:e} (relative)");
    // Stopped at the end of the ramp, or at the first point whose smoothed loss exceeds 4× the
    // minimum so far (or is not finite), and not before.
    let diverges = |k: usize| {
        let s = rows[k][3];
        let min = rows[..=k].iter().map(|r| r[3]).fold(f64::INFINITY, f64::min);
        !s.is_finite() || s > 4.0 * min
    };
    let last = rows.len() - 1;
    assert!(rows.len() == STEPS || diverges(last), "stopped at step {last} without a reason");
    assert!(!(0..last).any(diverges), "went on after diverging");
    assert!(stdout.contains(&format!("{} steps on 144 images (4 classes)", rows.len())), "{stdout}");

    // The suggestion: printed, near numpy's steepest point, below the LR of the minimum.
    let at = stdout.find("suggested --lr ").unwrap_or_else(|| panic!("no suggestion: {stdout}"));
    let after = &stdout[at + "suggested --lr ".len()..];
    let (lr_text, rest) = after.split_once(' ').unwrap();
    assert!(rest.starts_with("(steepest fall of the smoothed loss); train with:\n"), "{rest}");
    let lr: f64 = lr_text.parse().unwrap();
    let steepest = np["steepest_lr"].as_f64().unwrap();
    let min_lr = np["min_lr"].as_f64().unwrap();
    // The printed value has 2 significant digits, and on a near tie float rounding may pick a
    // neighbour: within 2× (3.6 steps of this ramp).
    assert!(
        lr / steepest < 2.0 && steepest / lr < 2.0,
        "suggested {lr:e}, numpy's steepest fall at {steepest:e}"
    );
    assert!(lr < min_lr, "suggested {lr:e} is not below the minimum's LR {min_lr:e}");
    eprintln!(
        "{} steps; suggested {lr:e}, numpy's steepest fall at {steepest:e}, minimum at {min_lr:e}",
        rows.len()
    );

    // The printed command: this test's flags, --lr replaced, lr-find's own flags gone.
    let command = rest.lines().nth(1).unwrap();
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(&words[..2], ["ringtrain", "train"], "{command}");
    for flag in FLAGS.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(words.contains(&flag), "{flag} missing from {command}");
    }
    assert_eq!(words.iter().filter(|w| **w == "--lr").count(), 1, "{command}");
    assert!(command.ends_with(&format!("--lr {lr_text}")), "{command}");
    assert!(!words.contains(&"--out") && !words.contains(&"--steps"), "{command}");
    assert!(command.contains(data.to_str().unwrap()), "{command}");
    // It runs: one epoch into a run directory, which the rest of the test must leave alone.
    let mut argv: Vec<&str> = words[1..].to_vec();
    let run_s = run.to_str().unwrap();
    argv.extend(["--epochs", "1", "--out", run_s]);
    let t = ringtrain(&argv);
    assert!(t.status.success(), "the suggested command failed: {}", common::text(&t));
    assert!(run.join("last").is_dir() && run.join("config.toml").is_file());

    // A run directory is untouched by lr-find on its data elsewhere, and refused as --out.
    let before = snapshot(&run);
    let again = d.path().join("again");
    let o = lr_find(&data, &again, "--steps 20 --start-lr 1e-4 --end-lr 1");
    assert!(o.status.success(), "{}", common::text(&o));
    let short = csv_rows(&again.join("lr_find.csv"));
    assert!(short.len() <= 20 && (short[0][1] / 1e-4 - 1.0).abs() < 1e-12, "{short:?}");
    if short.len() == 20 {
        assert!((short[19][1] - 1.0).abs() < 1e-12, "{short:?}");
    }
    common::expect_user_error(
        &common::argv(&format!("lr-find --data {{}} --out {{}} {FLAGS} --steps 20"), &[&data, &run]),
        "is a training run's directory",
    );
    assert!(snapshot(&run) == before, "lr-find changed the run directory");
    // Several processes are refused in one line too.
    common::expect_user_error(
        &common::argv(&format!("lr-find --data {{}} --out {{}} {FLAGS} --nproc-per-node 2"), &[&data, &found]),
        "lr-find runs in one process",
    );

    // The picture: a PNG of the stated size, with text and lines, the smoothed curve's blue and
    // the suggestion's red marker.
    let img = image::open(found.join("lr_find.png")).unwrap().into_rgb8();
    assert_eq!(img.dimensions(), (900, 560));
    let count = |f: &dyn Fn([u8; 3]) -> bool| img.pixels().filter(|p| f(p.0)).count();
    let dark = count(&|p| p.iter().all(|&c| c < 80));
    let blue = count(&|p| p == [20, 60, 170]);
    let red = count(&|p| p == [210, 30, 30]);
    assert!(dark > 500 && blue > 200 && red > 50, "dark {dark}, blue {blue}, red {red} pixels");
}
