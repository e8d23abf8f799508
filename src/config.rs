//! The training configuration: defaults ← TOML file (`--config`) ← command-line flags.
//! The resolved config is saved in the run directory and in every checkpoint's state.json.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::bail_user;
use crate::data::augment::transform::{Interpolation, Transform};
use crate::data::augment::ops::Sampling;
use crate::data::augment::pil::Filter;
use crate::data::augment::policy::{AutoPolicy, Policy, PolicyName, RA_BINS};
use crate::data::augment::timm_rand::TimmRand;
use crate::data::source::Columns;
use crate::data::source::DataSpec;
use crate::device::DeviceSpec;
use crate::model::weights::WeightsSource;
use crate::model::ModelKind;
use crate::train::step::amp::AmpMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
    Adam,
    Adamw,
    /// SGD with layer-wise trust ratios (MLPerf's ResNet-50 reference, timm.optim.Lars).
    Lars,
    /// Adam with layer-wise trust ratios (timm.optim.Lamb).
    Lamb,
    /// torch.optim.RMSprop (not centered; torchvision's MobileNet recipes).
    Rmsprop,
}

impl OptimizerKind {
    /// LARS and LAMB scale each tensor's update by a trust ratio; norms and biases are left
    /// out of it and of the weight decay.
    pub fn layer_wise(self) -> bool {
        matches!(self, OptimizerKind::Lars | OptimizerKind::Lamb)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SchedKind {
    /// Linear warm-up, then cosine annealing to eta_min over t_max epochs (per step).
    #[value(alias = "cosineannealinglr")]
    Cosine,
    /// lr * gamma^(epoch / step_size), epochs counted from the start (with --lr-warmup-method:
    /// from the warm-up's end, as torchvision's SequentialLR).
    #[value(alias = "steplr")]
    Step,
    /// Constant after the warm-up.
    Constant,
    /// lr * gamma^(number of milestones passed), milestones in epochs.
    Multistep,
    /// ReduceLROnPlateau on the monitored metric, once per epoch.
    Plateau,
    /// Polynomial decay to eta_min over t_max epochs (MLPerf's LARS schedule), per step.
    Poly,
}

/// torchvision's warm-up shapes (LinearLR and ConstantLR with `lr_warmup_decay` as the factor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WarmupMethod {
    Linear,
    Constant,
}

/// When the learning rate moves: every optimizer step (ringtrain's, timm's `sched_on_updates`),
/// or at each epoch's start (torchvision's train.py, whose scheduler steps once an epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SchedInterval {
    Step,
    Epoch,
}

/// The validation metric that picks the best checkpoint and drives ReduceLROnPlateau and early
/// stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Metric {
    ValTop1,
    ValTop5,
    ValLoss,
    ValMacroF1,
}

