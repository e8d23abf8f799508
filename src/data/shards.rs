//! WebDataset tar shards (`--data 'train-{000000..000146}.tar'`): how large sets are kept on
//! shared file systems. A sample is the run of consecutive members sharing a key (the member's
//! path up to the first dot of its file name, as WebDataset splits it): `KEY.jpg` (any image
//! extension, or `--image-column EXT`) and `KEY.cls` (`--label-column EXT`), the class number as
//! text. Labels that are not all numbers are class names, sorted as ImageFolder sorts.
//!
//! Opening reads each shard's member headers (in parallel; the image bytes are skipped, not
//! read) into a list of where each image lies, so a sample is read later by one positioned read.
//! Training reads them in WebDataset's order (`stream_order`).
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rand::seq::SliceRandom;
use rand::Rng;
use rayon::prelude::*;

use super::catalog::Catalog;
use super::folder::IMAGE_EXTENSIONS;
use super::labels::Columns;
use crate::bail_user;
use crate::report::progress::warn;
use crate::seeds;

/// Shards a brace pattern may name at most: a typo like `{0..99999999}` fails at once.
const MAX_SHARDS: usize = 1_000_000;
/// Class numbers at most (ImageNet-21k has 21,841 classes).
const MAX_CLASS_NUMBER: u64 = 1_000_000;

/// The shards of a set and where each sample's image lies.
pub struct Shards {
    /// Each shard's path, as named.
    pub paths: Vec<PathBuf>,
    /// The folder that holds them all ("" if none does): sample names are under it.
    pub root: PathBuf,
    /// Each shard's modification time (ns since the epoch), when opened.
    mtimes: Vec<i64>,
    /// Per sample, in catalog order: its shard, and its image's bytes in that shard.
    members: Vec<Member>,
}

#[derive(Clone, Copy)]
struct Member {
    shard: u32,
    len: u32,
    offset: u64,
}

