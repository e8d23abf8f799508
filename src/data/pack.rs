//! A pack: a whole ImageFolder in one file, read through a memory map (ranks on one node share
//! the page cache), its images either decoded once (`raw`: RGB8 pixels, the shorter side resized
//! to at most `--max-side`) or kept as their files' bytes (`encoded`: no quality lost, no
//! per-file cost).
//!
//! Layout (integers little-endian):
//! ```text
//! 0    b"RINGPACK", format version u32, 0u32
//! 16   the images' bytes, one record after another
//! I    the index: JSON (`Index`: store, classes, the source folder's files, the records)
//! end  I u64, index length u64, b"PACK-END"
//! ```
//! The index comes last so that packing streams; a file cut short loses its end marker.
//! The source folder's files (name, size, modification time) and directories (name, modification
//! time) are recorded, so a pack older than its folder is refused while the folder is there to
//! compare with. A pack of a folder with a label file records the label file too; a pack of tar
//! shards or parquet files records them (its files are then their samples, each with its
//! shard's or file's time).
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fast_image_resize as fr;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::decode::{decode_bytes, MAX_IMAGE_PIXELS};
use super::folder::ImageFolder;
use super::source::{DataSpec, Dataset, Samples, SourceKind, Stored};
use super::transform::RgbView;
use crate::bail_user;

const MAGIC: &[u8; 8] = b"RINGPACK";
const END: &[u8; 8] = b"PACK-END";
pub const VERSION: u32 = 1;
const HEAD: u64 = 16;
const FOOT: u64 = 24;
/// Images decoded (or read) at once while packing: enough to keep every thread busy, few
/// enough that memory stays small.
const CHUNK: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Store {
    /// Decoded RGB8 pixels: no decoding while training.
    Raw,
    /// The files' own bytes: lossless and compact; decoded while training, as from a folder.
    Encoded,
}

/// One image file of the source folder as it was when packed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceFile {
    /// Path under the folder, '/'-separated.
    pub name: String,
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

/// A directory of the source folder as it was when packed: a file added, removed or renamed
/// in it changes its modification time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceDir {
    /// Path under the folder, '/'-separated.
    pub name: String,
    pub mtime_ns: i64,
}

/// One image in the pack.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Its file in `Index::files`.
    pub file: usize,
    pub label: usize,
    pub offset: u64,
    pub len: u64,
    /// Raw records: the pixels' size (`len` = width × height × 3). Encoded: 0.
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    pub store: Store,
    pub max_side: Option<u32>,
    pub classes: Vec<String>,
    /// The folder packed (absolute) and every image file in it, in folder order.
    pub root: PathBuf,
    pub files: Vec<SourceFile>,
    /// Every directory of the folder ("" the folder itself) and its modification time. Packs
    /// written before this was recorded have none.
    #[serde(default)]
    pub dirs: Vec<SourceDir>,
    /// The images, in folder order; files that could not be read have none.
    pub records: Vec<Record>,
    /// What was packed when it was not an ImageFolder (packs of folders have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PackedFrom>,
}

/// A pack's source other than an ImageFolder, as it was when packed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PackedFrom {
    /// The folder (`Index::root`) with this label file (absolute).
    LabelFile(SourceFile),
    /// These tar shards or parquet files (absolute paths); `Index::files` are their samples.
    Shards(Vec<SourceFile>),
}

pub struct Pack {
    pub path: PathBuf,
    pub index: Index,
    map: memmap2::Mmap,
}

