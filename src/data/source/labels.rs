//! A folder of images with a label file (`--labels train.csv`): how most Kaggle competitions and
//! medical sets come. One row per image: an image column (a path under the folder, with or
//! without its extension, or just the file's name where the images sit in a sub-folder) and a
//! label column (a class name, or a class number). Classes follow the rule every source follows
//! (`common::class_list`): labels that are all integers are the classes 0…max by number, other
//! labels the distinct names sorted as ImageFolder sorts its folders; samples are the rows, in the
//! file's order. The delimiter is sniffed (`sniff_delimiter`), so a file a spreadsheet exported
//! with `;` (or tabs, or `|`) reads as one with commas; a byte-order mark and CRLF line ends are
//! taken as they come.
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;

use super::common::{class_index, class_list, walk_sorted};
use super::loose::LooseFiles;
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
    let delimiter = sniff_delimiter(&text);
    let mut reader = csv::ReaderBuilder::new().delimiter(delimiter).trim(csv::Trim::All).from_reader(&text[..]);
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
                "{flag} {} has {} column(s) ({}); it needs an image column and a label column (header line first; columns separated by one of {})",
                csv.display(),
                header.len(),
                header.iter().collect::<Vec<_>>().join(", "),
                DELIMITERS.iter().map(|&d| delimiter_name(d)).collect::<Vec<_>>().join(", ")
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
    let (classes, numbered) = class_list(rows.iter().map(|r| r.1.as_str()), &format!("{flag} {}", csv.display()))?;
    let catalog = rows
        .iter()
        .map(|(f, label)| (&files.names[*f as usize], class_index(&classes, numbered, label).expect("a label of a row")))
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
        source: Arc::new(LooseFiles { root, kind }),
    })
}

/// The delimiters a label file may use, in the order a tie is settled (Python's `csv.Sniffer`
/// prefers the comma, then the tab, then the semicolon).
const DELIMITERS: [u8; 4] = [b',', b'\t', b';', b'|'];

fn delimiter_name(d: u8) -> &'static str {
    match d {
        b',' => "',' (comma)",
        b'\t' => "tab",
        b';' => "';' (semicolon)",
        _ => "'|' (bar)",
    }
}

/// The delimiter of a CSV file, found as Python's `csv.Sniffer().sniff(text, ",\t;|")` finds it
/// in files without quoted fields (its `_guess_delimiter`): for each candidate, how often it
/// occurs on each of the first lines; the lines with its most common count (above zero), less
/// the lines with any other count, must be at least 90 % of the lines; the most consistent
/// candidate wins, a tie going to `DELIMITERS`' order. Unlike the Sniffer, a delimiter inside
/// double quotes does not count, so a quoted name with a comma in it does not vote. The comma
/// when no candidate qualifies (a file of one column, refused later with its columns named).
fn sniff_delimiter(text: &[u8]) -> u8 {
    let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    let lines: Vec<&[u8]> = text
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty())
        .take(SNIFFED_LINES)
        .collect();
    if lines.is_empty() {
        return b',';
    }
    let mut best: Option<(f64, u8)> = None;
    for &d in &DELIMITERS {
        let mut counts: HashMap<usize, usize> = HashMap::new();
        for line in &lines {
            let mut quoted = false;
            let n = line
                .iter()
                .filter(|&&b| {
                    quoted ^= b == b'"';
                    b == d && !quoted
                })
                .count();
            *counts.entry(n).or_default() += 1;
        }
        // The mode, ties to the smaller count; its lines less those of every other count.
        let Some((&mode, &agree)) = counts.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) else { continue };
        let score = agree as f64 - (lines.len() - agree) as f64;
        let consistency = score / lines.len() as f64;
        if mode > 0 && consistency >= 0.9 && best.is_none_or(|(c, _)| consistency > c) {
            best = Some((consistency, d));
        }
    }
    best.map_or(b',', |(_, d)| d)
}

/// Lines of a label file read to sniff its delimiter.
const SNIFFED_LINES: usize = 200;

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

    #[test]
    fn the_delimiter_is_sniffed_outside_quotes() {
        // A quoted comma does not vote; a name with ", " in a tab-separated file neither.
        assert_eq!(sniff_delimiter(b"image;label\n\"a,b.png\";cat\nc.png;dog\n"), b';');
        assert_eq!(sniff_delimiter(b"\xEF\xBB\xBFimage\tlabel\r\nx.png\tred, green\r\ny.png\tblue\r\n"), b'\t');
        // Decimal commas on every row but the header: the semicolon is the consistent one.
        assert_eq!(sniff_delimiter(b"a;b;c\nx;1;0,5\ny;2;1,5\nz;3;2,5\n"), b';');
        // Nothing qualifies: the comma (a one-column file is refused later, its column named).
        assert_eq!(sniff_delimiter(b"file\na/0.png\n"), b',');
        assert_eq!(sniff_delimiter(b""), b',');
    }
}