impl Metric {
    /// Whether smaller values are better.
    pub fn minimise(self) -> bool {
        self == Metric::ValLoss
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::ValTop1 => "val_top1",
            Metric::ValTop5 => "val_top5",
            Metric::ValLoss => "val_loss",
            Metric::ValMacroF1 => "val_macro_f1",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Training images: an ImageFolder (<dir>/<class>/<image>), a pack, tar shards, parquet
    /// files, or with `labels` a folder of images.
    pub data: Option<PathBuf>,
    /// Validation images; without it (and `val_labels`), `val_split` of the training images are
    /// held out.
    pub val: Option<PathBuf>,
    pub val_split: f64,
    /// A CSV file labelling `data`'s images (one row per image: image, label).
    pub labels: Option<PathBuf>,
    /// A CSV file labelling `val`'s images (`data`'s folder's, when no `val` is given).
    pub val_labels: Option<PathBuf>,
    /// The label files' (parquet files') image column (tar shards: the image member's extension).
    pub image_column: Option<String>,
    /// The label files' (parquet files') label column (tar shards: the label member's extension).
    pub label_column: Option<String>,
    /// Tar shards and parquet files: the shuffle buffer over each stream of samples.
    pub shuffle_buffer: usize,
    /// Tar shards and parquet files: the streams an epoch's shards are dealt to.
    pub shard_streams: usize,
    /// Each rank writes the samples of every optimizer step to `samples/`.
    pub log_samples: bool,
    pub out: PathBuf,
    pub model: ModelKind,
    pub img_size: u32,
    /// Evaluation: Resize(eval_resize) + CenterCrop(val_crop_size); default val_crop_size / 0.875.
    pub eval_resize: Option<u32>,
    /// The evaluation's centre crop (torchvision's `val_crop_size`); default img_size.
    pub val_crop_size: Option<u32>,
    /// The filter of the training crop's and the evaluation's resize; default: the one the
    /// `pretrained` published weights were evaluated with, else bilinear.
    pub interpolation: Option<Interpolation>,
    pub epochs: usize,
    pub batch_size: usize,
    pub optimizer: OptimizerKind,
    pub lr: f64,
    pub momentum: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    /// LARS's trust coefficient (eta).
    pub lars_eta: f64,
    /// RMSprop's smoothing constant and the eps added to the root of its average.
    pub rmsprop_alpha: f64,
    pub rmsprop_eps: f64,
    pub label_smoothing: f64,
    pub sched: SchedKind,
    /// Whether the schedule moves every step or once an epoch (its value at the epoch's start).
    pub sched_interval: SchedInterval,
    pub warmup_epochs: f64,
    /// torchvision's warm-up (`--lr-warmup-method`): linear from lr · lr_warmup_decay to lr, or
    /// constant at lr · lr_warmup_decay, and the main schedule restarted after it (SequentialLR).
    /// None: ringtrain's ramp, lr · (step + 1) / warm-up steps.
    pub lr_warmup_method: Option<WarmupMethod>,
    /// The warm-up's factor with a `lr_warmup_method` (None: torchvision's 0.01).
    pub lr_warmup_decay: Option<f64>,
    pub eta_min: f64,
    /// Cosine period (poly: decay) in epochs; default: epochs.
    pub t_max: Option<f64>,
    /// Poly: the power of (1 - progress).
    pub poly_power: f64,
    pub step_size: usize,
    pub gamma: f64,
    /// Multistep: the epochs at which the LR is multiplied by gamma.
    pub milestones: Vec<usize>,
    /// From this epoch (1-based) on, the LR stays at `constant_lr` (default eta_min).
    pub constant_lr_from_epoch: Option<usize>,
    pub constant_lr: Option<f64>,
    /// ReduceLROnPlateau (torch's defaults): factor, patience, relative threshold, cooldown, min_lr.
    pub plateau_factor: f64,
    pub plateau_patience: usize,
    pub plateau_threshold: f64,
    pub plateau_cooldown: usize,
    pub min_lr: f64,
    /// Picks the best checkpoint; also drives plateau and early stopping.
    pub monitor: Metric,
    /// Stop after this many epochs without improvement of `monitor`.
    pub early_stop_patience: Option<usize>,
    /// Keep an exponential moving average of the weights with this decay (e.g. 0.9998),
    /// evaluated each epoch and saved in checkpoints as model_ema.safetensors.
    pub ema: Option<f64>,
    /// torchvision's `--model-ema`: an average updated every `model_ema_steps` optimizer steps of
    /// an epoch (its first included), with `model_ema_decay` adjusted to the run's batch and
    /// epochs, copying the weights through the warm-up's epochs.
    pub model_ema: bool,
    pub model_ema_steps: Option<usize>,
    pub model_ema_decay: Option<f64>,
    /// Micro-batches per optimizer step: the effective batch is batch_size × accum_steps.
    pub accum_steps: usize,
    /// No weight decay on BatchNorm weights and biases.
    pub no_bn_weight_decay: bool,
    /// Also save `last` every N optimizer steps (mid-epoch), not only at epoch ends.
    pub save_every_steps: Option<usize>,
    /// Also save `last` once M minutes have passed since the last save (agreed by all ranks at
    /// the stop check, every 10th step when distributed).
    pub save_every_minutes: Option<f64>,
    /// On SIGUSR1 or SIGTERM: save, ask Slurm to requeue the job (`scontrol requeue`), exit 0.
    pub requeue: bool,
    /// Keep the checkpoints of the last N epochs as epoch-NNNN/ besides last/ and best/.
    pub keep: usize,
    /// Clip gradients to this global L2 norm.
    pub clip_grad_norm: Option<f64>,
    /// Mixup / CutMix in batch mode, on the device: active when an alpha is > 0; `mix_prob` of
    /// the batches are mixed, CutMix with `mix_switch_prob` when both are on; partner and box
    /// as timm's or torchvision's train.py (`mix_style`).
    pub mixup_alpha: f64,
    pub cutmix_alpha: f64,
    pub mix_prob: f64,
    pub mix_switch_prob: f64,
    pub mix_style: crate::data::augment::mixup::MixStyle,
    /// RandomErasing probability per training image (0: off), and its fill.
    pub random_erasing: f64,
    pub random_erasing_mode: crate::data::augment::erasing::EraseMode,
    /// An augmentation policy after the crop and flip (`--auto-augment`), with RandAugment's
    /// bin and number of operations and AugMix's severity (torchvision's policies), or timm's
    /// RandAugment with its settings in its string.
    pub auto_augment: Option<PolicyName>,
    /// ColorJitter after the flip (before the policy): brightness, contrast, saturation [, hue]
    /// as torchvision's, or one value for the first three (timm's `--color-jitter`).
    pub color_jitter: Vec<f64>,
    pub ra_magnitude: usize,
    pub ra_num_ops: usize,
    pub augmix_severity: usize,
    /// Repeated augmentation (torchvision's `RASampler`): each image `ra_reps` times an epoch,
    /// the copies on different ranks.
    pub ra_sampler: bool,
    pub ra_reps: usize,
    /// Shuffle as PyTorch's `DistributedSampler` and torchvision's `RASampler` seeded with this
    /// do: each epoch's permutation is `torch.randperm(n)` from a generator seeded seed + epoch,
    /// so the run reads its samples in a PyTorch script's order (None: drawn from `seed`).
    pub torch_sampler_seed: Option<u64>,
    /// RandomResizedCrop area range.
    pub crop_scale: Vec<f64>,
    /// CIFAR-style training crop instead: Resize(img_size) + RandomCrop(img_size, padding=N).
    pub crop_padding: Option<u32>,
    pub hflip: bool,
    /// torchvision's `zero_init_residual`: every residual block's last BatchNorm starts at 0.
    pub zero_init_residual: bool,
    /// Decode as torchvision does where ringtrain departs from it for speed: every JPEG whole,
    /// none at 1/8 size in the DCT domain (also for `eval` and `predict` of the run's
    /// checkpoints).
    pub torchvision_compat: bool,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
    /// Data worker threads; default: the available cores.
    pub workers: Option<usize>,
    /// Batches decoded ahead of the training step.
    pub prefetch: usize,
    /// Keep decoded images in RAM after the first epoch: auto (when the whole set fits the
    /// budget), ram (what fits), off.
    pub cache: crate::data::load::cache::CacheMode,
    /// The RAM cache's budget in GB; default: half the memory available at the start, shared
    /// by the node's ranks.
    pub cache_gb: Option<f64>,
    /// The whole uint8 data set on the training device; batches cut, resized, flipped and
    /// normalised there.
    pub data_on_device: bool,
    pub seed: u64,
    pub device: DeviceSpec,
    /// Print a progress line every N steps (0: only epoch summaries).
    pub log_every: usize,
    /// Mixed precision; auto is fp16 on CUDA, off on CPU.
    pub amp: AmpMode,
    /// A fixed fp16 loss scale instead of dynamic scaling.
    pub loss_scale: Option<f64>,
    /// Where dynamic fp16 loss scaling starts (PyTorch's `GradScaler(init_scale=...)`).
    pub init_loss_scale: f64,
    /// Reproducible CUDA kernels: cuDNN's deterministic algorithms without benchmark-mode
    /// autotuning, and cuBLAS's deterministic workspace (slower; no effect on the CPU).
    pub deterministic: bool,
    /// channels_last (NHWC) weights and inputs; default: on for CUDA, off on the CPU.
    pub channels_last: Option<bool>,
    /// Replace an earlier run in `out` (otherwise a run directory with checkpoints is refused).
    pub overwrite: bool,
    /// An unreadable image is an error, instead of a warning and a skip.
    pub strict: bool,
    /// Print and save (reports/epoch-NNNN.txt) the per-class report after every epoch.
    pub report_every_epoch: bool,
    /// SyncBatchNorm across ranks (changes the result, unlike how the job is launched).
    pub sync_bn: bool,
    /// Capture the whole training step as one CUDA graph and replay it (CUDA only).
    pub cuda_graphs: bool,
    /// Normalisation through ringtrain's fused kernels where they apply (CUDA, channels_last;
    /// the ResNet family's BatchNorm + add + ReLU, ConvNeXt's block LayerNorm and end); the
    /// unfused ops elsewhere. None: on where GPU runs showed them faster and equal
    /// (`model::fused::on_by_default`).
    pub fused_norm: Option<bool>,
    /// Fine-tune from these weights: a safetensors or PyTorch file with torchvision's names,
    /// `torchvision:NAME[.VARIANT]` or `hf-hub:ORG/NAME`.
    pub pretrained: Option<WeightsSource>,
    /// The dict of a PyTorch checkpoint that holds the weights (default: found by its usual
    /// names).
    pub pretrained_key: Option<String>,
    /// Load the tensors of `pretrained` that fit, leave the rest as initialised.
    pub pretrained_partial: bool,
    /// Parameter name prefixes to freeze, e.g. ["conv1", "bn1", "layer1"].
    pub freeze: Vec<String>,
    /// The classifier head's learning rate, as a multiple of --lr.
    pub head_lr_mult: f64,
    /// Stochastic depth rate (None: the architecture's torchvision default).
    pub drop_path: Option<f64>,
    /// Dropout before the classifier, or in a ViT's encoder (None: torchvision's default).
    pub dropout: Option<f64>,
    /// Layer-wise learning-rate decay: layer l of the L in the network learns at
    /// lr · decay^(L - 1 - l) (the stem the slowest, the head at lr).
    pub layer_decay: Option<f64>,
    /// No weight decay on normalisation weights, biases, layer scales, position embeddings and
    /// class tokens (timm's rule).
    pub no_norm_bias_decay: bool,
    /// torchvision's `set_weight_decay`: the weight decay of normalisation layers' parameters,
    /// and of every parameter named `bias` (which wins over the norm's); None: --weight-decay.
    pub norm_weight_decay: Option<f64>,
    pub bias_weight_decay: Option<f64>,
    /// `--resume auto|DIR`: a run-control flag, not a setting of the run (never saved).
    #[serde(skip)]
    pub resume: Option<String>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            data: None,
            val: None,
            val_split: 0.1,
            labels: None,
            val_labels: None,
            image_column: None,
            label_column: None,
            shuffle_buffer: crate::data::load::loader::DEFAULT_SHUFFLE_BUFFER,
            shard_streams: crate::data::load::loader::DEFAULT_SHARD_STREAMS,
            log_samples: false,
            out: PathBuf::from("runs/train"),
            model: ModelKind::ResNet18,
            img_size: 224,
            eval_resize: None,
            val_crop_size: None,
            interpolation: None,
            epochs: 30,
            batch_size: 64,
            optimizer: OptimizerKind::Sgd,
            lr: 0.1,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 1e-4,
            lars_eta: 0.001,
            // torch.optim.RMSprop's defaults (torchvision's train.py passes 0.9 and 0.0316).
            rmsprop_alpha: 0.99,
            rmsprop_eps: 1e-8,
            label_smoothing: 0.0,
            sched: SchedKind::Cosine,
            warmup_epochs: 0.0,
            lr_warmup_method: None,
            sched_interval: SchedInterval::Step,
            lr_warmup_decay: None,
            eta_min: 0.0,
            t_max: None,
            poly_power: 2.0,
            step_size: 30,
            gamma: 0.1,
            milestones: Vec::new(),
            constant_lr_from_epoch: None,
            constant_lr: None,
            plateau_factor: 0.1,
            plateau_patience: 10,
            plateau_threshold: 1e-4,
            plateau_cooldown: 0,
            min_lr: 0.0,
            monitor: Metric::ValTop1,
            early_stop_patience: None,
            ema: None,
            model_ema: false,
            model_ema_steps: None,
            model_ema_decay: None,
            accum_steps: 1,
            no_bn_weight_decay: false,
            save_every_steps: None,
            save_every_minutes: None,
            requeue: false,
            keep: 0,
            clip_grad_norm: None,
            mixup_alpha: 0.0,
            cutmix_alpha: 0.0,
            mix_prob: 1.0,
            mix_switch_prob: 0.5,
            mix_style: crate::data::augment::mixup::MixStyle::Timm,
            random_erasing: 0.0,
            random_erasing_mode: crate::data::augment::erasing::EraseMode::Const,
            auto_augment: None,
            color_jitter: Vec::new(),
            ra_magnitude: 9,
            ra_num_ops: 2,
            augmix_severity: 3,
            ra_sampler: false,
            ra_reps: 3,
            torch_sampler_seed: None,
            crop_scale: vec![0.08, 1.0],
            crop_padding: None,
            hflip: true,
            mean: crate::data::IMAGENET_MEAN.to_vec(),
            std: crate::data::IMAGENET_STD.to_vec(),
            workers: None,
            prefetch: 4,
            cache: crate::data::load::cache::CacheMode::Auto,
            cache_gb: None,
            data_on_device: false,
            seed: 42,
            device: DeviceSpec::Auto,
            log_every: 50,
            amp: AmpMode::Auto,
            loss_scale: None,
            init_loss_scale: crate::train::step::amp::INIT_SCALE,
            deterministic: false,
            channels_last: None,
            overwrite: false,
            strict: false,
            torchvision_compat: false,
            zero_init_residual: false,
            sync_bn: false,
            cuda_graphs: false,
            fused_norm: None,
            report_every_epoch: false,
            pretrained: None,
            pretrained_key: None,
            pretrained_partial: false,
            freeze: Vec::new(),
            head_lr_mult: 1.0,
            drop_path: None,
            dropout: None,
            layer_decay: None,
            no_norm_bias_decay: false,
            norm_weight_decay: None,
            bias_weight_decay: None,
            resume: None,
        }
    }
}