/// A record's contents.
pub enum Contents<'a> {
    Raw(RgbView<'a>),
    Encoded(&'a [u8]),
}

impl Pack {
    /// Opens and validates `path`; `what` names the flag it came from. Every record is checked
    /// to lie inside the file, so reading one later cannot fail.
    pub fn open(path: &Path, what: &str) -> Result<Pack> {
        Pack::map(path, what, true)
    }

    /// The folder `path` was packed from (its index alone: nothing read in ahead).
    pub fn folder_of(path: &Path, what: &str) -> Result<PathBuf> {
        Ok(Pack::map(path, what, false)?.index.root)
    }

    fn map(path: &Path, what: &str, read_ahead: bool) -> Result<Pack> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => bail_user!("cannot open {what} pack {}: {e}", path.display()),
        };
        // A pack that fits in half the available memory is read in at once (MAP_POPULATE): no
        // page fault per 4 KB later, 15.5k → 19.1k img/s on plant seedlings; a larger one pages
        // in as it is read.
        let len = file.metadata().map_or(0, |m| m.len());
        let mut options = memmap2::MmapOptions::new();
        if read_ahead && len < crate::data::cache::mem_available().unwrap_or(0) / 2 {
            options.populate();
        }
        // SAFETY: the map is read-only; a pack is written under a temporary name and renamed
        // into place, so the file behind it is not modified while mapped (by ringtrain).
        let map = match unsafe { options.map(&file) } {
            Ok(m) => m,
            Err(e) => bail_user!("cannot read {what} pack {}: {e}", path.display()),
        };
        let index = parse(&map).map_err(|e| crate::error::user_error(format!("{what} {} {e}", path.display())))?;
        Ok(Pack {
            path: path.to_path_buf(),
            index,
            map,
        })
    }

    pub fn len(&self) -> usize {
        self.index.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.records.is_empty()
    }

    pub fn contents(&self, i: usize) -> Contents<'_> {
        let r = &self.index.records[i];
        let bytes = &self.map[r.offset as usize..(r.offset + r.len) as usize];
        match self.index.store {
            Store::Raw => Contents::Raw(RgbView {
                width: r.width,
                height: r.height,
                px: bytes,
            }),
            Store::Encoded => Contents::Encoded(bytes),
        }
    }

    /// Refuses a pack whose source folder has changed since packing (files added, removed, or
    /// of another size or modification time). A folder that is not there (the pack was copied
    /// to another machine) is nothing to compare with: the pack stands alone.
    pub fn check_fresh(&self, what: &str) -> Result<()> {
        let root = &self.index.root;
        match &self.index.source {
            Some(PackedFrom::Shards(files)) => {
                let which = match files.iter().any(|f| f.name.ends_with(".parquet")) {
                    true => "its parquet files",
                    false => "its shards",
                };
                return self.check_fresh_files(files, which, what);
            }
            Some(PackedFrom::LabelFile(csv)) if root.is_dir() => {
                self.check_fresh_files(std::slice::from_ref(csv), "its label file", what)?;
                if stat_files(root, self.index.files.len(), |i| Path::new(&self.index.files[i].name)).is_ok_and(|now| now == self.index.files) {
                    return Ok(());
                }
                bail_user!(
                    "{what} pack {} is older than its images in {} (one was changed or removed since it was packed); pack it again (ringtrain pack)",
                    self.path.display(),
                    root.display()
                );
            }
            Some(PackedFrom::LabelFile(_)) => return Ok(()),
            None => {}
        }
        if !root.is_dir() {
            return Ok(());
        }
        if self.unchanged(root) {
            return Ok(());
        }
        let now = source_files(&ImageFolder::scan(root, what)?)?;
        if now == self.index.files {
            return Ok(());
        }
        let before: std::collections::HashMap<&str, &SourceFile> =
            self.index.files.iter().map(|f| (f.name.as_str(), f)).collect();
        let (mut added, mut changed) = (0, 0);
        for f in &now {
            match before.get(f.name.as_str()) {
                None => added += 1,
                Some(b) if *b != f => changed += 1,
                Some(_) => {}
            }
        }
        let removed = self.index.files.len() + added - now.len();
        if added + changed + removed > 0 {
            bail_user!(
                "{what} pack {} is older than its folder {} (images since it was packed: {added} added, {removed} removed, {changed} changed); pack it again (ringtrain pack)",
                self.path.display(),
                root.display()
            );
        }
        Ok(())
    }

    /// Refuses the pack when one of `files` (absolute; `what` names them) that is still there has
    /// another size or time than when packed.
    fn check_fresh_files(&self, files: &[SourceFile], which: &str, what: &str) -> Result<()> {
        for f in files {
            let Ok(m) = std::fs::metadata(&f.name) else { continue };
            if m.len() != f.size || mtime_ns(&m) != f.mtime_ns {
                bail_user!(
                    "{what} pack {} is older than {which}: {} changed since it was packed; pack it again (ringtrain pack)",
                    self.path.display(),
                    f.name
                );
            }
        }
        Ok(())
    }

    /// The usual case, proved without listing the folder: every directory has its modification
    /// time (nothing added, removed or renamed in it) and every file its size and time. Any
    /// difference (or a pack without directory times) is left to the full comparison.
    fn unchanged(&self, root: &Path) -> bool {
        let dirs = &self.index.dirs;
        let dirs_same = !dirs.is_empty()
            && dirs
                .par_iter()
                .all(|d| std::fs::metadata(root.join(&d.name)).is_ok_and(|m| mtime_ns(&m) == d.mtime_ns));
        let files = &self.index.files;
        dirs_same && stat_files(root, files.len(), |i| Path::new(&files[i].name)).is_ok_and(|now| now == *files)
    }

    /// Bytes of its images' data.
    pub fn data_bytes(&self) -> u64 {
        self.index.records.iter().map(|r| r.len).sum()
    }
}

