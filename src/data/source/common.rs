//! What several kinds of source use, beneath them all: walking a folder tree as torchvision
//! does, listing a flat folder, brace patterns, file sizes and times (the fingerprint packs and
//! freshness checks compare), and the class rule of labels that are numbers or names.
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::bail_user;

// Folder trees and flat folders.

/// Extensions accepted, compared case-insensitively: torchvision's `IMG_EXTENSIONS`.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"];

/// Whether a file name ends in one of the extensions, in any letter case, as torchvision's
/// `has_file_allowed_extension` tests it (`name.lower().endswith(".jpg")`, so `.JPG` too).
pub fn is_image_file(path: &Path) -> bool {
    let name = path.file_name().map_or(&[][..], |n| n.as_bytes());
    IMAGE_EXTENSIONS.iter().any(|x| {
        name.len() > x.len() && name[name.len() - x.len() - 1] == b'.' && name[name.len() - x.len()..].eq_ignore_ascii_case(x.as_bytes())
    })
}

/// Image files under `dir`, recursively, in torchvision's order (`walk_sorted`).
pub fn walk_images(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for rel in walk_sorted(dir)?.0 {
        out.push(dir.join(rel));
    }
    Ok(())
}

/// The image files under `dir` (paths relative to it) as `make_dataset` lists them:
/// `for root, _, files in sorted(os.walk(dir, followlinks=True)): for f in sorted(files)`. That
/// is every directory in the order of its path as a string (so `a b/` comes before `a/x/`), and
/// in each its files by name. Symlinks are followed, but a link back to a directory being walked
/// is refused (it would recurse forever). Errors name the path. Returns the files and the
/// directories walked.
pub fn walk_sorted(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut dirs = Vec::new();
    walk(dir, PathBuf::new(), &mut dirs, &mut Vec::new())?;
    dirs.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
    let mut files = Vec::new();
    for (rel, names) in &dirs {
        files.extend(names.iter().map(|f| rel.join(f)));
    }
    Ok((files, dirs.into_iter().map(|d| d.0).collect()))
}

/// Adds (`rel`, its image files sorted) for `dir` = base/`rel` and every directory below it.
fn walk(dir: &Path, rel: PathBuf, dirs: &mut Vec<(PathBuf, Vec<OsString>)>, ancestors: &mut Vec<PathBuf>) -> Result<()> {
    let real = match std::fs::canonicalize(dir) {
        Ok(r) => r,
        Err(e) => bail_user!("cannot read directory {}: {e}", dir.display()),
    };
    if ancestors.contains(&real) {
        bail_user!(
            "symlink loop in the data tree: {} leads back to {}",
            dir.display(),
            real.display()
        );
    }
    let listing = match std::fs::read_dir(dir).and_then(|r| r.collect::<std::io::Result<Vec<_>>>()) {
        Ok(l) => l,
        Err(e) => bail_user!("cannot read directory {}: {e}", dir.display()),
    };
    let (mut files, mut subdirs) = (Vec::new(), Vec::new());
    for e in listing {
        let name = e.file_name();
        let is_dir = match e.file_type() {
            Ok(t) if t.is_dir() => true,
            Ok(t) if t.is_file() => false,
            // A symlink (or a file system that does not say): what it points to decides. A
            // dangling one with an image's name is listed, as torchvision lists it (reported
            // when it cannot be read).
            _ => match std::fs::metadata(e.path()) {
                Ok(m) if m.is_dir() => true,
                Ok(m) if !m.is_file() => continue,
                Ok(_) => false,
                Err(_) if std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.file_type().is_symlink()) => false,
                Err(err) => bail_user!("cannot read {}: {err}", e.path().display()),
            },
        };
        if is_dir {
            subdirs.push(name);
        } else if is_image_file(Path::new(&name)) {
            files.push(name);
        }
    }
    files.sort();
    ancestors.push(real);
    dirs.push((rel.clone(), files));
    for d in subdirs {
        walk(&dir.join(&d), rel.join(&d), dirs, ancestors)?;
    }
    ancestors.pop();
    Ok(())
}

/// The files of `dir` whose names end in `suffix`, sorted; none when `dir` has a sub-folder
/// (it is then an ImageFolder).
pub(crate) fn files_in_flat_dir(dir: &Path, suffix: &str) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            return Ok(Vec::new());
        }
        if e.file_name().as_bytes().ends_with(suffix.as_bytes()) {
            files.push(e.path());
        }
    }
    files.sort();
    Ok(files)
}

