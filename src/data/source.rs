//! Where a data set's images come from: the files of an ImageFolder, or the records of a pack
//! (`pack.rs`). Either way a sample is a name (its path: for messages and reports), a label,
//! and bytes to decode or pixels ready to use. `--data` and `--val` take either.
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

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

/// Samples in a fixed order; cloning shares the pack.
#[derive(Clone)]
pub struct Samples {
    /// (name, label) of each sample: its file, or `<pack>/<its file's name in the folder>`.
    pub items: Vec<(PathBuf, usize)>,
    origin: Origin,
}

#[derive(Clone)]
enum Origin {
    Files,
    /// Sample i is record `records[i]` of the pack.
    Pack {
        pack: Arc<Pack>,
        records: Vec<usize>,
    },
}

impl From<Vec<(PathBuf, usize)>> for Samples {
    fn from(items: Vec<(PathBuf, usize)>) -> Self {
        Samples {
            items,
            origin: Origin::Files,
        }
    }
}

impl Samples {
    /// Every record of `pack`, in its (folder) order.
    pub fn of_pack(pack: Arc<Pack>) -> Self {
        let items = (0..pack.len())
            .map(|i| (pack.name(i), pack.index.records[i].label))
            .collect();
        Samples {
            items,
            origin: Origin::Pack {
                records: (0..pack.len()).collect(),
                pack,
            },
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn path(&self, i: usize) -> &Path {
        &self.items[i].0
    }

    pub fn label(&self, i: usize) -> usize {
        self.items[i].1
    }

    /// The pack the samples come from, if any.
    pub fn pack(&self) -> Option<&Pack> {
        match &self.origin {
            Origin::Pack { pack, .. } => Some(pack),
            Origin::Files => None,
        }
    }

    /// Whether the samples are stored decoded (a raw pack): nothing to gain from a RAM cache.
    pub fn decoded(&self) -> bool {
        self.pack().is_some_and(|p| p.index.store == Store::Raw)
    }

    /// Sample `i` as stored: a file is read here (errors name it).
    pub fn read(&self, i: usize) -> Result<Stored<'_>> {
        match &self.origin {
            Origin::Files => {
                let path = &self.items[i].0;
                let bytes = std::fs::read(path).with_context(|| format!("cannot open image {}", path.display()))?;
                Ok(Stored::Encoded(Cow::Owned(bytes)))
            }
            Origin::Pack { pack, records } => Ok(match pack.contents(records[i]) {
                Contents::Raw(v) => Stored::Raw(v),
                Contents::Encoded(b) => Stored::Encoded(Cow::Borrowed(b)),
            }),
        }
    }

    /// The samples at `picks`, in that order.
    pub fn select(&self, picks: &[usize]) -> Samples {
        let items = picks.iter().map(|&i| self.items[i].clone()).collect();
        let origin = match &self.origin {
            Origin::Files => Origin::Files,
            Origin::Pack { pack, records } => Origin::Pack {
                pack: pack.clone(),
                records: picks.iter().map(|&i| records[i]).collect(),
            },
        };
        Samples { items, origin }
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
        let folder = ImageFolder::scan(path, what)?;
        Ok(Dataset {
            root: folder.root,
            classes: folder.classes,
            samples: folder.samples.into(),
        })
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
