//! `ringtrain predict`: class probabilities for image files, flat folders or ImageFolder trees,
//! with the checkpoint's own preprocessing; or with an exported ONNX file's, run by ONNX Runtime
//! (`onnx`). Unreadable files are reported and skipped.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use image::RgbImage;
use rayon::prelude::*;
use tch::{Device, Kind, Tensor};

use crate::atomic;
use crate::bail_user;
use crate::data::augment::transform::{Interpolation, Transform};
use crate::data::load::loader::{Loader, LoaderOptions};
use crate::data::load::normalize::Normalizer;
use crate::data::load::sample::{decode_sample, Batch};
use crate::data::source::common::{is_image_file, walk_images};
use crate::data::source::{Dataset, Samples};
use crate::device::DeviceSpec;
use crate::infer::onnx::{self, OnnxModel};
use crate::model::Model;
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
    (path.is_file() && crate::data::source::pack::is_pack(path)) || crate::data::source::is_sharded(path) || crate::data::source::is_remote(path)
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
    /// A checkpoint directory (e.g. runs/x/best), or an ONNX file `ringtrain export` wrote.
    pub checkpoint: PathBuf,
    pub inputs: Vec<PathBuf>,
    pub out: PathBuf,
    pub topk: usize,
    /// Keep every class's logit (written as logit_<class> columns).
    pub logits: bool,
    pub batch_size: usize,
    pub device: DeviceSpec,
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
    /// Seconds from the first batch asked of the loader to the last prediction.
    pub seconds: f64,
    /// Of those, the seconds in the model (its input in, its output back on the host).
    pub model_seconds: f64,
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

/// What predicts: a checkpoint's model in libtorch, or an exported file in ONNX Runtime.
enum Predictor {
    Checkpoint { model: Model, normalize: Normalizer },
    Onnx(OnnxModel),
}

impl Predictor {
    /// A loader's batch → the output, f32 [N, classes] on the CPU.
    fn forward(&mut self, images: &Tensor) -> Result<Tensor> {
        match self {
            Predictor::Checkpoint { model, normalize } => {
                let x = normalize.apply(images);
                Ok(model.forward(&x, false).to_kind(Kind::Float).to_device(Device::Cpu))
            }
            Predictor::Onnx(m) => m.forward(images),
        }
    }
}

/// What predicting takes from a checkpoint or an exported file, beside the model.
struct Preprocess {
    classes: Vec<String>,
    transform: Transform,
    whole_jpeg: bool,
    /// Normalised by the loader's workers (else uint8 pixels handed to the model).
    normalize: Option<Normalizer>,
    /// The model gives probabilities, not logits.
    softmax: bool,
    /// The model takes images whole, as decoded, and resizes them itself.
    whole_images: bool,
}

fn open(o: &PredictOptions) -> Result<(Predictor, Preprocess)> {
    if onnx::is_onnx_file(&o.checkpoint) {
        if let DeviceSpec::Cuda(_) = o.device {
            bail_user!(
                "--device {}: ONNX files run on the CPU (ONNX Runtime's CPU build); predict on the checkpoint \
                 directory to use a GPU",
                o.device
            );
        }
        let model = OnnxModel::open(&o.checkpoint, o.workers)?;
        let m = &model.meta;
        if o.logits && m.softmax {
            bail_user!(
                "--logits: {} gives probabilities (exported with --softmax), not logits",
                o.checkpoint.display()
            );
        }
        if let (Some(filter), true) = (o.interpolation, m.resize_in_graph) {
            bail_user!(
                "--interpolation {filter}: {} resizes inside its graph, with its own filter ({})",
                o.checkpoint.display(),
                m.interpolation
            );
        }
        let pre = Preprocess {
            classes: m.classes.clone(),
            transform: m.eval_transform(o.interpolation),
            whole_jpeg: m.whole_jpeg,
            normalize: model.takes_normalised().then(|| Normalizer::new(m.mean, m.std, Device::Cpu)),
            softmax: m.softmax,
            whole_images: m.resize_in_graph,
        };
        return Ok((Predictor::Onnx(model), pre));
    }
    if o.checkpoint.is_file() {
        bail_user!(
            "--checkpoint {} is a file: give a checkpoint directory (e.g. runs/x/best) or an ONNX file (.onnx) \
             that `ringtrain export` wrote",
            o.checkpoint.display()
        );
    }
    let device = o.device.resolve()?;
    let (model, state) = checkpoint::load(&o.checkpoint, device)?;
    let normalize = Normalizer::new(state.mean3(), state.std3(), device);
    let pre = Preprocess {
        transform: state.eval_transform(o.interpolation),
        whole_jpeg: state.config.torchvision_compat,
        normalize: Some(normalize.shallow_clone()),
        classes: state.classes,
        softmax: false,
        whole_images: false,
    };
    Ok((Predictor::Checkpoint { model, normalize }, pre))
}

