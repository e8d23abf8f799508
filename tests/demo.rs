//! The README's main job: `ringtrain demo` generates its data set and trains to >= 90 % on CPU.
mod common;

#[test]
fn demo_reaches_ninety_percent_on_cpu() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("demo");
    let o = common::ringtrain(&["demo", "--out", out.to_str().unwrap(), "--device", "cpu"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}\n{}", stdout, String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("classification report"), "{stdout}");
    let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    let best = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(4).unwrap().parse::<f64>().unwrap())
        .fold(0.0, f64::max);
    assert!(best >= 0.9, "demo reached only {best}:\n{stdout}");
    assert_eq!(std::fs::read_dir(out.join("data/train")).unwrap().count(), 8);
}
