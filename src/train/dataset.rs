//! The run's data: the training and validation folders (or a stratified split of one), their
//! loaders sharded over ranks, the normalisation on the device, and the epoch's micro-batches
//! as the training step takes them.
use std::cell::RefCell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::Result;
use tch::Tensor;

use super::context::RankContext;
use super::eval::{evaluate, EvalResult};
use super::trainer::{MicroPos, Trainer};
use crate::config::TrainConfig;
use crate::data::erasing::RandomErasing;
use crate::data::folder::ImageFolder;
use crate::data::loader::{Batch, Loader, LoaderOptions, Shard};
use crate::data::transform::Transform;
use crate::data::Normalizer;
use crate::error::user_error;
use crate::report::classification::ClassificationReport;
use crate::report::progress::warn_unreadable;

use super::state::Validation;

pub struct TrainData {
    pub classes: Vec<String>,
    pub train: Loader,
    pub val: Loader,
    pub normalize: Normalizer,
    pub workers: usize,
    rank_batch: usize,
    accum: usize,
    /// Unreadable files warned about: one warning each for the whole run.
    warned: RefCell<HashSet<PathBuf>>,
}

/// A training micro-batch, normalised on the device, at the rank's batch size.
pub struct TrainBatch {
    pub pos: MicroPos,
    pub x: Tensor,
    pub y: Tensor,
    /// Images of the batch that could not be read (replaced by readable ones).
    pub unreadable: usize,
}

impl TrainData {
    pub fn load(cfg: &TrainConfig, ctx: &RankContext) -> Result<Self> {
        let data_dir = cfg.data.as_ref().expect("checked by preflight");
        let train_folder = ImageFolder::scan(data_dir, "--data")?;
        let (train_samples, val_samples) = match &cfg.val {
            Some(v) => {
                let val_folder = ImageFolder::scan(v, "--val")?;
                val_folder.check_same_classes(&train_folder)?;
                (train_folder.samples.clone(), val_folder.samples)
            }
            None => crate::data::split::stratified(&train_folder, cfg.val_split, cfg.seed),
        };
        let n_train = train_samples.len();
        let probe: Vec<PathBuf> = train_samples.iter().take(1000).map(|s| s.0.clone()).collect();
        check_something_decodes(&probe, data_dir)?;
        if cfg.batch_size > n_train {
            return Err(user_error(format!(
                "--batch-size {} is larger than the {n_train} training images in {}: no full batch exists",
                cfg.batch_size,
                data_dir.display()
            )));
        }
        let device = ctx.pg.device;
        let channels_last = crate::device::channels_last(cfg.channels_last, device);
        let normalize = Normalizer::new(cfg.mean3(), cfg.std3(), device).channels_last(channels_last);
        let (world, rank_batch, workers) = (ctx.world(), ctx.rank_batch, ctx.workers(cfg));
        let shard = |pad| {
            (world > 1).then_some(Shard {
                rank: ctx.pg.rank,
                world,
                pad,
            })
        };
        let base = LoaderOptions {
            seed: cfg.seed,
            prefetch: cfg.prefetch,
            skip_unreadable: !cfg.strict,
            whole_jpeg: cfg.torchvision_compat,
            ..LoaderOptions::in_order(rank_batch, workers).for_device(&normalize)
        };
        let train = Loader::new(
            train_samples,
            Transform::Train {
                size: cfg.img_size,
                scale: (cfg.crop_scale[0], cfg.crop_scale[1]),
                ratio: (3.0 / 4.0, 4.0 / 3.0),
                hflip: cfg.hflip,
                erase: (cfg.random_erasing > 0.0).then(|| RandomErasing {
                    p: cfg.random_erasing,
                    mode: cfg.random_erasing_mode,
                    mean: cfg.mean3(),
                    std: cfg.std3(),
                }),
                pad: cfg.crop_padding,
            },
            // A last batch of one image would break BatchNorm's training statistics: drop only
            // that. Padded shards are equal, so every rank takes the same number of steps.
            LoaderOptions {
                shuffle: true,
                drop_last: n_train.div_ceil(world) % rank_batch == 1,
                shard: shard(true),
                ..base.clone()
            },
        )?;
        let val = Loader::new(
            val_samples,
            Transform::Eval {
                size: cfg.img_size,
                resize: cfg.eval_resize(),
            },
            LoaderOptions {
                shard: shard(false),
                ..base
            },
        )?;
        Ok(TrainData {
            classes: train_folder.classes.clone(),
            train,
            val,
            normalize,
            workers,
            rank_batch,
            accum: cfg.accum_steps,
            warned: Default::default(),
        })
    }

