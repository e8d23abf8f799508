//! Never lose a run: a run stopped by SIGTERM in the middle of an epoch, or killed with SIGKILL
//! after a periodic save, and resumed with `--resume auto` ends bit-identical to one that was
//! never interrupted (model, optimizer state, moving average, metrics), with gradient
//! accumulation, EMA, Mixup/CutMix, RandomErasing, warm-up and cosine in play. Resume refuses what cannot continue exactly.
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{make_folder, ringtrain};

fn args(data: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut v = common::train_args(
        data,
        out,
        "--model resnet10-tiny --img-size 32 --epochs 3 --batch-size 6 --accum-steps 2 --ema 0.9 \
         --warmup-epochs 1 --mixup-alpha 0.8 --cutmix-alpha 1.0 --mix-prob 0.7 --label-smoothing 0.1 \
         --random-erasing 0.25 --device cpu --seed 5 --workers 2 --log-every 1",
    );
    // Extra flags (all "--flag value" pairs) replace the defaults: clap refuses a flag twice.
    for pair in extra.chunks(2) {
        match v.iter().position(|a| a == pair[0]) {
            Some(at) => v[at + 1] = pair[1].to_string(),
            None => v.extend(pair.iter().map(|s| s.to_string())),
        }
    }
    v
}

/// Starts a run and sends `signal` once a progress line contains `when`, or for SIGPIPE stops
/// reading its output there (a reader that goes, as `| head` does); returns the exit code.
fn interrupt(args: &[String], when: &str, signal: i32) -> Option<i32> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut sent = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if !sent && line.contains(when) {
            if signal == libc::SIGPIPE {
                sent = true;
                break; // the reader is dropped: the pipe closes
            }
            unsafe { libc::kill(child.id() as i32, signal) };
            if signal == libc::SIGTERM {
                // Delivered twice at once (a launcher's forward and the terminal's own, Slurm
                // signalling every process): still one request, and the checkpoint is saved.
                unsafe { libc::kill(child.id() as i32, signal) };
            }
            sent = true;
        }
    }
    assert!(sent, "never saw {when:?}");
    child.wait().unwrap().code()
}

fn state(run: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("last/state.json")).unwrap()).unwrap()
}

