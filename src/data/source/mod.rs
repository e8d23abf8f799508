//! Where a data set's images come from. Each kind of source has its file, behind one interface
//! (`interface.rs`): an ImageFolder (`folder.rs`), a folder with a label file (`labels.rs`), a
//! pack (`pack.rs`), tar shards (`shards.rs`) and parquet files (`parquet.rs`); what several
//! kinds use lies beneath them (`common.rs`, `catalog.rs`, `loose.rs`, the reader of loose image
//! files, and `files.rs`, the local or remote files of shards, parquet files and packs), and no
//! kind uses another. This file
//! alone decides which kind `--data` names, and gives the rest of ringtrain `Dataset` and
//! `Samples`: a sample is a name (its path, for messages and reports), a label, and bytes to
//! decode or pixels ready to use.
pub mod catalog;
pub mod common;
pub mod files;
pub mod folder;
pub mod interface;
pub mod labels;
pub mod loose;
pub mod pack;
pub mod parquet;
pub mod shards;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use catalog::Catalog;
use common::files_in_flat_dir;
use files::Files;
use folder::ImageFolder;
pub use interface::{Columns, SourceKind, Stored};
use interface::{Opened, Source};
use pack::Pack;
use parquet::Parquet;
use shards::Shards;

/// Samples in a fixed order; cloning shares the list and the source.
#[derive(Clone)]
pub struct Samples {
    /// Names and labels of every sample of the source.
    catalog: Arc<Catalog>,
    /// Sample i is entry `picks[i]` of the catalog (and of the source).
    picks: Vec<u32>,
    source: Arc<dyn Source>,
}

/// Loose image files (`predict`'s inputs): (path, label).
impl From<Vec<(PathBuf, usize)>> for Samples {
    fn from(items: Vec<(PathBuf, usize)>) -> Self {
        let files = loose::LooseFiles {
            root: PathBuf::new(),
            kind: SourceKind::Folder,
        };
        Samples::new(items.into_iter().collect(), Arc::new(files))
    }
}

impl Samples {
    /// Every entry of `catalog`, read from `source`.
    fn new(catalog: Catalog, source: Arc<dyn Source>) -> Self {
        Samples {
            picks: (0..catalog.len() as u32).collect(),
            catalog: Arc::new(catalog),
            source,
        }
    }

    pub fn len(&self) -> usize {
        self.picks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.picks.is_empty()
    }

    /// Sample `i`'s name: its file, or `<pack>/<its file's name in the folder>`.
    pub fn path(&self, i: usize) -> PathBuf {
        self.source.root().join(self.name(i))
    }

    pub fn label(&self, i: usize) -> usize {
        self.catalog.label(self.picks[i] as usize)
    }

    /// Sample `i`'s name under the set's root (a file's path in its folder), for orderings
    /// that must not depend on where the set lies.
    pub fn name(&self, i: usize) -> &Path {
        self.catalog.name(self.picks[i] as usize)
    }

    /// The files of a sharded source (tar shards, parquet files).
    pub fn shard_files(&self) -> Option<&files::Files> {
        self.source.shard_files()
    }

    /// The samples the next reads will be (`order`: indices of these samples, or draw keys,
    /// index + n·copy): a source of remote files fetches the files they lie in ahead of them.
    pub fn will_read(&self, order: &[usize]) {
        if self.shard_files().is_some_and(|f| f.is_remote()) {
            let entries: Vec<usize> = order.iter().map(|&key| self.picks[key % self.len()] as usize).collect();
            self.source.will_read(&entries);
        }
    }

    /// Sample `i`'s shard (a tar shard, a parquet row group), for a sharded source: read shard
    /// by shard (`load::order::stream_order`).
    pub fn shard_of(&self, i: usize) -> Option<usize> {
        self.source.shard_of(self.picks[i] as usize)
    }

    /// Whether the samples are stored decoded (a raw pack): nothing to gain from a RAM cache.
    pub fn decoded(&self) -> bool {
        self.source.decoded()
    }

