//! Hugging Face datasets as parquet files (`--data 'data/train-*.parquet'`): how most public
//! image-classification sets are published. The image column (`image`, `--image-column`) is the
//! `datasets` Image feature, a struct of `bytes` and `path` (or plain bytes; a row without bytes
//! is read from its path, as `datasets` reads it: `Dataset.to_parquet` of a set made from image
//! paths stores only the paths); the label column
//! (`label`, `--label-column`) a class number, its names read from the `huggingface` metadata
//! the library writes into the file (a `ClassLabel`'s `names`, in their own order), or text.
//!
//! Images live in row groups, compressed together, so one cannot be read alone: a row group is
//! decoded whole when one of its images is wanted and kept while its neighbours are read (a
//! small cache with a memory budget). Training reads row groups as tar shards are read
//! (`load/order.rs`: in streams, each front to back through a shuffle buffer), so
//! each is decoded about once an epoch; validation reads them in order.
use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result};
use parquet::basic::Type as Physical;
use parquet::column::reader::ColumnReader;
use parquet::data_type::ByteArray;
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::SerializedFileReader;

use super::catalog::Catalog;
use super::common::{class_index, class_list, expand, files_in_flat_dir};
use super::files::Files;
use super::interface::{Columns, Opened, Source, SourceKind, Stored};
use crate::bail_user;
use crate::report::progress::warn;

/// Decoded row groups kept at most (bytes of their images), and at least this many groups.
const CACHE_BYTES: usize = 1 << 30;
const CACHE_MIN_GROUPS: usize = 4;

/// The parquet files of a set and where each sample lies in them.
pub struct Parquet {
    /// Each file's path (or URL), as named, and how to open it.
    files: Files,
    /// The folder that holds them all ("" if none does): sample names are under it.
    pub root: PathBuf,
    mtimes: Vec<i64>,
    /// Each file's leaf column of image bytes, and of the images' paths where it has one.
    image_leaf: Vec<usize>,
    path_leaf: Vec<Option<usize>>,
    /// Every row group: (file, its index in the file).
    groups: Vec<(u32, u32)>,
    /// Per sample, in catalog order: (its row group in `groups`, its row in it).
    rows: Vec<(u32, u32)>,
    cache: GroupCache,
}

/// The files `spec` names: a directory's `.parquet` files (refused when they are several
/// splits: `train-…` and `test-…`), or a pattern's (braces, then `*`/`?` in file names), sorted.
fn files_of(spec: &Path, what: &str) -> Result<Vec<PathBuf>> {
    if spec.is_dir() {
        let files = files_in_flat_dir(spec, ".parquet").with_context(|| format!("reading {what} directory {}", spec.display()))?;
        one_split(&files, spec, what)?;
        return Ok(files);
    }
    let Some(pattern) = spec.to_str() else {
        bail_user!("{what} {} is not UTF-8", spec.display());
    };
    let mut files = Vec::new();
    for p in expand(pattern, what)? {
        let p = p.to_string_lossy().into_owned();
        if !p.contains(['*', '?', '[']) {
            files.push(PathBuf::from(p));
            continue;
        }
        let matches = match glob::glob(&p) {
            Ok(m) => m,
            Err(e) => bail_user!("{what} '{pattern}': {e}"),
        };
        let before = files.len();
        for m in matches {
            files.push(m.with_context(|| format!("listing {p}"))?);
        }
        if files.len() == before {
            bail_user!("{what} '{p}' matches no file");
        }
    }
    Ok(files)
}

/// A folder's parquet files (a remote one's: the objects directly under it) must be one split's:
/// `train-…` and `test-…` files together are refused, naming a pattern for one.
pub fn one_split(files: &[PathBuf], folder: &Path, what: &str) -> Result<()> {
    let mut splits: Vec<String> = files.iter().filter_map(|f| split_of(f)).collect();
    splits.sort();
    splits.dedup();
    if splits.len() > 1 {
        bail_user!(
            "{what} {} holds the parquet files of several splits ({}): name one, e.g. '{}'",
            folder.display(),
            splits.join(", "),
            folder.join(format!("{}-*.parquet", splits[0])).display()
        );
    }
    Ok(())
}