fn assert_same_run(a: &Path, b: &Path) {
    for f in ["model.safetensors", "optimizer.safetensors", "model_ema.safetensors"] {
        assert!(
            std::fs::read(a.join("last").join(f)).unwrap() == std::fs::read(b.join("last").join(f)).unwrap(),
            "last/{f} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
    let metrics = common::metrics_without_timing;
    assert_eq!(metrics(a), metrics(b));
    assert_eq!(metrics(a).len(), 4);
}

#[test]
fn interrupted_runs_resume_bit_identical() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["circle", "cross", "hexagon"], 20);
    let run = |name: &str, extra: &[&str]| -> PathBuf {
        let out = d.path().join(name);
        let o = ringtrain(&args(&data, &out, extra));
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        out
    };
    let straight = run("straight", &[]);

    // SIGTERM in the second epoch: a checkpoint at the next step, exit 128 + 15.
    let term = d.path().join("term");
    let code = interrupt(&args(&data, &term, &[]), "epoch 2/3 step 2/5", libc::SIGTERM);
    assert_eq!(code, Some(143));
    let st = state(&term);
    assert_eq!(st["epoch"], 1, "{st}");
    let steps = st["mid_epoch"]["steps"].as_u64().expect("a mid-epoch checkpoint");
    assert!((2..5).contains(&steps), "{st}");
    run("term", &["--resume", "auto"]);
    assert_same_run(&straight, &term);

    // A stop at an epoch's last step: the reader of the output goes after epoch 1's line, and
    // with --log-every 5 (the epoch's length) the next line is epoch 2's last step, whose
    // failed write stops the run there. Resumed, the epoch has no step left to take, and its
    // row reports the learning rate of that last step, not of the next one.
    let piped = d.path().join("piped");
    let code = interrupt(&args(&data, &piped, &["--log-every", "5"]), "| train loss", libc::SIGPIPE);
    assert_eq!(code, Some(128 + libc::SIGPIPE));
    let st = state(&piped);
    // A reader that took longer than epoch 2's five steps to go would stop the run at its end.
    let at_epoch_end = st["mid_epoch"].is_null() && st["epoch"] == 2;
    assert!(st["mid_epoch"]["steps"] == 5 || at_epoch_end, "{st}");
    run("piped", &["--log-every", "5", "--resume", "auto"]);
    assert_same_run(&straight, &piped);

    // --save-every-minutes: a clock this short is due at every step, so a SIGKILL in epoch 2
    // finds the checkpoint of a step inside it, not the end of epoch 1.
    let clock = d.path().join("clock");
    let every_step = ["--save-every-minutes", "1e-9"];
    let code = interrupt(&args(&data, &clock, &every_step), "epoch 2/3 step 3/5", libc::SIGKILL);
    assert_eq!(code, None, "killed by a signal");
    let st = state(&clock);
    assert!(st["epoch"] == 1 && st["mid_epoch"]["steps"].as_u64() >= Some(2), "{st}");
    run("clock", &[&every_step[..], &["--resume", "auto"]].concat());
    assert_same_run(&straight, &clock);

    // SIGKILL: nothing is saved at the kill; the last periodic save (every 3 steps) is used.
    let kill = d.path().join("kill");
    let code = interrupt(
        &args(&data, &kill, &["--save-every-steps", "3"]),
        "epoch 3/3 step 2/5",
        libc::SIGKILL,
    );
    assert_eq!(code, None, "killed by a signal");
    let st = state(&kill);
    assert!(
        st["global_step"].as_u64().unwrap() % 3 == 0 || st["mid_epoch"].is_null(),
        "{st}"
    );
    run("kill", &["--save-every-steps", "3", "--resume", "auto", "--keep", "2"]);
    assert_same_run(&straight, &kill);
    // --keep 2: the newest two epoch checkpoints beside last/ and best/.
    let mut kept: Vec<String> = std::fs::read_dir(&kill)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("epoch-"))
        .collect();
    kept.sort();
    assert_eq!(kept, ["epoch-0003"], "only epoch 3 ended after the resume with --keep");

    // A finished run has nothing left to do: `--resume auto` (a requeued job) says so and exits 0
    // without touching it; a checkpoint named explicitly is a mistake. More epochs continue it,
    // and the change is reported.
    let before = std::fs::read(straight.join("last/state.json")).unwrap();
    let again = ringtrain(&args(&data, &straight, &["--resume", "auto"]));
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to do"));
    assert_eq!(std::fs::read(straight.join("last/state.json")).unwrap(), before);
    let last = straight.join("last");
    let again = ringtrain(&args(&data, &straight, &["--resume", last.to_str().unwrap()]));
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("raise --epochs"));
    let o = ringtrain(&args(&data, &straight, &["--resume", "auto", "--epochs", "4"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("changed settings: epochs 3 → 4"), "{stdout}");
    assert!(stdout.contains("epoch 4/4"), "{stdout}");
    assert!(
        !stdout.contains("epoch 3/4"),
        "epochs already done are not repeated: {stdout}"
    );

    // What cannot continue exactly is refused, naming the flag.
    for (extra, needle) in [
        (
            vec!["--resume", "auto", "--epochs", "5", "--batch-size", "12"],
            "--batch-size",
        ),
        (
            vec!["--resume", "auto", "--epochs", "5", "--model", "lenet5"],
            "--model",
        ),
        (
            vec!["--resume", d.path().join("nope").to_str().unwrap(), "--epochs", "5"],
            "not a checkpoint",
        ),
    ] {
        let o = ringtrain(&args(&data, &straight, &extra));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(needle) && err.lines().count() == 1, "{extra:?}: {err}");
    }
}

/// Every checkpoint directory present can be read whole: state.json parses and each
/// safetensors file loads.
fn assert_checkpoints_readable(run: &Path) {
    for name in ["last", "best"] {
        let dir = run.join(name);
        if !dir.exists() {
            continue;
        }
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("state.json")).unwrap())
            .unwrap_or_else(|e| panic!("{}: state.json unreadable: {e}", dir.display()));
        assert!(st["global_step"].is_u64());
        for f in ["model.safetensors", "optimizer.safetensors", "model_ema.safetensors"] {
            tch::Tensor::read_safetensors(dir.join(f)).unwrap_or_else(|e| panic!("{}/{f}: {e}", dir.display()));
        }
    }
}