    pub fn num_classes(&self) -> i64 {
        self.classes.len() as i64
    }

    pub fn micro_per_epoch(&self) -> usize {
        self.train.batches_per_epoch()
    }

    pub fn steps_per_epoch(&self) -> usize {
        self.micro_per_epoch().div_ceil(self.accum)
    }

    /// The micro-batches of `epoch` after its first `steps_done` optimizer steps.
    pub fn train_from(&self, epoch: usize, steps_done: usize) -> impl Iterator<Item = Result<TrainBatch>> + '_ {
        let first = steps_done * self.accum;
        let micro_per_epoch = self.micro_per_epoch();
        self.train
            .epoch_from(epoch as u64, first)
            .zip(first..)
            .map(move |(batch, micro)| {
                let batch = batch?;
                let unreadable = batch.unreadable.len();
                self.warn_once(&batch.unreadable);
                let want = self.rank_batch.min(self.train.shard_len() - micro * self.rank_batch);
                let batch = refill(batch, want)?;
                Ok(TrainBatch {
                    pos: MicroPos {
                        epoch,
                        micro,
                        micro_per_epoch,
                        accum: self.accum,
                    },
                    x: self.normalize.apply(&batch.images),
                    y: self.normalize.labels(&batch.labels),
                    unreadable,
                })
            })
    }

    /// The epoch's validation of the model and of its moving average, over all ranks.
    pub fn validate(&self, t: &Trainer) -> Result<Validation> {
        let model = self.evaluate(&t.model, t)?;
        let report = ClassificationReport::new(&self.classes, &model.targets, &model.preds);
        let ema = t.ema.as_ref().map(|e| self.evaluate(&e.model, t)).transpose()?;
        Ok(Validation { model, report, ema })
    }

    fn evaluate(&self, model: &crate::model::Model, t: &Trainer) -> Result<EvalResult> {
        let ev = evaluate(model, &self.val, &self.normalize, t.pg())?;
        self.warn_once(&ev.unreadable);
        Ok(ev)
    }

    fn warn_once(&self, unreadable: &[(PathBuf, String)]) {
        let mut warned = self.warned.borrow_mut();
        for (p, e) in unreadable {
            if warned.insert(p.clone()) {
                warn_unreadable(p, e);
            }
        }
    }
}

/// Keeps a training batch at its size when some of its images could not be read, by repeating
/// readable ones: every rank then takes the same steps with the same batch size, and BatchNorm
/// never sees a batch of one.
fn refill(batch: Batch, want: usize) -> Result<Batch> {
    let have = batch.indices.len();
    if have == want {
        return Ok(batch);
    }
    if have == 0 {
        return Err(user_error("every image of a training batch was unreadable (see the warnings above); use --strict to stop at the first one"));
    }
    let pick: Vec<i64> = (0..want as i64).map(|j| j % have as i64).collect();
    let idx = Tensor::from_slice(&pick);
    Ok(Batch {
        images: batch.images.index_select(0, &idx),
        labels: batch.labels.index_select(0, &idx),
        indices: pick.iter().map(|&j| batch.indices[j as usize]).collect(),
        unreadable: batch.unreadable,
    })
}

/// A data set where nothing decodes is an error before training, not a run of unreadable batches.
fn check_something_decodes(paths: &[PathBuf], root: &Path) -> Result<()> {
    let mut first_error = None;
    for p in paths {
        match crate::data::decode::decode_rgb(p) {
            Ok(_) => return Ok(()),
            Err(e) if first_error.is_none() => first_error = Some(format!("{e:#}")),
            Err(_) => {}
        }
    }
    Err(user_error(format!(
        "none of the first {} images under {} could be read (first error: {})",
        paths.len(),
        root.display(),
        first_error.unwrap_or_default()
    )))
}
