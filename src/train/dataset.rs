//! The run's data: the training and validation folders (or a stratified split of one), their
//! loaders sharded over ranks, the normalisation on the device, and the epoch's micro-batches
//! as the training step takes them.
use std::cell::RefCell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::Result;
use tch::Tensor;

use super::context::RankContext;
use super::lifecycle::data_record::DataRecord;
use super::step::eval::{evaluate, EvalResult};
use super::step::trainer::{MicroPos, Trainer};
use crate::config::TrainConfig;
use crate::data::augment::erasing::RandomErasing;
use crate::data::augment::transform::Transform;
use crate::data::load::cache::{default_budget, CachePlan};
use crate::data::load::loader::{Loader, LoaderOptions, Shard};
use crate::data::load::normalize::Normalizer;
use crate::data::load::sample::Batch;
use crate::data::source::{Dataset, Samples, SourceKind, Stored};
use crate::error::user_error;
use crate::report::classification::ClassificationReport;
use crate::report::progress::{warn, warn_unreadable};

use super::step::state::Validation;

pub struct TrainData {
    pub classes: Vec<String>,
    /// Where the images come from and how they are kept, for the banner.
    pub note: String,
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
    /// The batch's samples (indices into the training samples; a replaced image's stand-in).
    pub indices: Vec<usize>,
}

