//! `ringtrain pack`: writes a pack (`source/pack.rs` reads it and describes the format) from an
//! ImageFolder, a folder with a label file, tar shards or parquet files, recording what it was
//! made from so that a pack older than its source is refused.
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fast_image_resize as fr;
use rayon::prelude::*;

use crate::bail_user;
use crate::data::decode::decode_bytes;
use crate::data::pixels::RgbView;
use crate::data::source::common::{stat_file, stat_files, SourceDir, SourceFile};
use crate::data::source::folder::ImageFolder;
use crate::data::source::pack::{is_pack, Index, PackedFrom, Record, Store, END, FOOT, HEAD, MAGIC, VERSION};
use crate::data::source::{is_sharded, DataSpec, Dataset, Samples, SourceKind, Stored};

/// Images decoded (or read) at once while packing: enough to keep every thread busy, few
/// enough that memory stays small.
const CHUNK: usize = 256;

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
        crate::data::source::refuse_remote(data, "--data")?;
        let absolute = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()));
        if spec.labels.is_none() && !is_sharded(data) && !crate::data::source::is_remote(data) {
            let folder = ImageFolder::scan(data, "--data")?;
            let (dirs, files) = (folder.dirs_now()?, folder.files_now()?);
            return Ok(PackSource {
                root: absolute(data)?,
                set: Dataset::of(data.clone(), folder.opened()),
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
                let Some(shard_files) = set.samples.shard_files() else {
                    bail_user!("--data {}: a pack is made of a folder, tar shards or parquet files, not of another pack", data.display());
                };
                let files = (0..set.len())
                    .map(|i| {
                        let (size, mtime_ns) = set.samples.size_and_mtime(i)?;
                        Ok(SourceFile { name: names(i), size, mtime_ns })
                    })
                    .collect::<Result<_>>()?;
                let root = shard_files.common_parent();
                (absolute(&root).unwrap_or(root), files, PackedFrom::Shards(shard_files.source_files()?))
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