#[test]
fn kill_9_at_random_moments_then_resume_each_time_ends_identical() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["circle", "cross", "hexagon"], 40);
    // A checkpoint at every step, so kills land inside checkpoint writes too.
    let extra = ["--save-every-steps", "1"];
    let straight = d.path().join("straight");
    let o = ringtrain(&args(&data, &straight, &extra));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let chaos = d.path().join("chaos");
    let mut resumed = args(&data, &chaos, &extra);
    resumed.extend(["--resume".to_string(), "auto".to_string()]);
    // Kill moments from a fixed pseudo-random sequence, counted in the run's own progress (it
    // prints a line after every optimizer step, just before that step's checkpoint is written)
    // plus 0-40 ms, so they fall in computation and in checkpoint writes alike, and do not
    // depend on how loaded the machine is.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let (mut kills, mut finished) = (0, false);
    let stderr_log = d.path().join("stderr.log");
    for _attempt in 0..16 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringtrain"))
            .args(&resumed)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_log).unwrap())
            .spawn()
            .unwrap();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (steps, extra_ms) = (1 + x % 4, (x >> 8) % 40);
        let mut seen = 0;
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            if line.unwrap().contains(" step ") {
                seen += 1;
                if seen == steps {
                    break;
                }
            }
        }
        if seen == steps {
            std::thread::sleep(std::time::Duration::from_millis(extra_ms));
        }
        if let Some(status) = child
            .try_wait()
            .unwrap()
            .or_else(|| (seen < steps).then(|| child.wait().unwrap()))
        {
            assert!(
                status.success(),
                "the resumed run failed: {status}: {}",
                std::fs::read_to_string(&stderr_log).unwrap()
            );
            finished = true;
            break;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
        assert_checkpoints_readable(&chaos);
    }
    if !finished {
        let o = ringtrain(&resumed);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(kills >= 3, "only {kills} kills landed before the run ended");
    assert_checkpoints_readable(&chaos);
    assert_same_run(&straight, &chaos);

    // A kill after the last epoch's checkpoint but before the final report and metrics were
    // written: resuming writes them, and trains nothing more.
    let metrics = std::fs::read_to_string(chaos.join("metrics.csv")).unwrap();
    for f in ["report.txt", "metrics.json", "metrics.csv", "curves.png"] {
        std::fs::remove_file(chaos.join(f)).unwrap();
    }
    let o = ringtrain(&resumed);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("writing the final report"), "{stdout}");
    assert!(!stdout.contains("epoch 3/3"), "no epoch is trained again: {stdout}");
    assert!(chaos.join("report.txt").is_file() && chaos.join("curves.png").is_file());
    assert_eq!(std::fs::read_to_string(chaos.join("metrics.csv")).unwrap(), metrics);
    assert_same_run(&straight, &chaos);
    // Nothing half-written is left behind by the kills.
    let leftovers: Vec<String> = std::fs::read_dir(&chaos)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The split's sizes from the banner's "N train / M val images".
fn banner_counts(stdout: &[u8]) -> (usize, usize) {
    let s = String::from_utf8_lossy(stdout);
    let line = s.lines().find(|l| l.contains(" val images")).expect("the banner");
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "train").unwrap();
    (words[at - 1].parse().unwrap(), words[at + 2].parse().unwrap())
}

