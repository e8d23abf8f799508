//! What data a run started with, kept in the run directory (`data-files.bin`), so that a resumed
//! run trains and validates on the images it started with: a validation split drawn from
//! `--data` keeps its images even when images were added or removed since, and what changed is
//! said in one line (an error under `--strict`).
//!
//! Per image, 16 bytes: a hash of its name (its path under the set's root) and a hash of its
//! name, size and modification time. A new run writes the file from a background thread (the
//! `stat` of every image is work the first step need not wait for); a resumed run reads it and
//! compares.
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::config::TrainConfig;
use crate::data::source::Samples;

pub const FILE: &str = "data-files.bin";
const MAGIC: &[u8; 8] = b"RTDATA1\0";

/// One image: hashes of its name and of (name, size, modification time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    name: u64,
    content: u64,
}

/// The images of the training and validation sets, each sorted by name hash.
#[derive(Debug, Clone, PartialEq)]
pub struct DataRecord {
    train: Vec<Entry>,
    val: Vec<Entry>,
}

/// What differs between a recorded set and the current one.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    pub added: usize,
    pub removed: usize,
    pub changed: usize,
}

impl Changes {
    fn any(&self) -> bool {
        self.added + self.removed + self.changed > 0
    }
}

impl std::fmt::Display for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.any() {
            false => write!(f, "unchanged"),
            true => write!(f, "{} added, {} removed, {} changed", self.added, self.removed, self.changed),
        }
    }
}

fn hash64(parts: &[&[u8]]) -> u64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

fn name_hash(samples: &Samples, i: usize) -> u64 {
    hash64(&[samples.name(i).as_os_str().as_encoded_bytes()])
}

/// Every image of `samples` with its size and time: a pack's from its index, a file's by `stat`
/// (in parallel, unless `background`). An image that cannot be read counts with size and time 0.
fn entries(samples: &Samples, background: bool) -> Vec<Entry> {
    let entry = |i: usize| {
        let name = samples.name(i).as_os_str().as_encoded_bytes();
        let (size, mtime) = samples.size_and_mtime(i).unwrap_or((0, 0));
        Entry {
            name: hash64(&[name]),
            content: hash64(&[name, &size.to_le_bytes(), &mtime.to_le_bytes()]),
        }
    };
    let mut out: Vec<Entry> = match background {
        true => (0..samples.len()).map(entry).collect(),
        false => (0..samples.len()).into_par_iter().map(entry).collect(),
    };
    out.sort_unstable();
    out
}

fn diff(before: &[Entry], now: &[Entry]) -> Changes {
    let (mut c, mut i, mut j) = (Changes::default(), 0, 0);
    while i < before.len() || j < now.len() {
        match (before.get(i), now.get(j)) {
            (Some(b), Some(n)) if b.name == n.name => {
                c.changed += (b.content != n.content) as usize;
                i += 1;
                j += 1;
            }
            (Some(b), Some(n)) if b.name < n.name => (c.removed, i) = (c.removed + 1, i + 1),
            (Some(_), None) => (c.removed, i) = (c.removed + 1, i + 1),
            _ => (c.added, j) = (c.added + 1, j + 1),
        }
    }
    c
}

impl DataRecord {
    pub fn of(train: &Samples, val: &Samples) -> Self {
        Self::of_with(train, val, false)
    }

    fn of_with(train: &Samples, val: &Samples, background: bool) -> Self {
        DataRecord {
            train: entries(train, background),
            val: entries(val, background),
        }
    }

    /// The record of the run `cfg --resume` continues, if it has one: beside the checkpoint
    /// (`<run>/last` → `<run>/data-files.bin`). Only read: `--resume auto` without a checkpoint
    /// in `last/` is a new run.
    pub fn of_resumed_run(cfg: &TrainConfig) -> Result<Option<Self>> {
        let checkpoint = match cfg.resume.as_deref() {
            None => return Ok(None),
            Some("auto") => cfg.out.join("last"),
            Some(dir) => PathBuf::from(dir),
        };
        if !checkpoint.join(super::checkpoint::STATE_FILE).is_file() {
            return Ok(None);
        }
        let path = checkpoint.parent().unwrap_or(Path::new(".")).join(FILE);
        match std::fs::read(&path) {
            Ok(bytes) => Self::parse(&bytes)
                .map(Some)
                .ok_or_else(|| crate::error::user_error(format!("--resume: {} is damaged; remove it to resume without checking the data", path.display()))),
            Err(_) => Ok(None),
        }
    }

