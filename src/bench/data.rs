//! `ringtrain bench-data`: the input pipeline alone, or feeding the training step (`--model`),
//! measured as `bench/torch_loader.py` measures PyTorch's ImageFolder + DataLoader: the
//! training transforms (RandomResizedCrop + horizontal flip + normalisation), shuffled,
//! drop_last, `epochs` passes, the first batch untimed (it includes start-up). `--vs-pytorch`
//! runs that script with the same settings in the same invocation.
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use tch::{Device, Kind};

use super::{amp_name, device_name, run_reference, TrainStep};
use crate::bail_user;
use crate::data::augment::transform::{Interpolation, Transform};
use crate::data::load::cache::{self, CacheMode, CachePlan};
use crate::data::load::loader::{Loader, LoaderOptions};
use crate::data::load::normalize::Normalizer;
use crate::data::source::{DataSpec, Dataset};
use crate::data::{IMAGENET_MEAN, IMAGENET_STD};
use crate::device::synchronize as sync;
use crate::data::augment::policy::{AutoPolicy, Policy, PolicyName};
use crate::data::augment::timm_rand::TimmRand;
use crate::say;

#[derive(Debug, Clone)]
pub struct DataBenchOptions {
    pub data: DataSpec,
    pub img_size: u32,
    pub batch_size: usize,
    pub workers: usize,
    pub epochs: usize,
    pub device: Device,
    /// Feed this model's training step too.
    pub model: Option<crate::model::ModelKind>,
    pub amp: Option<Kind>,
    pub channels_last: bool,
    /// Keep decoded images in RAM, as training does (`--cache`): when it does, only the epochs
    /// after the first, which read the cache, are timed.
    pub cache: CacheMode,
    /// The whole set on the device, batches made there (`--data-on-device`).
    pub on_device: bool,
    /// An augmentation policy after the crop and flip (`--auto-augment`).
    pub auto_augment: Option<PolicyName>,
}

/// Images per second through the loader (and the step, with a model).
pub fn run(o: &DataBenchOptions) -> Result<f64> {
    if o.on_device && o.auto_augment.is_some() {
        // As train refuses it: the batches made on the device take no policy, and the PyTorch
        // side would time one.
        bail_user!("--data-on-device does not do --auto-augment (its policies run in the host pipeline); drop one of the two");
    }
    let data = Dataset::open(o.data.clone(), "--data")?;
    let cache = match o.on_device {
        true => CachePlan::off("data on the device"),
        false => cache::plan(o.cache, &[&data.samples], cache::default_budget(1)),
    };
    let warm_only = cache.budget.is_some();
    say!("{}", cache.note);
    let normalize = Normalizer::new(IMAGENET_MEAN, IMAGENET_STD, o.device).channels_last(o.channels_last);
    let mut loader = Loader::new(
        data.samples,
        {
            let crop = Transform::random_resized_crop(o.img_size, Interpolation::Bilinear);
            match o.auto_augment {
                None => crop,
                Some(PolicyName::Torchvision(kind)) => {
                    crop.with_policy(AutoPolicy::Torchvision(Policy::torchvision(kind)))
                }
                // As timm's training transform: ImageNet's mean colour as the fill, and the
                // crop's bilinear filter.
                Some(PolicyName::TimmRand(spec)) => crop.with_policy(AutoPolicy::TimmRand(TimmRand {
                    spec,
                    filter: crate::data::augment::pil::Filter::Bilinear,
                    fill: IMAGENET_MEAN.map(|m| (255.0 * m).round_ties_even() as u8),
                })),
            }
        },
        LoaderOptions {
            shuffle: true,
            drop_last: true,
            skip_unreadable: false,
            cache: cache.budget.clone(),
            ..LoaderOptions::in_order(o.batch_size, o.workers).for_device(&normalize)
        },
    )?;
    if o.on_device {
        loader.put_on_device(&normalize)?;
    }
    let timed_epochs = o.epochs - warm_only as usize;
    if warm_only && timed_epochs == 0 {
        bail_user!(
            "with the RAM cache on, the epochs after the first are timed: give --epochs 2 or more, or --cache off"
        );
    }
    if loader.batches_per_epoch() * timed_epochs < 2 {
        bail_user!(
            "--data {} has {} images: too few for two batches of --batch-size {} in {} epochs",
            o.data.path.display(),
            loader.num_samples(),
            o.batch_size,
            o.epochs
        );
    }
    if o.device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(true);
    }
    let mut step = match &o.model {
        Some(m) => Some(TrainStep::new(
            *m,
            o.img_size,
            data.classes.len() as i64,
            o.device,
            o.amp,
            o.channels_last,
            Default::default(),
        )?),
        None => None,
    };
    let (mut n, mut t0) = (0usize, None);
    for epoch in 0..o.epochs {
        let timed = epoch >= o.epochs - timed_epochs;
        for batch in loader.epoch(epoch as u64) {
            let batch = batch?;
            let x = normalize.apply(&batch.images);
            if let Some(s) = step.as_mut() {
                s.step(&x, &normalize.labels(&batch.labels))?;
            }
            if !timed {
                continue;
            }
            if t0.is_none() {
                sync(o.device);
                t0 = Some(Instant::now());
                continue;
            }
            n += x.size()[0] as usize;
        }
    }
    sync(o.device);
    Ok(n as f64 / t0.expect("two batches or more").elapsed().as_secs_f64())
}

/// The same measurement of PyTorch's DataLoader by `script` (bench/torch_loader.py) in `python`,
/// on the folder itself (a pack's source folder: PyTorch reads files).
pub fn run_pytorch(o: &DataBenchOptions, python: &str, script: &Path) -> Result<f64> {
    if o.data.labels.is_some() || crate::data::source::is_sharded(&o.data.path) || crate::data::source::is_remote(&o.data.path) {
        bail_user!("--vs-pytorch compares PyTorch's ImageFolder: give --data a folder of class folders or a pack of one");
    }
    let folder = match o.data.path.is_file() {
        true => {
            let root = crate::data::source::pack::Pack::folder_of(&o.data.path, "--data")?;
            if !root.is_dir() {
                bail_user!(
                    "--vs-pytorch reads the pack's folder, {}, which is not there",
                    root.display()
                );
            }
            root
        }
        false => o.data.path.clone(),
    };
    let args = [
        folder.display().to_string(),
        o.img_size.to_string(),
        o.batch_size.to_string(),
        o.workers.to_string(),
        o.epochs.to_string(),
        o.model.map_or("none".into(), |m| m.to_string()),
        amp_name(o.amp).into(),
        (o.channels_last as u8).to_string(),
        device_name(o.device),
        o.auto_augment.map_or("none".into(), |p| p.to_string()),
    ];
    let v = run_reference(python, script, &args)?;
    v["images_per_s"]
        .as_f64()
        .with_context(|| format!("no images_per_s in the PyTorch reference's output: {v}"))
}