/// Whether `--data` names shards: a brace pattern or `::` list (WebDataset's own notation), a
/// `.tar` file, or a directory holding `.tar` files and no sub-folders.
pub fn is_shards(path: &Path) -> bool {
    let s = path.as_os_str().as_bytes();
    let has = |needle: &[u8]| s.windows(needle.len()).any(|w| w == needle);
    if (has(b"{") && has(b"}")) || has(b"::") || s.ends_with(b".tar") {
        return !path.exists() || path.is_file();
    }
    path.is_dir() && files_in_flat_dir(path, ".tar").is_ok_and(|v| !v.is_empty())
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

/// Each file's modification time (ns since the epoch); a file not there is a user error.
pub(crate) fn file_times(paths: &[PathBuf], what: &str) -> Result<Vec<i64>> {
    paths
        .iter()
        .map(|p| match std::fs::metadata(p) {
            Ok(m) if m.is_file() => Ok(super::pack::mtime_ns(&m)),
            Ok(_) => bail_user!("{what}: {} is not a file", p.display()),
            Err(e) => bail_user!("{what}: {}: {e}", p.display()),
        })
        .collect()
}

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

/// WebDataset's split of a member's path into (key, extension): the key runs to the first dot of
/// the file name; the extension, lower-cased, is the rest. `None` without a dot.
fn key_and_extension(path: &[u8]) -> Option<(&[u8], String)> {
    let file_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let dot = file_start + path[file_start..].iter().position(|&b| b == b'.')?;
    (dot > file_start).then(|| (&path[..dot], String::from_utf8_lossy(&path[dot + 1..]).to_lowercase()))
}

/// What one shard holds: (image member name, offset, length, label text) per complete sample.
struct ShardScan {
    samples: Vec<(Vec<u8>, u64, u64, String)>,
    /// Samples lacking an image or a label.
    incomplete: usize,
    /// The read error that ended the shard early, if it was cut short.
    cut: Option<String>,
}

fn scan_shard(path: &Path, columns: &Columns) -> Result<ShardScan> {
    let file = File::open(path).map_err(|e| crate::error::user_error(format!("cannot open shard {}: {e}", path.display())))?;
    let file_len = file.metadata().with_context(|| format!("reading shard {}", path.display()))?.len();
    let mut archive = tar::Archive::new(BufReader::with_capacity(16 << 10, file));
    let entries = archive
        .entries_with_seek()
        .with_context(|| format!("reading shard {}", path.display()))?;
    let label_ext = columns.label.as_deref().unwrap_or("cls").to_lowercase();
    let image_ext = columns.image.as_ref().map(|e| e.to_lowercase());
    let is_image = |ext: &str| match &image_ext {
        Some(want) => ext == want,
        None => IMAGE_EXTENSIONS.contains(&ext),
    };
    let mut scan = ShardScan {
        samples: Vec::new(),
        incomplete: 0,
        cut: None,
    };
    // The sample being gathered: key, image (name, offset, len), label (an empty one counts as
    // none).
    let mut key: Vec<u8> = Vec::new();
    let mut image: Option<(Vec<u8>, u64, u64)> = None;
    let mut label: Option<String> = None;
    let mut started = false;
    let finish = |image: &mut Option<(Vec<u8>, u64, u64)>, label: &mut Option<String>, scan: &mut ShardScan| {
        match (image.take(), label.take()) {
            (Some((name, offset, len)), Some(l)) if !l.is_empty() => scan.samples.push((name, offset, len, l)),
            _ => scan.incomplete += 1,
        }
    };
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                scan.cut = Some(e.to_string());
                break;
            }
        };
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path_bytes().into_owned();
        // The reader meets the end of a cut file as the end of the archive, so a member that
        // runs past it is the sign.
        if entry.raw_file_position() + entry.size() > file_len {
            scan.cut = Some(format!("the file ends inside {}", String::from_utf8_lossy(&name)));
            break;
        }
        // WebDataset leaves out `__NAME__` members at the top (its own metadata).
        if !name.contains(&b'/') && name.starts_with(b"__") && name.ends_with(b"__") {
            continue;
        }
        let Some((k, ext)) = key_and_extension(&name) else {
            continue;
        };
        if !started || k != key.as_slice() {
            if started {
                finish(&mut image, &mut label, &mut scan);
            }
            key = k.to_vec();
            started = true;
        }
        if ext == label_ext {
            let mut text = String::new();
            if let Err(e) = (&mut entry).take(4096).read_to_string(&mut text) {
                scan.cut = Some(format!("{}: {e}", String::from_utf8_lossy(&name)));
                break;
            }
            label = Some(text.trim().to_owned());
        } else if image.is_none() && is_image(&ext) {
            image = Some((name, entry.raw_file_position(), entry.size()));
        }
    }
    if started && scan.cut.is_none() {
        finish(&mut image, &mut label, &mut scan);
    }
    Ok(scan)
}