    /// Sample `i` as stored: a file is read here (errors name it).
    pub fn read(&self, i: usize) -> Result<Stored<'_>> {
        self.source.read(self.picks[i] as usize, self.name(i))
    }

    /// The samples at `picks`, in that order.
    pub fn select(&self, picks: &[usize]) -> Samples {
        Samples {
            catalog: self.catalog.clone(),
            picks: picks.iter().map(|&i| self.picks[i]).collect(),
            source: self.source.clone(),
        }
    }

    /// Sample `i`'s size and modification time (ns since the epoch): a pack's as packed, a
    /// file's now, a shard member's size and its shard's time.
    pub fn size_and_mtime(&self, i: usize) -> Result<(u64, i64)> {
        self.source.size_and_mtime(self.picks[i] as usize, self.name(i))
    }

    /// The sample indices of each class, in order.
    pub fn by_label(&self, classes: usize) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); classes];
        for i in 0..self.len() {
            out[self.label(i)].push(i);
        }
        out
    }
}

/// What `--data` or `--val` (or a command's input) names, with the flags that say how to read
/// it.
#[derive(Debug, Clone, Default)]
pub struct DataSpec {
    /// A folder, a pack, tar shards or parquet files (a pattern, a file or a folder of them).
    pub path: PathBuf,
    /// A label file for the folder's images (`--labels`, `--val-labels`).
    pub labels: Option<PathBuf>,
    pub columns: Columns,
    /// Missing images and shards cut short are errors, not warnings.
    pub strict: bool,
}

/// A folder, a pack, tar shards or parquet files, read with the defaults.
impl<P: AsRef<Path>> From<P> for DataSpec {
    fn from(path: P) -> DataSpec {
        DataSpec {
            path: path.as_ref().to_path_buf(),
            ..Default::default()
        }
    }
}

/// Refuses, in one line saying what ringtrain reads instead, what names neither a local path
/// nor a location ringtrain reads (`data::remote`): WebDataset's `pipe:` URLs (a shell command
/// whose output is a shard) and other schemes.
pub fn refuse_remote(path: &Path, what: &str) -> Result<()> {
    let s = path.to_string_lossy();
    if s.starts_with("pipe:") {
        crate::bail_user!(
            "{what} '{s}': ringtrain runs no command to read data (WebDataset's pipe: URLs); give the shards' s3://, gs://, az:// or http(s):// location, or their local path, with a brace pattern such as 'train-{{000000..000099}}.tar'"
        );
    }
    if let Some((scheme, _)) = s.split_once("://") {
        let url_like = !scheme.is_empty() && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+');
        if url_like && !is_remote(path) {
            crate::bail_user!(
                "{what} '{s}': ringtrain reads local paths and s3://, gs://, az:// and http(s):// locations, not {scheme}://"
            );
        }
    }
    Ok(())
}

/// Whether `path` names an object store's or a web server's location (`s3://`, `gs://`,
/// `az://`, `http(s)://`).
pub fn is_remote(path: &Path) -> bool {
    crate::data::remote::is_remote(&path.to_string_lossy())
}