/// `train` for `train-00000-of-00004.parquet`: the split the hub's file names start with.
fn split_of(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    let (split, rest) = name.split_once('-')?;
    rest.contains("-of-").then(|| split.to_owned())
}

/// A label as stored: a class number, or a name.
#[derive(Clone)]
enum Label {
    Number(i64),
    Name(String),
}

/// What one file holds.
struct FileScan {
    image_leaf: usize,
    path_leaf: Option<usize>,
    /// Rows per row group.
    group_rows: Vec<usize>,
    /// Per row of the file: its label, `None` where null.
    labels: Vec<Option<Label>>,
    /// The label column's class names from the file's `huggingface` metadata.
    names: Option<Vec<String>>,
}

fn open_reader(files: &Files, i: usize) -> Result<SerializedFileReader<File>> {
    let (file, path) = (files.open(i, "parquet file")?, &files.names[i]);
    SerializedFileReader::new(file)
        .map_err(|e| crate::error::user_error(format!("{} is not a readable parquet file: {e}", path.display())))
}

fn scan_file(files: &Files, i: usize, columns: &Columns) -> Result<FileScan> {
    let (reader, path) = (open_reader(files, i)?, &files.names[i]);
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    let (image, label) = (
        columns.image.as_deref().unwrap_or("image"),
        columns.label.as_deref().unwrap_or("label"),
    );
    let leaf = |parts: &[&str]| schema.columns().iter().position(|c| c.path().parts() == parts);
    let top: Vec<&str> = schema.root_schema().get_fields().iter().map(|f| f.name()).collect();
    let path_leaf = leaf(&[image, "path"]).filter(|&l| schema.column(l).physical_type() == Physical::BYTE_ARRAY);
    let Some(image_leaf) = leaf(&[image, "bytes"]).or_else(|| leaf(&[image])) else {
        bail_user!(
            "{} has no image column '{image}' (--image-column); its columns: {}",
            path.display(),
            top.join(", ")
        );
    };
    if schema.column(image_leaf).physical_type() != Physical::BYTE_ARRAY {
        bail_user!("{}: column '{image}' holds no image bytes", path.display());
    }
    let Some(label_leaf) = leaf(&[label]) else {
        bail_user!(
            "{} has no label column '{label}' (--label-column); its columns: {}",
            path.display(),
            top.join(", ")
        );
    };
    let names = meta
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == "huggingface"))
        .and_then(|k| k.value.as_deref())
        .and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok())
        .and_then(|v| {
            let names = v.pointer(&format!("/info/features/{}/names", label.replace('~', "~0").replace('/', "~1")))?;
            names.as_array()?.iter().map(|n| n.as_str().map(str::to_owned)).collect()
        });
    let (mut group_rows, mut labels) = (Vec::new(), Vec::new());
    for g in 0..meta.num_row_groups() {
        let group = reader.get_row_group(g).with_context(|| format!("reading {}", path.display()))?;
        let rows = group.metadata().num_rows() as usize;
        group_rows.push(rows);
        let max_def = schema.column(label_leaf).max_def_level();
        let mut defs = Vec::new();
        let present = |defs: &[i16], i: usize| max_def == 0 || defs[i] == max_def;
        let read = |e: parquet::errors::ParquetError| crate::error::user_error(format!("{}: {e}", path.display()));
        match group.get_column_reader(label_leaf).map_err(read)? {
            ColumnReader::Int64ColumnReader(mut r) => {
                let mut v = Vec::new();
                r.read_records(rows, Some(&mut defs), None, &mut v).map_err(read)?;
                let mut v = v.into_iter();
                labels.extend((0..rows).map(|i| present(&defs, i).then(|| Label::Number(v.next().unwrap_or(-1)))));
            }
            ColumnReader::Int32ColumnReader(mut r) => {
                let mut v = Vec::new();
                r.read_records(rows, Some(&mut defs), None, &mut v).map_err(read)?;
                let mut v = v.into_iter();
                labels.extend((0..rows).map(|i| present(&defs, i).then(|| Label::Number(v.next().unwrap_or(-1) as i64))));
            }
            ColumnReader::ByteArrayColumnReader(mut r) => {
                let mut v: Vec<ByteArray> = Vec::new();
                r.read_records(rows, Some(&mut defs), None, &mut v).map_err(read)?;
                let mut v = v.into_iter();
                labels.extend((0..rows).map(|i| {
                    present(&defs, i)
                        .then(|| v.next().map(|b| Label::Name(String::from_utf8_lossy(b.data()).trim().to_owned())))
                        .flatten()
                }));
            }
            _ => bail_user!("{}: column '{label}' holds neither class numbers nor names", path.display()),
        }
    }
    Ok(FileScan {
        image_leaf,
        path_leaf,
        group_rows,
        labels,
        names,
    })
}

