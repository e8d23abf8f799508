//! Where a data set's images come from: the files of an ImageFolder or of a folder with a label
//! file (`labels.rs`), the records of a pack (`pack.rs`), the members of tar shards
//! (`shards.rs`), or the rows of parquet files (`parquet.rs`). Either way a sample is a name
//! (its path: for messages and reports), a label, and bytes to decode or pixels ready to use.
//! `--data` and `--val` take any of them.
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

use super::catalog::Catalog;
use super::folder::ImageFolder;
use super::labels::Columns;
use super::pack::{Contents, Pack, Store};
use super::parquet::Parquet;
use super::shards::Shards;
use super::transform::RgbView;

/// A sample's stored form.
pub enum Stored<'a> {
    /// An image file's bytes (read from disk, or borrowed from an encoded pack).
    Encoded(Cow<'a, [u8]>),
    /// Decoded pixels (a raw pack's).
    Raw(RgbView<'a>),
}

/// Samples in a fixed order; cloning shares the list and the pack.
#[derive(Clone)]
pub struct Samples {
    /// Names and labels of every sample of the source.
    catalog: Arc<Catalog>,
    /// Sample i is entry `picks[i]` of the catalog (and record `picks[i]` of a pack).
    picks: Vec<u32>,
    origin: Origin,
}

#[derive(Clone)]
enum Origin {
    /// Image files: the catalog's names are paths under `root`.
    Files { root: PathBuf },
    /// A pack's records: the catalog's names are its files' names in the folder packed.
    Pack(Arc<Pack>),
    /// Tar shards' members: the catalog's names are `SHARD/MEMBER` under the shards' folder.
    Shards(Arc<Shards>),
    /// Parquet files' rows: the catalog's names are `FILE/ROW` under the files' folder.
    Parquet(Arc<Parquet>),
}

/// Loose image files (`predict`'s inputs): (path, label).
impl From<Vec<(PathBuf, usize)>> for Samples {
    fn from(items: Vec<(PathBuf, usize)>) -> Self {
        Samples::of_files(PathBuf::new(), items.into_iter().collect())
    }
}

impl Samples {
    /// Every file of `catalog`, whose names are paths under `root`.
    pub fn of_files(root: PathBuf, catalog: Catalog) -> Self {
        Samples {
            picks: (0..catalog.len() as u32).collect(),
            catalog: Arc::new(catalog),
            origin: Origin::Files { root },
        }
    }

    /// Every record of `pack`, in its (folder) order.
    pub fn of_pack(pack: Arc<Pack>) -> Self {
        let catalog = pack
            .index
            .records
            .iter()
            .map(|r| (&pack.index.files[r.file].name, r.label))
            .collect();
        Samples {
            picks: (0..pack.len() as u32).collect(),
            catalog: Arc::new(catalog),
            origin: Origin::Pack(pack),
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
        let name = self.catalog.name(self.picks[i] as usize);
        match &self.origin {
            Origin::Files { root } => root.join(name),
            Origin::Pack(pack) => pack.path.join(name),
            Origin::Shards(shards) => shards.root.join(name),
            Origin::Parquet(files) => files.root.join(name),
        }
    }

    pub fn label(&self, i: usize) -> usize {
        self.catalog.label(self.picks[i] as usize)
    }

    /// Sample `i`'s name under the set's root (a file's path in its folder), for orderings
    /// that must not depend on where the set lies.
    pub fn name(&self, i: usize) -> &Path {
        self.catalog.name(self.picks[i] as usize)
    }

    /// The pack the samples come from, if any.
    pub fn pack(&self) -> Option<&Pack> {
        match &self.origin {
            Origin::Pack(pack) => Some(pack),
            _ => None,
        }
    }

    /// The files of a sharded source (tar shards, parquet files) and the folder holding them.
    pub fn shard_files(&self) -> Option<(&[PathBuf], &Path)> {
        match &self.origin {
            Origin::Shards(s) => Some((&s.paths, &s.root)),
            Origin::Parquet(p) => Some((&p.paths, &p.root)),
            _ => None,
        }
    }

    /// Sample `i`'s shard (a tar shard, a parquet row group), for a sharded source: read shard
    /// by shard (`shards::stream_order`).
    pub fn shard_of(&self, i: usize) -> Option<usize> {
        let i = self.picks[i] as usize;
        match &self.origin {
            Origin::Shards(s) => Some(s.shard_of(i)),
            Origin::Parquet(p) => Some(p.group_of(i)),
            _ => None,
        }
    }

    /// Whether the samples are stored decoded (a raw pack): nothing to gain from a RAM cache.
    pub fn decoded(&self) -> bool {
        self.pack().is_some_and(|p| p.index.store == Store::Raw)
    }

    /// Sample `i` as stored: a file is read here (errors name it).
    pub fn read(&self, i: usize) -> Result<Stored<'_>> {
        match &self.origin {
            Origin::Files { .. } => {
                let path = self.path(i);
                let bytes = std::fs::read(&path).with_context(|| format!("cannot open image {}", path.display()))?;
                Ok(Stored::Encoded(Cow::Owned(bytes)))
            }
            Origin::Pack(pack) => Ok(match pack.contents(self.picks[i] as usize) {
                Contents::Raw(v) => Stored::Raw(v),
                Contents::Encoded(b) => Stored::Encoded(Cow::Borrowed(b)),
            }),
            Origin::Shards(shards) => Ok(Stored::Encoded(Cow::Owned(shards.read(self.picks[i] as usize)?))),
            Origin::Parquet(files) => Ok(Stored::Encoded(Cow::Owned(files.read(self.picks[i] as usize)?))),
        }
    }

    /// The samples at `picks`, in that order.
    pub fn select(&self, picks: &[usize]) -> Samples {
        Samples {
            catalog: self.catalog.clone(),
            picks: picks.iter().map(|&i| self.picks[i]).collect(),
            origin: self.origin.clone(),
        }
    }

    /// Sample `i`'s size and modification time (ns since the epoch): a pack's as packed, a
    /// file's now, a shard member's size and its shard's time.
    pub fn size_and_mtime(&self, i: usize) -> Result<(u64, i64)> {
        match &self.origin {
            Origin::Files { .. } => {
                let m = std::fs::metadata(self.path(i))?;
                Ok((m.len(), super::pack::mtime_ns(&m)))
            }
            Origin::Pack(pack) => {
                let f = &pack.index.files[pack.index.records[self.picks[i] as usize].file];
                Ok((f.size, f.mtime_ns))
            }
            Origin::Shards(shards) => Ok(shards.size_and_mtime(self.picks[i] as usize)),
            Origin::Parquet(files) => Ok(files.size_and_mtime(self.picks[i] as usize)),
        }
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

/// What kind of source a data set was read from.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceKind {
    Folder,
    Pack,
    /// A folder with this label file; `images` image files are in the folder, labelled or not.
    Labelled { file: PathBuf, images: usize },
    /// This many tar shards.
    Shards(usize),
    /// This many parquet files, holding this many row groups.
    Parquet { files: usize, row_groups: usize },
}

/// Whether `path` names a sharded source: parquet files or tar shards.
pub fn is_sharded(path: &Path) -> bool {
    super::parquet::is_parquet(path) || super::shards::is_shards(path)
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

impl Dataset {
    /// Opens what `spec` names: with a label file, the folder's images it labels; tar shards
    /// (`shards::is_shards`); a pack file (validated, and refused when older than its folder);
    /// else a directory scanned as an ImageFolder. `what` names the flag, for error messages.
    pub fn open(spec: impl Into<DataSpec>, what: &str) -> Result<Dataset> {
        let spec = spec.into();
        let path = &spec.path;
        if let Some(csv) = &spec.labels {
            if is_sharded(path) {
                crate::bail_user!(
                    "{what} {} is tar shards or parquet files, which carry their own labels; a label file labels a folder's images",
                    path.display()
                );
            }
            let flag = if what == "--val" { "--val-labels" } else { "--labels" };
            let set = super::labels::open(path, csv, &spec.columns, spec.strict, flag)?;
            return Ok(Dataset {
                root: path.clone(),
                classes: set.classes,
                samples: Samples::of_files(path.clone(), set.catalog),
                kind: SourceKind::Labelled {
                    file: csv.clone(),
                    images: set.images,
                },
            });
        }
        // Parquet before shards: a brace pattern of parquet files is not tar shards.
        let (classes, catalog, kind, origin) = if super::parquet::is_parquet(path) {
            let (classes, catalog, files) = Parquet::open(path, &spec.columns, spec.strict, what)?;
            let kind = SourceKind::Parquet {
                files: files.paths.len(),
                row_groups: files.row_groups(),
            };
            (classes, catalog, kind, Origin::Parquet(Arc::new(files)))
        } else if super::shards::is_shards(path) {
            let (classes, catalog, shards) = Shards::open(path, &spec.columns, spec.strict, what)?;
            (classes, catalog, SourceKind::Shards(shards.paths.len()), Origin::Shards(Arc::new(shards)))
        } else if path.is_file() {
            let pack = Pack::open(path, what)?;
            pack.check_fresh(what)?;
            return Ok(Dataset {
                root: path.to_path_buf(),
                classes: pack.index.classes.clone(),
                samples: Samples::of_pack(Arc::new(pack)),
                kind: SourceKind::Pack,
            });
        } else {
            return Ok(Dataset::of_folder(ImageFolder::scan(path, what)?));
        };
        Ok(Dataset {
            root: path.clone(),
            classes,
            kind,
            samples: Samples {
                picks: (0..catalog.len() as u32).collect(),
                catalog: Arc::new(catalog),
                origin,
            },
        })
    }

    /// The images of a scanned folder.
    pub fn of_folder(folder: ImageFolder) -> Dataset {
        Dataset {
            samples: Samples::of_files(folder.root.clone(), folder.catalog),
            root: folder.root,
            classes: folder.classes,
            kind: SourceKind::Folder,
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
        if matches!(self.kind, SourceKind::Folder | SourceKind::Pack) {
            super::folder::same_classes(&self.classes, classes, &self.root)?;
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
