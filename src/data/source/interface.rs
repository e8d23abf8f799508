//! The interface every kind of source stands behind, and what passes through it: how a sample
//! is stored, what a kind is told (`Columns`) and what it says it is (`SourceKind`). The kinds
//! (folder, labels, pack, shards, parquet) implement `Source`; `Samples` reads through it.
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use super::catalog::Catalog;
use super::files::Files;
use crate::data::pixels::RgbView;

/// An opened source. Entry `entry` is the catalog's entry (and the pack's record, the shards'
/// member, the parquet files' row) of the same index; `name` is its name in the catalog.
pub trait Source: Send + Sync {
    /// The folder sample names are under (a pack's own path, the shards' folder).
    fn root(&self) -> &Path;

    /// What the source is, for the banner and the checks that depend on it.
    fn describe(&self) -> SourceKind;

    /// The entry as stored: a file is read here (errors name it).
    fn read(&self, entry: usize, name: &Path) -> Result<Stored<'_>>;

    /// The entry's size and modification time (ns since the epoch): its fingerprint for
    /// freshness (a pack's as packed, a file's now, a shard member's size and its shard's time).
    fn size_and_mtime(&self, entry: usize, name: &Path) -> Result<(u64, i64)>;

    /// The entry's shard (a tar shard, a parquet row group), for a source read shard by shard.
    fn shard_of(&self, _entry: usize) -> Option<usize> {
        None
    }

    /// The files of a sharded source (tar shards, parquet files).
    fn shard_files(&self) -> Option<&Files> {
        None
    }

    /// The entries the next reads will be, in order: a source of remote files fetches the files
    /// they lie in ahead of the reads.
    fn will_read(&self, _entries: &[usize]) {}

    /// Whether entries are stored decoded (a raw pack): nothing to gain from a RAM cache.
    fn decoded(&self) -> bool {
        false
    }
}

/// What a kind gives when opened: the classes, every entry's name and label, and the reader.
pub struct Opened {
    pub classes: Vec<String>,
    pub catalog: Catalog,
    pub source: Arc<dyn Source>,
}

/// A sample's stored form.
pub enum Stored<'a> {
    /// An image file's bytes (read from disk, or borrowed from an encoded pack).
    Encoded(Cow<'a, [u8]>),
    /// Decoded pixels (a raw pack's).
    Raw(RgbView<'a>),
}

/// What kind of source a data set was read from.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceKind {
    Folder,
    /// A pack of the folder `folder` (absolute, as packed), its images stored decoded (`raw`)
    /// or as their files' bytes, in `data_bytes` bytes.
    Pack { folder: PathBuf, raw: bool, data_bytes: u64 },
    /// A folder with this label file; `images` image files are in the folder, labelled or not.
    Labelled { file: PathBuf, images: usize },
    /// This many tar shards.
    Shards(usize),
    /// This many parquet files, holding this many row groups.
    Parquet { files: usize, row_groups: usize },
}

/// Which columns (of a label file or a parquet table) or members (of a shard's sample) hold the
/// image and the label. `None`: the source's own default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Columns {
    pub image: Option<String>,
    pub label: Option<String>,
}