impl Parquet {
    /// Opens the parquet files `spec` names and lists their labelled rows; rows whose label is
    /// null or negative (the hub's unlabelled test splits write -1) are left out with one warning
    /// (an error when `strict`). `what` names the flag.
    pub fn open(spec: &Path, columns: &Columns, strict: bool, what: &str) -> Result<Opened> {
        let paths = files_of(spec, what)?;
        if paths.is_empty() {
            bail_user!("{what} {}: no .parquet files there", spec.display());
        }
        Parquet::open_files(Files::local(paths), columns, strict, what)
    }

    /// Lists the labelled rows of the parquet files `files` holds (local or remote).
    pub fn open_files(files: Files, columns: &Columns, strict: bool, what: &str) -> Result<Opened> {
        let mtimes = files.times(what)?;
        let scans = files.each(|i| scan_file(&files, i, columns))?;
        let paths = &files.names;
        // Class names from the metadata, in their order; else the classes the labels' text
        // makes, as tar shards' labels make them (`common::class_list`).
        let names = scans.iter().find_map(|s| s.names.clone());
        let text = |l: &Label| match l {
            Label::Number(n) if *n < 0 => None,
            Label::Number(n) => Some(n.to_string()),
            Label::Name(s) => Some(s.clone()),
        };
        let (classes, numbered) = match &names {
            Some(n) => (n.clone(), false),
            None => {
                let texts: Vec<String> = scans.iter().flat_map(|s| s.labels.iter().flatten()).filter_map(text).collect();
                class_list(texts.iter().map(String::as_str), what)?
            }
        };
        let index_of = |l: &Label| match (l, &names) {
            (Label::Number(n), Some(_)) => usize::try_from(*n).ok(),
            (Label::Name(s), Some(_)) => classes.iter().position(|c| c == s),
            (l, None) => text(l).and_then(|t| class_index(&classes, numbered, &t)),
        };
        let root = files.common_parent();
        let (mut catalog, mut groups, mut rows) = (Catalog::default(), Vec::new(), Vec::new());
        let (mut unlabelled, mut out_of_range) = (0usize, None);
        for (f, (p, s)) in paths.iter().zip(&scans).enumerate() {
            let prefix = p.strip_prefix(&root).unwrap_or(p);
            let mut row_in_file = 0;
            for (g, &n) in s.group_rows.iter().enumerate() {
                let group = groups.len() as u32;
                groups.push((f as u32, g as u32));
                for r in 0..n {
                    let label = s.labels[row_in_file + r].as_ref();
                    match label.map(|l| (l, index_of(l))) {
                        Some((_, Some(c))) if c < classes.len() => {
                            catalog.push(prefix.join(format!("{}", row_in_file + r)).as_os_str(), c);
                            rows.push((group, r as u32));
                        }
                        Some((Label::Number(n), _)) if *n >= 0 => {
                            out_of_range.get_or_insert((p.clone(), row_in_file + r, *n));
                        }
                        _ => unlabelled += 1,
                    }
                }
                row_in_file += n;
            }
        }
        if let Some((p, row, n)) = out_of_range {
            bail_user!(
                "{}: row {row} has label {n}, outside its {} classes",
                p.display(),
                classes.len()
            );
        }
        if unlabelled > 0 {
            let line = format!("{what}: {unlabelled} rows have no label (null or negative, as in an unlabelled test split)");
            if strict || catalog.is_empty() {
                bail_user!("{line}");
            }
            warn(&format!("{line}; they are left out"));
        }
        let set = Parquet {
            image_leaf: scans.iter().map(|s| s.image_leaf).collect(),
            path_leaf: scans.iter().map(|s| s.path_leaf).collect(),
            files,
            root,
            mtimes,
            groups,
            rows,
            cache: GroupCache::default(),
        };
        Ok(Opened {
            classes,
            catalog,
            source: Arc::new(set),
        })
    }

