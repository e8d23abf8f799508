//! Standard output that may close under us (`ringtrain models | head -2`, a training piped into
//! `head`). Rust ignores SIGPIPE, so a write to a closed pipe fails and `println!` would panic.
//! Every line goes through `line` instead: a command ends quietly with 0 when its reader has gone
//! (as ripgrep does), and a training run, which must not lose its work, is asked to stop as a
//! signal would ask it (`stop_runs_instead`): it saves `last/` and ends with 128 + SIGPIPE. A
//! training command whose reader goes before its loop starts has nothing to save: it ends at
//! once with 128 + SIGPIPE (`training_command`), not with a 0 that would claim a finished run.
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);
static RUN_STOPS: AtomicBool = AtomicBool::new(false);
static EXIT_CODE: AtomicI32 = AtomicI32::new(0);

/// Writes one line to standard output (nothing once it has closed).
pub fn line(args: std::fmt::Arguments) {
    write(|out| writeln!(out, "{args}"));
}

/// Writes bytes as they are (generated scripts and pages) to standard output.
pub fn bytes(b: &[u8]) {
    write(|out| out.write_all(b));
}

fn write(f: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = f(&mut out).and_then(|_| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            closed();
        }
        // Any other failure (a full disk behind a redirect) loses the output, not the command.
    }
}

/// The reader of standard output has gone.
pub fn closed() {
    if CLOSED.swap(true, Ordering::SeqCst) {
        return;
    }
    if !RUN_STOPS.load(Ordering::SeqCst) {
        std::process::exit(EXIT_CODE.load(Ordering::SeqCst));
    }
    eprintln!("warning: standard output was closed: the run stops at the next step and saves last/ (--resume auto continues it)");
}

/// This command trains: a closed standard output ends it with 128 + SIGPIPE until its loop runs.
pub fn training_command() {
    EXIT_CODE.store(128 + libc::SIGPIPE, Ordering::SeqCst);
}

/// From now on a closed standard output asks the run to stop instead of ending the process.
pub fn stop_runs_instead() {
    RUN_STOPS.store(true, Ordering::SeqCst);
}

/// Whether standard output has closed (the run's stop request reads it as SIGPIPE).
pub fn is_closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// `println!` that survives a closed standard output.
#[macro_export]
macro_rules! outln {
    () => { $crate::report::stdout::line(format_args!("")) };
    ($($arg:tt)*) => { $crate::report::stdout::line(format_args!($($arg)*)) };
}
