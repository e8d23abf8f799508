//! A pack: a whole ImageFolder in one file, read through a memory map (ranks on one node share
//! the page cache), its images either decoded once (`raw`: RGB8 pixels, the shorter side resized
//! to at most `--max-side`) or kept as their files' bytes (`encoded`: no quality lost, no
//! per-file cost).
//!
//! Layout (integers little-endian):
//! ```text
//! 0    b"RINGPACK", format version u32, 0u32
//! 16   the images' bytes, one record after another
//! I    the index: JSON (`Index`: store, classes, the source folder's files, the records)
//! end  I u64, index length u64, b"PACK-END"
//! ```
//! The index comes last so that packing streams; a file cut short loses its end marker.
//! The source folder's files (name, size, modification time) and directories (name, modification
//! time) are recorded, so a pack older than its folder is refused while the folder is there to
//! compare with. A pack of a folder with a label file records the label file too; a pack of tar
//! shards or parquet files records them (its files are then their samples, each with its
//! shard's or file's time). `ringtrain pack` writes packs (`data/tools/pack.rs`).
use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::common::{mtime_ns, stat_files, SourceDir, SourceFile};
use super::interface::{Opened, Source, SourceKind, Stored};
use crate::bail_user;
use crate::data::decode::MAX_IMAGE_PIXELS;
use crate::data::pixels::RgbView;

pub const MAGIC: &[u8; 8] = b"RINGPACK";
pub const END: &[u8; 8] = b"PACK-END";
pub const VERSION: u32 = 1;
pub const HEAD: u64 = 16;
pub const FOOT: u64 = 24;
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Store {
    /// Decoded RGB8 pixels: no decoding while training.
    Raw,
    /// The files' own bytes: lossless and compact; decoded while training, as from a folder.
    Encoded,
}

/// One image in the pack.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Its file in `Index::files`.
    pub file: usize,
    pub label: usize,
    pub offset: u64,
    pub len: u64,
    /// Raw records: the pixels' size (`len` = width × height × 3). Encoded: 0.
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    pub store: Store,
    pub max_side: Option<u32>,
    pub classes: Vec<String>,
    /// The folder packed (absolute) and every image file in it, in folder order.
    pub root: PathBuf,
    pub files: Vec<SourceFile>,
    /// Every directory of the folder ("" the folder itself) and its modification time. Packs
    /// written before this was recorded have none.
    #[serde(default)]
    pub dirs: Vec<SourceDir>,
    /// The images, in folder order; files that could not be read have none.
    pub records: Vec<Record>,
    /// What was packed when it was not an ImageFolder (packs of folders have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PackedFrom>,
}

/// A pack's source other than an ImageFolder, as it was when packed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PackedFrom {
    /// The folder (`Index::root`) with this label file (absolute).
    LabelFile(SourceFile),
    /// These tar shards or parquet files (absolute paths); `Index::files` are their samples.
    Shards(Vec<SourceFile>),
}

pub struct Pack {
    pub path: PathBuf,
    pub index: Index,
    map: memmap2::Mmap,
}

