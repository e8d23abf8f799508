//! WebDataset tar shards (`--data 'train-{000000..000146}.tar'`): how large sets are kept on
//! shared file systems. A sample is the run of consecutive members sharing a key (the member's
//! path up to the first dot of its file name, as WebDataset splits it): `KEY.jpg` (any image
//! extension, or `--image-column EXT`) and `KEY.cls` (`--label-column EXT`), the class number as
//! text. Labels that are not all numbers are class names, sorted as ImageFolder sorts.
//!
//! Opening reads each shard's member headers (in parallel; the image bytes are skipped, not
//! read) into a list of where each image lies, so a sample is read later by one positioned read.
//! Training reads them in streams of shards (`load/order.rs`).
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

use super::catalog::Catalog;
use super::common::{class_index, class_list, expand, files_in_flat_dir, IMAGE_EXTENSIONS};
use super::files::Files;
use super::interface::{Columns, Opened, Source, SourceKind, Stored};
use crate::bail_user;
use crate::report::progress::warn;

/// The shards of a set and where each sample's image lies.
pub struct Shards {
    /// Each shard's path (or URL), as named, and how to open it.
    files: Files,
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

fn scan_shard(file: File, path: &Path, columns: &Columns) -> Result<ShardScan> {
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
    pub fn open(spec: &Path, columns: &Columns, strict: bool, what: &str) -> Result<Opened> {
        let paths = if spec.is_dir() {
            files_in_flat_dir(spec, ".tar").with_context(|| format!("reading {what} directory {}", spec.display()))?
        } else {
            let Some(pattern) = spec.to_str() else {
                bail_user!("{what} {} is not UTF-8", spec.display());
            };
            expand(pattern, what)?
        };
        Shards::open_files(spec, Files::local(paths), columns, strict, what)
    }

    /// Lists the samples of the shards `files` holds (local or remote; `spec` as named).
    pub fn open_files(spec: &Path, files: Files, columns: &Columns, strict: bool, what: &str) -> Result<Opened> {
        let mtimes = files.times(what)?;
        let scans = files.each(|i| scan_shard(files.open(i, "shard")?, &files.names[i], columns))?;
        let paths = &files.names;

        // Names under the shards' common folder: `train-000001.tar/KEY.jpg`.
        let root = files.common_parent();
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
            files,
            root,
            mtimes,
            members,
        };
        Ok(Opened {
            classes,
            catalog,
            source: Arc::new(shards),
        })
    }
}

impl Source for Shards {
    fn root(&self) -> &Path {
        &self.root
    }

    fn describe(&self) -> SourceKind {
        SourceKind::Shards(self.files.len())
    }

    /// The member's image bytes: one positioned read of its shard.
    fn read(&self, entry: usize, _name: &Path) -> Result<Stored<'_>> {
        let m = self.members[entry];
        let path = &self.files.names[m.shard as usize];
        let mut bytes = vec![0u8; m.len as usize];
        self.files
            .open(m.shard as usize, "shard")?
            .read_exact_at(&mut bytes, m.offset)
            .with_context(|| format!("cannot read shard {}", path.display()))?;
        Ok(Stored::Encoded(Cow::Owned(bytes)))
    }

    /// The image's size and its shard's modification time.
    fn size_and_mtime(&self, entry: usize, _name: &Path) -> Result<(u64, i64)> {
        let m = self.members[entry];
        Ok((m.len as u64, self.mtimes[m.shard as usize]))
    }

    fn shard_of(&self, entry: usize) -> Option<usize> {
        Some(self.members[entry].shard as usize)
    }

    fn shard_files(&self) -> Option<&Files> {
        Some(&self.files)
    }

    /// The shards the reads will meet, fetched ahead when remote.
    fn will_read(&self, entries: &[usize]) {
        let shards = entries.iter().map(|&e| self.members[e].shard as usize);
        self.files.will_read(&super::files::first_appearances(shards));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_at_the_file_names_first_dot() {
        assert_eq!(key_and_extension(b"a/b.c/x.seg.PNG"), Some((&b"a/b.c/x"[..], "seg.png".to_owned())));
        assert_eq!(key_and_extension(b"n01.jpg"), Some((&b"n01"[..], "jpg".to_owned())));
        assert_eq!(key_and_extension(b"noext"), None);
        assert_eq!(key_and_extension(b"d/.hidden"), None);
    }
}