impl Shards {
    /// Opens the shards `spec` names (a pattern, a `.tar` file or a directory of them) and lists
    /// their samples. `what` names the flag. A shard cut short (a copy still running, a disk
    /// full) keeps the samples before the cut, with a warning (an error when `strict`).
    pub fn open(spec: &Path, columns: &Columns, strict: bool, what: &str) -> Result<(Vec<String>, Catalog, Shards)> {
        let paths = if spec.is_dir() {
            files_in_flat_dir(spec, ".tar").with_context(|| format!("reading {what} directory {}", spec.display()))?
        } else {
            let Some(pattern) = spec.to_str() else {
                bail_user!("{what} {} is not UTF-8", spec.display());
            };
            expand(pattern, what)?
        };
        let mtimes = file_times(&paths, what)?;
        let scans: Vec<ShardScan> = paths
            .par_iter()
            .map(|p| scan_shard(p, columns))
            .collect::<Result<_>>()?;

        // Names under the shards' common folder: `train-000001.tar/KEY.jpg`.
        let root = common_parent(&paths);
        let mut incomplete = 0;
        for (p, s) in paths.iter().zip(&scans) {
            incomplete += s.incomplete;
            if let Some(e) = &s.cut {
                let line = format!(
                    "{what}: shard {} is cut short after {} samples ({e})",
                    p.display(),
                    s.samples.len()
                );
                if strict {
                    bail_user!("{line}");
                }
                warn(&format!("{line}; the rest of it is left out"));
            }
        }
        if incomplete > 0 {
            let line = format!(
                "{what}: {incomplete} samples of the shards have no image or no .{} member",
                columns.label.as_deref().unwrap_or("cls")
            );
            if strict {
                bail_user!("{line}");
            }
            warn(&format!("{line}; they are left out"));
        }
        let total: usize = scans.iter().map(|s| s.samples.len()).sum();
        if total == 0 {
            bail_user!(
                "{what} {}: no sample of its {} shard(s) has an image and a .{} label",
                spec.display(),
                paths.len(),
                columns.label.as_deref().unwrap_or("cls")
            );
        }
        let (classes, numbered) = class_list(scans.iter().flat_map(|s| s.samples.iter().map(|x| x.3.as_str())), what)?;
        let (mut catalog, mut members) = (Catalog::default(), Vec::with_capacity(total));
        for (shard, (p, s)) in paths.iter().zip(&scans).enumerate() {
            let prefix = p.strip_prefix(&root).unwrap_or(p);
            for (name, offset, len, label) in &s.samples {
                let label = class_index(&classes, numbered, label).expect("a label class_list saw");
                let name = prefix.join(std::ffi::OsStr::from_bytes(name));
                catalog.push(name.as_os_str(), label);
                if *len > u32::MAX as u64 {
                    bail_user!("{what}: {} in shard {} is larger than 4 GB", String::from_utf8_lossy(&name.as_os_str().as_bytes()), p.display());
                }
                members.push(Member {
                    shard: shard as u32,
                    len: *len as u32,
                    offset: *offset,
                });
            }
        }
        let shards = Shards {
            paths,
            root,
            mtimes,
            members,
        };
        Ok((classes, catalog, shards))
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Sample `i`'s shard.
    pub fn shard_of(&self, i: usize) -> usize {
        self.members[i].shard as usize
    }

    /// Sample `i`'s image bytes: one positioned read of its shard.
    pub fn read(&self, i: usize) -> Result<Vec<u8>> {
        let m = self.members[i];
        let path = &self.paths[m.shard as usize];
        let mut bytes = vec![0u8; m.len as usize];
        File::open(path)
            .and_then(|f| f.read_exact_at(&mut bytes, m.offset))
            .with_context(|| format!("cannot read shard {}", path.display()))?;
        Ok(bytes)
    }

    /// Sample `i`'s image size and its shard's modification time.
    pub fn size_and_mtime(&self, i: usize) -> (u64, i64) {
        let m = self.members[i];
        (m.len as u64, self.mtimes[m.shard as usize])
    }
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

/// One rank's samples for a training epoch, in WebDataset's order: the shards in an order drawn
/// from (seed, epoch), every `world`-th of them from `rank` on, their samples read front to
/// back through a shuffle buffer of `buffer` samples (seeded by seed, epoch and rank), cut or
/// repeated to `len` so that every rank takes the same number of steps. `shard_of(i)` is sample
/// i's shard; samples of one shard keep their index order.
pub fn stream_order(
    n: usize,
    shard_of: impl Fn(usize) -> usize,
    seed: u64,
    epoch: u64,
    (rank, world): (usize, usize),
    buffer: usize,
    len: usize,
) -> Vec<usize> {
    let mut per_shard: Vec<Vec<usize>> = Vec::new();
    for i in 0..n {
        let s = shard_of(i);
        if s >= per_shard.len() {
            per_shard.resize_with(s + 1, Vec::new);
        }
        per_shard[s].push(i);
    }
    // Shards whose every sample went to validation take no turn: each rank's shards hold samples.
    let mut order: Vec<usize> = (0..per_shard.len()).filter(|&s| !per_shard[s].is_empty()).collect();
    order.shuffle(&mut seeds::shard_order(seed, epoch));
    let mut rng = seeds::shuffle_buffer(seed, epoch, rank as u64);
    let (mut buf, mut out) = (Vec::with_capacity(buffer + 1), Vec::with_capacity(len));
    for &s in order.iter().skip(rank).step_by(world) {
        for &i in &per_shard[s] {
            buf.push(i);
            if buf.len() >= buffer.max(1) {
                out.push(buf.swap_remove(rng.gen_range(0..buf.len())));
            }
        }
    }
    buf.shuffle(&mut rng);
    out.append(&mut buf);
    if out.is_empty() {
        return out;
    }
    let have = out.len();
    if have < len {
        let again: Vec<usize> = out.iter().cycle().take(len - have).copied().collect();
        out.extend(again);
    }
    out.truncate(len);
    out
}

/// The number of shards the samples `0..n` come from (those holding at least one of them).
pub fn shard_count(n: usize, shard_of: impl Fn(usize) -> usize) -> usize {
    let mut held = Vec::new();
    for i in 0..n {
        let s = shard_of(i);
        if s >= held.len() {
            held.resize(s + 1, false);
        }
        held[s] = true;
    }
    held.into_iter().filter(|&h| h).count()
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

    #[test]
    fn keys_split_at_the_file_names_first_dot() {
        assert_eq!(key_and_extension(b"a/b.c/x.seg.PNG"), Some((&b"a/b.c/x"[..], "seg.png".to_owned())));
        assert_eq!(key_and_extension(b"n01.jpg"), Some((&b"n01"[..], "jpg".to_owned())));
        assert_eq!(key_and_extension(b"noext"), None);
        assert_eq!(key_and_extension(b"d/.hidden"), None);
    }

    #[test]
    fn stream_order_covers_each_ranks_shards_and_evens_lengths() {
        // 5 shards of unequal size over 2 ranks.
        let sizes = [4, 4, 4, 4, 3];
        let shard_of: Vec<usize> = sizes.iter().enumerate().flat_map(|(s, &k)| std::iter::repeat_n(s, k)).collect();
        let n = shard_of.len();
        let len = n.div_ceil(2);
        let a = stream_order(n, |i| shard_of[i], 7, 3, (0, 2), 4, len);
        let b = stream_order(n, |i| shard_of[i], 7, 3, (1, 2), 4, len);
        assert_eq!((a.len(), b.len()), (len, len));
        // Each rank's samples come from its own shards only (3 and 2 of them: 11 or 12 samples
        // and 7 or 8): the longer stream is cut to 10, the shorter one repeats its first.
        let shards = |o: &[usize]| o.iter().map(|&i| shard_of[i]).collect::<std::collections::BTreeSet<_>>();
        assert!(shards(&a).is_disjoint(&shards(&b)));
        let held = |o: &[usize]| shards(o).iter().map(|&s| sizes[s]).sum::<usize>();
        let distinct = |o: &[usize]| o.iter().collect::<std::collections::BTreeSet<_>>().len();
        for o in [&a, &b] {
            assert_eq!(distinct(o), held(o).min(len));
        }
        // The same draw again; another epoch draws another shard order or buffer.
        assert_eq!(a, stream_order(n, |i| shard_of[i], 7, 3, (0, 2), 4, len));
        assert_ne!(a, stream_order(n, |i| shard_of[i], 7, 4, (0, 2), 4, len));
        // Shards emptied by a validation split take no turn: samples of shards 0 and 2 only, over
        // 2 ranks, give each rank one shard.
        let held = [0, 0, 2, 2, 2];
        assert_eq!(shard_count(held.len(), |i| held[i]), 2);
        for rank in 0..2 {
            let o = stream_order(held.len(), |i| held[i], 7, 0, (rank, 2), 4, 3);
            assert_eq!(o.len(), 3, "rank {rank}");
        }
        // A buffer of one keeps the shards' own order.
        let one = stream_order(n, |i| shard_of[i], 7, 3, (0, 1), 1, n);
        for w in one.windows(2) {
            assert!(shard_of[w[0]] != shard_of[w[1]] || w[0] < w[1]);
        }
    }
}