/// What an option left unset (None) means, for the help, where "none" would not say it.
pub const UNSET_DEFAULTS: &[(&str, &str)] = &[
    ("data", "none, required"),
    ("val", "none: --val-split of --data"),
    ("labels", "none: the folder's class sub-folders label its images"),
    ("val_labels", "none"),
    ("image_column", "the first column; in tar shards the member with an image extension; in parquet files image"),
    ("label_column", "the second column; in tar shards the .cls member; in parquet files label"),
    ("eval_resize", "val-crop-size / 0.875"),
    ("val_crop_size", "img-size (with --train-crop-size: the model's input size, as torchvision's 224)"),
    ("lr_warmup_method", "none: ringtrain's ramp, lr · (step + 1) / warm-up steps (with --lr-warmup-epochs: constant)"),
    ("lr_warmup_decay", "0.01, with --lr-warmup-method"),
    ("model_ema_steps", "32, with --model-ema"),
    ("model_ema_decay", "0.99998, with --model-ema"),
    ("norm_weight_decay", "weight-decay"),
    ("bias_weight_decay", "weight-decay"),
    ("interpolation", "the --pretrained weights' filter (bicubic for some), else bilinear"),
    ("t_max", "epochs"),
    ("constant_lr", "eta-min"),
    ("crop_padding", "none: RandomResizedCrop"),
    ("torch_sampler_seed", "none: the order drawn from --seed"),
    ("auto_augment", "none: no policy"),
    ("workers", "available cores"),
    ("cache_gb", "half the available memory, shared by the node's ranks"),
    ("loss_scale", "none: dynamic scaling"),
    ("channels_last", "on for CUDA, off on the CPU"),
    ("fused_norm", "on for the ResNet and ConvNeXt families in fp16 or bf16, channels_last, on GPUs of compute capability 9.0 (with --cuda-graphs: ResNets only); off elsewhere"),
    ("drop_path", "the model's: see ringtrain models"),
    ("dropout", "the model's: see ringtrain models"),
    ("layer_decay", "none: one rate for all layers"),
    ("pretrained", "none: the architecture's own initialisation"),
    (
        "pretrained_key",
        "the file itself when it is a state_dict, else the first of state_dict, model_state_dict, model_state, model, net ...",
    ),
];

