//! What the user sees while a run goes on. On a terminal: a progress bar per epoch (images/s,
//! loss, lr, ETA). Otherwise (logs, CI): a plain line every `log_every` steps. `--quiet`: errors only.
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

pub fn set_quiet(q: bool) {
    QUIET.store(q, Ordering::Relaxed);
}

pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A line on standard output unless `--quiet` (`outln!`: a closed output ends quietly).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => { if !$crate::report::progress::quiet() { $crate::outln!($($arg)*) } };
}

/// A warning line on stderr (shown under --quiet too).
pub fn warn(message: &str) {
    eprintln!("warning: {message}");
}

/// The one wording of the unreadable-image warning, wherever a file is skipped.
pub fn warn_unreadable(path: &std::path::Path, reason: &str) {
    eprintln!("warning: skipped unreadable image {}: {reason}", path.display());
}

/// A bar counting `total` items of a long job (packing, loading a set to the device), on a
/// terminal only; hidden otherwise.
pub fn count_bar(total: u64, what: &str) -> ProgressBar {
    if quiet() || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {per_sec} | ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    b.set_prefix(what.to_string());
    b
}

pub struct EpochProgress {
    bar: Option<ProgressBar>,
    label: String,
    total: usize,
    log_every: usize,
    start: Instant,
}

impl EpochProgress {
    pub fn new(epoch: usize, epochs: usize, total: usize, log_every: usize) -> Self {
        let label = format!("epoch {epoch}/{epochs}");
        let bar = (!quiet() && std::io::stdout().is_terminal()).then(|| {
            let b = ProgressBar::new(total as u64);
            b.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} | ETA {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            b.set_prefix(label.clone());
            b
        });
        EpochProgress {
            bar,
            label,
            total,
            log_every,
            start: Instant::now(),
        }
    }

    /// Whether the caller should read the loss back for this (1-based) step: reading it waits
    /// for the device, so it happens only every `log_every` steps (every 10 on a terminal).
    pub fn wants_loss(&self, step: usize) -> bool {
        let every = if self.bar.is_some() { 10 } else { self.log_every };
        every > 0 && step % every == 0
    }

    pub fn update(&self, step: usize, images: usize, loss: Option<f64>, lr: f64) {
        let rate = images as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        match (&self.bar, loss) {
            (Some(b), Some(loss)) => {
                b.set_position(step as u64);
                b.set_message(format!("loss {loss:.4} lr {lr:.5} {rate:.0} img/s"));
            }
            (Some(b), None) => b.set_position(step as u64),
            (None, Some(loss)) if !quiet() => {
                crate::outln!(
                    "{} step {step}/{} loss {loss:.4} lr {lr:.5} {rate:.0} img/s",
                    self.label, self.total
                )
            }
            _ => {}
        }
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
