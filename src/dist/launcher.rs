//! The built-in launcher (`--nproc-per-node N`): starts N workers of this same binary with the
//! same arguments, each with torchrun's environment variables, like `torch.multiprocessing.spawn`.
//! - Output: each line prefixed with `[rank R]`; only rank 0 prints progress (the workers decide).
//! - Signals: SIGINT, SIGTERM and SIGUSR1 are forwarded to the workers, which save a checkpoint
//!   and exit with 128 + the signal (0 with `--requeue`); the launcher then exits with that code.
//!   A closed standard output stops them as SIGTERM does.
//! - Restarts (`--max-restarts N`): when a worker fails for a reason other than its input, the
//!   others are stopped and all are started again with `--resume auto`, up to N times.
//! - Failure: when a worker fails, the others get SIGTERM (SIGKILL 10 s later), and the launcher
//!   exits non-zero naming the rank and how it ended. Workers die with the launcher (PDEATHSIG).
//!   A bad input is found by every worker alike: its `error:` line is shown once, from the first
//!   rank that printed it, and when the first worker to fail ended with the user-error code 2,
//!   that line is the whole message.
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Set in workers' environment: a launched worker never launches again.
pub const LAUNCHED_VAR: &str = "RINGTRAIN_LAUNCHED";
/// The CUDA device (index among the visible ones) a launched worker must use (`--devices`).
pub const DEVICE_VAR: &str = "RINGTRAIN_CUDA_DEVICE";
/// How often the workers were restarted before this start (torchrun's is
/// TORCHELASTIC_RESTART_COUNT, read too).
pub const RESTARTS_VAR: &str = "RINGTRAIN_RESTART_COUNT";

/// The restart count a launcher gave this worker (0 on the first start).
pub fn restart_count() -> Result<usize> {
    for var in [RESTARTS_VAR, "TORCHELASTIC_RESTART_COUNT"] {
        if let Ok(v) = std::env::var(var) {
            return v
                .trim()
                .parse()
                .map_err(|_| crate::error::user_error(format!("environment variable {var}={v:?} is not a count")));
        }
    }
    Ok(0)
}

#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// CUDA device for each local rank (`--devices 1,3`).
    pub devices: Option<Vec<usize>>,
    /// Restarts after a worker fails (`--max-restarts`).
    pub max_restarts: usize,
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// A free TCP port on this machine for a single-node job's rendezvous.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(libc::SIGABRT)) => "was aborted (SIGABRT)".into(),
        (None, Some(s)) => format!("was killed by signal {s}{}", if s == 9 { " (SIGKILL)" } else { "" }),
        _ => "ended".into(),
    }
}

/// Runs the workers to completion; returns the launcher's exit code.
pub fn launch(spec: &LaunchSpec, args: &[String]) -> Result<i32> {
    // Rank 0 will serve the rendezvous here: a port already taken is the user's to change, said
    // before any worker starts (c10d's own message comes from every rank, after a wait).
    if spec.node_rank == 0 {
        let addr = (spec.master_addr.as_str(), spec.master_port);
        if let Err(e) = std::net::TcpListener::bind(addr) {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                return Err(crate::error::user_error(format!(
                    "--master-port {} on {} is already in use; choose another port, or leave --master-port out on one node for a free one",
                    spec.master_port, spec.master_addr
                )));
            }
        }
    }
    // A closed standard output (`... | head`) must not end the launcher, whose workers would die
    // with it unsaved: it stops them as SIGTERM does (see wait_for_workers).
    crate::report::stdout::stop_runs_instead();
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGUSR1, on_signal as *const () as libc::sighandler_t);
    }
    let mut restarts = 0;
    loop {
        let argv = match restarts {
            0 => args.to_vec(),
            _ => resuming(args),
        };
        let f = match run_workers(spec, &argv, restarts)? {
            Outcome::Ended(code) => return Ok(code),
            Outcome::Failed(f) => f,
        };
        if restarts < spec.max_restarts && !f.stopping {
            restarts += 1;
            eprintln!(
                "restart {restarts} of {}: worker rank {} (pid {}) {}; starting this node's {} workers again with --resume auto",
                spec.max_restarts,
                f.rank,
                f.pid,
                describe(f.status),
                spec.nproc_per_node
            );
            continue;
        }
        // NCCL's watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING=1, see csrc/dist.cpp) ends a rank with
        // SIGABRT when a collective fails or outlasts the timeout: say so, it is not a crash.
        let why = if f.status.signal() == Some(libc::SIGABRT) {
            " — under NCCL its watchdog aborts a rank whose collective failed or outlasted --dist-timeout \
             (a peer died or hung; the ranks' lines above say which), otherwise libtorch stopped on an internal error"
        } else {
            ""
        };
        let others = match f.others.is_empty() {
            true => String::new(),
            false => format!("; stopped the others ({})", f.others.join(", ")),
        };
        eprintln!("error: worker rank {} (pid {}) {}{why}{others}", f.rank, f.pid, describe(f.status));
        return Ok(1);
    }
}