/// A record's contents.
pub enum Contents<'a> {
    Raw(RgbView<'a>),
    Encoded(&'a [u8]),
}

impl Pack {
    /// Opens and validates `path`; `what` names the flag it came from. Every record is checked
    /// to lie inside the file, so reading one later cannot fail.
    pub fn open(path: &Path, what: &str) -> Result<Pack> {
        Pack::map(path, what, true)
    }

    /// The folder `path` was packed from (its index alone: nothing read in ahead).
    pub fn folder_of(path: &Path, what: &str) -> Result<PathBuf> {
        Ok(Pack::map(path, what, false)?.index.root)
    }

    fn map(path: &Path, what: &str, read_ahead: bool) -> Result<Pack> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => bail_user!("cannot open {what} pack {}: {e}", path.display()),
        };
        Pack::map_file(file, path, what, read_ahead)
    }

    /// Opens and validates the pack `file`, named `path` (a remote pack's URL, its bytes
    /// fetched into the cache).
    pub fn open_file(file: File, path: &Path, what: &str) -> Result<Pack> {
        Pack::map_file(file, path, what, true)
    }

    fn map_file(file: File, path: &Path, what: &str, read_ahead: bool) -> Result<Pack> {
        // A pack that fits in half the available memory is read in at once (MAP_POPULATE): no
        // page fault per 4 KB later, 15.5k → 19.1k img/s on plant seedlings; a larger one pages
        // in as it is read.
        let len = file.metadata().map_or(0, |m| m.len());
        let mut options = memmap2::MmapOptions::new();
        if read_ahead && len < crate::doctor::system::memory().map_or(0, |m| m.1) / 2 {
            options.populate();
        }
        // SAFETY: the map is read-only; a pack is written under a temporary name and renamed
        // into place, so the file behind it is not modified while mapped (by ringtrain).
        let map = match unsafe { options.map(&file) } {
            Ok(m) => m,
            Err(e) => bail_user!("cannot read {what} pack {}: {e}", path.display()),
        };
        let index = parse(&map).map_err(|e| crate::error::user_error(format!("{what} {} {e}", path.display())))?;
        Ok(Pack {
            path: path.to_path_buf(),
            index,
            map,
        })
    }

    pub fn len(&self) -> usize {
        self.index.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.records.is_empty()
    }

    pub fn contents(&self, i: usize) -> Contents<'_> {
        let r = &self.index.records[i];
        let bytes = &self.map[r.offset as usize..(r.offset + r.len) as usize];
        match self.index.store {
            Store::Raw => Contents::Raw(RgbView {
                width: r.width,
                height: r.height,
                px: bytes,
            }),
            Store::Encoded => Contents::Encoded(bytes),
        }
    }

    /// Refuses a pack whose source folder has changed since packing (files added, removed, or
    /// of another size or modification time). A folder that is not there (the pack was copied
    /// to another machine) is nothing to compare with: the pack stands alone.
    /// `list_folder` lists the folder's files now (the folder kind's own scan).
    pub fn check_fresh(&self, what: &str, list_folder: impl FnOnce(&Path) -> Result<Vec<SourceFile>>) -> Result<()> {
        let root = &self.index.root;
        match &self.index.source {
            Some(PackedFrom::Shards(files)) => {
                let which = match files.iter().any(|f| f.name.ends_with(".parquet")) {
                    true => "its parquet files",
                    false => "its shards",
                };
                return self.check_fresh_files(files, which, what);
            }
            Some(PackedFrom::LabelFile(csv)) if root.is_dir() => {
                self.check_fresh_files(std::slice::from_ref(csv), "its label file", what)?;
                if stat_files(root, self.index.files.len(), |i| Path::new(&self.index.files[i].name)).is_ok_and(|now| now == self.index.files) {
                    return Ok(());
                }
                bail_user!(
                    "{what} pack {} is older than its images in {} (one was changed or removed since it was packed); pack it again (ringtrain pack)",
                    self.path.display(),
                    root.display()
                );
            }
            Some(PackedFrom::LabelFile(_)) => return Ok(()),
            None => {}
        }
        if !root.is_dir() {
            return Ok(());
        }
        if self.unchanged(root) {
            return Ok(());
        }
        let now = list_folder(root)?;
        if now == self.index.files {
            return Ok(());
        }
        let before: std::collections::HashMap<&str, &SourceFile> =
            self.index.files.iter().map(|f| (f.name.as_str(), f)).collect();
        let (mut added, mut changed) = (0, 0);
        for f in &now {
            match before.get(f.name.as_str()) {
                None => added += 1,
                Some(b) if *b != f => changed += 1,
                Some(_) => {}
            }
        }
        let removed = self.index.files.len() + added - now.len();
        if added + changed + removed > 0 {
            bail_user!(
                "{what} pack {} is older than its folder {} (images since it was packed: {added} added, {removed} removed, {changed} changed); pack it again (ringtrain pack)",
                self.path.display(),
                root.display()
            );
        }
        Ok(())
    }

    /// Refuses the pack when one of `files` (absolute; `what` names them) that is still there has
    /// another size or time than when packed.
    fn check_fresh_files(&self, files: &[SourceFile], which: &str, what: &str) -> Result<()> {
        for f in files {
            let Ok(m) = std::fs::metadata(&f.name) else { continue };
            if m.len() != f.size || mtime_ns(&m) != f.mtime_ns {
                bail_user!(
                    "{what} pack {} is older than {which}: {} changed since it was packed; pack it again (ringtrain pack)",
                    self.path.display(),
                    f.name
                );
            }
        }
        Ok(())
    }

    /// The usual case, proved without listing the folder: every directory has its modification
    /// time (nothing added, removed or renamed in it) and every file its size and time. Any
    /// difference (or a pack without directory times) is left to the full comparison.
    fn unchanged(&self, root: &Path) -> bool {
        let dirs = &self.index.dirs;
        let dirs_same = !dirs.is_empty()
            && dirs
                .par_iter()
                .all(|d| std::fs::metadata(root.join(&d.name)).is_ok_and(|m| mtime_ns(&m) == d.mtime_ns));
        let files = &self.index.files;
        dirs_same && stat_files(root, files.len(), |i| Path::new(&files[i].name)).is_ok_and(|now| now == *files)
    }

    /// Bytes of its images' data.
    pub fn data_bytes(&self) -> u64 {
        self.index.records.iter().map(|r| r.len).sum()
    }

    /// As a source: every record, in its (folder) order, named by its file in the folder.
    pub fn opened(self) -> Opened {
        let catalog = self.index.records.iter().map(|r| (&self.index.files[r.file].name, r.label)).collect();
        Opened {
            classes: self.index.classes.clone(),
            catalog,
            source: Arc::new(self),
        }
    }
}