/// Whether `path` names a sharded source: parquet files or tar shards.
pub fn is_sharded(path: &Path) -> bool {
    is_parquet(path) || is_shards(path)
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

/// Whether `--data` names parquet files: a `.parquet` file or pattern (`*` and braces), or a
/// directory holding `.parquet` files and no sub-folders.
pub fn is_parquet(path: &Path) -> bool {
    let s = path.to_string_lossy();
    if s.ends_with(".parquet") {
        return true;
    }
    path.is_dir() && files_in_flat_dir(path, ".parquet").is_ok_and(|v| !v.is_empty())
}

/// A labelled data set: an ImageFolder directory, a pack, a folder with a label file, or tar
/// shards.
pub struct Dataset {
    /// What the user named (`--data`, `--val`).
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub samples: Samples,
    pub kind: SourceKind,
}

/// Opens the remote location `path` names: tar shards, parquet files, or a pack.
fn open_remote(path: &Path, spec: &DataSpec, what: &str) -> Result<Opened> {
    Ok(match files::open_location(&path.to_string_lossy(), what)? {
        files::RemoteKind::Shards(objects) => Shards::open_files(path, Files::remote(objects)?, &spec.columns, spec.strict, what)?,
        files::RemoteKind::Parquet(objects) => {
            let files = Files::remote(objects)?;
            if path.to_string_lossy().ends_with('/') {
                parquet::one_split(&files.names, path, what)?;
            }
            Parquet::open_files(files, &spec.columns, spec.strict, what)?
        }
        files::RemoteKind::Single(object) => {
            let files = Files::remote(vec![object])?;
            Pack::open_file(files.open(0, "pack")?, &files.names[0], what)?.opened()
        }
    })
}

impl Dataset {
    /// Opens what `spec` names: with a label file, the folder's images it labels; parquet files
    /// (`is_parquet`); tar shards (`is_shards`); a pack file (validated, and refused when older
    /// than its folder); else a directory scanned as an ImageFolder. `what` names the flag, for
    /// error messages.
    pub fn open(spec: impl Into<DataSpec>, what: &str) -> Result<Dataset> {
        let spec = spec.into();
        let path = &spec.path;
        refuse_remote(path, what)?;
        let opened = if is_remote(path) {
            if spec.labels.is_some() {
                crate::bail_user!(
                    "{what} {}: a label file labels the images of a local folder; remote data must be tar shards, parquet files or a pack",
                    path.display()
                );
            }
            open_remote(path, &spec, what)?
        } else if let Some(csv) = &spec.labels {
            if is_sharded(path) {
                crate::bail_user!(
                    "{what} {} is tar shards or parquet files, which carry their own labels; a label file labels a folder's images",
                    path.display()
                );
            }
            let flag = if what == "--val" { "--val-labels" } else { "--labels" };
            labels::open(path, csv, &spec.columns, spec.strict, flag)?
        // Parquet before shards: a brace pattern of parquet files is not tar shards.
        } else if is_parquet(path) {
            Parquet::open(path, &spec.columns, spec.strict, what)?
        } else if is_shards(path) {
            Shards::open(path, &spec.columns, spec.strict, what)?
        } else if path.is_file() {
            let pack = Pack::open(path, what)?;
            // A pack of a folder is fresh while the folder, scanned now, has the files it packed.
            pack.check_fresh(what, |folder| ImageFolder::scan(folder, what)?.files_now())?;
            pack.opened()
        } else {
            ImageFolder::scan(path, what)?.opened()
        };
        Ok(Dataset::of(path.clone(), opened))
    }

    /// The set an opened source holds; `root` is what the user named.
    pub fn of(root: PathBuf, opened: Opened) -> Dataset {
        Dataset {
            root,
            classes: opened.classes,
            kind: opened.source.describe(),
            samples: Samples::new(opened.catalog, opened.source),
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// This set's samples labelled with `classes` (a model's, or the training set's). A folder
    /// or a pack must have exactly those classes (`folder::same_classes`); a label file or shards
    /// name theirs by the labels present, so any of `classes` may be absent from them, but none
    /// may be new.
    pub fn onto_classes(mut self, classes: &[String]) -> Result<Dataset> {
        if self.classes == classes {
            return Ok(self);
        }
        if matches!(self.kind, SourceKind::Folder | SourceKind::Pack { .. }) {
            folder::same_classes(&self.classes, classes, &self.root)?;
        }
        let map: Vec<Option<usize>> = self.classes.iter().map(|c| classes.iter().position(|k| k == c)).collect();
        let extra: Vec<&String> = self.classes.iter().zip(&map).filter(|(_, m)| m.is_none()).map(|(c, _)| c).collect();
        if !extra.is_empty() {
            crate::bail_user!(
                "{} has classes the model does not know: {:?} (its classes: {} in all)",
                self.root.display(),
                extra,
                classes.len()
            );
        }
        let catalog = Arc::make_mut(&mut self.samples.catalog);
        catalog.relabel(|l| map[l].expect("checked above"));
        self.classes = classes.to_vec();
        Ok(self)
    }
}