/// How one start of the workers ended.
enum Outcome {
    /// The launcher's exit code: 0, 2 (a rejected input: never retried, as the same input fails
    /// the same way; its `error:` line is the message), or 128 + a signal forwarded to them.
    Ended(i32),
    /// A worker failed otherwise; the others were stopped.
    Failed(Failure),
}

struct Failure {
    rank: usize,
    pid: u32,
    status: ExitStatus,
    /// How each other worker ended.
    others: Vec<String>,
    /// The launcher was asked to stop (SIGTERM, Ctrl-C) meanwhile: no restart.
    stopping: bool,
}

/// Starts this node's workers and waits for all of them.
fn run_workers(spec: &LaunchSpec, args: &[String], restarts: usize) -> Result<Outcome> {
    let (mut children, readers) = spawn_workers(spec, args, restarts)?;
    let Ended {
        status,
        first_failure,
        forwarded,
    } = wait_for_workers(&mut children)?;
    for r in readers {
        let _ = r.join();
    }
    let Some((rank, pid, s)) = first_failure else {
        // Stopped by a forwarded signal: 128 + it, unless the workers ended well (`--requeue`).
        let all_ok = status.iter().all(|s| s.is_some_and(|s| s.success()));
        return Ok(Outcome::Ended(forwarded.filter(|_| !all_ok).map(|f| 128 + f).unwrap_or(0)));
    };
    if s.code() == Some(2) {
        return Ok(Outcome::Ended(2));
    }
    let others = children
        .iter()
        .zip(&status)
        .filter(|((r, _), _)| *r != rank)
        .map(|((r, _), s)| format!("rank {r} {}", s.map(describe).unwrap_or_default()))
        .collect();
    Ok(Outcome::Failed(Failure {
        rank,
        pid,
        status: s,
        others,
        stopping: forwarded.is_some(),
    }))
}