impl Source for Pack {
    fn root(&self) -> &Path {
        &self.path
    }

    fn describe(&self) -> SourceKind {
        SourceKind::Pack {
            folder: self.index.root.clone(),
            raw: self.index.store == Store::Raw,
            data_bytes: self.data_bytes(),
        }
    }

    fn read(&self, entry: usize, _name: &Path) -> Result<Stored<'_>> {
        Ok(match self.contents(entry) {
            Contents::Raw(v) => Stored::Raw(v),
            Contents::Encoded(b) => Stored::Encoded(Cow::Borrowed(b)),
        })
    }

    /// As packed.
    fn size_and_mtime(&self, entry: usize, _name: &Path) -> Result<(u64, i64)> {
        let f = &self.index.files[self.index.records[entry].file];
        Ok((f.size, f.mtime_ns))
    }

    fn decoded(&self) -> bool {
        self.index.store == Store::Raw
    }
}

fn parse(map: &[u8]) -> Result<Index> {
    let n = map.len() as u64;
    if n < 8 || &map[..8] != MAGIC {
        anyhow::bail!(
            "is a file but not a ringtrain pack (no RINGPACK header): give a folder of <class>/<image> files or a pack"
        );
    }
    if n < HEAD + FOOT {
        anyhow::bail!("is truncated ({n} bytes)");
    }
    let version = u32::from_le_bytes(map[8..12].try_into().unwrap());
    if version != VERSION {
        anyhow::bail!(
            "is a pack of format version {version}; this ringtrain reads version {VERSION}: pack the folder again"
        );
    }
    let foot = &map[(n - FOOT) as usize..];
    if &foot[16..] != END {
        anyhow::bail!("is truncated or was not finished (no end marker): pack the folder again");
    }
    let at = u64::from_le_bytes(foot[..8].try_into().unwrap());
    let len = u64::from_le_bytes(foot[8..16].try_into().unwrap());
    if at < HEAD || at.checked_add(len) != Some(n - FOOT) {
        anyhow::bail!("is corrupt: its index lies outside the file");
    }
    let index: Index = serde_json::from_slice(&map[at as usize..(at + len) as usize])
        .map_err(|e| anyhow::anyhow!("is corrupt: its index does not parse ({e})"))?;
    index.validate(at)?;
    Ok(index)
}

impl Index {
    /// Everything a reader relies on: records inside the data area, labels and files that
    /// exist, raw sizes that add up, every class with an image.
    pub fn validate(&self, data_end: u64) -> Result<()> {
        if self.classes.is_empty() {
            anyhow::bail!("is corrupt: no classes");
        }
        let mut per_class = vec![0usize; self.classes.len()];
        for (i, r) in self.records.iter().enumerate() {
            let end = r.offset.checked_add(r.len);
            if r.offset < HEAD || end.is_none_or(|e| e > data_end) {
                anyhow::bail!("is corrupt: image {i} lies outside the data");
            }
            if r.file >= self.files.len() || r.label >= self.classes.len() {
                anyhow::bail!("is corrupt: image {i} names a file or class that does not exist");
            }
            if self.store == Store::Raw {
                let px = r.width as u64 * r.height as u64;
                if px == 0 || px > MAX_IMAGE_PIXELS || r.len != px * 3 {
                    anyhow::bail!("is corrupt: image {i} is {}×{} in {} bytes", r.width, r.height, r.len);
                }
            }
            per_class[r.label] += 1;
        }
        // A label file or shards may lack a class number; a folder has a folder per class.
        if let Some(c) = per_class.iter().position(|&n| n == 0).filter(|_| self.source.is_none()) {
            anyhow::bail!("has no images of class '{}'", self.classes[c]);
        }
        Ok(())
    }
}

/// Whether `path` starts as a pack does.
pub fn is_pack(path: &Path) -> bool {
    let mut head = [0u8; 8];
    File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|_| &head == MAGIC)
}

/// The fuzzing entry point: any bytes as a pack file's contents. Errors, never panics.
pub fn parse_bytes(bytes: &[u8]) -> Result<Index> {
    parse(bytes)
}
