//! A folder of images with a label file (`--labels train.csv`): how most Kaggle competitions and
//! medical sets come. One row per image: an image column (a path under the folder, with or
//! without its extension, or just the file's name where the images sit in a sub-folder) and a
//! label column (a class name). Classes are the distinct labels sorted as ImageFolder sorts its
//! folders; samples are the rows, in the file's order.
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use super::common::{walk_sorted, Files};
use super::interface::{Columns, Opened, SourceKind};
use crate::bail_user;
use crate::report::progress::warn;

/// Reads `csv` and finds its images under `dir`: classes sorted, and a catalog of paths under
/// the folder, in row order, read as loose files. `flag` names the label file's flag for
/// messages. Rows whose image is not there are left out with a warning (an error when
/// `strict`); a malformed file, an image labelled twice, an empty label or a name that fits
/// several images is an error that names the line.
pub fn open(dir: &Path, csv: &Path, columns: &Columns, strict: bool, flag: &str) -> Result<Opened> {
    if !dir.is_dir() {
        bail_user!("{flag} {}: its images' folder {} is not a directory", csv.display(), dir.display());
    }
    let text = match std::fs::read(csv) {
        Ok(t) => t,
        Err(e) => bail_user!("cannot read {flag} {}: {e}", csv.display()),
    };
    let mut reader = csv::ReaderBuilder::new().trim(csv::Trim::All).from_reader(&text[..]);
    let header = match reader.headers() {
        Ok(h) => h.clone(),
        Err(e) => bail_user!("{flag} {}: {e}", csv.display()),
    };
    let column = |name: &Option<String>, position: usize, what: &str| -> Result<usize> {
        match name {
            Some(n) => match header.iter().position(|h| h == n) {
                Some(i) => Ok(i),
                None => bail_user!(
                    "{flag} {} has no column '{n}' (--{what}-column); its columns: {}",
                    csv.display(),
                    header.iter().collect::<Vec<_>>().join(", ")
                ),
            },
            None if position < header.len() => Ok(position),
            None => bail_user!(
                "{flag} {} has {} column(s) ({}); it needs an image column and a label column (header line first)",
                csv.display(),
                header.len(),
                header.iter().collect::<Vec<_>>().join(", ")
            ),
        }
    };
    let (image_col, label_col) = (column(&columns.image, 0, "image")?, column(&columns.label, 1, "label")?);
    if image_col == label_col {
        bail_user!("{flag} {}: the image and the label column are both '{}'", csv.display(), &header[image_col]);
    }

    let files = FolderIndex::new(dir)?;
    let mut rows: Vec<(u32, String)> = Vec::new();
    let mut line_of_file = vec![0u64; files.names.len()];
    let (mut missing, mut first_missing) = (0usize, None);
    let mut record = csv::StringRecord::new();
    // Lines are counted here: the csv crate's own count is one short after "\r\n" endings.
    let (mut counted_to, mut line) = (0usize, 1u64);
    loop {
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => bail_user!("{flag} {}: {e}", csv.display()),
        }
        let start = record.position().map_or(0, |p| p.byte() as usize);
        line += text[counted_to..start].iter().filter(|&&b| b == b'\n').count() as u64;
        counted_to = start;
        let (image, label) = (&record[image_col], &record[label_col]);
        if image.is_empty() {
            bail_user!("{flag} {} line {line}: the image column '{}' is empty", csv.display(), &header[image_col]);
        }
        if label.is_empty() {
            bail_user!("{flag} {} line {line}: image '{image}' has an empty label", csv.display());
        }
        match files.find(image) {
            Found::One(f) => {
                if line_of_file[f as usize] != 0 {
                    bail_user!(
                        "{flag} {} line {line}: image '{image}' is labelled again (first on line {})",
                        csv.display(),
                        line_of_file[f as usize]
                    );
                }
                line_of_file[f as usize] = line;
                rows.push((f, label.to_owned()));
            }
            Found::Several => bail_user!(
                "{flag} {} line {line}: '{image}' names more than one image under {}; give its path under the folder",
                csv.display(),
                dir.display()
            ),
            Found::None => {
                missing += 1;
                first_missing.get_or_insert((line, image.to_owned()));
            }
        }
    }
    if let Some((line, image)) = first_missing {
        let what = format!(
            "{flag} {}: {missing} row(s) name no image under {} (first: line {line}, '{image}')",
            csv.display(),
            dir.display()
        );
        if strict || rows.is_empty() {
            bail_user!("{what}");
        }
        warn(&format!("{what}; they are left out"));
    }
    if rows.is_empty() {
        bail_user!("{flag} {} has no rows", csv.display());
    }
    let mut classes: Vec<String> = rows.iter().map(|r| r.1.clone()).collect();
    // ImageFolder's order: Python's str ordering, UTF-8 byte order.
    classes.sort_unstable();
    classes.dedup();
    let catalog = rows
        .iter()
        .map(|(f, label)| (&files.names[*f as usize], classes.binary_search(label).expect("a label of a row")))
        .collect();
    // Image files under the folder, labelled or not.
    let kind = SourceKind::Labelled {
        file: csv.to_path_buf(),
        images: files.names.len(),
    };
    let root = dir.to_path_buf();
    Ok(Opened {
        classes,
        catalog,
        source: Arc::new(Files { root, kind }),
    })
}

enum Found {
    One(u32),
    Several,
    None,
}

/// Every image file under a folder, findable by the names label files use: its path under the
/// folder, that path without the extension, and (for files in sub-folders) its file name with
/// or without the extension.
struct FolderIndex {
    names: Vec<PathBuf>,
    exact: HashMap<Box<[u8]>, u32>,
    /// The looser names; `u32::MAX` where several files share one.
    loose: HashMap<Box<[u8]>, u32>,
}

impl FolderIndex {
    fn new(dir: &Path) -> Result<FolderIndex> {
        let (names, _) = walk_sorted(dir)?;
        let (mut exact, mut loose) = (HashMap::with_capacity(names.len()), HashMap::new());
        let mut add = |key: &[u8], i: u32| {
            loose
                .entry(key.into())
                .and_modify(|v: &mut u32| {
                    if *v != i {
                        *v = u32::MAX
                    }
                })
                .or_insert(i);
        };
        for (i, name) in names.iter().enumerate() {
            let i = i as u32;
            let path = name.as_os_str().as_bytes();
            exact.insert(path.into(), i);
            add(without_extension(path), i);
            if let Some(file) = name.file_name().filter(|f| f.len() != path.len()) {
                add(file.as_bytes(), i);
                add(without_extension(file.as_bytes()), i);
            }
        }
        Ok(FolderIndex { names, exact, loose })
    }

    fn find(&self, image: &str) -> Found {
        let key = image.strip_prefix("./").unwrap_or(image).as_bytes();
        match self.exact.get(key).or_else(|| self.loose.get(key)) {
            Some(&u32::MAX) => Found::Several,
            Some(&i) => Found::One(i),
            None => Found::None,
        }
    }
}

/// `a/b.c.jpg` → `a/b.c`: the name without its last extension.
fn without_extension(path: &[u8]) -> &[u8] {
    let file_start = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    match path[file_start..].iter().rposition(|&b| b == b'.') {
        Some(dot) if dot > 0 => &path[..file_start + dot],
        _ => path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_without_extension() {
        assert_eq!(without_extension(b"a/b.c.jpg"), b"a/b.c");
        assert_eq!(without_extension(b"x.png"), b"x");
        assert_eq!(without_extension(b"d.x/.hidden"), b"d.x/.hidden");
        assert_eq!(without_extension(b"noext"), b"noext");
    }
}
