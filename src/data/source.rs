//! Where a data set's images come from: the files of an ImageFolder, or the records of a pack
//! (`pack.rs`). Either way a sample is a name (its path: for messages and reports), a label,
//! and bytes to decode or pixels ready to use. `--data` and `--val` take either.
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

use super::catalog::Catalog;
use super::folder::ImageFolder;
use super::pack::{Contents, Pack, Store};
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
            Origin::Files { .. } => None,
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
    /// file's now.
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

/// A labelled data set: an ImageFolder directory or a pack of one.
pub struct Dataset {
    /// What the user named (`--data`, `--val`).
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub samples: Samples,
}

impl Dataset {
    /// Opens `path`, a directory (scanned as an ImageFolder) or a pack file (validated, and
    /// refused when older than its folder). `what` names the flag, for error messages.
    pub fn open(path: &Path, what: &str) -> Result<Dataset> {
        if path.is_file() {
            let pack = Pack::open(path, what)?;
            pack.check_fresh(what)?;
            return Ok(Dataset {
                root: path.to_path_buf(),
                classes: pack.index.classes.clone(),
                samples: Samples::of_pack(Arc::new(pack)),
            });
        }
        Ok(Dataset::of_folder(ImageFolder::scan(path, what)?))
    }

    /// The images of a scanned folder.
    pub fn of_folder(folder: ImageFolder) -> Dataset {
        Dataset {
            samples: Samples::of_files(folder.root.clone(), folder.catalog),
            root: folder.root,
            classes: folder.classes,
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Validation must use the training classes (`folder::same_classes`).
    pub fn check_same_classes(&self, train: &Dataset) -> Result<()> {
        super::folder::same_classes(&self.classes, &train.classes, &self.root)
    }
}