    fn parse(b: &[u8]) -> Option<Self> {
        let rest = b.strip_prefix(MAGIC)?;
        let n = |k: usize| Some(u64::from_le_bytes(rest.get(k * 8..k * 8 + 8)?.try_into().ok()?) as usize);
        let (nt, nv) = (n(0)?, n(1)?);
        let body = &rest[16..];
        if body.len() as u64 != (nt as u64 + nv as u64) * 16 {
            return None;
        }
        let e: Vec<Entry> = body
            .chunks_exact(16)
            .map(|c| Entry {
                name: u64::from_le_bytes(c[..8].try_into().unwrap()),
                content: u64::from_le_bytes(c[8..].try_into().unwrap()),
            })
            .collect();
        Some(DataRecord {
            train: e[..nt].to_vec(),
            val: e[nt..].to_vec(),
        })
    }

    pub fn write(&self, run_dir: &Path) -> Result<()> {
        let mut b = Vec::with_capacity(24 + (self.train.len() + self.val.len()) * 16);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&(self.train.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.val.len() as u64).to_le_bytes());
        for e in self.train.iter().chain(&self.val) {
            b.extend_from_slice(&e.name.to_le_bytes());
            b.extend_from_slice(&e.content.to_le_bytes());
        }
        crate::atomic::write_file(&run_dir.join(FILE), &b)
    }

    /// `samples` split as recorded: (train, val), an image in validation exactly when it was,
    /// images added since in training. The order is that of `order` (the split drawn now), so
    /// an unchanged set gives the same samples in the same order.
    pub fn split(&self, samples: &Samples, order: &[usize]) -> (Samples, Samples) {
        let val: HashSet<u64> = self.val.iter().map(|e| e.name).collect();
        let (v, t): (Vec<usize>, Vec<usize>) = order.iter().partition(|&&i| val.contains(&name_hash(samples, i)));
        (samples.select(&t), samples.select(&v))
    }

    /// What changed from this record to the sets now: (train, val).
    pub fn changes(&self, now: &DataRecord) -> (Changes, Changes) {
        (diff(&self.train, &now.train), diff(&self.val, &now.val))
    }
}

/// Compares the run's data with its record and says what changed, in one line; `--strict`
/// makes a change an error. Nothing is said when nothing changed.
pub fn check(recorded: &DataRecord, train: &Samples, val: &Samples, split: bool, strict: bool) -> Result<()> {
    let (t, v) = recorded.changes(&DataRecord::of(train, val));
    if !t.any() && !v.any() {
        return Ok(());
    }
    let line = format!(
        "the data changed since the run started (training images: {t}; validation images: {v}){}",
        match split {
            true => "; the validation images stay those the run started with, and images added train",
            false => "",
        }
    );
    if strict {
        return Err(crate::error::user_error(format!("--resume: {line}; --strict stops here")));
    }
    crate::report::progress::warn(&format!("resume: {line}"));
    Ok(())
}

/// Writes the record of a new run's data from a background thread; joined (and any error
/// warned about) when dropped, at the end of the run.
pub struct Recording(Option<std::thread::JoinHandle<Result<()>>>);

impl Recording {
    /// Records the run's data in a background thread when `record`; nothing otherwise.
    pub fn start_if(record: bool, run_dir: &Path, train: &Samples, val: &Samples) -> Self {
        if !record {
            return Recording(None);
        }
        let (dir, train, val) = (run_dir.to_path_buf(), train.clone(), val.clone());
        let handle = std::thread::Builder::new()
            .name("ringtrain-data-record".into())
            .spawn(move || {
                // One thread at the lowest priority: the data workers and the first steps go first
                // (in parallel at normal priority it delayed a million-file run's first step by 1.3 s).
                // SAFETY: setpriority on this thread's own id.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
                DataRecord::of_with(&train, &val, true).write(&dir).context("recording the run's data files")
            })
            .ok();
        Recording(handle)
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if let Some(Ok(Err(e))) = self.0.take().map(|h| h.join()) {
            crate::report::progress::warn(&format!("{e:#}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(name: u64, content: u64) -> Entry {
        Entry { name, content }
    }

    #[test]
    fn changes_count_added_removed_and_changed() {
        let before = [e(1, 1), e(2, 2), e(4, 4), e(6, 6)];
        let now = [e(2, 2), e(3, 3), e(4, 9), e(5, 5), e(7, 7)];
        assert_eq!(
            diff(&before, &now),
            Changes {
                added: 3,
                removed: 2,
                changed: 1
            }
        );
        assert!(!diff(&now, &now).any());
        let r = DataRecord {
            train: before.to_vec(),
            val: now.to_vec(),
        };
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&4u64.to_le_bytes());
        b.extend_from_slice(&5u64.to_le_bytes());
        for x in before.iter().chain(&now) {
            b.extend_from_slice(&x.name.to_le_bytes());
            b.extend_from_slice(&x.content.to_le_bytes());
        }
        assert_eq!(DataRecord::parse(&b), Some(r));
        assert_eq!(DataRecord::parse(&b[..b.len() - 1]), None);
    }
}
