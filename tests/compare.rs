//! `ringtrain compare` on three real runs (plant seedlings, 3 classes × 12 images, 32 px, two
//! epochs): the configuration keys it reports as differing are exactly the flags that differed,
//! its figures are those of each run's metrics.csv read here independently, `--plot` draws
//! every run, and what is not a run is refused in one line naming it.
mod common;

use std::path::{Path, PathBuf};

use common::{expect_user_error, metrics_rows, ringtrain, text};

const FLAGS: &str = "--img-size 32 --epochs 2 --batch-size 8 --val-split 0.25 --device cpu --seed 5 --workers 2";

fn train(data: &Path, out: &Path, flags: &str) -> PathBuf {
    let o = ringtrain(&common::train_args(data, out, &format!("{FLAGS} {flags}")));
    assert!(o.status.success(), "{}", text(&o));
    out.to_path_buf()
}

/// `compare` followed by `args`.
fn compare_args<'a>(args: &[&'a Path]) -> Vec<&'a Path> {
    std::iter::once(Path::new("compare")).chain(args.iter().copied()).collect()
}

/// `ringtrain compare ARGS`'s standard output (it must succeed).
fn compare(args: &[&Path]) -> String {
    let o = ringtrain(&compare_args(args));
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// The keys listed under "configuration keys that differ" (the first word of each line after
/// the column header), with the rest of their line.
fn differing(out: &str) -> Vec<Vec<String>> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with("configuration keys that differ"));
    let title = lines.next().expect("a differing-keys section");
    if title.contains(": none") {
        return Vec::new();
    }
    assert!(lines.next().unwrap().starts_with("key "), "{out}");
    lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// The table's cells of `run`'s line: run, model, best top-1, epoch, macro-F1, epochs, time,
/// images/s.
fn table_row(out: &str, run: &Path) -> Vec<String> {
    let name = run.to_str().unwrap();
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no line for {name} in:\n{out}"));
    line.split_whitespace().map(String::from).collect()
}

/// The line `ringtrain compare` must show for `run`, computed from its metrics.csv (columns:
/// epoch 0, val_top1 4, seconds 7, images_per_s 8, val_macro_f1 10): the best is the first
/// epoch of highest val_top1.
fn expected_row(run: &Path, model: &str, planned: usize) -> Vec<String> {
    let rows = metrics_rows(run);
    let mut best = &rows[0];
    for r in &rows {
        if r[4] > best[4] {
            best = r;
        }
    }
    let seconds: f64 = rows.iter().map(|r| r[7]).sum();
    let time = if seconds < 59.95 {
        format!("{seconds:.1}s")
    } else {
        let s = seconds.round() as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    };
    let ips = rows.iter().map(|r| r[8]).sum::<f64>() / rows.len() as f64;
    vec![
        run.to_str().unwrap().to_string(),
        model.to_string(),
        format!("{:.2}%", 100.0 * best[4]),
        format!("{}", best[0] as usize),
        format!("{:.4}", best[10]),
        format!("{}/{planned}", rows.len()),
        time,
        format!("{ips:.1}"),
    ]
}

