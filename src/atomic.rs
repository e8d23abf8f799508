//! Atomic writes: a reader (or a crash) sees the old content or the new, never a mix.
//! Files: write a temporary sibling, fsync it, rename over the target, fsync the directory.
//! Directories (checkpoints): fill a temporary sibling directory, fsync everything, then swap it
//! with the target in one `renameat2(RENAME_EXCHANGE)` and delete the old one.
use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("fsync {}", dir.display()))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn temp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent(path).join(format!(".{name}.tmp-{}", std::process::id()))
}

pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file_with(path, |f| Ok(f.write_all(bytes)?)).map(|_| ())
}

/// `write_file` for content written piece by piece (a pack): `fill` writes into the temporary
/// file, which is then synced and renamed over `path`; on an error it is removed.
pub fn write_file_with<T>(path: &Path, fill: impl FnOnce(&mut File) -> Result<T>) -> Result<T> {
    write_file_by_path(path, |tmp| {
        let mut f = File::create(tmp).with_context(|| format!("creating {}", tmp.display()))?;
        fill(&mut f)
    })
}

/// `write_file` for a writer that takes a path (a library's `save(path)`): it writes the
/// temporary sibling, which is then synced and renamed over `path`; on an error it is removed.
pub fn write_file_by_path<T>(path: &Path, write: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    remove_dead_writers_temps(path);
    let tmp = temp_sibling(path);
    let result = (|| -> Result<T> {
        let value = write(&tmp)?;
        File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, path).with_context(|| format!("renaming onto {}", path.display()))?;
        fsync_dir(&parent(path))?;
        Ok(value)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes the temporaries of `path` (`.<name>.tmp-<pid>`) whose writer is no longer running on
/// this machine: a write killed midway leaves one (a pack killed after a second, 138 MB), and
/// nothing else would ever remove it. Says so in one line each.
fn remove_dead_writers_temps(path: &Path) {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = fs::read_dir(parent(path)) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file.strip_prefix(&prefix).and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid == std::process::id() as i32 || process_alive(pid) {
            continue;
        }
        let p = e.path();
        let removed = match p.is_dir() {
            true => fs::remove_dir_all(&p),
            false => fs::remove_file(&p),
        };
        if removed.is_ok() {
            crate::report::progress::warn(&format!(
                "removed {}, left by a write of {} that was killed (process {pid})",
                p.display(),
                path.display()
            ));
        }
    }
}

/// Whether process `pid` exists here (one of another user's counts too).
fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let sent = unsafe { libc::kill(pid, 0) };
    sent == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// fsyncs every file in `dir` and the directory itself.
pub fn sync_tree(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_file() {
            File::open(&p)?.sync_all()?;
        }
    }
    fsync_dir(dir)
}

fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: two valid NUL-terminated paths; AT_FDCWD resolves them like rename(2).
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Creates directory `target` atomically: `fill` writes into a fresh temporary directory, which
/// then replaces `target` (if any) in one step.
pub fn write_dir(target: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    remove_dead_writers_temps(target);
    let tmp = temp_sibling(target);
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let result = (|| -> Result<()> {
        fill(&tmp)?;
        sync_tree(&tmp)?;
        if target.exists() {
            if let Err(e) = exchange(&tmp, target) {
                // Filesystems without RENAME_EXCHANGE: keep the old copy until the new one is in.
                let old = temp_sibling(&target.with_extension("old"));
                fs::rename(target, &old).with_context(|| format!("moving aside {} ({e})", target.display()))?;
                fs::rename(&tmp, target)?;
                fs::remove_dir_all(&old)?;
                return fsync_dir(&parent(target));
            }
            fs::remove_dir_all(&tmp)?; // now holds the previous content
        } else {
            fs::rename(&tmp, target)?;
        }
        fsync_dir(&parent(target))
    })();
    if result.is_err() && tmp.exists() {
        let _ = fs::remove_dir_all(&tmp);
    }
    if result.is_ok() && !target.is_dir() {
        bail!("{} was not written", target.display());
    }
    result
}

/// After a kill inside `write_dir`'s fallback path (filesystems without RENAME_EXCHANGE), the
/// previous `target` may exist only as its moved-aside copy: move it back.
pub fn recover_dir(target: &Path) -> Result<()> {
    if target.exists() {
        return Ok(());
    }
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{name}.old.tmp-");
    let Ok(entries) = fs::read_dir(parent(target)) else {
        return Ok(());
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) && e.path().is_dir() {
            match fs::rename(e.path(), target) {
                Ok(()) => return fsync_dir(&parent(target)),
                // Another rank of the same job put it back first.
                Err(_) if target.exists() => return Ok(()),
                Err(err) => bail!("restoring {} from {}: {err}", target.display(), e.path().display()),
            }
        }
    }
    Ok(())
}

/// Removes the temporary files and directories that writes killed midway left in `dir`
/// (names `.<target>.tmp-<pid>`). Only the process that owns `dir`'s writes calls this.
pub fn remove_stale_temps(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with('.') && name.contains(".tmp-")) {
            continue;
        }
        let p = e.path();
        let r = if p.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
        r.with_context(|| format!("removing the stale temporary {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_aside_checkpoint_is_recovered_and_stale_temps_go() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("last");
        // What a kill between write_dir's two fallback renames leaves behind.
        let aside = d.path().join(".last.old.tmp-4242");
        fs::create_dir(&aside).unwrap();
        fs::write(aside.join("state.json"), b"{}").unwrap();
        let half = d.path().join(".last.tmp-4243");
        fs::create_dir(&half).unwrap();
        fs::write(half.join("model.safetensors"), b"partial").unwrap();
        fs::write(d.path().join(".metrics.csv.tmp-4243"), b"partial").unwrap();
        recover_dir(&t).unwrap();
        assert_eq!(fs::read(t.join("state.json")).unwrap(), b"{}");
        remove_stale_temps(d.path()).unwrap();
        let names: Vec<String> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["last"]);
        // An existing target is left alone.
        recover_dir(&t).unwrap();
        assert!(t.join("state.json").is_file());
    }

    #[test]
    fn file_is_replaced_whole_and_no_temp_is_left() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.csv");
        write_file(&p, b"one").unwrap();
        write_file(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn directory_swap_keeps_old_content_when_fill_fails() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("last");
        write_dir(&t, |p| Ok(fs::write(p.join("a"), b"1")?)).unwrap();
        write_dir(&t, |p| Ok(fs::write(p.join("a"), b"2")?)).unwrap();
        assert_eq!(fs::read(t.join("a")).unwrap(), b"2");
        let e = write_dir(&t, |p| {
            fs::write(p.join("a"), b"3")?;
            bail!("disk full")
        });
        assert!(e.is_err());
        assert_eq!(fs::read(t.join("a")).unwrap(), b"2");
        assert_eq!(
            fs::read_dir(d.path()).unwrap().count(),
            1,
            "temporary directories must be removed"
        );
    }
}