/// Reads a TOML file into a table (unknown keys are caught when the merged table is parsed).
pub fn read_toml(path: &Path) -> Result<toml::Table> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => bail_user!("cannot read --config {}: {e}", path.display()),
    };
    parse_toml(&text, path)
}

/// A config file's text as a table; `path` names it in errors.
pub fn parse_toml(text: &str, path: &Path) -> Result<toml::Table> {
    match text.parse::<toml::Table>() {
        Ok(t) => Ok(t),
        Err(e) => {
            let line = e.span().map(|r| text[..r.start].matches('\n').count() + 1).unwrap_or(0);
            bail_user!(
                "invalid TOML in --config {} at line {line}: {}",
                path.display(),
                one_line(e.message())
            )
        }
    }
}

/// torchvision's reference-script names of ringtrain's settings: (torchvision's key, ringtrain's
/// key). Each is read into ringtrain's key (the saved config has only those); both in one layer
/// (the flags, or the file) must agree. Spelled torchvision's way, the training crop leaves the
/// evaluation crop at the model's size and the warm-up takes torchvision's shape, as there.
pub const TORCHVISION_NAMES: &[(&str, &str)] = &[
    ("train_crop_size", "img_size"),
    ("val_resize_size", "eval_resize"),
    ("lr_warmup_epochs", "warmup_epochs"),
];