#[test]
fn compare_shows_exactly_the_flags_that_differ_and_each_runs_figures() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let classes = ["Black-grass", "Charlock", "Cleavers"];
    common::link_first(&common::shared_data("plant-seedlings/train"), &data, &classes, 12);
    let a = train(&data, &d.path().join("a"), "--model resnet10-tiny --lr 0.05");
    let b = train(&data, &d.path().join("b"), "--model resnet10-tiny --lr 0.02");
    let c = train(&data, &d.path().join("c"), "--model lenet5 --lr 0.1");

    let abc = compare(&[&a, &b, &c]);
    eprintln!("{abc}");
    let keys = differing(&abc);
    let names: Vec<&str> = keys.iter().map(|k| k[0].as_str()).collect();
    assert_eq!(names, ["lr", "model"], "{abc}");
    assert_eq!(keys[0][1..], ["0.05", "0.02", "0.1"], "each run's lr, in order: {abc}");
    assert_eq!(keys[1][1..], ["resnet10-tiny", "resnet10-tiny", "lenet5"], "{abc}");
    for (run, model) in [(&a, "resnet10-tiny"), (&b, "resnet10-tiny"), (&c, "lenet5")] {
        assert_eq!(table_row(&abc, run), expected_row(run, model, 2), "{abc}");
    }

    let ab = compare(&[&a, &b]);
    let names: Vec<String> = differing(&ab).into_iter().map(|k| k[0].clone()).collect();
    assert_eq!(names, ["lr"], "{ab}");

    // A run in progress: a's first epoch only, its configuration the same (out aside).
    let running = d.path().join("running");
    std::fs::create_dir(&running).unwrap();
    let config = std::fs::read_to_string(a.join("config.toml")).unwrap();
    let out_line = format!("out = {:?}", a.to_str().unwrap());
    assert!(config.contains(&out_line), "config.toml records out as expected:\n{config}");
    let moved = config.replace(&out_line, &format!("out = {:?}", running.to_str().unwrap()));
    std::fs::write(running.join("config.toml"), moved).unwrap();
    let csv = std::fs::read_to_string(a.join("metrics.csv")).unwrap();
    std::fs::write(running.join("metrics.csv"), csv.lines().take(2).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let partial = compare(&[&a, &running]);
    assert_eq!(table_row(&partial, &running), expected_row(&running, "resnet10-tiny", 2), "{partial}");
    assert_eq!(table_row(&partial, &running)[5], "1/2");
    assert!(differing(&partial).is_empty(), "only out differs, and it is left out:\n{partial}");

    // A longer run written here: the best epoch (2) is neither the first nor the last, a later
    // epoch ties it, and the time passes a minute.
    let long = d.path().join("long");
    std::fs::create_dir(&long).unwrap();
    std::fs::write(long.join("config.toml"), config.replace("\nepochs = 2\n", "\nepochs = 5\n")).unwrap();
    let header = csv.lines().next().unwrap();
    let rows = [
        "1,1.1,0.3,1.0,0.4,1.0,0.1,30.5,100.0,0,0.3,",
        "2,0.9,0.5,0.8,0.7,1.0,0.1,40.25,120.0,0,0.6,",
        "3,0.8,0.6,0.9,0.7,1.0,0.1,20.0,110.0,0,0.65,",
    ];
    std::fs::write(long.join("metrics.csv"), format!("{header}\n{}\n", rows.join("\n"))).unwrap();
    let out = compare(&[&a, &long]);
    assert_eq!(table_row(&out, &long), expected_row(&long, "resnet10-tiny", 5), "{out}");
    assert_eq!(table_row(&out, &long)[2..], ["70.00%", "2", "0.6000", "3/5", "1m31s", "110.0"], "{out}");
    let keys = differing(&out);
    assert_eq!(keys, [["epochs", "2", "5"]], "{out}");

    // --plot: both panels, every run in its own colour, written atomically (no temporary left).
    let png = d.path().join("curves.png");
    let o = ringtrain(&compare_args(&[&a, &b, &c, Path::new("--plot"), &png]));
    assert!(o.status.success(), "{}", text(&o));
    let img = image::open(&png).unwrap().into_rgb8();
    assert_eq!(img.dimensions(), (1200, 480));
    let dark = img.pixels().filter(|p| p.0.iter().all(|&v| v < 80)).count();
    assert!(dark > 500, "almost no text or axes ({dark} dark pixels)");
    for colour in [[31, 119, 180], [255, 127, 14], [44, 160, 44]] {
        let n = img.pixels().filter(|p| p.0 == colour).count();
        assert!(n > 50, "run colour {colour:?} drawn in {n} pixels only");
    }
    let hidden: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "temporary files left: {hidden:?}");

    // Not run directories, a malformed metrics.csv, a plot into no folder: one line naming them.
    let missing = d.path().join("no-such-run");
    expect_user_error(&compare_args(&[&a, &missing]), missing.to_str().unwrap());
    expect_user_error(&compare_args(&[&a, &data]), data.to_str().unwrap());
    let broken = d.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::copy(a.join("config.toml"), broken.join("config.toml")).unwrap();
    std::fs::write(broken.join("metrics.csv"), "epoch,train_loss\n1,abc\n").unwrap();
    expect_user_error(&compare_args(&[&a, &broken]), broken.join("metrics.csv").to_str().unwrap());
    let nowhere = d.path().join("no-folder/curves.png");
    expect_user_error(&compare_args(&[&a, &b, Path::new("--plot"), &nowhere]), "no-folder");
}