// Patterns, the folder common to several files, and the class rule.

/// Shards a brace pattern may name at most: a typo like `{0..99999999}` fails at once.
const MAX_SHARDS: usize = 1_000_000;

/// Class numbers at most (ImageNet-21k has 21,841 classes).
const MAX_CLASS_NUMBER: u64 = 1_000_000;

/// The shard paths a pattern names: `::` separates alternatives, as in WebDataset; each may hold
/// braces, `{000..146}` (a range, zero-padded to the width written) or `{a,b}` (a list).
pub fn expand(pattern: &str, what: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for part in pattern.split("::").filter(|p| !p.is_empty()) {
        expand_braces(part, what, pattern, &mut out)?;
    }
    if out.is_empty() {
        bail_user!("{what} '{pattern}' names no shards");
    }
    Ok(out.into_iter().map(PathBuf::from).collect())
}

fn expand_braces(s: &str, what: &str, pattern: &str, out: &mut Vec<String>) -> Result<()> {
    let Some(open) = s.find('{') else {
        if s.contains('}') {
            bail_user!("{what} '{pattern}': '}}' without '{{'");
        }
        out.push(s.to_owned());
        return Ok(());
    };
    let Some(close) = s[open..].find('}').map(|c| open + c) else {
        bail_user!("{what} '{pattern}': '{{' without '}}'");
    };
    let (head, body, tail) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    if body.contains('{') {
        bail_user!("{what} '{pattern}': nested braces are not supported");
    }
    let choices: Vec<String> = match body.split_once("..") {
        Some((a, b)) if is_digits(a) && is_digits(b) => {
            let (lo, hi): (u64, u64) = (a.parse()?, b.parse()?);
            if lo > hi {
                bail_user!("{what} '{pattern}': the range {{{body}}} runs backwards");
            }
            if hi - lo >= MAX_SHARDS as u64 {
                bail_user!("{what} '{pattern}': {{{body}}} names more than {MAX_SHARDS} shards");
            }
            let width = if a.starts_with('0') || b.starts_with('0') { a.len().max(b.len()) } else { 0 };
            (lo..=hi).map(|n| format!("{n:0width$}")).collect()
        }
        Some(_) => bail_user!("{what} '{pattern}': {{{body}}} is not a range of numbers like {{000..146}}"),
        None => body.split(',').map(str::to_owned).collect(),
    };
    for c in choices {
        expand_braces(&format!("{head}{c}{tail}"), what, pattern, out)?;
        if out.len() > MAX_SHARDS {
            bail_user!("{what} '{pattern}' names more than {MAX_SHARDS} shards");
        }
    }
    Ok(())
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The folder holding every shard ("" when they lie in different ones).
pub(crate) fn common_parent(paths: &[PathBuf]) -> PathBuf {
    let first = paths[0].parent().unwrap_or(Path::new(""));
    match paths.iter().all(|p| p.parent() == Some(first)) {
        true => first.to_path_buf(),
        false => PathBuf::new(),
    }
}

/// The classes the labels name, and whether they are numbered: the numbers 0..=max when every
/// label is a number (WebDataset's `.cls`, a class index), else the distinct names sorted as
/// ImageFolder sorts them. `class_index` finds a label's class.
pub(crate) fn class_list<'a>(labels: impl Iterator<Item = &'a str> + Clone, what: &str) -> Result<(Vec<String>, bool)> {
    let mut max = None;
    for l in labels.clone() {
        match l.parse::<u64>() {
            Ok(n) if n < MAX_CLASS_NUMBER => max = Some(max.map_or(n, |m: u64| m.max(n))),
            Ok(n) => bail_user!("{what}: class number {n} is too large (at most {MAX_CLASS_NUMBER} classes)"),
            Err(_) => {
                max = None;
                break;
            }
        }
    }
    if let Some(max) = max {
        return Ok(((0..=max).map(|n| n.to_string()).collect(), true));
    }
    let mut names: Vec<String> = labels.filter(|l| !l.is_empty()).map(str::to_owned).collect();
    names.sort_unstable();
    names.dedup();
    Ok((names, false))
}

