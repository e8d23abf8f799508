//! ImageFolder scanning with torchvision's semantics: classes are the sorted names of the
//! sub-directories of the root, samples are the image files below each (recursively, sorted).
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::bail_user;

/// Extensions accepted, compared case-insensitively.
pub const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "bmp", "webp"];

#[derive(Debug, Clone)]
pub struct ImageFolder {
    pub root: PathBuf,
    pub classes: Vec<String>,
    /// (path, class index), ordered by class then path, as torchvision's `make_dataset`.
    pub samples: Vec<(PathBuf, usize)>,
}

pub fn is_image_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .map(|e| IMAGE_EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
        .unwrap_or(false)
}

/// Image files under `dir`, recursively, sorted; symlinks are followed as torchvision does
/// (`os.walk(followlinks=True)`), but a link back to a directory being walked is refused (it
/// would recurse forever). Errors name the path.
pub fn walk_images(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    walk(dir, out, &mut Vec::new())
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>, ancestors: &mut Vec<PathBuf>) -> Result<()> {
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
    let mut entries = listing;
    entries.sort_by_key(|e| e.file_name());
    ancestors.push(real);
    for e in entries {
        let path = e.path();
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            // A dangling symlink: an image that cannot be read (reported when loaded), else ignored.
            Err(_) if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) => {
                if is_image_file(&path) {
                    out.push(path);
                }
                continue;
            }
            Err(e) => bail_user!("cannot read {}: {e}", path.display()),
        };
        if meta.is_dir() {
            walk(&path, out, ancestors)?;
        } else if meta.is_file() && is_image_file(&path) {
            out.push(path);
        }
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
        let mut samples = Vec::new();
        for (idx, class) in classes.iter().enumerate() {
            let mut files = Vec::new();
            walk_images(&root.join(class), &mut files)?;
            if files.is_empty() {
                bail_user!(
                    "class '{class}' has no images ({}): {}",
                    IMAGE_EXTENSIONS.join(" "),
                    root.join(class).display()
                );
            }
            samples.extend(files.into_iter().map(|p| (p, idx)));
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            samples,
        })
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
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
        let f = ImageFolder::scan(d.path(), "--data").unwrap();
        assert_eq!(f.classes, vec!["C", "a", "b"]);
        let rel: Vec<_> = f
            .samples
            .iter()
            .map(|(p, c)| (p.strip_prefix(d.path()).unwrap().to_owned(), *c))
            .collect();
        assert_eq!(
            rel,
            vec![
                (PathBuf::from("C/y.webp"), 0),
                (PathBuf::from("a/x.JpG"), 1),
                (PathBuf::from("b/1.PNG"), 2),
                (PathBuf::from("b/sub/2.jpeg"), 2)
            ]
        );
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
