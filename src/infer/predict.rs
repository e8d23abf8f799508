//! `ringtrain predict`: class probabilities for image files, flat folders or ImageFolder trees,
//! with the checkpoint's own preprocessing. Unreadable files are reported and skipped.
use std::path::{Path, PathBuf};

use anyhow::Result;
use tch::{Device, Kind};

use crate::atomic;
use crate::bail_user;
use crate::data::augment::transform::Interpolation;
use crate::data::load::loader::{Loader, LoaderOptions};
use crate::data::load::normalize::Normalizer;
use crate::data::source::common::{is_image_file, walk_images};
use crate::data::source::{Dataset, Samples};
use crate::train::lifecycle::checkpoint;

/// The images to predict, with their true class where the input was an ImageFolder tree whose
/// sub-directories are the checkpoint's classes.
#[derive(Debug, Default)]
pub struct Inputs {
    pub paths: Vec<PathBuf>,
    pub labels: Vec<Option<usize>>,
}

pub fn collect_inputs(inputs: &[PathBuf], classes: &[String]) -> Result<Inputs> {
    let mut out = Inputs::default();
    for input in inputs {
        if is_set(input) {
            bail_user!(
                "{} is a pack, tar shards or parquet files: predict takes one alone, not with other inputs",
                input.display()
            );
        }
        if !input.exists() {
            bail_user!("input does not exist: {}", input.display());
        }
        if input.is_file() {
            out.paths.push(input.clone());
            out.labels.push(None);
            continue;
        }
        let mut subdirs: Vec<PathBuf> = std::fs::read_dir(input)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        subdirs.sort();
        let class_of = |d: &Path| {
            d.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| classes.iter().position(|c| c == n))
        };
        let labelled = !subdirs.is_empty() && subdirs.iter().all(|d| class_of(d).is_some());
        if labelled {
            let mut top: Vec<PathBuf> = std::fs::read_dir(input)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && is_image_file(p))
                .collect();
            top.sort();
            out.labels.extend(top.iter().map(|_| None));
            out.paths.extend(top);
            for d in &subdirs {
                let mut files = Vec::new();
                walk_images(d, &mut files)?;
                out.labels.extend(files.iter().map(|_| class_of(d)));
                out.paths.extend(files);
            }
        } else {
            let mut files = Vec::new();
            walk_images(input, &mut files)?;
            out.labels.extend(files.iter().map(|_| None));
            out.paths.extend(files);
        }
    }
    if out.paths.is_empty() {
        bail_user!(
            "no images found in the inputs ({})",
            inputs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(out)
}

/// A pack, tar shards or parquet files: read as a data set, not as image files.
fn is_set(path: &Path) -> bool {
    (path.is_file() && crate::data::source::pack::is_pack(path)) || crate::data::source::is_sharded(path)
}

/// A pack's, tar shards' or parquet files' images as inputs, labelled by class name where the
/// checkpoint has the class.
fn set_inputs(path: &Path, classes: &[String]) -> Result<(Inputs, Samples)> {
    let set = Dataset::open(path, "input")?;
    let label = |c: usize| classes.iter().position(|k| *k == set.classes[c]);
    let inputs = Inputs {
        paths: (0..set.len()).map(|i| set.samples.path(i)).collect(),
        labels: (0..set.len()).map(|i| label(set.samples.label(i))).collect(),
    };
    Ok((inputs, set.samples))
}

pub struct PredictOptions {
    pub checkpoint: PathBuf,
    pub inputs: Vec<PathBuf>,
    pub out: PathBuf,
    pub topk: usize,
    /// Keep every class's logit (written as logit_<class> columns).
    pub logits: bool,
    pub batch_size: usize,
    pub device: Device,
    pub workers: usize,
    /// The resize filter; None: the run's (the checkpoint's).
    pub interpolation: Option<Interpolation>,
}

#[derive(Debug, Clone)]
pub struct Prediction {
    pub path: PathBuf,
    pub label: Option<usize>,
    /// (class index, probability), best first.
    pub top: Vec<(usize, f64)>,
    /// The model's output for every class, with `--logits`.
    pub logits: Option<Vec<f32>>,
}

pub struct PredictSummary {
    pub predictions: Vec<Prediction>,
    pub unreadable: Vec<(PathBuf, String)>,
    pub classes: Vec<String>,
}

impl PredictSummary {
    /// Accuracy over the labelled inputs, if any.
    pub fn accuracy(&self) -> Option<(f64, usize)> {
        let labelled: Vec<_> = self.predictions.iter().filter(|p| p.label.is_some()).collect();
        (!labelled.is_empty()).then(|| {
            let correct = labelled.iter().filter(|p| p.label == Some(p.top[0].0)).count();
            (correct as f64 / labelled.len() as f64, labelled.len())
        })
    }
}

pub fn predict(o: &PredictOptions) -> Result<PredictSummary> {
    if o.topk == 0 || o.batch_size == 0 {
        bail_user!("--topk and --batch-size must be at least 1");
    }
    let (model, state) = checkpoint::load(&o.checkpoint, o.device)?;
    let (inputs, samples) = match o.inputs.as_slice() {
        [one] if is_set(one) => set_inputs(one, &state.classes)?,
        _ => {
            let inputs = collect_inputs(&o.inputs, &state.classes)?;
            let samples: Vec<(PathBuf, usize)> = inputs.paths.iter().map(|p| (p.clone(), 0)).collect();
            (inputs, samples.into())
        }
    };
    let normalize = Normalizer::new(state.mean3(), state.std3(), o.device);
    let loader = Loader::new(
        samples,
        state.eval_transform(o.interpolation),
        LoaderOptions {
            whole_jpeg: state.config.torchvision_compat,
            ..LoaderOptions::in_order(o.batch_size, o.workers).for_device(&normalize)
        },
    )?;
    let k = o.topk.min(state.classes.len());
    let mut predictions = Vec::new();
    let unreadable = tch::no_grad(|| {
        loader.each_readable_batch(|batch| {
            let x = normalize.apply(&batch.images);
            let logits = model.forward(&x, false).to_kind(Kind::Float);
            let probs = logits.softmax(-1, Kind::Float);
            let (p, idx) = probs.topk(k as i64, 1, true, true);
            let all = match o.logits {
                true => Some(Vec::<f32>::try_from(logits.to_device(Device::Cpu).flatten(0, -1))?),
                false => None,
            };
            let n = state.classes.len();
            let p = Vec::<f64>::try_from(p.to_kind(Kind::Double).to_device(Device::Cpu).flatten(0, -1))?;
            let idx = Vec::<i64>::try_from(idx.to_device(Device::Cpu).flatten(0, -1))?;
            for (row, &i) in batch.indices.iter().enumerate() {
                let top = (0..k).map(|j| (idx[row * k + j] as usize, p[row * k + j])).collect();
                predictions.push(Prediction {
                    path: inputs.paths[i].clone(),
                    label: inputs.labels[i],
                    top,
                    logits: all.as_ref().map(|v| v[row * n..(row + 1) * n].to_vec()),
                });
            }
            Ok(())
        })
    })?;
    let summary = PredictSummary {
        predictions,
        unreadable,
        classes: state.classes,
    };
    write_csv(&o.out, &summary, k)?;
    Ok(summary)
}

/// path, predicted, probability, label, correct, then top-k class/probability pairs, then (with
/// `--logits`) one logit_<class> column per class.
fn write_csv(path: &Path, s: &PredictSummary, k: usize) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header = vec![
        "path".to_string(),
        "predicted".into(),
        "probability".into(),
        "label".into(),
        "correct".into(),
    ];
    for j in 1..=k {
        header.push(format!("top{j}_class"));
        header.push(format!("top{j}_probability"));
    }
    let with_logits = s.predictions.first().is_some_and(|p| p.logits.is_some());
    if with_logits {
        header.extend(s.classes.iter().map(|c| format!("logit_{c}")));
    }
    w.write_record(&header)?;
    for p in &s.predictions {
        let (best, prob) = p.top[0];
        let mut rec = vec![
            p.path.display().to_string(),
            s.classes[best].clone(),
            format!("{prob:.6}"),
            p.label.map(|l| s.classes[l].clone()).unwrap_or_default(),
            p.label.map(|l| (l == best).to_string()).unwrap_or_default(),
        ];
        for &(c, pr) in &p.top {
            rec.push(s.classes[c].clone());
            rec.push(format!("{pr:.6}"));
        }
        // Shortest text that reads back as the same f32.
        rec.extend(p.logits.iter().flatten().map(|l| format!("{l:e}")));
        w.write_record(&rec)?;
    }
    let bytes = w.into_inner().map_err(|e| anyhow::anyhow!("writing CSV: {e}"))?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    atomic::write_file(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        image::RgbImage::new(4, 4).save(p).unwrap();
    }

    #[test]
    fn inputs_are_files_flat_folders_or_labelled_trees() {
        let d = tempfile::tempdir().unwrap();
        let classes = vec!["cat".to_string(), "dog".to_string()];
        img(&d.path().join("tree/dog/1.png"));
        img(&d.path().join("tree/cat/2.png"));
        img(&d.path().join("flat/a.png"));
        img(&d.path().join("flat/other/b.png"));
        img(&d.path().join("single.png"));
        let i = collect_inputs(
            &[
                d.path().join("tree"),
                d.path().join("flat"),
                d.path().join("single.png"),
            ],
            &classes,
        )
        .unwrap();
        let names: Vec<_> = i
            .paths
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names, vec!["2.png", "1.png", "a.png", "b.png", "single.png"]);
        assert_eq!(i.labels, vec![Some(0), Some(1), None, None, None]);
        let e = collect_inputs(&[d.path().join("missing")], &classes).unwrap_err();
        assert!(e.to_string().contains("input does not exist"));
    }
}