    fn load_group(&self, g: u32) -> Result<GroupImages> {
        let (f, rg) = self.groups[g as usize];
        let path = &self.files.names[f as usize];
        let reader = open_reader(&self.files, f as usize)?;
        let group = reader.get_row_group(rg as usize).with_context(|| format!("reading {}", path.display()))?;
        let rows = group.metadata().num_rows() as usize;
        // A leaf column of byte strings, `None` where a row has none.
        let column = |leaf: usize, what: &str| -> Result<Vec<Option<ByteArray>>> {
            let max_def = reader.metadata().file_metadata().schema_descr().column(leaf).max_def_level();
            let ColumnReader::ByteArrayColumnReader(mut r) = group.get_column_reader(leaf)? else {
                anyhow::bail!("{}: the image column's {what} are not bytes", path.display());
            };
            let (mut defs, mut values) = (Vec::new(), Vec::<ByteArray>::new());
            r.read_records(rows, Some(&mut defs), None, &mut values)
                .with_context(|| format!("reading the images' {what} in {}", path.display()))?;
            let mut values = values.into_iter();
            Ok((0..rows).map(|i| (max_def == 0 || defs[i] == max_def).then(|| values.next()).flatten()).collect())
        };
        let bytes = column(self.image_leaf[f as usize], "bytes")?;
        let paths = match self.path_leaf[f as usize] {
            Some(leaf) if bytes.iter().any(Option::is_none) => column(leaf, "paths")?,
            _ => vec![None; rows],
        };
        let rows: Vec<Image> = bytes
            .into_iter()
            .zip(paths)
            .map(|(b, p)| match (b, p) {
                (Some(b), _) => Image::Bytes(b),
                (None, Some(p)) => Image::Path(String::from_utf8_lossy(p.data()).into_owned()),
                (None, None) => Image::Missing,
            })
            .collect();
        let bytes = rows.iter().map(|r| if let Image::Bytes(b) = r { b.len() } else { 0 }).sum();
        Ok(GroupImages { rows, bytes })
    }

    /// The file a row without bytes names, as `datasets` opens it: an absolute path as it is; a
    /// relative one under the parquet file's folder, else under the current directory.
    fn image_file(&self, g: u32, image: &str) -> Result<Vec<u8>> {
        let parquet = &self.files.names[self.groups[g as usize].0 as usize];
        let beside = parquet.parent().unwrap_or(Path::new("")).join(image);
        let file = if Path::new(image).is_absolute() || beside.exists() { beside } else { PathBuf::from(image) };
        std::fs::read(&file).map_err(|e| {
            crate::error::user_error(format!(
                "{}: a row without image bytes names {image}, which cannot be read ({e}; a relative path is looked for beside the parquet file, then in the current directory)",
                parquet.display()
            ))
        })
    }
}