fn parse(map: &[u8]) -> Result<Index> {
    let n = map.len() as u64;
    if n < 8 || &map[..8] != MAGIC {
        anyhow::bail!(
            "is a file but not a ringtrain pack (no RINGPACK header): give a folder of <class>/<image> files or a pack"
        );
    }
    if n < HEAD + FOOT {
        anyhow::bail!("is truncated ({n} bytes)");
    }
    let version = u32::from_le_bytes(map[8..12].try_into().unwrap());
    if version != VERSION {
        anyhow::bail!(
            "is a pack of format version {version}; this ringtrain reads version {VERSION}: pack the folder again"
        );
    }
    let foot = &map[(n - FOOT) as usize..];
    if &foot[16..] != END {
        anyhow::bail!("is truncated or was not finished (no end marker): pack the folder again");
    }
    let at = u64::from_le_bytes(foot[..8].try_into().unwrap());
    let len = u64::from_le_bytes(foot[8..16].try_into().unwrap());
    if at < HEAD || at.checked_add(len) != Some(n - FOOT) {
        anyhow::bail!("is corrupt: its index lies outside the file");
    }
    let index: Index = serde_json::from_slice(&map[at as usize..(at + len) as usize])
        .map_err(|e| anyhow::anyhow!("is corrupt: its index does not parse ({e})"))?;
    index.validate(at)?;
    Ok(index)
}

impl Index {
    /// Everything a reader relies on: records inside the data area, labels and files that
    /// exist, raw sizes that add up, every class with an image.
    fn validate(&self, data_end: u64) -> Result<()> {
        if self.classes.is_empty() {
            anyhow::bail!("is corrupt: no classes");
        }
        let mut per_class = vec![0usize; self.classes.len()];
        for (i, r) in self.records.iter().enumerate() {
            let end = r.offset.checked_add(r.len);
            if r.offset < HEAD || end.is_none_or(|e| e > data_end) {
                anyhow::bail!("is corrupt: image {i} lies outside the data");
            }
            if r.file >= self.files.len() || r.label >= self.classes.len() {
                anyhow::bail!("is corrupt: image {i} names a file or class that does not exist");
            }
            if self.store == Store::Raw {
                let px = r.width as u64 * r.height as u64;
                if px == 0 || px > MAX_IMAGE_PIXELS || r.len != px * 3 {
                    anyhow::bail!("is corrupt: image {i} is {}×{} in {} bytes", r.width, r.height, r.len);
                }
            }
            per_class[r.label] += 1;
        }
        // A label file or shards may lack a class number; a folder has a folder per class.
        if let Some(c) = per_class.iter().position(|&n| n == 0).filter(|_| self.source.is_none()) {
            anyhow::bail!("has no images of class '{}'", self.classes[c]);
        }
        Ok(())
    }
}