impl TrainData {
    /// The run's data; a resumed run's as `recorded` when it started (`lifecycle/data_record.rs`).
    pub fn load(cfg: &TrainConfig, ctx: &RankContext, recorded: Option<&DataRecord>) -> Result<Self> {
        let data_dir = cfg.data.as_ref().expect("checked by preflight");
        let train_set = Dataset::open(cfg.data_spec(), "--data")?;
        if let [only] = &train_set.classes[..] {
            return Err(user_error(format!(
                "--data {} has one class ('{only}'): a classifier needs two or more (a folder of images labelled by a CSV file takes --labels)",
                data_dir.display()
            )));
        }
        let val_spec = cfg.val_spec();
        let split = val_spec.is_none();
        let (train_samples, val_samples) = match val_spec {
            Some(spec) => {
                let val_set = Dataset::open(spec, "--val")?.onto_classes(&train_set.classes)?;
                if same_images(&train_set, &val_set) {
                    warn(&format!(
                        "--val {} holds the same images as --data: the validation figures will measure the training set",
                        val_set.root.display()
                    ));
                }
                (train_set.samples.clone(), val_set.samples)
            }
            None => {
                let (t, v) = crate::data::tools::split::stratified_indices(&train_set, cfg.val_split, cfg.seed);
                match recorded {
                    Some(r) => r.split(&train_set.samples, &[t, v].concat()),
                    None => (train_set.samples.select(&t), train_set.samples.select(&v)),
                }
            }
        };
        if ctx.is_main() {
            warn_unlabelled(&train_set, &val_samples, cfg);
        }
        if let (Some(r), true) = (recorded, ctx.is_main()) {
            super::lifecycle::data_record::check(r, &train_samples, &val_samples, split, cfg.strict)?;
        }
        if train_samples.shard_files().is_some() {
            let held = crate::data::load::order::shard_count(train_samples.len(), |i| train_samples.shard_of(i).unwrap_or(0));
            let unit = if matches!(train_set.kind, SourceKind::Parquet { .. }) { "row group(s)" } else { "shard(s)" };
            if held < ctx.world() {
                return Err(user_error(format!(
                    "--data {}: {held} {unit} for {} ranks; training splits them across the ranks, so every rank needs one: write the set in at least {} of them",
                    data_dir.display(),
                    ctx.world(),
                    ctx.world()
                )));
            }
        }
        let n_train = train_samples.len();
        if cfg.ra_sampler {
            check_repeatable(&train_samples, ctx.world(), ctx.rank_batch, data_dir)?;
        }
        if cfg.torch_sampler_seed.is_some() {
            check_map_style("--torch-sampler-seed", &train_samples, data_dir)?;
        }
        check_something_decodes(&train_samples, data_dir)?;
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
        let budget = cfg
            .cache_gb
            .map_or_else(|| default_budget(ctx.local_world), |gb| (gb * 1e9) as u64);
        let cache = match cfg.data_on_device {
            true => CachePlan::off("the set is on the device"),
            false => crate::data::load::cache::plan(cfg.cache, &[&train_samples, &val_samples], budget),
        };
        let base = LoaderOptions {
            seed: cfg.seed,
            shuffle_buffer: cfg.shuffle_buffer,
            shard_streams: cfg.shard_streams,
            prefetch: cfg.prefetch,
            skip_unreadable: !cfg.strict,
            whole_jpeg: cfg.torchvision_compat,
            cache: cache.budget.clone(),
            ..LoaderOptions::in_order(rank_batch, workers).for_device(&normalize)
        };
        let per_rank = match cfg.ra_sampler {
            true => crate::data::load::order::repeated_len(n_train, world),
            false => n_train.div_ceil(world),
        };
        let mut source = describe_source(&train_set);
        let mut train = Loader::new(
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
                interpolation: cfg.interpolation(),
                color_jitter: crate::data::augment::jitter::ColorJitter::from_flag(&cfg.color_jitter)?,
                policy: cfg.policy(),
            },
            // A last batch of one image would break BatchNorm's training statistics: drop only
            // that. Padded shards are equal, so every rank takes the same number of steps.
            LoaderOptions {
                shuffle: true,
                drop_last: per_rank % rank_batch == 1,
                shard: shard(true),
                repeats: cfg.ra_sampler.then_some(cfg.ra_reps),
                torch_sampler_seed: cfg.torch_sampler_seed,
                ..base.clone()
            },
        )?;
        if train.samples().shard_files().is_some() {
            source += &format!(
                ", read in streams (shards in an order drawn per epoch, dealt to {} streams, each through a {}-sample shuffle buffer, interleaved into one order whatever the number of ranks; {} samples per rank per epoch)",
                cfg.shard_streams,
                cfg.shuffle_buffer,
                train.shard_len()
            );
        }
        let mut val = Loader::new(
            val_samples,
            cfg.eval_transform(),
            LoaderOptions {
                shard: shard(false),
                ..base
            },
        )?;
        let note = match cfg.data_on_device {
            true => {
                let bytes = train.put_on_device(&normalize)? + val.put_on_device(&normalize)?;
                format!("{source}; on {device:?}: {:.2} GB of uint8 images", bytes as f64 / 1e9)
            }
            false => format!("{source}; {}", cache.note),
        };
        Ok(TrainData {
            note,
            classes: train_set.classes.clone(),
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
                    indices: batch.indices,
                })
            })
    }

    /// The epoch's validation of the model and of its moving average, over all ranks.
    pub fn validate(&self, t: &Trainer) -> Result<Validation> {
        t.buffers_from_rank0()?;
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

/// `--ra-sampler` takes a map-style source (`check_map_style`) and, as torchvision's `RASampler` keeps n // 256 * 256 images an epoch
/// over the ranks, at least a full batch of them per rank.
fn check_repeatable(samples: &Samples, world: usize, rank_batch: usize, root: &Path) -> Result<()> {
    check_map_style("--ra-sampler", samples, root)?;
    let per_rank = crate::data::load::order::repeated_len(samples.len(), world);
    if per_rank < rank_batch {
        return Err(user_error(format!(
            "--ra-sampler keeps {} // 256 * 256 training images an epoch, {per_rank} per rank: fewer than a batch of {rank_batch} (as torchvision's RASampler); drop --ra-sampler for a set this small",
            samples.len()
        )));
    }
    Ok(())
}

/// A sampler's order (`flag`: `--ra-sampler`, `--torch-sampler-seed`) over the whole set needs a
/// map-style source: tar shards and parquet row groups stream in WebDataset's order.
fn check_map_style(flag: &str, samples: &Samples, root: &Path) -> Result<()> {
    match samples.shard_files() {
        Some(_) => Err(user_error(format!(
            "{flag}: --data {} streams its shards in WebDataset's order; {flag} needs a folder, a label file or a pack",
            root.display()
        ))),
        None => Ok(()),
    }
}

/// A data set where nothing decodes is an error before training, not a run of unreadable
/// batches: the first 1000 samples are tried until one decodes.
fn check_something_decodes(samples: &Samples, root: &Path) -> Result<()> {
    let n = samples.len().min(1000);
    let mut first_error = None;
    for i in 0..n {
        let decoded = match samples.read(i) {
            Ok(Stored::Raw(_)) => return Ok(()),
            Ok(Stored::Encoded(bytes)) => crate::data::decode::decode_bytes(&bytes, &samples.path(i)).map(|_| ()),
            Err(e) => Err(e),
        };
        match decoded {
            Ok(()) => return Ok(()),
            Err(e) if first_error.is_none() => first_error = Some(format!("{e:#}")),
            Err(_) => {}
        }
    }
    Err(user_error(format!(
        "none of the first {n} images under {} could be read (first error: {})",
        root.display(),
        first_error.unwrap_or_default()
    )))
}

/// The images of a label file's folder that neither label file names are left out: said in one
/// line (with `--val-labels` over the same folder, what neither file labels).
fn warn_unlabelled(train: &Dataset, val: &Samples, cfg: &TrainConfig) {
    let SourceKind::Labelled { file, images } = &train.kind else { return };
    let shared_folder = cfg.val_labels.is_some() && cfg.val.is_none();
    let labelled = train.len() + if shared_folder { val.len() } else { 0 };
    if *images > labelled {
        let by = match shared_folder {
            true => format!("neither {} nor {}", file.display(), cfg.val_labels.as_ref().expect("shared").display()),
            false => file.display().to_string(),
        };
        warn(&format!(
            "{} of the {images} images under {} have no row in {by}: they are left out",
            images - labelled,
            train.root.display()
        ));
    }
}

/// Whether two sets are the same images: the same folder or pack, or a pack and its folder, or
/// the same shards; a folder with a label file is the same only with the same file.
fn same_images(a: &Dataset, b: &Dataset) -> bool {
    let place = |d: &Dataset| {
        let root = match &d.kind {
            SourceKind::Pack { folder, .. } => folder.clone(),
            _ => d.root.clone(),
        };
        let labels = match &d.kind {
            SourceKind::Labelled { file, .. } => Some(std::fs::canonicalize(file).unwrap_or(file.clone())),
            _ => None,
        };
        (std::fs::canonicalize(&root).unwrap_or(root), labels)
    };
    place(a) == place(b)
}

/// "the folder X", "the raw pack X (N MB)", "N tar shards X", for the banner; for remote data,
/// what was fetched into which cache.
fn describe_source(set: &Dataset) -> String {
    let what = describe_kind(set);
    match crate::data::remote::cache::describe() {
        Some(fetched) => format!("{what}; {fetched}"),
        None => what,
    }
}

fn describe_kind(set: &Dataset) -> String {
    match &set.kind {
        SourceKind::Pack { raw, data_bytes, .. } => format!(
            "images from the {} pack {} ({:.0} MB)",
            if *raw { "raw" } else { "encoded" },
            set.root.display(),
            *data_bytes as f64 / 1e6
        ),
        SourceKind::Labelled { file, .. } => format!("images from the folder {} labelled by {}", set.root.display(), file.display()),
        SourceKind::Shards(n) => format!("images from {n} tar shard(s) {}", set.root.display()),
        SourceKind::Parquet { files, row_groups } => format!(
            "images from {files} parquet file(s) {} ({row_groups} row groups: its shards)",
            set.root.display()
        ),
        _ => format!("images from the folder {}", set.root.display()),
    }
}
