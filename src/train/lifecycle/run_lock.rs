//! The run directory is held by the run that writes it: an advisory lock (`flock`) on
//! `--out/.ringtrain.lock`, taken by the rank that writes (rank 0) before anything in the
//! directory is read or written, and held until the process ends. A second run or resume into a
//! held directory is refused in one line naming the holder. The kernel drops the lock with the
//! holder's last file descriptor, however it ends (kill -9 included), so a dead run never leaves
//! a stale lock behind; the file itself stays and is reused. On NFS, `flock` is forwarded to the
//! server's lock manager (Linux ≥ 2.6.12), so runs on two nodes see each other's lock too.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::error::user_error;

/// The lock file's name inside `--out`.
pub const LOCK_FILE: &str = ".ringtrain.lock";

/// Holds `--out` while it lives (the lock goes with the file descriptor).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    pub path: PathBuf,
}

impl RunLock {
    /// Takes the lock of `out` (creating the directory), or says who holds it.
    pub fn acquire(out: &Path) -> Result<RunLock> {
        if let Err(e) = std::fs::create_dir_all(out) {
            return Err(user_error(format!("cannot create --out {}: {e}", out.display())));
        }
        let path = out.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| user_error(format!("cannot open the lock file {}: {e}", path.display())))?;
        // SAFETY: a valid open descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(user_error(format!(
                    "--out {} is in use by another run ({}); wait for it to end, stop it, or choose another --out",
                    out.display(),
                    describe_holder(holder.trim())
                )));
            }
            return Err(user_error(format!("cannot lock {}: {err}", path.display())));
        }
        // Ours now: say who holds it, for the run that is refused.
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "pid {} on {}", std::process::id(), hostname())?;
        file.flush()?;
        Ok(RunLock { _file: file, path })
    }

    /// Whether `out` is held by a live run now: for the launcher, which checks before it starts
    /// any worker (the lock itself is taken by the rank that writes).
    pub fn check_free(out: &Path) -> Result<()> {
        if !out.join(LOCK_FILE).exists() {
            return Ok(());
        }
        RunLock::acquire(out).map(drop)
    }
}

fn describe_holder(text: &str) -> String {
    match text {
        "" => "holder unknown".into(),
        t => format!("held by {t}"),
    }
}

/// This host's name, as the lock file records its holder.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates within it on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match ok {
        true => String::from_utf8_lossy(&buf[..end]).into_owned(),
        false => "unknown host".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_directory_is_refused_naming_the_holder_and_freed_with_it() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("run");
        let held = RunLock::acquire(&out).unwrap();
        // flock locks belong to open file descriptions: a second open in this process is refused
        // as another process would be.
        let e = RunLock::acquire(&out).unwrap_err();
        assert!(crate::error::is_user_error(&e));
        let msg = e.to_string();
        let me = format!("held by pid {} on {}", std::process::id(), hostname());
        assert!(msg.contains("is in use by another run") && msg.contains(&me), "{msg}");
        assert!(RunLock::check_free(&out).is_err());
        drop(held);
        RunLock::check_free(&out).unwrap();
        RunLock::acquire(&out).unwrap();
    }
}
