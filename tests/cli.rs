//! The binary as a user meets it: bad input is one clear line and exit code 2 with nothing
//! written; the same seed gives the same run; the version names libtorch.
mod common;

use common::{expect_user_error, make_folder, ringtrain};

#[test]
fn bad_input_is_rejected_with_one_line_and_exit_2_before_any_work() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["a", "b"], 3);
    let out = d.path().join("run");
    let (data_s, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    let base = |extra: &[&str]| -> Vec<String> {
        ["train", "--data", data_s, "--out", out_s, "--epochs", "1"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let run = |extra: &[&str], needle: &str| {
        let args = base(extra);
        expect_user_error(&args.iter().map(String::as_str).collect::<Vec<_>>(), needle);
    };
    run(&["--lr", "-0.1"], "--lr must be a positive number");
    run(&["--batch-size", "0"], "--batch-size must be at least 1");
    run(&["--model", "resnet9000"], "unknown --model 'resnet9000'");
    run(&["--device", "tpu"], "invalid --device 'tpu'");
    run(&["--interpolation", "lanczos"], "invalid --interpolation 'lanczos'");
    for command in ["eval", "predict"] {
        expect_user_error(
            &[command, "--checkpoint", "/no/such/run", "--data", data_s, "--interpolation", "cubic"],
            "invalid --interpolation 'cubic'",
        );
    }
    run(&["--warmup-epochs", "5"], "--warmup-epochs");
    run(&["--optimizer", "lamb", "--nesterov"], "--optimizer lamb has none");
    run(&["--optimizer", "lars", "--lars-eta", "0"], "--lars-eta must be positive");
    run(&["--sched", "poly", "--poly-power", "0"], "--poly-power must be positive");

    expect_user_error(&["train", "--data", "/no/such/dir", "--out", out_s], "/no/such/dir");
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    expect_user_error(
        &["train", "--data", empty.to_str().unwrap(), "--out", out_s],
        "no class sub-directories",
    );
    let with_empty_class = d.path().join("with_empty_class");
    make_folder(&with_empty_class, &["a"], 2);
    std::fs::create_dir(with_empty_class.join("b")).unwrap();
    expect_user_error(
        &["train", "--data", with_empty_class.to_str().unwrap(), "--out", out_s],
        "class 'b' has no images",
    );
    let val = d.path().join("val");
    make_folder(&val, &["a", "c"], 2);
    run(&["--val", val.to_str().unwrap()], "validation classes differ");

    let cfg = d.path().join("run.toml");
    std::fs::write(&cfg, "learning_rate = 0.1\n").unwrap();
    run(&["--config", cfg.to_str().unwrap()], "unknown field `learning_rate`");
    run(&["--config", "/no/such.toml"], "cannot read --config /no/such.toml");

    assert!(!out.exists(), "a rejected run must not create its run directory");
}

#[test]
fn config_file_is_used_and_flags_override_it() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["a", "b"], 6);
    let cfg = d.path().join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "data = {:?}\nmodel = \"resnet10-tiny\"\nimg_size = 32\nepochs = 1\nbatch_size = 4\nlr = 0.5\n",
            data
        ),
    )
    .unwrap();
    let out = d.path().join("run");
    let o = ringtrain(&common::argv("train --config {} --lr 0.02 --out {} --device cpu", &[&cfg, &out]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let resolved: toml::Table = std::fs::read_to_string(out.join("config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(resolved["lr"].as_float(), Some(0.02));
    assert_eq!(resolved["batch_size"].as_integer(), Some(4));
    assert_eq!(resolved["model"].as_str(), Some("resnet10-tiny"));

    // A second run into the same directory is refused, and the first run's checkpoint stays.
    let before = std::fs::read(out.join("last/model.safetensors")).unwrap();
    let args = [
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--device",
        "cpu",
    ];
    expect_user_error(&args, "already holds a run");
    assert_eq!(std::fs::read(out.join("last/model.safetensors")).unwrap(), before);
    let o = ringtrain(&[&args[..], &["--overwrite"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(common::event_files(&out), 1, "--overwrite replaces the event file too");
}

#[test]
fn same_seed_gives_bit_identical_cpu_runs() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["circle", "cross", "hexagon"], 16);
    let run = |name: &str| {
        let out = d.path().join(name);
        let o = ringtrain(&common::train_args(
            &data,
            &out,
            "--model resnet10-tiny --img-size 32 --epochs 2 --batch-size 8 --device cpu --seed 5 --workers 2",
        ));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    };
    let (a, b) = (run("a"), run("b"));
    assert_eq!(common::metrics_without_timing(&a), common::metrics_without_timing(&b));
    assert_eq!(common::metrics_without_timing(&a).len(), 3);
    assert_eq!(
        std::fs::read(a.join("last/model.safetensors")).unwrap(),
        std::fs::read(b.join("last/model.safetensors")).unwrap()
    );
}

/// The flags of a command, as its help lists them.
fn flags_of(command: &str) -> Vec<String> {
    let o = ringtrain(&[command, "--help"]);
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.trim_end_matches([',', '.']).to_string())
        .collect()
}

#[test]
fn every_command_reads_data_and_writes_out_and_the_old_names_still_work_unlisted() {
    for command in ["train", "eval", "predict", "bench-data", "split", "stats", "pack"] {
        assert!(flags_of(command).contains(&"--data".to_string()), "{command} has no --data");
    }
    for command in ["train", "demo", "eval", "predict", "split", "pack", "convert", "doctor"] {
        assert!(flags_of(command).contains(&"--out".to_string()), "{command} has no --out");
    }
    let split = flags_of("split");
    assert!(!split.contains(&"--src".to_string()) && !split.contains(&"--dst".to_string()), "{split:?}");

    // split as a new user writes it, and as earlier versions took it: the same split.
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["a", "b"], 5);
    let listing = |dir: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = ["train", "val"]
            .iter()
            .flat_map(|s| std::fs::read_dir(dir.join(s)).unwrap().map(|e| e.unwrap().path()))
            .flat_map(|c| std::fs::read_dir(&c).unwrap().map(|e| e.unwrap().path()))
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect();
        v.sort();
        v
    };
    let (new, old) = (d.path().join("new"), d.path().join("old"));
    for (args, out) in [(["--data", "--out"], &new), (["--src", "--dst"], &old)] {
        let o = ringtrain(&["split", args[0], data.to_str().unwrap(), args[1], out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(listing(&new), listing(&old));
    assert_eq!(listing(&new).len(), 10);
    // Its refusals name the flags a user now types.
    expect_user_error(&["split", "--data", data.to_str().unwrap(), "--out", new.to_str().unwrap()], "--out");
    expect_user_error(&["split", "--data", "/no/such/dir", "--out", d.path().join("x").to_str().unwrap()], "--data");
}

#[test]
fn version_names_ringtrain_and_libtorch() {
    let o = ringtrain(&["--version"]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        s.starts_with(&format!("ringtrain {}", env!("CARGO_PKG_VERSION"))),
        "{s}"
    );
    assert!(s.contains("libtorch 2.11.0"), "{s}");
}

#[test]
fn unreadable_images_are_skipped_with_a_warning_or_stop_the_run_with_strict() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["a", "b"], 6);
    std::fs::write(data.join("a/truncated.png"), b"\x89PNG\r\n\x1a\n truncated").unwrap();
    std::fs::write(data.join("b/text.jpg"), b"not a jpeg at all").unwrap();
    let out = d.path().join("run");
    let base = [
        "train",
        "--data",
        data.to_str().unwrap(),
        "--model",
        "resnet10-tiny",
        "--img-size",
        "32",
        "--epochs",
        "2",
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "--val-split",
        "0.2",
    ];
    let o = ringtrain(&[&base[..], &["--out", out.to_str().unwrap()]].concat());
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{stderr}");
    for bad in ["truncated.png", "text.jpg"] {
        assert_eq!(
            stderr.lines().filter(|l| l.contains(bad)).count(),
            1,
            "one warning per file, naming it: {stderr}"
        );
    }
    assert!(stdout.contains("unreadable images skipped"), "{stdout}");

    let strict = d.path().join("strict");
    let o = ringtrain(&[&base[..], &["--out", strict.to_str().unwrap(), "--strict"]].concat());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && (stderr.contains("truncated.png") || stderr.contains("text.jpg")),
        "{stderr}"
    );

    // Nothing decodes: an error before training, naming the folder.
    let broken = d.path().join("broken");
    for c in ["a", "b"] {
        std::fs::create_dir_all(broken.join(c)).unwrap();
        std::fs::write(broken.join(c).join("x.png"), b"nope").unwrap();
        std::fs::write(broken.join(c).join("y.png"), b"nope").unwrap();
    }
    let o = ringtrain(&common::argv("train --data {} --out {} --device cpu", &[&broken, &d.path().join("r3")]));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("could be read") && stderr.contains("broken"),
        "{stderr}"
    );
    assert!(!d.path().join("r3").exists());
}