fn flag(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

/// Numbers compare by value (a TOML integer against a flag's float).
fn same_value(a: &toml::Value, b: &toml::Value) -> bool {
    let num = |v: &toml::Value| v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
    match (num(a), num(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// One layer with torchvision's names read into ringtrain's; returns the ringtrain keys it gave
/// by torchvision's name. `layer` names it in errors.
fn read_torchvision_names(table: &mut toml::Table, layer: &str) -> Result<std::collections::HashSet<&'static str>> {
    let mut spelled = std::collections::HashSet::new();
    for &(theirs, ours) in TORCHVISION_NAMES {
        let Some(v) = table.remove(theirs) else { continue };
        if let Some(o) = table.get(ours).filter(|o| !same_value(o, &v)) {
            bail_user!(
                "{} {o} and {} {v} are one setting (torchvision's name and ringtrain's){layer}: give one, or the same value",
                flag(ours),
                flag(theirs)
            );
        }
        if !table.contains_key(ours) {
            spelled.insert(ours);
        }
        table.insert(ours.to_string(), v);
    }
    Ok(spelled)
}

/// defaults ← file ← flags: `overrides` holds only the flags the user gave.
pub fn resolve(file: Option<toml::Table>, overrides: toml::Table) -> Result<TrainConfig> {
    let mut table = file.unwrap_or_default();
    let mut torchvision_spelled = read_torchvision_names(&mut table, " in the --config file")?;
    let mut overrides = overrides;
    let flags_spelled = read_torchvision_names(&mut overrides, "")?;
    for (k, v) in overrides {
        // The layer that gives a key last decides how it was spelled.
        torchvision_spelled.retain(|s| *s != k);
        table.insert(k, v);
    }
    torchvision_spelled.extend(flags_spelled);
    let given = |k: &str| table.contains_key(k);
    let (model_given, img_size_given, resize_given, mean_given, std_given) =
        (given("model"), given("img_size"), given("eval_resize"), given("mean"), given("std"));
    let (interpolation_given, val_crop_given) = (given("interpolation"), given("val_crop_size"));
    let warmup_method_given = given("lr_warmup_method");
    let mut c = match TrainConfig::deserialize(toml::Value::Table(table)) {
        Ok(c) => c,
        // toml's message spans lines ("invalid type: ..., expected usize", "in `epochs`").
        Err(e) => bail_user!("invalid configuration: {}", one_line(&e.to_string())),
    };
    // Published weights name their architecture and how they were evaluated: unless the
    // flags say otherwise, the run takes both.
    let mut eval = None;
    if let Some(source) = &c.pretrained {
        match source.model() {
            Some(m) if !model_given => c.model = m,
            _ => crate::model::weights::check_model_matches(source, c.model)?,
        }
        if !(img_size_given && resize_given && mean_given && std_given && interpolation_given) {
            eval = source.eval_transform()?;
        }
    }
    let model_size = eval.as_ref().map_or(c.model.default_img_size(), |t| t.img_size);
    if !img_size_given {
        c.img_size = model_size;
    }
    // torchvision's --train-crop-size is the training crop alone: its --val-crop-size stays 224,
    // the model's size.
    if torchvision_spelled.contains("img_size") && !val_crop_given {
        c.val_crop_size = Some(model_size).filter(|&s| s != c.img_size);
    }
    // torchvision's --lr-warmup-epochs comes with its warm-up, ConstantLR unless told.
    if torchvision_spelled.contains("warmup_epochs") && !warmup_method_given && c.warmup_epochs > 0.0 {
        c.lr_warmup_method = Some(WarmupMethod::Constant);
    }
    if let Some(t) = eval {
        // The weights' resize is for their input size; for another crop, the ratio is kept.
        if !resize_given {
            let crop = c.val_crop_size();
            c.eval_resize = Some(((t.resize as f64) * crop as f64 / t.img_size as f64).round() as u32);
        }
        if !interpolation_given {
            c.interpolation = Some(published_interpolation(&t));
        }
        if !mean_given {
            c.mean = t.mean.unwrap_or(c.mean);
        }
        if !std_given {
            c.std = t.std.unwrap_or(c.std);
        }
    }
    Ok(c)
}

/// The filter published weights were evaluated with.
pub fn published_interpolation(t: &crate::model::weights::EvalTransform) -> Interpolation {
    match t.bicubic {
        true => Interpolation::Bicubic,
        false => Interpolation::Bilinear,
    }
}

/// A multi-line parser message joined into one line (its parts kept, unlike cli's first line of
/// a libtorch error, whose rest is a stack trace).
fn one_line(s: &str) -> String {
    s.trim().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

fn positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

fn non_negative(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

impl TrainConfig {
    /// Whether `out` already holds a run (checkpoints).
    pub fn holds_run(&self) -> bool {
        ["last", "best"].iter().any(|d| self.out.join(d).exists())
    }

    /// The evaluation's centre crop: `--val-crop-size`, else the training crop.
    pub fn val_crop_size(&self) -> u32 {
        self.val_crop_size.unwrap_or(self.img_size)
    }

    pub fn eval_resize(&self) -> u32 {
        self.eval_resize
            .unwrap_or(((self.val_crop_size() as f64) / 0.875).round() as u32)
    }

    /// The resize filter: as given or set by the weights (`resolve`), else bilinear.
    pub fn interpolation(&self) -> Interpolation {
        self.interpolation.unwrap_or_default()
    }

    /// The evaluation transform: Resize(eval_resize) + CenterCrop(val_crop_size) with the filter.
    pub fn eval_transform(&self) -> Transform {
        Transform::eval(self.val_crop_size(), self.eval_resize(), self.interpolation())
    }

    /// torchvision's `--model-ema` as (decay, optimizer steps between updates): its decay
    /// adjusted so the average spans as many images whatever the batch, the steps between
    /// updates and the epochs (pycls's rule): alpha = min(1, (1 − decay) · batch · steps / epochs)
    /// with the images of an optimizer step (all ranks' and micro-batches') as the batch.
    pub fn model_ema_schedule(&self) -> Option<(f64, usize)> {
        if !self.model_ema {
            return None;
        }
        let steps = self.model_ema_steps.unwrap_or(32);
        let decay = self.model_ema_decay.unwrap_or(0.99998);
        let images_per_step = (self.batch_size * self.accum_steps) as f64;
        let adjust = images_per_step * steps as f64 / self.epochs as f64;
        let alpha = ((1.0 - decay) * adjust).min(1.0);
        Some((1.0 - alpha, steps))
    }

    /// The `--auto-augment` policy, if any: its geometric operations sample as the run's
    /// `--interpolation` where torchvision's tensor kernels can (bicubic: bilinear); timm's
    /// RandAugment samples as PIL does with that filter and fills with the run's mean colour
    /// (timm's `img_mean`).
    pub fn policy(&self) -> Option<AutoPolicy> {
        let interpolation = self.interpolation();
        Some(match self.auto_augment? {
            PolicyName::Torchvision(kind) => AutoPolicy::Torchvision(Policy {
                kind,
                ra_magnitude: self.ra_magnitude,
                ra_num_ops: self.ra_num_ops,
                augmix_severity: self.augmix_severity,
                // torchvision's tensor kernels have no bicubic sampling: a bicubic run's policies
                // shear, translate and rotate bilinearly.
                sampling: match interpolation {
                    Interpolation::Nearest => Sampling::Nearest,
                    Interpolation::Bilinear | Interpolation::Bicubic => Sampling::Bilinear,
                },
            }),
            PolicyName::TimmRand(spec) => AutoPolicy::TimmRand(TimmRand {
                spec,
                filter: match interpolation {
                    Interpolation::Nearest => Filter::Nearest,
                    Interpolation::Bilinear => Filter::Bilinear,
                    Interpolation::Bicubic => Filter::Bicubic,
                },
                fill: self.mean3().map(|m| (255.0 * m).round_ties_even().clamp(0.0, 255.0) as u8),
            }),
        })
    }

    /// Mixup/CutMix settings when either is on.
    pub fn mixup(&self, num_classes: i64) -> Option<crate::data::augment::mixup::MixupConfig> {
        (self.mixup_alpha > 0.0 || self.cutmix_alpha > 0.0).then(|| crate::data::augment::mixup::MixupConfig {
            style: self.mix_style,
            mixup_alpha: self.mixup_alpha,
            cutmix_alpha: self.cutmix_alpha,
            prob: self.mix_prob,
            switch_prob: self.mix_switch_prob,
            label_smoothing: self.label_smoothing,
            num_classes,
            correct_lam: true,
        })
    }

    pub fn t_max(&self) -> f64 {
        self.t_max.unwrap_or(self.epochs as f64)
    }

    pub fn mean3(&self) -> [f64; 3] {
        [self.mean[0], self.mean[1], self.mean[2]]
    }

    pub fn std3(&self) -> [f64; 3] {
        [self.std[0], self.std[1], self.std[2]]
    }

    /// The training images as `--data`, `--labels` and the column flags name them.
    pub fn data_spec(&self) -> DataSpec {
        DataSpec {
            path: self.data.clone().expect("checked by preflight"),
            labels: self.labels.clone(),
            columns: self.columns(),
            strict: self.strict,
        }
    }

    /// The validation images, if named apart from `--data`: `--val`, or `--val-labels` over
    /// `--data`'s folder.
    pub fn val_spec(&self) -> Option<DataSpec> {
        if self.val.is_none() && self.val_labels.is_none() {
            return None;
        }
        Some(DataSpec {
            path: self.val.clone().or_else(|| self.data.clone()).expect("checked by preflight"),
            labels: self.val_labels.clone(),
            columns: self.columns(),
            strict: self.strict,
        })
    }

    fn columns(&self) -> Columns {
        Columns {
            image: self.image_column.clone(),
            label: self.label_column.clone(),
        }
    }

    /// The checks of the values alone (no filesystem, no device): each failure one line naming
    /// the flag.
    pub fn check(&self) -> Result<()> {
        if self.data.is_none() {
            bail_user!("--data is required (a folder of <class>/<image> files)");
        }
        self.check_optimizer()?;
        self.check_sizes()?;
        self.check_schedule()?;
        self.check_augmentation()?;
        self.check_loading()?;
        self.check_cuda_graphs()
    }

    /// What a captured step cannot hold: values drawn on the host every step, or a step made of
    /// several backward passes. Refused rather than silently run eagerly.
    fn check_cuda_graphs(&self) -> Result<()> {
        if !self.cuda_graphs {
            return Ok(());
        }
        if self.mixup_alpha > 0.0 || self.cutmix_alpha > 0.0 {
            let flag = if self.mixup_alpha > 0.0 { "--mixup-alpha" } else { "--cutmix-alpha" };
            bail_user!("--cuda-graphs cannot capture {flag}: its mixing is drawn on the host every step; drop one of the two");
        }
        if self.accum_steps > 1 {
            bail_user!(
                "--cuda-graphs captures one forward and backward per step, not --accum-steps {}; drop one of the two",
                self.accum_steps
            );
        }
        Ok(())
    }

    /// `check`, then what needs the machine: the inputs exist, `out` holds no run unless asked,
    /// and the precision suits the device. Run before any work.
    pub fn preflight(&self) -> Result<()> {
        self.check()?;
        for (flag, path) in [("--data", &self.data), ("--val", &self.val)] {
            if let Some(p) = path {
                crate::data::source::refuse_remote(p, flag)?;
            }
            let local = |p: &&PathBuf| !crate::data::source::is_sharded(p) && !crate::data::source::is_remote(p);
            if let Some(p) = path.as_ref().filter(|p| !p.exists()).filter(local) {
                bail_user!("{flag} directory (or pack) does not exist: {}", p.display());
            }
        }
        for (flag, path) in [("--labels", &self.labels), ("--val-labels", &self.val_labels)] {
            if let Some(p) = path.as_ref().filter(|p| !p.is_file()) {
                bail_user!("{flag} file does not exist: {}", p.display());
            }
        }
        if let Some(source) = self.pretrained.as_ref().filter(|_| self.resume.is_none() || !self.holds_run()) {
            // A file must exist; published weights are fetched into their cache now, once,
            // before any rank starts (a run resumed from its checkpoints needs neither).
            source.fetch()?;
        }
        if self.holds_run() && !self.overwrite && self.resume.is_none() {
            bail_user!(
                "--out {} already holds a run (checkpoints in last/ or best/): continue it with --resume auto, choose another --out, or pass --overwrite to replace it",
                self.out.display()
            );
        }
        let device = self.device.resolve()?;
        self.amp.autocast_kind(device)?;
        if self.cuda_graphs && !device.is_cuda() {
            bail_user!("--cuda-graphs needs a CUDA device (--device cuda); this run is on {device:?}");
        }
        Ok(())
    }

    fn check_optimizer(&self) -> Result<()> {
        if !positive(self.lr) {
            bail_user!("--lr must be a positive number, got {}", self.lr);
        }
        if !(0.0..1.0).contains(&self.momentum) {
            bail_user!("--momentum must be in [0, 1), got {}", self.momentum);
        }
        if self.nesterov && self.momentum == 0.0 {
            bail_user!("--nesterov needs --momentum > 0");
        }
        if self.nesterov && self.optimizer == OptimizerKind::Lamb {
            bail_user!("--nesterov is SGD's and LARS's momentum; --optimizer lamb has none (its betas are 0.9, 0.999)");
        }
        if self.nesterov && self.optimizer == OptimizerKind::Rmsprop {
            bail_user!("--nesterov is SGD's and LARS's momentum; --optimizer rmsprop takes --momentum without it");
        }
        if !(0.0..1.0).contains(&self.rmsprop_alpha) {
            bail_user!("--rmsprop-alpha must be in [0, 1), got {}", self.rmsprop_alpha);
        }
        if !non_negative(self.rmsprop_eps) {
            bail_user!("--rmsprop-eps must be >= 0, got {}", self.rmsprop_eps);
        }
        if !positive(self.lars_eta) {
            bail_user!("--lars-eta must be positive, got {}", self.lars_eta);
        }
        if !non_negative(self.weight_decay) {
            bail_user!("--weight-decay must be >= 0, got {}", self.weight_decay);
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            bail_user!("--label-smoothing must be in [0, 1), got {}", self.label_smoothing);
        }
        if let Some(d) = self.ema {
            if !(d > 0.0 && d < 1.0) {
                bail_user!("--ema (the decay) must be in (0, 1), e.g. 0.9998; got {d}");
            }
        }
        self.check_model_ema()?;
        self.check_decay_groups()?;
        if let Some(c) = self.clip_grad_norm {
            if !positive(c) {
                bail_user!("--clip-grad-norm must be positive, got {c}");
            }
        }
        if !positive(self.head_lr_mult) {
            bail_user!("--head-lr-mult must be positive, got {}", self.head_lr_mult);
        }
        if let Some(s) = self.loss_scale {
            if !positive(s) {
                bail_user!("--loss-scale must be positive, got {s}");
            }
        }
        if !positive(self.init_loss_scale) {
            bail_user!("--init-loss-scale must be positive, got {}", self.init_loss_scale);
        }
        Ok(())
    }

    fn check_sizes(&self) -> Result<()> {
        if self.batch_size == 0 {
            bail_user!("--batch-size must be at least 1");
        }
        if self.epochs == 0 {
            bail_user!("--epochs must be at least 1");
        }
        let min_size = self.model.min_img_size();
        if self.img_size < min_size || self.img_size > 4096 {
            bail_user!(
                "--img-size {} is out of range for {} ({min_size}..4096)",
                self.img_size,
                self.model
            );
        }
        if let Some(v) = self.val_crop_size {
            if v < min_size || v > 4096 {
                bail_user!("--val-crop-size {v} is out of range for {} ({min_size}..4096)", self.model);
            }
            // Its position embeddings fix a ViT's input size.
            if self.model.patch_size().is_some() && v != self.img_size {
                bail_user!(
                    "--val-crop-size {v} differs from the training crop --img-size {}: {} takes one input size (its position embeddings); give them the same value",
                    self.img_size,
                    self.model
                );
            }
        }
        if self.eval_resize() < self.val_crop_size() {
            let crop = match self.val_crop_size {
                Some(v) => format!("--val-crop-size {v}"),
                None => format!("--img-size {}", self.img_size),
            };
            bail_user!("--eval-resize {} must be at least {crop}", self.eval_resize());
        }
        if self.accum_steps == 0 {
            bail_user!("--accum-steps must be at least 1");
        }
        if self.save_every_steps == Some(0) {
            bail_user!("--save-every-steps must be at least 1");
        }
        if let Some(m) = self.save_every_minutes {
            if !positive(m) {
                bail_user!("--save-every-minutes must be positive, got {m}");
            }
        }
        Ok(())
    }

    fn check_schedule(&self) -> Result<()> {
        if !non_negative(self.warmup_epochs) || self.warmup_epochs >= self.epochs as f64 {
            bail_user!(
                "--warmup-epochs must be >= 0 and less than --epochs, got {}",
                self.warmup_epochs
            );
        }
        if !non_negative(self.eta_min) || self.eta_min > self.lr {
            bail_user!("--eta-min must be in [0, lr], got {}", self.eta_min);
        }
        if let Some(d) = self.lr_warmup_decay {
            if !(d > 0.0 && d <= 1.0) {
                bail_user!("--lr-warmup-decay must be in (0, 1], got {d}");
            }
            if self.lr_warmup_method.is_none() {
                bail_user!("--lr-warmup-decay is the factor of --lr-warmup-method linear|constant; give the method too");
            }
        }
        if let Some(m) = self.lr_warmup_method.filter(|_| self.warmup_epochs == 0.0) {
            let m = format!("{m:?}").to_lowercase();
            bail_user!("--lr-warmup-method {m} needs a warm-up: --lr-warmup-epochs (or --warmup-epochs) > 0");
        }
        if !positive(self.t_max()) {
            bail_user!("--t-max must be positive, got {}", self.t_max());
        }
        if self.step_size == 0 || !positive(self.gamma) {
            bail_user!("--step-size must be >= 1 and --gamma > 0");
        }
        if !positive(self.poly_power) {
            bail_user!("--poly-power must be positive, got {}", self.poly_power);
        }
        if self.sched == SchedKind::Multistep && self.milestones.is_empty() {
            bail_user!("--sched multistep needs --milestones, e.g. --milestones 30,60,80");
        }
        if self.milestones.windows(2).any(|w| w[0] >= w[1]) || self.milestones.first() == Some(&0) {
            bail_user!("--milestones must be increasing epochs >= 1, got {:?}", self.milestones);
        }
        if self.constant_lr_from_epoch == Some(0) {
            bail_user!("--constant-lr-from-epoch counts epochs from 1");
        }
        if let Some(c) = self.constant_lr {
            if !non_negative(c) {
                bail_user!("--constant-lr must be >= 0, got {c}");
            }
        }
        if !(self.plateau_factor > 0.0 && self.plateau_factor < 1.0) {
            bail_user!("--plateau-factor must be in (0, 1), got {}", self.plateau_factor);
        }
        if !non_negative(self.plateau_threshold) || !non_negative(self.min_lr) {
            bail_user!("--plateau-threshold and --min-lr must be >= 0");
        }
        if self.early_stop_patience == Some(0) {
            bail_user!("--early-stop-patience must be at least 1");
        }
        Ok(())
    }

    fn check_augmentation(&self) -> Result<()> {
        if !non_negative(self.mixup_alpha) || !non_negative(self.cutmix_alpha) {
            bail_user!("--mixup-alpha and --cutmix-alpha must be >= 0");
        }
        for (flag, v) in [
            ("--mix-prob", self.mix_prob),
            ("--mix-switch-prob", self.mix_switch_prob),
            ("--random-erasing", self.random_erasing),
        ] {
            if !(0.0..=1.0).contains(&v) {
                bail_user!("{flag} must be a probability in [0, 1], got {v}");
            }
        }
        if self.crop_scale.len() != 2
            || !(self.crop_scale[0] > 0.0 && self.crop_scale[0] <= self.crop_scale[1] && self.crop_scale[1] <= 1.0)
        {
            bail_user!(
                "--crop-scale must be two numbers 0 < min <= max <= 1, got {:?}",
                self.crop_scale
            );
        }
        if self.ra_magnitude >= RA_BINS {
            bail_user!("--ra-magnitude must be a bin in 0..{}, got {}", RA_BINS - 1, self.ra_magnitude);
        }
        if !(1..=10).contains(&self.augmix_severity) {
            bail_user!("--augmix-severity must be in 1..10, got {}", self.augmix_severity);
        }
        if self.ra_reps == 0 {
            bail_user!("--ra-reps must be at least 1");
        }
        crate::data::augment::jitter::ColorJitter::from_flag(&self.color_jitter)?;
        if self.data_on_device && !self.color_jitter.is_empty() {
            bail_user!("--data-on-device does not do --color-jitter (it runs in the host pipeline); drop one of the two");
        }
        if self.data_on_device && self.auto_augment.is_some() {
            bail_user!("--data-on-device does not do --auto-augment (its policies run in the host pipeline); drop one of the two");
        }
        if self.data_on_device && self.ra_sampler {
            bail_user!("--data-on-device does not do --ra-sampler; drop one of the two");
        }
        if let Some(p) = self.crop_padding.filter(|&p| p >= self.img_size) {
            bail_user!(
                "--crop-padding must be smaller than --img-size {}, got {p}",
                self.img_size
            );
        }
        if self.mean.len() != 3 || self.std.len() != 3 || !self.std.iter().all(|&s| positive(s)) {
            bail_user!(
                "--mean and --std need three values each, std > 0 (got {:?} and {:?})",
                self.mean,
                self.std
            );
        }
        Ok(())
    }

    fn check_loading(&self) -> Result<()> {
        if self.shuffle_buffer == 0 {
            bail_user!("--shuffle-buffer must be at least 1 (1 reads each shard in order)");
        }
        if self.shard_streams == 0 {
            bail_user!("--shard-streams must be at least 1");
        }
        if self.val.is_none() && self.val_labels.is_none() && !(self.val_split > 0.0 && self.val_split < 1.0) {
            bail_user!(
                "--val-split must be in (0, 1) when no --val is given, got {}",
                self.val_split
            );
        }
        if self.workers == Some(0) || self.prefetch == 0 {
            bail_user!("--workers and --prefetch must be at least 1");
        }
        if let Some(gb) = self.cache_gb {
            if !positive(gb) {
                bail_user!("--cache-gb must be a positive number of GB, got {gb}");
            }
        }
        if self.data_on_device && self.random_erasing > 0.0 {
            bail_user!("--data-on-device does not do --random-erasing; drop one of the two");
        }
        if self.zero_init_residual && self.model.residual_bn().is_none() {
            bail_user!("--zero-init-residual needs a ResNet; --model {} has no residual blocks", self.model);
        }
        if let Some(patch) = self.model.patch_size() {
            if !self.img_size.is_multiple_of(patch) {
                bail_user!("--img-size {} must be a multiple of {}'s patch size {patch}", self.img_size, self.model);
            }
        }
        if let Some(p) = self.drop_path {
            if self.model.default_drop_path().is_none() {
                bail_user!("--drop-path: --model {} has no stochastic depth", self.model);
            }
            if !(0.0..1.0).contains(&p) {
                bail_user!("--drop-path must be in [0, 1), got {p}");
            }
        }
        if let Some(p) = self.dropout {
            if self.model.default_dropout().is_none() {
                bail_user!("--dropout: --model {} has no dropout", self.model);
            }
            if !(0.0..1.0).contains(&p) {
                bail_user!("--dropout must be in [0, 1), got {p}");
            }
        }
        if let Some(d) = self.layer_decay {
            if !(d > 0.0 && d <= 1.0) {
                bail_user!("--layer-decay must be in (0, 1], got {d}");
            }
        }
        Ok(())
    }

    /// torchvision's --model-ema and ringtrain's --ema are two averages: one at a time, and the
    /// former's settings only with it.
    fn check_model_ema(&self) -> Result<()> {
        if self.model_ema && self.ema.is_some() {
            bail_user!("--model-ema (torchvision's average) and --ema (ringtrain's, every step at its decay) are two averages; give one");
        }
        for (given, f) in [
            (self.model_ema_steps.is_some(), "--model-ema-steps"),
            (self.model_ema_decay.is_some(), "--model-ema-decay"),
        ] {
            if given && !self.model_ema {
                bail_user!("{f} sets torchvision's average: give --model-ema too");
            }
        }
        if self.model_ema_steps == Some(0) {
            bail_user!("--model-ema-steps must be at least 1");
        }
        if let Some(d) = self.model_ema_decay {
            if !(d > 0.0 && d < 1.0) {
                bail_user!("--model-ema-decay must be in (0, 1), e.g. 0.99998; got {d}");
            }
        }
        if self.model_ema && self.cuda_graphs {
            bail_user!("--cuda-graphs captures one step, but --model-ema decides on the host which steps update the average; drop one of the two");
        }
        Ok(())
    }

    /// torchvision's per-group decays beside ringtrain's no-decay switches: each parameter gets
    /// one decay, so a switch's zero and a flag's non-zero for the same parameters are refused.
    fn check_decay_groups(&self) -> Result<()> {
        for (v, f) in [(self.norm_weight_decay, "--norm-weight-decay"), (self.bias_weight_decay, "--bias-weight-decay")] {
            let Some(w) = v else { continue };
            if !non_negative(w) {
                bail_user!("{f} must be >= 0, got {w}");
            }
            if w == 0.0 {
                continue;
            }
            if self.no_norm_bias_decay {
                bail_user!("--no-norm-bias-decay (no decay on norms and biases) and {f} {w} disagree; give one");
            }
            if self.no_bn_weight_decay {
                bail_user!("--no-bn-weight-decay (no decay on BatchNorm's weights and biases) and {f} {w} disagree; give one");
            }
        }
        Ok(())
    }

    /// How the network is built for this run.
    pub fn model_options(&self) -> crate::model::ModelOptions {
        crate::model::ModelOptions {
            img_size: self.img_size,
            drop_path: self.drop_path,
            dropout: self.dropout,
            // Decided per device when the run starts (train::step::trainer::model_options).
            fused_norm: false,
        }
    }

    pub fn to_toml(&self) -> Result<String> {
        toml::to_string_pretty(self).context("serialising the configuration")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_override_defaults() {
        let file: toml::Table = "lr = 0.5\nepochs = 3\nmodel = \"resnet50\"".parse().unwrap();
        let flags: toml::Table = "lr = 0.01".parse().unwrap();
        let c = resolve(Some(file), flags).unwrap();
        assert_eq!(
            (c.lr, c.epochs, c.model, c.batch_size),
            (0.01, 3, ModelKind::ResNet50, 64)
        );
    }

    #[test]
    fn unknown_key_is_a_user_error() {
        let file: toml::Table = "learning_rate = 0.5".parse().unwrap();
        let e = resolve(Some(file), toml::Table::new()).unwrap_err();
        assert!(crate::error::is_user_error(&e));
        assert!(e.to_string().contains("learning_rate"), "{e}");
    }

    #[test]
    fn resolved_config_round_trips_through_toml() {
        let c = TrainConfig {
            data: Some("d".into()),
            clip_grad_norm: Some(1.0),
            ..Default::default()
        };
        let back = resolve(Some(c.to_toml().unwrap().parse().unwrap()), toml::Table::new()).unwrap();
        assert_eq!(back.to_toml().unwrap(), c.to_toml().unwrap());
    }

    /// A config that passes `check`, changed by `edit`; the message `check` gives, if any.
    fn check_message(edit: impl FnOnce(&mut TrainConfig)) -> Option<String> {
        let mut c = TrainConfig {
            data: Some("no/such/dir".into()),
            ..Default::default()
        };
        edit(&mut c);
        c.check().err().map(|e| {
            assert!(crate::error::is_user_error(&e), "{e}");
            e.to_string()
        })
    }

    #[test]
    fn check_names_the_flag_of_a_bad_value() {
        let cases: [(&str, fn(&mut TrainConfig)); 9] = [
            ("--data is required", |c| c.data = None),
            ("--lr must be a positive number", |c| c.lr = f64::NAN),
            ("--momentum must be in [0, 1)", |c| c.momentum = 1.0),
            ("--batch-size must be at least 1", |c| c.batch_size = 0),
            ("--img-size 4 is out of range", |c| c.img_size = 4),
            ("--warmup-epochs", |c| c.warmup_epochs = c.epochs as f64),
            ("--sched multistep needs --milestones", |c| {
                c.sched = SchedKind::Multistep
            }),
            ("--crop-padding must be smaller than --img-size 224", |c| {
                c.crop_padding = Some(224)
            }),
            ("--mix-prob must be a probability", |c| c.mix_prob = 1.5),
        ];
        for (needle, edit) in cases {
            let msg = check_message(edit).unwrap_or_else(|| panic!("no error for {needle}"));
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        }
    }

    #[test]
    fn check_leaves_the_filesystem_and_device_to_preflight() {
        // A missing --data, an existing run in --out and fp16 on the CPU are not check's concern.
        assert_eq!(
            check_message(|c| {
                c.pretrained = Some("no/such/file.safetensors".parse().unwrap());
                c.device = DeviceSpec::Cpu;
                c.amp = AmpMode::Fp16;
            }),
            None
        );
        let c = TrainConfig {
            data: Some("no/such/dir".into()),
            ..Default::default()
        };
        let e = c.preflight().unwrap_err();
        assert!(
            e.to_string().contains("--data directory (or pack) does not exist: no/such/dir"),
            "{e}"
        );
    }

    /// Published weights name their architecture and evaluation transform (torchvision's
    /// table); flags and files still win, and another input size keeps the weights' ratio.
    #[test]
    fn published_weights_set_the_model_and_eval_transform_unless_given() {
        let r = |flags: &str| resolve(None, flags.parse().unwrap());
        let sizes = |c: &TrainConfig| (c.model, c.img_size, c.eval_resize());
        let c = r(r#"pretrained = "torchvision:resnet50""#).unwrap();
        assert_eq!(sizes(&c), (ModelKind::ResNet50, 224, 232));
        let c = r(r#"pretrained = "torchvision:resnet50.IMAGENET1K_V1""#).unwrap();
        assert_eq!(sizes(&c), (ModelKind::ResNet50, 224, 256));
        let c = r(r#"pretrained = "torchvision:efficientnet_b3""#).unwrap();
        assert_eq!(sizes(&c), (ModelKind::EfficientNetB3, 300, 320));
        let c = r(r#"pretrained = "torchvision:vit_b_16.IMAGENET1K_SWAG_E2E_V1""#).unwrap();
        assert_eq!(sizes(&c), (ModelKind::VitB16, 384, 384));
        let c = r("pretrained = \"torchvision:resnet50\"\nimg_size = 128").unwrap();
        assert_eq!(sizes(&c), (ModelKind::ResNet50, 128, 133)); // 232 · 128 / 224
        let c = r("pretrained = \"torchvision:resnet50\"\neval_resize = 256").unwrap();
        assert_eq!(sizes(&c), (ModelKind::ResNet50, 224, 256));
        // The filter: the weights' (torchvision's table), unless given; bilinear without weights.
        let filter = |flags: &str| r(flags).unwrap().interpolation();
        assert_eq!(filter(r#"pretrained = "torchvision:resnet50""#), Interpolation::Bilinear);
        assert_eq!(filter(r#"pretrained = "torchvision:efficientnet_b0""#), Interpolation::Bicubic);
        assert_eq!(
            filter("pretrained = \"torchvision:efficientnet_b0\"\ninterpolation = \"nearest\""),
            Interpolation::Nearest
        );
        assert_eq!(filter("model = \"resnet50\""), Interpolation::Bilinear);
        assert_eq!(r("").unwrap().interpolation, None);
        let e = r("interpolation = \"lanczos\"").unwrap_err();
        assert!(e.to_string().contains("invalid --interpolation 'lanczos'"), "{e}");
        let e = r("pretrained = \"torchvision:resnet50\"\nmodel = \"resnet18\"").unwrap_err();
        assert!(e.to_string().contains("holds resnet50 weights, not resnet18"), "{e}");
        // A file says nothing of either: the defaults stand.
        let c = r("pretrained = \"weights.pth\"\nmodel = \"resnet50\"").unwrap();
        assert_eq!(sizes(&c), (ModelKind::ResNet50, 224, 256));
        assert_eq!(c.pretrained, Some(WeightsSource::File("weights.pth".into())));
    }
}