impl Source for Parquet {
    fn root(&self) -> &Path {
        &self.root
    }

    fn describe(&self) -> SourceKind {
        SourceKind::Parquet {
            files: self.files.len(),
            row_groups: self.groups.len(),
        }
    }

    /// The row's image bytes, from its row group (decoded whole, then kept a while).
    fn read(&self, entry: usize, _name: &Path) -> Result<Stored<'_>> {
        let (g, r) = self.rows[entry];
        let images = self.cache.get(g, || self.load_group(g))?;
        match &images.rows[r as usize] {
            Image::Bytes(b) => Ok(Stored::Encoded(Cow::Owned(b.data().to_vec()))),
            Image::Path(p) => Ok(Stored::Encoded(Cow::Owned(self.image_file(g, p)?))),
            Image::Missing => anyhow::bail!("row {r} of its row group has neither image bytes nor a path"),
        }
    }

    /// What stands for a row's size and time in a run's data record and a pack's list of
    /// sources: its row in its row group (its bytes are not known before the group is decoded)
    /// and its file's modification time.
    fn size_and_mtime(&self, entry: usize, _name: &Path) -> Result<(u64, i64)> {
        let (g, r) = self.rows[entry];
        Ok((r as u64, self.mtimes[self.groups[g as usize].0 as usize]))
    }

    /// The row's row group: its "shard" for the training order.
    fn shard_of(&self, entry: usize) -> Option<usize> {
        Some(self.rows[entry].0 as usize)
    }

    fn shard_files(&self) -> Option<&Files> {
        Some(&self.files)
    }

    /// The files of the row groups the reads will meet, fetched ahead when remote.
    fn will_read(&self, entries: &[usize]) {
        let files = entries.iter().map(|&e| self.groups[self.rows[e].0 as usize].0 as usize);
        self.files.will_read(&super::files::first_appearances(files));
    }
}

/// A row group's images.
struct GroupImages {
    rows: Vec<Image>,
    /// Of the images held as bytes.
    bytes: usize,
}

/// A row's image: its bytes, or the path of its file.
enum Image {
    Bytes(ByteArray),
    Path(String),
    Missing,
}

type Slot = Arc<OnceLock<std::result::Result<Arc<GroupImages>, String>>>;

/// The row groups decoded lately, least recently used dropped first past `CACHE_BYTES`. A group
/// wanted by several workers at once is decoded once (the others wait for it).
#[derive(Default)]
struct GroupCache {
    slots: Mutex<(u64, Vec<(u32, u64, Slot)>)>,
}

impl GroupCache {
    fn get(&self, g: u32, load: impl FnOnce() -> Result<GroupImages>) -> Result<Arc<GroupImages>> {
        let slot = {
            let mut guard = self.slots.lock().expect("the cache's lock");
            let (tick, slots) = &mut *guard;
            *tick += 1;
            match slots.iter_mut().find(|s| s.0 == g) {
                Some(s) => {
                    s.1 = *tick;
                    s.2.clone()
                }
                None => {
                    let slot: Slot = Arc::default();
                    slots.push((g, *tick, slot.clone()));
                    evict(slots);
                    slot
                }
            }
        };
        slot.get_or_init(|| load().map(Arc::new).map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(|e| anyhow::anyhow!(e))
    }
}

/// Drops the least recently used decoded groups while they hold more than `CACHE_BYTES`.
fn evict(slots: &mut Vec<(u32, u64, Slot)>) {
    let held = |s: &(u32, u64, Slot)| s.2.get().and_then(|r| r.as_ref().ok()).map_or(0, |g| g.bytes);
    while slots.len() > CACHE_MIN_GROUPS && slots.iter().map(held).sum::<usize>() > CACHE_BYTES {
        let oldest = (0..slots.len()).min_by_key(|&i| slots[i].1).expect("slots");
        slots.remove(oldest);
    }
}
