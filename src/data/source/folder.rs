//! ImageFolder scanning with torchvision's semantics: classes are the sorted names of the
//! sub-directories of the root, samples are the image files below each, in the order
//! torchvision's `make_dataset` lists them. Class folders are walked in parallel, and an entry
//! costs no `stat` unless it is a symlink (the directory listing says what it is): a training
//! run on a million files reaches its first step in about a second (docs/BENCHMARKS.md).
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use rayon::prelude::*;

use super::catalog::Catalog;
use super::common::{mtime_ns, stat_files, walk_sorted, SourceDir, SourceFile, IMAGE_EXTENSIONS};
use super::loose::LooseFiles;
use super::interface::{Opened, SourceKind};
use crate::bail_user;

#[derive(Debug, Clone)]
pub struct ImageFolder {
    pub root: PathBuf,
    pub classes: Vec<String>,
    /// Each image's path under `root` and its class, ordered by class, then as torchvision lists them.
    pub catalog: Catalog,
    /// Every directory walked, under `root` ("" is the root itself): a file added or removed
    /// changes its directory's modification time (`pack::check_fresh`).
    pub dirs: Vec<PathBuf>,
}

impl ImageFolder {
    /// Scans `root`. `what` names the flag the directory came from, for error messages.
    pub fn scan(root: &Path, what: &str) -> Result<Self> {
        if !root.exists() {
            bail_user!("{what} directory does not exist: {}", root.display());
        }
        if !root.is_dir() {
            bail_user!("{what} is not a directory: {}", root.display());
        }
        let mut classes: Vec<String> = Vec::new();
        let listing = match std::fs::read_dir(root).and_then(|r| r.collect::<std::io::Result<Vec<_>>>()) {
            Ok(l) => l,
            Err(e) => bail_user!("cannot read {what} directory {}: {e}", root.display()),
        };
        for e in listing {
            if std::fs::metadata(e.path()).is_ok_and(|m| m.is_dir()) {
                let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                    bail_user!("class directory name is not UTF-8: {}", e.path().display());
                };
                classes.push(name);
            }
        }
        // torchvision sorts with Python's str ordering = Unicode code points = UTF-8 byte order.
        classes.sort();
        if classes.is_empty() {
            bail_user!(
                "{what} has no class sub-directories (expected <dir>/<class>/<image>): {}",
                root.display()
            );
        }
        let per_class: Vec<Result<(Catalog, Vec<PathBuf>)>> = classes
            .par_iter()
            .enumerate()
            .map(|(idx, class)| {
                let (files, dirs) = walk_sorted(&root.join(class))?;
                if files.is_empty() {
                    bail_user!(
                        "class '{class}' has no images ({}): {}",
                        IMAGE_EXTENSIONS.join(" "),
                        root.join(class).display()
                    );
                }
                let catalog = files.into_iter().map(|f| (Path::new(class).join(f), idx)).collect();
                Ok((catalog, dirs.into_iter().map(|d| Path::new(class).join(d)).collect()))
            })
            .collect();
        let (mut catalog, mut dirs) = (Catalog::default(), vec![PathBuf::new()]);
        for c in per_class {
            let (names, mut walked) = c?;
            catalog.append(&names);
            dirs.append(&mut walked);
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            catalog,
            dirs,
        })
    }

    pub fn len(&self) -> usize {
        self.catalog.len()
    }

    pub fn is_empty(&self) -> bool {
        self.catalog.is_empty()
    }

    /// Image `i`'s path.
    pub fn path(&self, i: usize) -> PathBuf {
        self.root.join(self.catalog.name(i))
    }

    /// As a source: its image files, read where they lie.
    pub fn opened(self) -> Opened {
        let kind = SourceKind::Folder;
        Opened {
            classes: self.classes,
            catalog: self.catalog,
            source: Arc::new(LooseFiles { root: self.root, kind }),
        }
    }

    /// Every image file with its size and modification time, in folder order: what a pack of
    /// the folder records, and what its freshness check compares with.
    pub fn files_now(&self) -> Result<Vec<SourceFile>> {
        stat_files(&self.root, self.len(), |i| self.catalog.name(i))
    }

    /// Every directory walked with its modification time.
    pub fn dirs_now(&self) -> Result<Vec<SourceDir>> {
        self.dirs
            .par_iter()
            .map(|d| {
                let p = self.root.join(d);
                let m = std::fs::metadata(&p).with_context(|| format!("cannot read {}", p.display()))?;
                Ok(SourceDir {
                    name: d.to_string_lossy().into_owned(),
                    mtime_ns: mtime_ns(&m),
                })
            })
            .collect()
    }
}