/// The class of `label` among `classes` as `class_list` made them.
pub(crate) fn class_index(classes: &[String], numbered: bool, label: &str) -> Option<usize> {
    match numbered {
        true => label.parse().ok().filter(|&n| n < classes.len()),
        false => classes.binary_search_by(|c| c.as_str().cmp(label)).ok(),
    }
}

// Sizes and times.

/// Each file's modification time (ns since the epoch); a file not there is a user error.
pub(crate) fn file_times(paths: &[PathBuf], what: &str) -> Result<Vec<i64>> {
    paths
        .iter()
        .map(|p| match std::fs::metadata(p) {
            Ok(m) if m.is_file() => Ok(mtime_ns(&m)),
            Ok(_) => bail_user!("{what}: {} is not a file", p.display()),
            Err(e) => bail_user!("{what}: {}: {e}", p.display()),
        })
        .collect()
}

/// One image file of the source folder as it was when packed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceFile {
    /// Path under the folder, '/'-separated.
    pub name: String,
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

/// A directory of the source folder as it was when packed: a file added, removed or renamed
/// in it changes its modification time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceDir {
    /// Path under the folder, '/'-separated.
    pub name: String,
    pub mtime_ns: i64,
}

/// A file's (absolute) path, size and modification time.
pub fn stat_file(path: &Path) -> Result<SourceFile> {
    let m = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(SourceFile {
        name: path.to_string_lossy().into_owned(),
        size: m.len(),
        mtime_ns: mtime_ns(&m),
    })
}

/// The files `name(0..n)` under `root` with their sizes and modification times. The files of a
/// directory are `stat`ed relative to it (no walk of the whole path each time), the directories
/// in parallel.
pub fn stat_files<'a>(root: &Path, n: usize, name: impl Fn(usize) -> &'a Path + Sync) -> Result<Vec<SourceFile>> {
    // Runs of consecutive files in one directory (a folder's files are listed together).
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=n {
        if i == n || name(i).parent() != name(start).parent() {
            runs.push(start..i);
            start = i;
        }
    }
    let per_dir: Vec<Result<Vec<SourceFile>>> = runs
        .into_par_iter()
        .map(|run| {
            let dir = root.join(name(run.start).parent().unwrap_or(Path::new("")));
            let dir = File::open(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
            run.map(|i| {
                let meta = stat_at(&dir, name(i).file_name().unwrap_or_default())
                    .with_context(|| format!("cannot read {}", root.join(name(i)).display()))?;
                Ok(SourceFile {
                    name: name(i).to_string_lossy().into_owned(),
                    size: meta.st_size as u64,
                    mtime_ns: meta.st_mtime * 1_000_000_000 + meta.st_mtime_nsec,
                })
            })
            .collect()
        })
        .collect();
    let mut files = Vec::with_capacity(n);
    for d in per_dir {
        files.append(&mut d?);
    }
    Ok(files)
}

/// A file's modification time in nanoseconds since the Unix epoch, as packs record it.
pub(crate) fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

/// `stat` of `name` in the open directory `dir` (symlinks followed).
fn stat_at(dir: &File, name: &std::ffi::OsStr) -> std::io::Result<libc::stat> {
    use std::os::fd::AsRawFd;
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name))?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a valid directory descriptor, a NUL-terminated name and room for the result.
    match unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), st.as_mut_ptr(), 0) } {
        // SAFETY: filled in by a successful fstatat.
        0 => Ok(unsafe { st.assume_init() }),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brace_patterns_expand_as_webdataset_does() {
        let names = |p| expand(p, "--data").unwrap().into_iter().map(|p| p.display().to_string()).collect::<Vec<_>>();
        assert_eq!(names("a-{000..002}.tar"), ["a-000.tar", "a-001.tar", "a-002.tar"]);
        assert_eq!(names("a-{8..10}.tar"), ["a-8.tar", "a-9.tar", "a-10.tar"]);
        assert_eq!(names("{x,y}-{0..1}.tar"), ["x-0.tar", "x-1.tar", "y-0.tar", "y-1.tar"]);
        assert_eq!(names("a.tar::b-{1..2}.tar"), ["a.tar", "b-1.tar", "b-2.tar"]);
        for bad in ["a-{3..1}.tar", "a-{1..x}.tar", "a-{1.tar", "a-1}.tar", "a-{0..99999999}.tar"] {
            let e = expand(bad, "--data").unwrap_err();
            assert!(crate::error::is_user_error(&e), "{bad}: {e}");
        }
    }
}