/// What `ringtrain pack` made.
#[derive(Debug)]
pub struct PackSummary {
    pub images: usize,
    pub bytes: u64,
    /// Files left out because they could not be read: path, reason.
    pub unreadable: Vec<(PathBuf, String)>,
}

pub struct PackOptions {
    pub store: Store,
    /// Raw store: shrink each image so that its shorter side is at most this (torchvision's
    /// Resize arithmetic, antialiased bilinear); larger images are kept as they are.
    pub max_side: Option<u32>,
    pub workers: usize,
}

/// Packs the images `spec` names (an ImageFolder, a folder with a label file, tar shards or
/// parquet files) into `out`, atomically: a temporary sibling is written, synced and renamed
/// over `out`, so a reader sees the old pack or the new one, never a part.
pub fn write(spec: impl Into<DataSpec>, out: &Path, o: &PackOptions) -> Result<PackSummary> {
    let spec = &spec.into();
    if o.store == Store::Encoded && o.max_side.is_some() {
        bail_user!("--max-side resizes decoded images: it needs --store raw (--store encoded keeps the files' bytes)");
    }
    if o.max_side == Some(0) {
        bail_user!("--max-side must be at least 1");
    }
    if out.is_dir() {
        bail_user!(
            "--out {} is a directory; name the pack file, e.g. {}",
            out.display(),
            out.join("train.pack").display()
        );
    }
    let data = &spec.path;
    if spec.labels.is_none() && data.is_file() && is_pack(data) {
        bail_user!("--data {} is a pack already", data.display());
    }
    let source = PackSource::read(spec)?;
    let set = &source.set;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(o.workers.max(1))
        .build()
        .context("starting packing threads")?;
    crate::atomic::write_file_with(out, |f| {
        let mut w = BufWriter::with_capacity(1 << 22, f);
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&0u32.to_le_bytes())?;
        let n = set.len();
        let bar = crate::report::progress::count_bar(n as u64, "packing");
        let (mut records, mut unreadable, mut offset) = (Vec::new(), Vec::new(), HEAD);
        for start in (0..n).step_by(CHUNK) {
            let chunk = start..(start + CHUNK).min(n);
            let items: Vec<Result<(Vec<u8>, u32, u32)>> =
                pool.install(|| chunk.clone().into_par_iter().map(|i| read_one(&set.samples, i, o)).collect());
            for (k, item) in items.into_iter().enumerate() {
                let label = set.samples.label(start + k);
                match item {
                    Ok((bytes, width, height)) => {
                        w.write_all(&bytes)
                            .with_context(|| format!("writing {}", out.display()))?;
                        records.push(Record {
                            file: start + k,
                            label,
                            offset,
                            len: bytes.len() as u64,
                            width,
                            height,
                        });
                        offset += bytes.len() as u64;
                    }
                    Err(e) => unreadable.push((set.samples.path(start + k), e.root_cause().to_string())),
                }
            }
            bar.inc(chunk.len() as u64);
        }
        bar.finish_and_clear();
        let index = Index {
            store: o.store,
            max_side: o.max_side,
            classes: set.classes.clone(),
            root: source.root.clone(),
            files: source.files.clone(),
            dirs: source.dirs.clone(),
            records,
            source: source.packed_from.clone(),
        };
        // A class whose every image was unreadable would train without it: refuse.
        let invalid = |e: anyhow::Error| crate::error::user_error(format!("--data {}: {e}", data.display()));
        index.validate(offset).map_err(invalid)?;
        let json = serde_json::to_vec(&index)?;
        w.write_all(&json)?;
        w.write_all(&offset.to_le_bytes())?;
        w.write_all(&(json.len() as u64).to_le_bytes())?;
        w.write_all(END)?;
        w.flush().with_context(|| format!("writing {}", out.display()))?;
        Ok(PackSummary {
            images: index.records.len(),
            bytes: offset + json.len() as u64 + FOOT,
            unreadable,
        })
    })
}