/// Refuses validation classes (`val`, from `root`) that differ from the training classes: the
/// same classes in the same order, or labels would silently mismatch.
pub fn same_classes(val: &[String], train: &[String], root: &Path) -> Result<()> {
    if val != train {
        let missing: Vec<_> = train.iter().filter(|c| !val.contains(c)).collect();
        let extra: Vec<_> = val.iter().filter(|c| !train.contains(c)).collect();
        bail_user!(
            "validation classes differ from training classes in {} (missing: {:?}, extra: {:?})",
            root.display(),
            missing,
            extra
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"x").unwrap();
    }

    #[test]
    fn classes_sorted_and_extensions_case_insensitive() {
        let d = tempfile::tempdir().unwrap();
        touch(&d.path().join("b/1.PNG"));
        touch(&d.path().join("b/sub/2.jpeg"));
        touch(&d.path().join("a/x.JpG"));
        touch(&d.path().join("a/notes.txt"));
        touch(&d.path().join("C/y.webp"));
        touch(&d.path().join("b/sub b/3.TIFF"));
        touch(&d.path().join("b/sub/x/4.pgm"));
        touch(&d.path().join("b/.ppm"));
        touch(&d.path().join("b/ppm"));
        let f = ImageFolder::scan(d.path(), "--data").unwrap();
        assert_eq!(f.classes, vec!["C", "a", "b"]);
        let rel: Vec<_> = (0..f.len()).map(|i| (f.catalog.name(i).to_owned(), f.catalog.label(i))).collect();
        // torchvision's order: a folder's own files, then its sub-folders by their path as a
        // string ("sub b" before "sub/x", as ' ' < '/').
        let want = [
            ("C/y.webp", 0),
            ("a/x.JpG", 1),
            ("b/.ppm", 2),
            ("b/1.PNG", 2),
            ("b/sub/2.jpeg", 2),
            ("b/sub b/3.TIFF", 2),
            ("b/sub/x/4.pgm", 2),
        ];
        assert_eq!(rel, want.map(|(p, c)| (PathBuf::from(p), c)));
        assert_eq!(f.path(0), d.path().join("C/y.webp"));
    }

    #[test]
    fn errors_name_the_problem_and_path() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("nope");
        let e = ImageFolder::scan(&missing, "--data").unwrap_err();
        assert!(crate::error::is_user_error(&e));
        assert!(e.to_string().contains("does not exist") && e.to_string().contains("nope"));

        let e = ImageFolder::scan(d.path(), "--data").unwrap_err();
        assert!(e.to_string().contains("no class sub-directories"), "{e}");

        std::fs::create_dir(d.path().join("empty")).unwrap();
        touch(&d.path().join("full/a.png"));
        let e = ImageFolder::scan(d.path(), "--data").unwrap_err();
        assert!(e.to_string().contains("class 'empty' has no images"), "{e}");
    }

    #[test]
    fn differing_validation_classes_are_rejected() {
        let t = tempfile::tempdir().unwrap();
        let v = tempfile::tempdir().unwrap();
        touch(&t.path().join("cat/a.png"));
        touch(&t.path().join("dog/a.png"));
        touch(&v.path().join("cat/a.png"));
        touch(&v.path().join("cow/a.png"));
        let tf = ImageFolder::scan(t.path(), "--data").unwrap();
        let vf = ImageFolder::scan(v.path(), "--val").unwrap();
        let e = same_classes(&vf.classes, &tf.classes, &vf.root).unwrap_err().to_string();
        assert!(e.contains("\"dog\"") && e.contains("\"cow\""), "{e}");
    }
}
