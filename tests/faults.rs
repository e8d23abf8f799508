//! Faults a cluster job meets, on 2 local ranks: a peer that hangs, a worker killed and
//! restarted, a second run into a held run directory, and Slurm's signal before the time
//! limit. Each must end cleanly within a stated bound, with the run directory intact.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{text, weights};

const BIN: &str = env!("CARGO_BIN_EXE_ringtrain");

struct Data {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn data() -> Data {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::Shapes { size: 36, seed: 4, first: 0 }.write(&root.join("train"), &["circle", "cross", "ring"], 16);
    common::Shapes { size: 36, seed: 4, first: 10_000 }.write(&root.join("val"), &["circle", "cross", "ring"], 4);
    Data { _dir: dir, root }
}

/// LeNet-5 on 48 images, global batch 8 (6 steps an epoch) over `epochs`, 2 local ranks, then
/// `extra`.
fn args(d: &Data, out: &Path, epochs: usize, extra: &str) -> Vec<String> {
    let mut a = common::train_val_args(
        &d.root.join("train"),
        &d.root.join("val"),
        out,
        &format!(
            "--model lenet5 --img-size 32 --epochs {epochs} --batch-size 8 --lr 0.02 --device cpu --seed 2 \
             --workers 1 --log-every 0 --nproc-per-node 2"
        ),
    );
    a.extend(extra.split_whitespace().map(String::from));
    a
}

fn start(args: &[String], envs: &[(&str, &str)]) -> Child {
    Command::new(BIN)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The pid of the launcher's worker of `rank`, once both workers run and `ready` holds.
fn worker(launcher: &Child, rank: usize, ready: impl Fn() -> bool) -> u32 {
    let t0 = Instant::now();
    loop {
        let kids = children_of(launcher.id());
        let found = kids.iter().copied().find(|&k| rank_of(k) == Some(rank));
        if let (Some(pid), 2, true) = (found, kids.len(), ready()) {
            return pid;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "workers did not start: {kids:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    let out = Command::new("pgrep").args(["-P", &pid.to_string()]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// RANK in a process's environment.
fn rank_of(pid: u32) -> Option<usize> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"RANK="))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Waits for `child` at most `limit`; its output and how long it took.
fn finish(mut child: Child, limit: Duration) -> (Output, Duration) {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}:\n{}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().unwrap(), t0.elapsed())
}


/// A rank stopped with SIGSTOP (as a frozen driver or a stuck NFS read leaves it) is named
/// within half the timeout, the job ends within the timeout (plus the launcher's stop), the
/// stopped worker is killed, and last/ is intact.
#[test]
fn a_hung_peer_is_named_and_the_job_ends_within_the_timeout() {
    const TIMEOUT: u64 = 16;
    let d = data();
    let out = d.root.join("hung");
    let launcher = start(&args(&d, &out, 300, &format!("--dist-timeout {TIMEOUT} --save-every-steps 3")), &[]);
    let stopped = worker(&launcher, 1, || out.join("last/state.json").exists());
    unsafe { libc::kill(stopped as i32, libc::SIGSTOP) };
    let (o, took) = finish(launcher, Duration::from_secs(TIMEOUT + 60));
    let all = text(&o);
    eprintln!("{all}\nended {took:.1?} after the SIGSTOP");
    assert!(!o.status.success(), "{all}");
    // The warning (at half the timeout) and the error line both name the stopped rank.
    let warning = all.lines().find(|l| l.contains("warning: rank 1 stopped answering: no heartbeat for"));
    assert!(warning.is_some(), "no warning naming rank 1:\n{all}");
    let error = all.lines().find(|l| l.contains("error: rank 1 stopped answering"));
    assert!(error.is_some_and(|l| !l.contains("gloo/")), "the error line names rank 1, in ringtrain's words:\n{all}");
    // The collective's timeout, then the launcher kills the stopped worker at once.
    assert!(took < Duration::from_secs(TIMEOUT + 15), "took {took:?}");
    assert!(all.contains("rank 1 was killed by signal 9"), "{all}");
    assert!(!alive(stopped), "the stopped worker was left behind");
    weights(&out); // last/ is whole and loads
}

/// `--max-restarts`: rank 1 killed (SIGKILL) after a mid-epoch checkpoint; the launcher stops
/// rank 0, starts both again with --resume auto, says so in one line, and the run ends with the
/// bits of a run that was never interrupted; metrics.json counts the restart.
#[test]
fn a_killed_worker_is_restarted_and_the_run_ends_bit_identical() {
    let d = data();
    let (plain, restarted) = (d.root.join("plain"), d.root.join("restarted"));
    let run = args(&d, &plain, 40, "--save-every-steps 4");
    let o = Command::new(BIN).args(&run).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let launcher = start(&args(&d, &restarted, 40, "--save-every-steps 4 --max-restarts 2"), &[]);
    let victim = worker(&launcher, 1, || restarted.join("last/state.json").exists());
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let (o, _) = finish(launcher, Duration::from_secs(300));
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    let restarts: Vec<&str> = all.lines().filter(|l| l.starts_with("restart ")).collect();
    assert_eq!(restarts.len(), 1, "{all}");
    assert!(
        restarts[0].starts_with("restart 1 of 2: worker rank 1")
            && restarts[0].contains("SIGKILL")
            && restarts[0].contains("--resume auto"),
        "{}",
        restarts[0]
    );
    let (a, b) = (weights(&plain), weights(&restarted));
    let diff = common::max_diff(&a, &b);
    assert!(diff == 0.0, "restarted run differs from the uninterrupted one by {diff:e}");
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(restarted.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(metrics["restarts"], 1, "{metrics}");
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plain.join("metrics.json")).unwrap()).unwrap();
    assert_eq!(metrics["restarts"], 0, "{metrics}");
}