/// What a pack is made from, and what its freshness check will compare with.
struct PackSource {
    set: Dataset,
    /// The folder packed (absolute), or the shards' folder.
    root: PathBuf,
    files: Vec<SourceFile>,
    dirs: Vec<SourceDir>,
    packed_from: Option<PackedFrom>,
}

impl PackSource {
    fn read(spec: &DataSpec) -> Result<PackSource> {
        let data = &spec.path;
        let absolute = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()));
        if spec.labels.is_none() && !super::source::is_sharded(data) {
            let folder = ImageFolder::scan(data, "--data")?;
            let (dirs, files) = (source_dirs(&folder)?, source_files(&folder)?);
            return Ok(PackSource {
                root: absolute(data)?,
                set: Dataset::of_folder(folder),
                files,
                dirs,
                packed_from: None,
            });
        }
        let set = Dataset::open(spec.clone(), "--data")?;
        let names = |i| set.samples.name(i).to_string_lossy().into_owned();
        let (root, files, packed_from) = match &set.kind {
            SourceKind::Labelled { file: csv, .. } => {
                let root = absolute(data)?;
                let files = stat_files(&root, set.len(), |i| set.samples.name(i))?;
                (root, files, PackedFrom::LabelFile(stat_file(&absolute(csv)?)?))
            }
            _ => {
                let (paths, root) = set.samples.shard_files().expect("tar shards or parquet files");
                let files = (0..set.len())
                    .map(|i| {
                        let (size, mtime_ns) = set.samples.size_and_mtime(i)?;
                        Ok(SourceFile { name: names(i), size, mtime_ns })
                    })
                    .collect::<Result<_>>()?;
                let paths = paths.iter().map(|p| stat_file(&absolute(p)?)).collect::<Result<_>>()?;
                (absolute(root).unwrap_or_default(), files, PackedFrom::Shards(paths))
            }
        };
        Ok(PackSource {
            set,
            root,
            files,
            dirs: Vec::new(),
            packed_from: Some(packed_from),
        })
    }
}

/// A file's (absolute) path, size and modification time.
fn stat_file(path: &Path) -> Result<SourceFile> {
    let m = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(SourceFile {
        name: path.to_string_lossy().into_owned(),
        size: m.len(),
        mtime_ns: mtime_ns(&m),
    })
}

/// Sample `i` as the pack stores it: its file's bytes (checked to have a readable header), or
/// its pixels, decoded and shrunk to `max_side`. Returns the bytes and the pixel size (0×0 for
/// encoded images).
fn read_one(samples: &Samples, i: usize, o: &PackOptions) -> Result<(Vec<u8>, u32, u32)> {
    let path = samples.path(i);
    let bytes = match samples.read(i)? {
        Stored::Encoded(b) => b.into_owned(),
        Stored::Raw(_) => unreachable!("a pack is never packed again"),
    };
    match o.store {
        Store::Encoded => {
            image::ImageReader::new(std::io::Cursor::new(&bytes))
                .with_guessed_format()?
                .into_dimensions()
                .with_context(|| format!("cannot decode image {}", path.display()))?;
            Ok((bytes, 0, 0))
        }
        Store::Raw => {
            let img = decode_bytes(&bytes, &path)?;
            let (w, h) = img.dimensions();
            match o.max_side.map(|m| shorter_side_to(w, h, m)) {
                Some((nw, nh)) if (nw, nh) != (w, h) => Ok((resize(RgbView::from(&img), nw, nh)?, nw, nh)),
                _ => Ok((img.into_raw(), w, h)),
            }
        }
    }
}

/// torchvision's Resize(m) size for a w×h image whose shorter side is over m: the shorter side
/// becomes m, the longer int(m × long / short). Smaller images keep their size.
pub fn shorter_side_to(w: u32, h: u32, m: u32) -> (u32, u32) {
    if w.min(h) <= m {
        return (w, h);
    }
    let long = |l: u32, s: u32| ((m as u64 * l as u64) / s as u64).max(1) as u32;
    if w <= h {
        (m, long(h, w))
    } else {
        (long(w, h), m)
    }
}

