//! Gloo's connection log, in ringtrain's words. While ranks connect, Gloo writes a raw line to
//! the process's stderr for every failed try (`[/pytorch/third_party/gloo/gloo/transport/tcp/
//! debug_logger.cc:9] ERROR failed to connect, willRetry=1, retry=1, ... remote=[127.0.0.1]:...`),
//! four for one unreachable peer, with no switch to turn them off. So the rendezvous runs with
//! stderr captured (`captured`), and what it wrote is passed on (`pass_on`): Gloo's lines as one
//! warning, anything else as it was.
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use anyhow::{bail, Result};

/// The real stderr while a capture is on (-1 otherwise), for a message that must not wait.
static TERMINAL: AtomicI32 = AtomicI32::new(-1);

/// Writes a line to the real stderr, also while a capture is on.
pub fn say_now(line: &str) {
    let text = format!("{line}\n");
    let fd = match TERMINAL.load(Ordering::SeqCst) {
        -1 => 2,
        fd => fd,
    };
    // SAFETY: a write of a valid buffer to an open descriptor.
    unsafe { libc::write(fd, text.as_ptr() as *const libc::c_void, text.len()) };
}

/// Whether a capture is on. fd 2 belongs to the whole process: ranks run as threads of one
/// process (as in tests) rendezvous at the same time, and a second capture nested in the first
/// would save the first's pipe as "the terminal", restore it at its end and leave the first's
/// reader waiting for ever. So only the first captures; the others' lines go into its pipe.
static CAPTURING: AtomicBool = AtomicBool::new(false);

/// Runs `f` with file descriptor 2 going into a pipe; returns its result and what it wrote
/// (nothing when another thread's capture is on: that one gets it).
pub fn captured<T>(f: impl FnOnce() -> T) -> Result<(T, String)> {
    if CAPTURING.swap(true, Ordering::SeqCst) {
        return Ok((f(), String::new()));
    }
    let result = capture_on(f);
    CAPTURING.store(false, Ordering::SeqCst);
    result
}

fn capture_on<T>(f: impl FnOnce() -> T) -> Result<(T, String)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, owned below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("capturing stderr: {}", std::io::Error::last_os_error());
    }
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A thread drains the pipe, so a long log cannot fill it and block the writer.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::fs::File::from(read).read_to_string(&mut text);
        text
    });
    let _ = std::io::stderr().flush();
    // SAFETY: dup and dup2 on descriptors this process owns; 2 is restored before returning.
    let saved = unsafe { libc::dup(2) };
    if saved < 0 {
        bail!("capturing stderr: {}", std::io::Error::last_os_error());
    }
    TERMINAL.store(saved, Ordering::SeqCst);
    unsafe { libc::dup2(write.as_raw_fd(), 2) };
    drop(write);
    let out = f();
    let _ = std::io::stderr().flush();
    unsafe {
        libc::dup2(saved, 2);
        TERMINAL.store(-1, Ordering::SeqCst);
        libc::close(saved);
    }
    Ok((out, reader.join().unwrap_or_default()))
}

/// Writes `text` to stderr: Gloo's connection lines as one warning, other lines as they were.
pub fn pass_on(text: &str) {
    let (gloo, other): (Vec<&str>, Vec<&str>) = text.lines().partition(|l| l.contains("gloo/transport/tcp/debug_logger"));
    let mut err = std::io::stderr().lock();
    for l in other {
        let _ = writeln!(err, "{l}");
    }
    if let Some(line) = summary(&gloo) {
        let _ = writeln!(err, "{line}");
    }
}

/// Gloo's failed tries as one line: which peer address, how many tries, the last error.
fn summary(lines: &[&str]) -> Option<String> {
    let last = lines.last()?;
    let field = |name: &str| {
        last.split(", ")
            .find_map(|kv| kv.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    Some(format!(
        "warning: could not connect to a peer at {} ({} tries; {})",
        field("remote="),
        lines.len(),
        field("error=")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glooss_tries_become_one_line() {
        let line = |retry: usize| {
            format!(
                "[/pytorch/third_party/gloo/gloo/transport/tcp/debug_logger.cc:9] ERROR failed to connect, willRetry=1, \
                 retry={retry}, retryLimit=3, rank=1, size=2, local=[127.0.0.1]:53922, remote=[127.0.0.1]:28586$1, \
                 error=SO_ERROR: Connection refused, remote=[127.0.0.1]:28586$1"
            )
        };
        let lines: Vec<String> = (1..=4).map(line).collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert_eq!(
            summary(&refs).unwrap(),
            "warning: could not connect to a peer at [127.0.0.1]:28586$1 (4 tries; SO_ERROR: Connection refused)"
        );
        assert_eq!(summary(&[]), None);
    }

    #[test]
    fn what_is_written_to_fd_2_is_captured_and_fd_2_restored() {
        let (v, text) = captured(|| {
            let msg = b"from C\n";
            unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
            7
        })
        .unwrap();
        assert_eq!((v, text.as_str()), (7, "from C\n"));
        // fd 2 is the test's stderr again: a write to it succeeds.
        let msg = b"";
        assert!(unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, 0) } >= 0);

        // Two threads capturing at once (two ranks' rendezvous in one process): both return,
        // and the one capture holds both lines. (In this one test: the capture is the process's.)
        let both = std::sync::Arc::new(std::sync::Barrier::new(2));
        let (tx, rx) = std::sync::mpsc::channel();
        for name in ["a", "b"] {
            let (both, tx) = (both.clone(), tx.clone());
            std::thread::spawn(move || {
                let (_, text) = captured(|| {
                    both.wait();
                    let msg = format!("from {name}\n");
                    unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
                    both.wait();
                })
                .unwrap();
                tx.send(text).unwrap();
            });
        }
        let wait = std::time::Duration::from_secs(20);
        let mut texts = [rx.recv_timeout(wait).expect("a capture never ended"), rx.recv_timeout(wait).expect("a capture never ended")];
        texts.sort();
        assert_eq!(texts[0], "");
        assert!(texts[1].contains("from a\n") && texts[1].contains("from b\n"), "{texts:?}");
    }
}
