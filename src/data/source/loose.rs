//! The reader of loose image files: an ImageFolder's, a label file's, `predict`'s inputs.
use std::borrow::Cow;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::common::mtime_ns;
use super::interface::{Source, SourceKind, Stored};

/// Loose image files under `root`: a catalog's names are their paths under it.
pub struct LooseFiles {
    pub root: PathBuf,
    pub kind: SourceKind,
}

impl Source for LooseFiles {
    fn root(&self) -> &Path {
        &self.root
    }

    fn describe(&self) -> SourceKind {
        self.kind.clone()
    }

    fn read(&self, _entry: usize, name: &Path) -> Result<Stored<'_>> {
        let path = self.root.join(name);
        let bytes = std::fs::read(&path).with_context(|| format!("cannot open image {}", path.display()))?;
        Ok(Stored::Encoded(Cow::Owned(bytes)))
    }

    /// A file's size and time now.
    fn size_and_mtime(&self, _entry: usize, name: &Path) -> Result<(u64, i64)> {
        let m = std::fs::metadata(self.root.join(name))?;
        Ok((m.len(), mtime_ns(&m)))
    }
}
