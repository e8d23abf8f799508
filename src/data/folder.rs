//! ImageFolder scanning with torchvision's semantics: classes are the sorted names of the
//! sub-directories of the root, samples are the image files below each, in the order
//! torchvision's `make_dataset` lists them. Class folders are walked in parallel, and an entry
//! costs no `stat` unless it is a symlink (the directory listing says what it is): a training
//! run on a million files reaches its first step in about a second (docs/BENCHMARKS.md).
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use rayon::prelude::*;

use super::catalog::Catalog;
use crate::bail_user;

/// Extensions accepted, compared case-insensitively: torchvision's `IMG_EXTENSIONS`.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"];

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

/// Whether a file name ends in one of the extensions, in any letter case, as torchvision's
/// `has_file_allowed_extension` tests it (`name.lower().endswith(".jpg")`, so `.JPG` too).
pub fn is_image_file(path: &Path) -> bool {
    let name = path.file_name().map_or(&[][..], |n| n.as_bytes());
    IMAGE_EXTENSIONS.iter().any(|x| {
        name.len() > x.len() && name[name.len() - x.len() - 1] == b'.' && name[name.len() - x.len()..].eq_ignore_ascii_case(x.as_bytes())
    })
}

/// Image files under `dir`, recursively, in torchvision's order (`walk_sorted`).
pub fn walk_images(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for rel in walk_sorted(dir)?.0 {
        out.push(dir.join(rel));
    }
    Ok(())
}

/// The image files under `dir` (paths relative to it) as `make_dataset` lists them:
/// `for root, _, files in sorted(os.walk(dir, followlinks=True)): for f in sorted(files)`. That
/// is every directory in the order of its path as a string (so `a b/` comes before `a/x/`), and
/// in each its files by name. Symlinks are followed, but a link back to a directory being walked
/// is refused (it would recurse forever). Errors name the path. Returns the files and the
/// directories walked.
pub fn walk_sorted(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut dirs = Vec::new();
    walk(dir, PathBuf::new(), &mut dirs, &mut Vec::new())?;
    dirs.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
    let mut files = Vec::new();
    for (rel, names) in &dirs {
        files.extend(names.iter().map(|f| rel.join(f)));
    }
    Ok((files, dirs.into_iter().map(|d| d.0).collect()))
}

/// Adds (`rel`, its image files sorted) for `dir` = base/`rel` and every directory below it.
fn walk(dir: &Path, rel: PathBuf, dirs: &mut Vec<(PathBuf, Vec<OsString>)>, ancestors: &mut Vec<PathBuf>) -> Result<()> {
    let real = match std::fs::canonicalize(dir) {
        Ok(r) => r,
        Err(e) => bail_user!("cannot read directory {}: {e}", dir.display()),
    };
    if ancestors.contains(&real) {
        bail_user!(
            "symlink loop in the data tree: {} leads back to {}",
            dir.display(),
            real.display()
        );
    }
    let listing = match std::fs::read_dir(dir).and_then(|r| r.collect::<std::io::Result<Vec<_>>>()) {
        Ok(l) => l,
        Err(e) => bail_user!("cannot read directory {}: {e}", dir.display()),
    };
    let (mut files, mut subdirs) = (Vec::new(), Vec::new());
    for e in listing {
        let name = e.file_name();
        let is_dir = match e.file_type() {
            Ok(t) if t.is_dir() => true,
            Ok(t) if t.is_file() => false,
            // A symlink (or a file system that does not say): what it points to decides. A
            // dangling one with an image's name is listed, as torchvision lists it (reported
            // when it cannot be read).
            _ => match std::fs::metadata(e.path()) {
                Ok(m) if m.is_dir() => true,
                Ok(m) if !m.is_file() => continue,
                Ok(_) => false,
                Err(_) if std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.file_type().is_symlink()) => false,
                Err(err) => bail_user!("cannot read {}: {err}", e.path().display()),
            },
        };
        if is_dir {
            subdirs.push(name);
        } else if is_image_file(Path::new(&name)) {
            files.push(name);
        }
    }
    files.sort();
    ancestors.push(real);
    dirs.push((rel.clone(), files));
    for d in subdirs {
        walk(&dir.join(&d), rel.join(&d), dirs, ancestors)?;
    }
    ancestors.pop();
    Ok(())
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
