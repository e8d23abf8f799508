//! `ringtrain split`: a stratified train/val split of an ImageFolder tree into a new directory
//! (`<dst>/train/<class>/...`, `<dst>/val/<class>/...`), by copy or hard link, reproducible from
//! its seed. It refuses to write into an existing directory, and builds the result under a
//! temporary name first, so an interrupted split leaves no half-filled `dst`.
use std::path::Path;

use anyhow::{Context, Result};
use rand::seq::SliceRandom;

use crate::bail_user;
use crate::data::source::folder::ImageFolder;
use crate::data::source::{Dataset, Samples};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SplitCounts {
    /// (class, train images, val images)
    pub per_class: Vec<(String, usize, usize)>,
}

/// Which samples of each class go to validation: a seeded shuffle of the class's files sorted
/// by path, the first round(n × ratio) of it (at least one when the class has two or more
/// images, never all). Returns (sample index, goes to validation), class by class. Names are
/// paths under the set's root, and a pack's are its folder's, so a pack splits as its folder does.
fn plan(samples: &Samples, classes: usize, val_ratio: f64, seed: u64) -> Vec<(usize, bool)> {
    let mut out = Vec::with_capacity(samples.len());
    for (c, mut files) in samples.by_label(classes).into_iter().enumerate() {
        files.sort_by(|&a, &b| samples.name(a).cmp(samples.name(b)));
        files.shuffle(&mut crate::seeds::split(seed, c as u64));
        let n = files.len();
        let n_val = if n >= 2 {
            ((n as f64 * val_ratio).round() as usize).clamp(1, n - 1)
        } else {
            0
        };
        out.extend(files.into_iter().enumerate().map(|(k, i)| (i, k < n_val)));
    }
    out
}

/// The same split as (train samples, val samples), for `train --val-split` without copying.
pub fn stratified(data: &Dataset, val_ratio: f64, seed: u64) -> (Samples, Samples) {
    let (train, val) = stratified_indices(data, val_ratio, seed);
    (data.samples.select(&train), data.samples.select(&val))
}

/// `stratified`'s split as indices of `data`'s samples: (train, val).
pub fn stratified_indices(data: &Dataset, val_ratio: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (i, is_val) in plan(&data.samples, data.classes.len(), val_ratio, seed) {
        if is_val {
            val.push(i)
        } else {
            train.push(i)
        }
    }
    (train, val)
}

pub fn split(src: &Path, dst: &Path, val_ratio: f64, seed: u64, hard_link: bool) -> Result<SplitCounts> {
    if !(val_ratio > 0.0 && val_ratio < 1.0) {
        bail_user!("--val-ratio must be in (0, 1), got {val_ratio}");
    }
    if dst.exists() {
        bail_user!(
            "--out {} already exists; split writes a new directory and never overwrites",
            dst.display()
        );
    }
    let data = Dataset::of(src.to_path_buf(), ImageFolder::scan(src, "--data")?.opened());
    let tmp = dst.with_file_name(format!(
        ".{}.partial",
        dst.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    let mut counts = SplitCounts {
        per_class: data.classes.iter().map(|c| (c.clone(), 0, 0)).collect(),
    };
    let result = (|| -> Result<()> {
        for (i, is_val) in plan(&data.samples, data.classes.len(), val_ratio, seed) {
            let (path, c) = (data.samples.path(i), data.samples.label(i));
            // The name is <class>/<path in the class folder>.
            let target = tmp.join(if is_val { "val" } else { "train" }).join(data.samples.name(i));
            std::fs::create_dir_all(target.parent().expect("has a parent"))?;
            if hard_link {
                std::fs::hard_link(&path, &target)
                    .with_context(|| format!("linking {} (use copies across file systems)", path.display()))?;
            } else {
                std::fs::copy(&path, &target).with_context(|| format!("copying {}", path.display()))?;
            }
            let entry = &mut counts.per_class[c];
            if is_val {
                entry.2 += 1;
            } else {
                entry.1 += 1;
            }
        }
        std::fs::rename(&tmp, dst).with_context(|| format!("renaming into {}", dst.display()))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result.map(|_| counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn split_is_stratified_reproducible_and_refuses_to_overwrite() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        for (c, n) in [("a", 10), ("b", 3)] {
            std::fs::create_dir_all(src.join(c)).unwrap();
            for i in 0..n {
                image::RgbImage::new(2, 2)
                    .save(src.join(c).join(format!("{i}.png")))
                    .unwrap();
            }
        }
        let counts = split(&src, &d.path().join("one"), 0.3, 7, false).unwrap();
        assert_eq!(counts.per_class, vec![("a".to_string(), 7, 3), ("b".to_string(), 2, 1)]);
        split(&src, &d.path().join("two"), 0.3, 7, true).unwrap();
        let list = |root: &Path| {
            let f = ImageFolder::scan(&root.join("val"), "--val").unwrap();
            (0..f.len())
                .map(|i| f.path(i).strip_prefix(root).unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(list(&d.path().join("one")), list(&d.path().join("two")));
        // `train --val-split` holds out exactly the files `split` puts in val/.
        let (_, held_out) = stratified(&Dataset::open(&src, "--data").unwrap(), 0.3, 7);
        let mut held: Vec<PathBuf> = (0..held_out.len()).map(|i| held_out.name(i).to_owned()).collect();
        let mut listed: Vec<PathBuf> = list(&d.path().join("one"))
            .iter()
            .map(|p| p.strip_prefix("val").unwrap().to_owned())
            .collect();
        held.sort();
        listed.sort();
        assert_eq!(held, listed);
        let e = split(&src, &d.path().join("one"), 0.3, 7, false).unwrap_err();
        assert!(e.to_string().contains("already exists"));
    }
}