/// A second run, or a resume, into the --out of a live run is refused in one line naming the
/// holder; once the holder is killed (-9: no chance to clean up), the resume goes ahead.
#[test]
fn a_run_directory_is_held_by_its_live_run() {
    let d = data();
    let out = d.root.join("held");
    let mut holder = start(&args(&d, &out, 300, "--save-every-steps 3"), &[]);
    let rank0 = worker(&holder, 0, || out.join("last/state.json").exists());
    for extra in ["--overwrite", "--resume auto"] {
        let o = Command::new(BIN).args(args(&d, &out, 1, extra)).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra}: {}", text(&o));
        let host = ringtrain::train::lifecycle::run_lock::hostname();
        assert!(
            stderr.contains(&format!("is in use by another run (held by pid {rank0} on {host})")),
            "{extra}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
    assert!(alive(rank0), "the holder went on");
    let _ = holder.kill();
    unsafe { libc::kill(rank0 as i32, libc::SIGKILL) };
    let _ = holder.wait();
    while alive(rank0) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = Command::new(BIN).args(args(&d, &out, 1, "--resume auto")).output().unwrap();
    assert!(o.status.success(), "the lock died with its holder: {}", text(&o));
}

/// Slurm's `--signal=USR1@90` with --requeue: both ranks save last/ at one step, rank 0 runs
/// `scontrol requeue $SLURM_JOB_ID` (a stand-in on PATH records its arguments), the job exits
/// 0, and --resume auto continues from the checkpoint. Without scontrol it says so, and exits 0.
#[test]
fn slurms_signal_saves_requeues_and_exits_zero() {
    let d = data();
    let bin = d.root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let record = d.root.join("scontrol.args");
    let scontrol = bin.join("scontrol");
    std::fs::write(&scontrol, format!("#!/bin/sh\necho \"$@\" >> {}\n", record.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for (with_scontrol, said) in [(true, "Slurm job 4242 requeued"), (false, "scontrol is not on PATH")] {
        let out = d.root.join(format!("requeue-{with_scontrol}"));
        let path = if with_scontrol { path.as_str() } else { "/usr/bin:/bin" };
        let launcher = start(&args(&d, &out, 300, "--requeue"), &[("SLURM_JOB_ID", "4242"), ("PATH", path)]);
        worker(&launcher, 1, || out.join("config.toml").exists());
        std::thread::sleep(Duration::from_millis(500));
        unsafe { libc::kill(launcher.id() as i32, libc::SIGUSR1) };
        let (o, took) = finish(launcher, Duration::from_secs(60));
        let all = text(&o);
        assert!(o.status.success(), "{all}");
        assert!(all.contains(said) && all.contains("stopped by signal 10"), "{all}");
        assert!(took < Duration::from_secs(30), "took {took:?}");
        weights(&out); // last/ saved whole
    }
    assert_eq!(std::fs::read_to_string(&record).unwrap(), "requeue 4242\n");
    let o = Command::new(BIN)
        .args(args(&d, &d.root.join("requeue-true"), 2, "--resume auto"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
}
