//! `ringtrain bench-data`: the input pipeline measured beside PyTorch's DataLoader in one run,
//! and feeding a training step.
mod common;

fn figure(stdout: &str, prefix: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no '{prefix}' line in {stdout}"));
    line.split_whitespace().find_map(|w| w.parse::<f64>().ok()).unwrap()
}

#[test]
fn bench_data_measures_the_loader_beside_pytorchs_and_feeds_a_model() {
    let d = tempfile::tempdir().unwrap();
    common::make_folder(d.path(), &["circle", "cross", "ring"], 12);
    let data = d.path().to_str().unwrap();
    let common_args = [
        "bench-data",
        "--data",
        data,
        "--img-size",
        "32",
        "--batch-size",
        "8",
        "--workers",
        "2",
        "--device",
        "cpu",
    ];
    let python = common::python();
    let o = common::ringtrain(&[&common_args[..], &["--vs-pytorch", "--python", &python]].concat());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    let (ours, theirs, ratio) = (
        figure(&stdout, "ringtrain:"),
        figure(&stdout, "pytorch:"),
        figure(&stdout, "ratio ringtrain / pytorch:"),
    );
    assert!(ours > 0.0 && theirs > 0.0);
    assert!((ratio - ours / theirs).abs() < 0.01 * ratio, "{stdout}");

    let o = common::ringtrain(&[&common_args[..], &["--model", "resnet10-tiny"]].concat());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.contains("feeding resnet10-tiny") && figure(&stdout, "ringtrain:") > 0.0,
        "{stdout}"
    );

    // The batches made on the device take no policy: refused, as train refuses it, rather than
    // timing no augmentation beside a PyTorch side that times one.
    common::expect_user_error(
        &[&common_args[..], &["--data-on-device", "--auto-augment", "ta_wide"]].concat(),
        "--data-on-device does not do --auto-augment",
    );

    // 36 images cannot make two batches of 64.
    let o = common::ringtrain(&[
        "bench-data",
        "--data",
        data,
        "--batch-size",
        "64",
        "--epochs",
        "1",
        "--device",
        "cpu",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("too few for two batches"), "{stderr}");
}