pub fn predict(o: &PredictOptions) -> Result<PredictSummary> {
    if o.topk == 0 || o.batch_size == 0 {
        bail_user!("--topk and --batch-size must be at least 1");
    }
    let (mut predictor, pre) = open(o)?;
    let classes = &pre.classes;
    let (inputs, samples) = match o.inputs.as_slice() {
        [one] if is_set(one) => set_inputs(one, classes)?,
        _ => {
            let inputs = collect_inputs(&o.inputs, classes)?;
            let samples: Vec<(PathBuf, usize)> = inputs.paths.iter().map(|p| (p.clone(), 0)).collect();
            (inputs, samples.into())
        }
    };
    let n = classes.len();
    let k = o.topk.min(n);
    let mut predictions = Vec::new();
    let started = Instant::now();
    let mut model_seconds = 0.0;
    let mut each_batch = |batch: &Batch| -> Result<()> {
        let t = Instant::now();
        let out = predictor.forward(&batch.images)?;
        model_seconds += t.elapsed().as_secs_f64();
        let probs = match pre.softmax {
            true => out.shallow_clone(),
            false => out.softmax(-1, Kind::Float),
        };
        let (p, idx) = probs.topk(k as i64, 1, true, true);
        let all = match o.logits {
            true => Some(Vec::<f32>::try_from(out.flatten(0, -1))?),
            false => None,
        };
        let p = Vec::<f64>::try_from(p.to_kind(Kind::Double).flatten(0, -1))?;
        let idx = Vec::<i64>::try_from(idx.flatten(0, -1))?;
        for (row, &i) in batch.indices.iter().enumerate() {
            let top = (0..k).map(|j| (idx[row * k + j] as usize, p[row * k + j])).collect();
            let prediction = Prediction {
                path: inputs.paths[i].clone(),
                label: inputs.labels[i],
                top,
                logits: all.as_ref().map(|v| v[row * n..(row + 1) * n].to_vec()),
            };
            predictions.push((i, prediction));
        }
        Ok(())
    };
    let unreadable = tch::no_grad(|| match pre.whole_images {
        true => each_whole_image_batch(&samples, o.batch_size, o.workers, &mut each_batch),
        false => {
            let in_order = LoaderOptions::in_order(o.batch_size, o.workers);
            let options = match &pre.normalize {
                Some(n) => in_order.for_device(n),
                None => in_order,
            };
            let options = LoaderOptions { whole_jpeg: pre.whole_jpeg, ..options };
            Loader::new(samples, pre.transform.clone(), options)?.each_readable_batch(&mut each_batch)
        }
    })?;
    // In the inputs' order (whole images are batched by size).
    predictions.sort_by_key(|(i, _)| *i);
    let summary = PredictSummary {
        predictions: predictions.into_iter().map(|(_, p)| p).collect(),
        unreadable,
        classes: pre.classes,
        seconds: started.elapsed().as_secs_f64(),
        model_seconds,
    };
    write_csv(&o.out, &summary, k)?;
    Ok(summary)
}

/// Every sample decoded whole, for a model that resizes images itself: batches of at most
/// `batch_size` images of one size each, decoded by `workers` threads; the unreadable ones
/// returned as the loader returns them.
fn each_whole_image_batch(
    samples: &Samples,
    batch_size: usize,
    workers: usize,
    mut f: impl FnMut(&Batch) -> Result<()>,
) -> Result<Vec<(PathBuf, String)>> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(workers.max(1)).build()?;
    let all: Vec<usize> = (0..samples.len()).collect();
    let mut unreadable = Vec::new();
    for chunk in all.chunks(batch_size) {
        let decoded: Vec<Result<RgbImage>> =
            pool.install(|| chunk.par_iter().map(|&i| Ok(decode_sample(samples, i, None)?.0)).collect());
        let mut by_size: BTreeMap<(u32, u32), Vec<(usize, RgbImage)>> = BTreeMap::new();
        for (&i, image) in chunk.iter().zip(decoded) {
            match image {
                Ok(image) => by_size.entry(image.dimensions()).or_default().push((i, image)),
                Err(e) => unreadable.push((samples.path(i), e.root_cause().to_string())),
            }
        }
        for ((w, h), images) in by_size {
            let pixels: Vec<u8> = images.iter().flat_map(|(_, image)| image.as_raw().iter().copied()).collect();
            let count = images.len() as i64;
            f(&Batch {
                images: Tensor::from_slice(&pixels).view([count, h as i64, w as i64, 3]),
                labels: Tensor::zeros([count], (Kind::Int64, Device::Cpu)),
                indices: images.iter().map(|(i, _)| *i).collect(),
                unreadable: vec![],
            })?;
        }
    }
    Ok(unreadable)
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