/// Starts this node's workers, each with its rank's environment; their output lines go through
/// with a `[rank N]` prefix (an `error:` line that another rank printed already, once).
fn spawn_workers(
    spec: &LaunchSpec,
    args: &[String],
    restarts: usize,
) -> Result<(Vec<(usize, Child)>, Vec<JoinHandle<()>>)> {
    let exe = std::env::current_exe().context("finding the ringtrain executable")?;
    let world = spec.nproc_per_node * spec.nnodes;
    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut readers = Vec::new();
    let errors_shown: Arc<Mutex<HashSet<String>>> = Arc::default();
    for local in 0..spec.nproc_per_node {
        let rank = spec.node_rank * spec.nproc_per_node + local;
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", spec.nproc_per_node.to_string())
            .env("GROUP_RANK", spec.node_rank.to_string())
            .env("MASTER_ADDR", &spec.master_addr)
            .env("MASTER_PORT", spec.master_port.to_string())
            .env(LAUNCHED_VAR, "1")
            .env(RESTARTS_VAR, restarts.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(d) = &spec.devices {
            cmd.env(DEVICE_VAR, d[local].to_string());
        }
        unsafe {
            cmd.pre_exec(|| {
                // The worker dies with the launcher, whatever kills the launcher.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().with_context(|| format!("starting worker rank {rank}"))?;
        for (stream, to_stderr) in [
            (
                child
                    .stdout
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                false,
            ),
            (
                child
                    .stderr
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                true,
            ),
        ] {
            let Some(stream) = stream else { continue };
            let errors_shown = errors_shown.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(|l| l.ok()) {
                    let repeated = || !errors_shown.lock().unwrap().insert(line.clone());
                    if to_stderr && line.starts_with("error: ") && repeated() {
                        continue; // another rank said it already
                    }
                    if to_stderr {
                        let _ = writeln!(std::io::stderr().lock(), "[rank {rank}] {line}");
                    } else if let Err(e) = writeln!(std::io::stdout().lock(), "[rank {rank}] {line}") {
                        if e.kind() == std::io::ErrorKind::BrokenPipe {
                            crate::report::stdout::closed();
                        }
                    }
                }
            }));
        }
        children.push((rank, child));
    }

    Ok((children, readers))
}

/// How the workers ended: each one's status, the first failure (rank, pid, status), and the
/// signal forwarded to them, if any.
struct Ended {
    status: Vec<Option<ExitStatus>>,
    first_failure: Option<(usize, u32, ExitStatus)>,
    forwarded: Option<i32>,
}

/// Waits for every worker; forwards SIGTERM/SIGINT to them, and stops the others (SIGTERM, then
/// SIGKILL after 10 s) once one has failed.
fn wait_for_workers(children: &mut [(usize, Child)]) -> Result<Ended> {
    let mut status: Vec<Option<ExitStatus>> = vec![None; children.len()];
    let mut first_failure: Option<(usize, u32, ExitStatus)> = None;
    let mut kill_deadline: Option<Instant> = None;
    let signal_all = |children: &[(usize, Child)], status: &Vec<Option<ExitStatus>>, sig: i32| {
        for ((_, c), s) in children.iter().zip(status) {
            // A stopped worker (SIGSTOP, a hung peer) would keep a SIGTERM pending forever and
            // could not save anyway: it is killed.
            let sig = if sig == libc::SIGTERM && is_stopped(c.id()) { libc::SIGKILL } else { sig };
            if s.is_none() {
                unsafe { libc::kill(c.id() as i32, sig) };
            }
        }
    };
    // A forwarded SIGTERM/SIGINT (preemption, Ctrl-C): workers then save and exit with 128 + it,
    // which is the expected end, not a failure.
    let mut forwarded: Option<i32> = None;
    while status.iter().any(Option::is_none) {
        let mut sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig == 0 && forwarded.is_none() && crate::report::stdout::is_closed() {
            sig = libc::SIGTERM;
        }
        if sig != 0 {
            signal_all(children, &status, sig);
            forwarded.get_or_insert(sig);
        }
        for (i, (rank, child)) in children.iter_mut().enumerate() {
            if status[i].is_some() {
                continue;
            }
            if let Some(s) = child.try_wait()? {
                status[i] = Some(s);
                let stopped_as_asked = forwarded.is_some_and(|f| s.code() == Some(128 + f));
                if !s.success() && !stopped_as_asked && first_failure.is_none() {
                    first_failure = Some((*rank, child.id(), s));
                    kill_deadline = Some(Instant::now() + Duration::from_secs(10));
                }
            }
        }
        if first_failure.is_some() && status.iter().any(Option::is_none) {
            match kill_deadline {
                Some(d) if Instant::now() >= d => signal_all(children, &status, libc::SIGKILL),
                _ => signal_all(children, &status, libc::SIGTERM),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Ended {
        status,
        first_failure,
        forwarded,
    })
}

/// Whether process `pid` is stopped (state T in /proc/PID/stat, after the command's name).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
        .unwrap_or(false)
}

/// The workers' arguments for a restart: `--resume auto` in place of any `--resume` given, so
/// each restart continues from the run's last checkpoint (or starts anew when none was saved).
fn resuming(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--resume" => {
                it.next();
            }
            _ if a.starts_with("--resume=") => {}
            _ => out.push(a.clone()),
        }
    }
    out.extend(["--resume".to_string(), "auto".to_string()]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_resumes_from_the_last_checkpoint() {
        let v = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(resuming(&v("train --out r --epochs 3")), v("train --out r --epochs 3 --resume auto"));
        assert_eq!(resuming(&v("train --resume r/best --out r")), v("train --out r --resume auto"));
        assert_eq!(resuming(&v("train --resume=r/last --out r")), v("train --out r --resume auto"));
    }
}
