//! `ringtrain split`: a stratified train/val split of an ImageFolder tree into a new directory
//! (`<dst>/train/<class>/...`, `<dst>/val/<class>/...`), by copy or hard link, reproducible from
//! its seed. It refuses to write into an existing directory, and builds the result under a
//! temporary name first, so an interrupted split leaves no half-filled `dst`.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rand::seq::SliceRandom;

use super::folder::ImageFolder;
use super::source::{Dataset, Samples};
use crate::bail_user;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SplitCounts {
    /// (class, train images, val images)
    pub per_class: Vec<(String, usize, usize)>,
}

/// Which files of each class go to validation: a seeded shuffle of the sorted files, the first
/// round(n × ratio) of it (at least one when the class has two or more images, never all).
pub fn plan(folder: &ImageFolder, val_ratio: f64, seed: u64) -> Vec<(PathBuf, usize, bool)> {
    plan_items(&folder.samples, folder.classes.len(), val_ratio, seed)
        .into_iter()
        .map(|(i, is_val)| (folder.samples[i].0.clone(), folder.samples[i].1, is_val))
        .collect()
}

/// `plan` over (path, class) items: (item index, goes to validation), class by class. Packs
/// name their images `<pack>/<path in the folder>`, so a pack splits as its folder does.
fn plan_items(items: &[(PathBuf, usize)], classes: usize, val_ratio: f64, seed: u64) -> Vec<(usize, bool)> {
    let mut out = Vec::new();
    for c in 0..classes {
        let mut files: Vec<usize> = (0..items.len()).filter(|&i| items[i].1 == c).collect();
        files.sort_by(|&a, &b| items[a].0.cmp(&items[b].0));
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
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (i, is_val) in plan_items(&data.samples.items, data.classes.len(), val_ratio, seed) {
        if is_val {
            val.push(i)
        } else {
            train.push(i)
        }
    }
    (data.samples.select(&train), data.samples.select(&val))
}

pub fn split(src: &Path, dst: &Path, val_ratio: f64, seed: u64, hard_link: bool) -> Result<SplitCounts> {
    if !(val_ratio > 0.0 && val_ratio < 1.0) {
        bail_user!("--val-ratio must be in (0, 1), got {val_ratio}");
    }
    if dst.exists() {
        bail_user!(
            "--dst {} already exists; split writes a new directory and never overwrites",
            dst.display()
        );
    }
    let folder = ImageFolder::scan(src, "--src")?;
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
        per_class: folder.classes.iter().map(|c| (c.clone(), 0, 0)).collect(),
    };
    let result = (|| -> Result<()> {
        for (path, c, is_val) in plan(&folder, val_ratio, seed) {
            let rel = path.strip_prefix(folder.root.join(&folder.classes[c])).unwrap_or(&path);
            let target = tmp
                .join(if is_val { "val" } else { "train" })
                .join(&folder.classes[c])
                .join(rel);
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
            f.samples
                .iter()
                .map(|s| s.0.strip_prefix(root).unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(list(&d.path().join("one")), list(&d.path().join("two")));
        // `train --val-split` holds out exactly the files `split` puts in val/.
        let (_, held_out) = stratified(&Dataset::open(&src, "--src").unwrap(), 0.3, 7);
        let mut held: Vec<PathBuf> = held_out
            .items
            .iter()
            .map(|(p, _)| p.strip_prefix(&src).unwrap().to_owned())
            .collect();
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