/// Antialiased bilinear resize of a whole image (PIL's `resize(..., BILINEAR)`).
pub fn resize(img: RgbView<'_>, w: u32, h: u32) -> Result<Vec<u8>> {
    let src = fr::images::ImageRef::new(img.width, img.height, img.px, fr::PixelType::U8x3).context("source image")?;
    let mut out = vec![0u8; (w * h * 3) as usize];
    let mut dst = fr::images::Image::from_slice_u8(w, h, &mut out, fr::PixelType::U8x3).context("destination")?;
    let opts = fr::ResizeOptions::new().resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear));
    fr::Resizer::new().resize(&src, &mut dst, &opts).context("resize")?;
    Ok(out)
}

/// Every image file of `folder` with its size and modification time, in folder order.
fn source_files(folder: &ImageFolder) -> Result<Vec<SourceFile>> {
    stat_files(&folder.root, folder.len(), |i| folder.catalog.name(i))
}

/// The files `name(0..n)` under `root` with their sizes and modification times. The files of a
/// directory are `stat`ed relative to it (no walk of the whole path each time), the directories
/// in parallel.
fn stat_files<'a>(root: &Path, n: usize, name: impl Fn(usize) -> &'a Path + Sync) -> Result<Vec<SourceFile>> {
    // Runs of consecutive files in one directory (a folder's files are listed together).
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=n {
        if i == n || name(i).parent() != name(start).parent() {
            runs.push(start..i);
            start = i;
        }
    }
    let per_dir: Vec<Result<Vec<SourceFile>>> = runs
        .into_par_iter()
        .map(|run| {
            let dir = root.join(name(run.start).parent().unwrap_or(Path::new("")));
            let dir = File::open(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
            run.map(|i| {
                let meta = stat_at(&dir, name(i).file_name().unwrap_or_default())
                    .with_context(|| format!("cannot read {}", root.join(name(i)).display()))?;
                Ok(SourceFile {
                    name: name(i).to_string_lossy().into_owned(),
                    size: meta.st_size as u64,
                    mtime_ns: meta.st_mtime * 1_000_000_000 + meta.st_mtime_nsec,
                })
            })
            .collect()
        })
        .collect();
    let mut files = Vec::with_capacity(n);
    for d in per_dir {
        files.append(&mut d?);
    }
    Ok(files)
}

/// A file's modification time in nanoseconds since the Unix epoch, as packs record it.
pub(crate) fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

/// The directories of `folder` with their modification times.
fn source_dirs(folder: &ImageFolder) -> Result<Vec<SourceDir>> {
    folder
        .dirs
        .par_iter()
        .map(|d| {
            let p = folder.root.join(d);
            let m = std::fs::metadata(&p).with_context(|| format!("cannot read {}", p.display()))?;
            Ok(SourceDir {
                name: d.to_string_lossy().into_owned(),
                mtime_ns: mtime_ns(&m),
            })
        })
        .collect()
}

/// `stat` of `name` in the open directory `dir` (symlinks followed).
fn stat_at(dir: &File, name: &std::ffi::OsStr) -> std::io::Result<libc::stat> {
    use std::os::fd::AsRawFd;
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name))?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a valid directory descriptor, a NUL-terminated name and room for the result.
    match unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), st.as_mut_ptr(), 0) } {
        // SAFETY: filled in by a successful fstatat.
        0 => Ok(unsafe { st.assume_init() }),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Whether `path` starts as a pack does.
pub fn is_pack(path: &Path) -> bool {
    let mut head = [0u8; 8];
    File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|_| &head == MAGIC)
}

/// The fuzzing entry point: any bytes as a pack file's contents. Errors, never panics.
pub fn parse_bytes(bytes: &[u8]) -> Result<Index> {
    parse(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_sizes_follow_torchvision() {
        assert_eq!(shorter_side_to(150, 100, 64), (96, 64));
        assert_eq!(shorter_side_to(100, 150, 64), (64, 96));
        assert_eq!(shorter_side_to(101, 333, 50), (50, 164));
        assert_eq!(shorter_side_to(32, 32, 64), (32, 32), "never enlarged");
    }
}