/// As a new user found it: 11 images added to a class of a 40-image folder between epochs 2 and
/// 3, then `--resume auto` (validation split from --data). The run keeps the validation images
/// it started with (4 of 40; a split drawn again from 51 would hold 5, some of them images that
/// trained), the new images train, and one warning line says what changed; `--strict` stops.
#[test]
fn a_resumed_run_keeps_its_validation_split_when_images_are_added() {
    let d = tempfile::tempdir().unwrap();
    let (data, out) = (d.path().join("data"), d.path().join("run"));
    make_folder(&data, &["a", "b"], 20);
    let flags = "--model resnet10-tiny --img-size 32 --batch-size 8 --device cpu --workers 2 --seed 3 --val-split 0.1";
    let first = ringtrain(&common::train_args(&data, &out, &format!("{flags} --epochs 2")));
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert_eq!(banner_counts(&first.stdout), (36, 4));
    assert!(out.join("data-files.bin").is_file(), "the run records its data");
    let val_before = val_names(&data, 0.1, 3);

    common::Shapes { size: 36, seed: 3, first: 100 }.write(&d.path().join("more"), &["a"], 11);
    for i in 0..11 {
        std::fs::rename(d.path().join(format!("more/a/{i}.png")), data.join(format!("a/new-{i}.png"))).unwrap();
    }
    assert_ne!(val_names(&data, 0.1, 3), val_before, "a split drawn again moves images");

    let resume = format!("{flags} --epochs 3 --resume auto");
    let strict = ringtrain(&common::train_args(&data, &out, &format!("{resume} --strict")));
    let err = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(2), "{err}");
    assert!(err.contains("the data changed since the run started (training images: 11 added, 0 removed, 0 changed; validation images: unchanged)"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let resumed = ringtrain(&common::train_args(&data, &out, &resume));
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{err}");
    assert_eq!(banner_counts(&resumed.stdout), (47, 4));
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: resume:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("training images: 11 added") && warnings[0].contains("validation images stay"), "{err}");

    // The validation set evaluated is the one the run started with: the final report's support
    // per class is the recorded split's (2 + 2), not a new draw's.
    let report = std::fs::read_to_string(out.join("report.txt")).unwrap();
    let support: Vec<&str> = report.lines().filter(|l| l.trim_start().starts_with("a ") || l.trim_start().starts_with("b ")).collect();
    assert_eq!(support.len(), 2, "{report}");
    assert!(support.iter().all(|l| l.trim_end().ends_with(" 2")), "{report}");
}

/// The validation images `train --val-split RATIO --seed SEED` draws from `data` now.
fn val_names(data: &Path, ratio: f64, seed: u64) -> Vec<PathBuf> {
    let set = ringtrain::data::source::Dataset::open(data, "--data").unwrap();
    let (_, val) = ringtrain::data::tools::split::stratified(&set, ratio, seed);
    let mut v: Vec<PathBuf> = (0..val.len()).map(|i| val.name(i).to_owned()).collect();
    v.sort();
    v
}

/// torchvision's --model-ema (an average every --model-ema-steps optimizer steps, reset while
/// the warm-up lasts) resumes as the rest does: stopped by SIGTERM inside the second epoch and
/// resumed, the run ends bit-identical to one never stopped, its average included.
#[test]
fn a_model_ema_run_resumes_bit_identical() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["circle", "cross", "hexagon"], 20);
    let model_ema = |out: &Path, extra: &[&str]| -> Vec<String> {
        let mut v = args(&data, out, extra);
        let at = v.iter().position(|a| a == "--ema").unwrap();
        v.drain(at..at + 2);
        let flags = ["--model-ema", "--model-ema-steps", "2", "--model-ema-decay", "0.99"];
        v.extend(flags.into_iter().chain(["--lr-warmup-method", "linear"]).map(String::from));
        v
    };
    let straight = d.path().join("straight");
    let o = ringtrain(&model_ema(&straight, &[]));
    assert!(o.status.success(), "{}", common::text(&o));
    let term = d.path().join("term");
    let code = interrupt(&model_ema(&term, &[]), "epoch 2/3 step 3/5", libc::SIGTERM);
    assert_eq!(code, Some(143));
    assert!(state(&term)["mid_epoch"]["steps"].as_u64().is_some(), "{}", state(&term));
    let o = ringtrain(&model_ema(&term, &["--resume", "auto"]));
    assert!(o.status.success(), "{}", common::text(&o));
    assert_same_run(&straight, &term);
    // The average is its own: not the weights.
    let (m, e) = (straight.join("last/model.safetensors"), straight.join("last/model_ema.safetensors"));
    assert!(std::fs::read(m).unwrap() != std::fs::read(e).unwrap());
}
