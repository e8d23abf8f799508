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

/// Starts a run and sends `signal` once a progress line contains `when`; returns the exit code.
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
