//! The command line: `ringtrain train`, `ringtrain demo`, `ringtrain --version`.
//! Every `train` option can also come from a TOML file (`--config`); flags override the file.
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::config::{self, OptimizerKind, SchedKind, TrainConfig};
use crate::device::DeviceSpec;
use crate::dist::ddp::WirePrecision;
use crate::model::ModelKind;
use crate::train::amp::AmpMode;
use crate::data::demo;
use crate::data::folder::ImageFolder;
use crate::data::loader::{Loader, LoaderOptions, Shard};
use crate::data::transform::Transform;
use crate::dist::env as dist_env;
use crate::dist::launcher::{self, LaunchSpec};
use crate::dist::process_group::{nccl_available, ProcessGroup};
use crate::dist::DistSetup;
use crate::error::{is_user_error, user_error};
use crate::predict::PredictOptions;
use crate::report::write_evaluation;
use crate::say;
use crate::shim;
use crate::train::checkpoint;
use crate::train::eval::evaluate;

#[derive(Parser)]
#[command(
    name = "ringtrain",
    about = "Train image classifiers on folders of images.",
    disable_version_flag = true
)]
struct Cli {
    /// Print ringtrain's version and those of libtorch, CUDA and cuDNN.
    #[arg(short = 'V', long)]
    version: bool,
    /// Print errors only.
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a network on an ImageFolder directory (<dir>/<class>/<image>).
    Train(TrainArgs),
    /// Generate the built-in shapes data set and train on it: the quickest end-to-end check.
    Demo(DemoArgs),
    /// Evaluate a checkpoint on an ImageFolder directory: loss, top-1/5, per-class report,
    /// confusion matrix (CSV and PNG), all metrics as JSON.
    Eval(EvalArgs),
    /// Predict the classes of images: files, flat folders, or ImageFolder trees (then with accuracy).
    Predict(PredictArgs),
    /// Measure the training step alone on synthetic data (optionally against PyTorch's).
    Bench(BenchArgs),
    /// Measure the input pipeline on an ImageFolder directory, alone or feeding the training
    /// step (optionally against PyTorch's DataLoader).
    BenchData(BenchDataArgs),
    /// Split an ImageFolder tree into <dst>/train and <dst>/val, stratified per class.
    Split(SplitArgs),
    /// Exact per-channel mean and std over all pixels of a folder, as Normalize arguments.
    Stats(StatsArgs),
}

#[derive(Args)]
struct SplitArgs {
    #[arg(long)]
    src: PathBuf,
    /// A new directory (never overwritten).
    #[arg(long)]
    dst: PathBuf,
    #[arg(long, default_value_t = 0.2)]
    val_ratio: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Hard-link the files instead of copying them.
    #[arg(long)]
    link: bool,
}

#[derive(Args)]
struct StatsArgs {
    #[arg(long)]
    data: PathBuf,
}

#[derive(Args)]
struct BenchArgs {
    #[arg(long, default_value = "resnet50")]
    model: ModelKind,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    #[arg(long, default_value_t = 224)]
    img_size: u32,
    /// auto (fp16 on CUDA, off on CPU), off, bf16, fp16.
    #[arg(long, default_value = "auto")]
    amp: AmpMode,
    /// Timed steps after the warm-up.
    #[arg(long, default_value_t = 50)]
    steps: usize,
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    #[command(flatten)]
    run: BenchRunArgs,
}

/// What `bench` and `bench-data` share: where and how the step runs, and the PyTorch reference.
#[derive(Args)]
struct BenchRunArgs {
    /// channels_last memory format [on for CUDA].
    #[arg(long)]
    channels_last: Option<bool>,
    #[arg(long, default_value = "auto")]
    device: DeviceSpec,
    /// Also run the PyTorch reference (bench/torch_step.py, bench/torch_loader.py) with the same
    /// settings and print the ratio.
    #[arg(long)]
    vs_pytorch: bool,
    /// Python with torch and torchvision for --vs-pytorch [$RINGTRAIN_PYTHON, else python3].
    #[arg(long)]
    python: Option<String>,
}

#[derive(Args)]
struct BenchDataArgs {
    /// Images in the ImageFolder layout.
    #[arg(long)]
    data: PathBuf,
    #[arg(long, default_value_t = 224)]
    img_size: u32,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Data threads (PyTorch: DataLoader worker processes) [cores].
    #[arg(long)]
    workers: Option<usize>,
    /// Passes over the data (the first batch is not timed).
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// Feed this model's training step (SGD) too, as training does.
    #[arg(long)]
    model: Option<ModelKind>,
    /// With --model: auto (fp16 on CUDA, off on CPU), off, bf16, fp16.
    #[arg(long, default_value = "auto")]
    amp: AmpMode,
    #[command(flatten)]
    run: BenchRunArgs,
}

#[derive(Args)]
struct EvalArgs {
    /// A checkpoint directory (e.g. runs/x/best).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Images in the ImageFolder layout, with the checkpoint's classes.
    #[arg(long)]
    data: PathBuf,
    /// Where the report goes [<run>/eval-<checkpoint name>].
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    infer: InferArgs,
}

/// How eval and predict run the model.
#[derive(Args)]
struct InferArgs {
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// auto | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto")]
    device: DeviceSpec,
    /// Data worker threads [available cores].
    #[arg(long)]
    workers: Option<usize>,
}

#[derive(Args)]
struct PredictArgs {
    /// A checkpoint directory (e.g. runs/x/best).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Image files, flat folders or ImageFolder trees.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// CSV of the predictions.
    #[arg(long, default_value = "predictions.csv")]
    out: PathBuf,
    /// Classes and probabilities listed per image.
    #[arg(long, default_value_t = 5)]
    topk: usize,
    /// Also write each class's raw logit (columns logit_<class>), at full float precision.
    #[arg(long)]
    logits: bool,
    #[command(flatten)]
    infer: InferArgs,
}

/// How many processes, and how they meet. Not part of the saved config: a run's result does not
/// depend on how it was launched, only on the global batch.
#[derive(Args, Default, Clone)]
struct DistArgs {
    /// Workers on this node [visible GPUs when training on CUDA, else 1].
    #[arg(long)]
    nproc_per_node: Option<usize>,
    /// Nodes in the job (run the same command on each, with its --node-rank).
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// Address of the node of rank 0 [127.0.0.1 on one node].
    #[arg(long)]
    master_addr: Option<String>,
    /// Rendezvous port on the master [a free port on one node, 29500 across nodes].
    #[arg(long)]
    master_port: Option<u16>,
    /// CUDA devices for the local ranks, e.g. 1,3 (indices among the visible ones).
    #[arg(long, value_delimiter = ',')]
    devices: Option<Vec<usize>>,
    /// Seconds a collective or the rendezvous may take before it is an error [1800].
    #[arg(long, default_value_t = 1800)]
    dist_timeout: u64,
    /// Gradient all-reduce bucket size in MB.
    #[arg(long, default_value_t = crate::dist::ddp::DEFAULT_BUCKET_MB)]
    bucket_mb: f64,
    /// All-reduce gradients in half precision: bf16 or fp16 (averaged in fp32).
    #[arg(long)]
    grad_compress: Option<WirePrecision>,
}

/// Flags given on the command line; only those present override the config file.
#[serde_with::skip_serializing_none]
#[derive(Args, Serialize, Default)]
struct TrainArgs {
    #[command(flatten)]
    #[serde(skip)]
    dist: DistArgs,
    /// TOML file with any of the options below (flag names with '_' for '-').
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Training images: <dir>/<class>/<image>.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Validation images, same classes as --data.
    #[arg(long)]
    val: Option<PathBuf>,
    /// Without --val, hold out this fraction of each class [0.1].
    #[arg(long)]
    val_split: Option<f64>,
    /// Run directory: config, checkpoints, metrics [runs/train].
    #[arg(long)]
    out: Option<PathBuf>,
    /// resnet18 | resnet34 | resnet50 | resnet101 | alexnet | resnet18-cifar | resnet10-tiny [resnet18].
    #[arg(long)]
    model: Option<ModelKind>,
    /// Training crop size in pixels [224].
    #[arg(long)]
    img_size: Option<u32>,
    /// Evaluation resize before the centre crop [img-size / 0.875].
    #[arg(long)]
    eval_resize: Option<u32>,
    #[arg(long)]
    epochs: Option<usize>,
    #[arg(long)]
    batch_size: Option<usize>,
    #[arg(long, value_enum)]
    optimizer: Option<OptimizerKind>,
    /// Peak learning rate [0.1].
    #[arg(long, allow_negative_numbers = true)]
    lr: Option<f64>,
    #[arg(long)]
    momentum: Option<f64>,
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    nesterov: Option<bool>,
    #[arg(long, allow_negative_numbers = true)]
    weight_decay: Option<f64>,
    #[arg(long)]
    label_smoothing: Option<f64>,
    /// LR schedule after the warm-up [cosine].
    #[arg(long, value_enum)]
    sched: Option<SchedKind>,
    #[arg(long)]
    warmup_epochs: Option<f64>,
    #[arg(long)]
    eta_min: Option<f64>,
    /// Cosine period in epochs [epochs].
    #[arg(long)]
    t_max: Option<f64>,
    #[arg(long)]
    step_size: Option<usize>,
    #[arg(long)]
    gamma: Option<f64>,
    /// Clip gradients to this global L2 norm.
    #[arg(long)]
    clip_grad_norm: Option<f64>,
    /// RandomResizedCrop area range, e.g. 0.08,1.
    #[arg(long, value_delimiter = ',')]
    crop_scale: Option<Vec<f64>>,
    /// CIFAR-style training crop: Resize(img-size) + RandomCrop(img-size, padding=N), zero fill,
    /// instead of RandomResizedCrop.
    #[arg(long)]
    crop_padding: Option<u32>,
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    hflip: Option<bool>,
    /// Normalisation mean, e.g. 0.485,0.456,0.406 (ImageNet's by default).
    #[arg(long, value_delimiter = ',')]
    mean: Option<Vec<f64>>,
    #[arg(long, value_delimiter = ',')]
    std: Option<Vec<f64>>,
    /// Data worker threads [available cores].
    #[arg(long)]
    workers: Option<usize>,
    /// Batches prepared ahead of the training step [4].
    #[arg(long)]
    prefetch: Option<usize>,
    #[arg(long)]
    seed: Option<u64>,
    /// auto | cpu | cuda | cuda:N [auto].
    #[arg(long)]
    device: Option<DeviceSpec>,
    /// Progress line every N steps, 0 for epoch summaries only [50].
    #[arg(long)]
    log_every: Option<usize>,
    /// Mixed precision: auto (fp16 on CUDA, off on CPU), off, bf16, fp16 [auto].
    #[arg(long)]
    amp: Option<AmpMode>,
    /// Fixed fp16 loss scale (e.g. 1024) instead of dynamic scaling.
    #[arg(long)]
    loss_scale: Option<f64>,
    /// channels_last memory format [on for CUDA, off on the CPU].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    channels_last: Option<bool>,
    /// Replace the run already in --out (its checkpoints are lost).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    overwrite: Option<bool>,
    /// Stop at the first unreadable image instead of skipping it with a warning.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    strict: Option<bool>,
    /// Print and save (reports/epoch-NNNN.txt) the per-class report after every epoch.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    report_every_epoch: Option<bool>,
    /// Synchronise BatchNorm statistics across ranks (SyncBatchNorm) when distributed.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    sync_bn: Option<bool>,
    /// Fine-tune from a torchvision-named safetensors state_dict (the head is re-initialised
    /// when the class count differs).
    #[arg(long)]
    pretrained: Option<PathBuf>,
    /// Freeze parameters under these name prefixes, e.g. conv1,bn1,layer1.
    #[arg(long, value_delimiter = ',')]
    freeze: Option<Vec<String>>,
    /// Learning rate of the classifier head as a multiple of --lr (e.g. 10) [1].
    #[arg(long)]
    head_lr_mult: Option<f64>,
    /// No weight decay on BatchNorm weights and biases.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    no_bn_weight_decay: Option<bool>,
    /// Mixup alpha (timm's mixup_alpha, e.g. 0.8); 0 is off [0].
    #[arg(long)]
    mixup_alpha: Option<f64>,
    /// CutMix alpha (timm's cutmix_alpha, e.g. 1.0); 0 is off [0].
    #[arg(long)]
    cutmix_alpha: Option<f64>,
    /// Probability that a batch is mixed [1].
    #[arg(long)]
    mix_prob: Option<f64>,
    /// With Mixup and CutMix both on: probability of CutMix [0.5].
    #[arg(long)]
    mix_switch_prob: Option<f64>,
    /// RandomErasing probability per training image, e.g. 0.25 [0].
    #[arg(long)]
    random_erasing: Option<f64>,
    /// RandomErasing fill: const (the mean colour, torchvision's value=0) or pixel (timm's noise) [const].
    #[arg(long, value_enum)]
    random_erasing_mode: Option<crate::data::erasing::EraseMode>,
    /// Multistep schedule: epochs at which the LR is multiplied by --gamma, e.g. 30,60,80.
    #[arg(long, value_delimiter = ',')]
    milestones: Option<Vec<usize>>,
    /// From this epoch (1-based) on, keep the LR at --constant-lr [eta-min].
    #[arg(long)]
    constant_lr_from_epoch: Option<usize>,
    #[arg(long)]
    constant_lr: Option<f64>,
    /// ReduceLROnPlateau (--sched plateau): LR factor [0.1], patience in epochs [10], relative
    /// threshold [1e-4], cooldown epochs [0], floor [0].
    #[arg(long)]
    plateau_factor: Option<f64>,
    #[arg(long)]
    plateau_patience: Option<usize>,
    #[arg(long)]
    plateau_threshold: Option<f64>,
    #[arg(long)]
    plateau_cooldown: Option<usize>,
    #[arg(long)]
    min_lr: Option<f64>,
    /// Metric that picks the best checkpoint and drives plateau and early stopping [val_top1].
    #[arg(long, value_enum)]
    monitor: Option<config::Metric>,
    /// Stop after this many epochs without improvement of --monitor.
    #[arg(long)]
    early_stop_patience: Option<usize>,
    /// Exponential moving average of the weights with this decay (e.g. 0.9998), evaluated
    /// each epoch and saved beside the model.
    #[arg(long)]
    ema: Option<f64>,
    /// Micro-batches per optimizer step (effective batch = batch-size × accum-steps) [1].
    #[arg(long)]
    accum_steps: Option<usize>,
    /// Save last/ every N optimizer steps too, not only at epoch ends.
    #[arg(long)]
    save_every_steps: Option<usize>,
    /// Keep the last N epochs' checkpoints as epoch-NNNN/ [0].
    #[arg(long)]
    keep: Option<usize>,
    /// Continue a run: `auto` (the --out run's last/ checkpoint, or a new run if there is none)
    /// or a checkpoint directory. Model, optimizer, schedule, scaler, EMA and data position are
    /// restored, mid-epoch included.
    #[arg(long)]
    #[serde(skip)]
    resume: Option<String>,
}

#[derive(Args)]
struct DemoArgs {
    /// Run directory; the generated images go to <out>/data.
    #[arg(long, default_value = "runs/demo")]
    out: PathBuf,
    /// auto | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto")]
    device: DeviceSpec,
    /// Epochs [15, as recipes/demo.toml].
    #[arg(long, default_value_t = 15)]
    epochs: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn train_config(args: &TrainArgs) -> Result<TrainConfig> {
    let file = args.config.as_deref().map(config::read_toml).transpose()?;
    let flags = toml::Table::try_from(args).map_err(|e| user_error(format!("invalid flags: {e}")))?;
    let mut cfg = config::resolve(file, flags)?;
    cfg.resume = args.resume.clone();
    Ok(cfg)
}

/// The demo's training settings (data, val, out, epochs, seed and device come from its flags).
const DEMO_RECIPE: &str = include_str!("../recipes/demo.toml");

/// Images per class and size of the demo data set.
const DEMO_TRAIN_PER_CLASS: usize = 600;
const DEMO_VAL_PER_CLASS: usize = 60;
const DEMO_IMAGE_SIZE: u32 = 36;

fn demo(args: &DemoArgs) -> Result<()> {
    let data = args.out.join("data");
    let stamp = data.join(format!(
        ".demo-{}x{}-{}-{}",
        DEMO_TRAIN_PER_CLASS, DEMO_VAL_PER_CLASS, DEMO_IMAGE_SIZE, args.seed
    ));
    if !stamp.exists() {
        let t = std::time::Instant::now();
        if data.exists() {
            std::fs::remove_dir_all(&data)?;
        }
        demo::generate(
            &data,
            DEMO_TRAIN_PER_CLASS,
            DEMO_VAL_PER_CLASS,
            DEMO_IMAGE_SIZE,
            args.seed,
        )?;
        std::fs::write(&stamp, b"")?;
        say!(
            "demo: wrote {} shape images ({} classes) to {} in {:.1}s",
            (DEMO_TRAIN_PER_CLASS + DEMO_VAL_PER_CLASS) * demo::CLASSES.len(),
            demo::CLASSES.len(),
            data.display(),
            t.elapsed().as_secs_f64()
        );
    }
    let mut flags = toml::Table::new();
    let path = |p: PathBuf| toml::Value::String(p.to_string_lossy().into_owned());
    flags.insert("data".into(), path(data.join("train")));
    flags.insert("val".into(), path(data.join("val")));
    flags.insert("out".into(), path(args.out.clone()));
    flags.insert("epochs".into(), toml::Value::Integer(args.epochs as i64));
    flags.insert("seed".into(), toml::Value::Integer(args.seed as i64));
    flags.insert("device".into(), toml::Value::String(args.device.to_string()));
    let recipe = DEMO_RECIPE
        .parse::<toml::Table>()
        .expect("recipes/demo.toml is valid TOML");
    let mut cfg = config::resolve(Some(recipe), flags)?;
    if cfg.epochs <= 1 {
        cfg.warmup_epochs = 0.0; // a one-epoch check run: no warm-up to spend it in
    }
    finish_run(crate::train::run(&cfg, None)?)
}

/// A training run's end on the command line: the report, or the exit code of the signal that
/// stopped it (its checkpoint is saved).
fn finish_run(summary: crate::train::RunSummary) -> Result<()> {
    if let Some(sig) = summary.interrupted {
        return Err(anyhow::Error::new(ExitCode(128 + sig)));
    }
    if let Some(r) = &summary.report {
        say!(
            "\nclassification report (best epoch {}):\n{}",
            summary.best_epoch,
            r.to_text()
        );
    }
    Ok(())
}

/// Four significant figures or more, so printed figures give the printed ratio.
fn rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.4}")
    }
}

/// A PyTorch reference script of bench/: in the working directory's bench/ (a copy of the
/// repository on another machine), else in the source tree the binary was built from.
fn reference_script(name: &str) -> Result<PathBuf> {
    let candidates = [
        Path::new("bench").join(name),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("bench").join(name),
    ];
    match candidates.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => Err(user_error(format!(
            "--vs-pytorch: cannot find bench/{name}; run from the repository's root"
        ))),
    }
}

fn reference_python(flag: &Option<String>) -> String {
    flag.clone()
        .or_else(|| std::env::var("RINGTRAIN_PYTHON").ok())
        .unwrap_or_else(|| "python3".into())
}

fn bench_data(a: &BenchDataArgs) -> Result<()> {
    let device = a.run.device.resolve()?;
    if a.batch_size == 0 || a.epochs == 0 || a.img_size == 0 || a.workers == Some(0) {
        return Err(user_error(
            "--batch-size, --epochs, --img-size and --workers must be at least 1",
        ));
    }
    let o = crate::bench::data::DataBenchOptions {
        data: a.data.clone(),
        img_size: a.img_size,
        batch_size: a.batch_size,
        workers: workers(a.workers),
        epochs: a.epochs,
        device,
        model: a.model,
        amp: a.amp.autocast_kind(device)?.filter(|_| a.model.is_some()),
        channels_last: a.run.channels_last.unwrap_or(device.is_cuda()),
    };
    say!(
        "{} at {}px, batch {}, {} workers, {} epochs, {:?}{}",
        o.data.display(),
        o.img_size,
        o.batch_size,
        o.workers,
        o.epochs,
        o.device,
        o.model
            .as_ref()
            .map(|m| format!(", feeding {m} (amp {:?}, channels_last {})", o.amp, o.channels_last))
            .unwrap_or_else(|| ", loader alone".into())
    );
    let ours = crate::bench::data::run(&o)?;
    say!("ringtrain: {} img/s", rate(ours));
    if a.run.vs_pytorch {
        let script = reference_script("torch_loader.py")?;
        let theirs = crate::bench::data::run_pytorch(&o, &reference_python(&a.run.python), &script)?;
        say!("pytorch:   {} img/s", rate(theirs));
        say!("ratio ringtrain / pytorch: {:.3}", ours / theirs);
    }
    Ok(())
}

fn workers(n: Option<usize>) -> usize {
    n.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2))
        .max(1)
}

fn eval(args: &EvalArgs) -> Result<()> {
    let device = args.infer.device.resolve()?;
    if args.infer.batch_size == 0 {
        return Err(user_error("--batch-size must be at least 1"));
    }
    // Under torchrun, srun or mpirun each rank evaluates its shard; the counts are combined
    // so every image counts exactly once, and rank 0 writes the report.
    let pg = match dist_env::from_process_env()? {
        Some(e) => crate::dist::join(&e, device, std::time::Duration::from_secs(1800))?,
        None => ProcessGroup::single(device),
    };
    let device = pg.device;
    let is_main = pg.is_main();
    if !is_main {
        crate::report::progress::set_quiet(true);
    }
    let (model, state) = checkpoint::load(&args.checkpoint, device)?;
    let folder = ImageFolder::scan(&args.data, "--data")?;
    if folder.classes != state.classes {
        return Err(user_error(format!(
            "--data {} has classes {:?}, the checkpoint was trained on {:?}",
            args.data.display(),
            folder.classes,
            state.classes
        )));
    }
    let normalize = crate::data::Normalizer::new(state.mean3(), state.std3(), device);
    let loader = Loader::new(
        folder.samples,
        Transform::Eval {
            size: state.img_size,
            resize: state.eval_resize,
        },
        LoaderOptions {
            shard: pg.is_distributed().then_some(Shard {
                rank: pg.rank,
                world: pg.world_size,
                pad: false,
            }),
            ..LoaderOptions::in_order(args.infer.batch_size, workers(args.infer.workers)).for_device(&normalize)
        },
    )?;
    let ev = evaluate(&model, &loader, &normalize, &pg)?;
    for (p, e) in &ev.skipped {
        crate::report::progress::warn_unreadable(p, e);
    }
    let out = args.out.clone().unwrap_or_else(|| {
        let name = args
            .checkpoint
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "checkpoint".into());
        args.checkpoint
            .parent()
            .unwrap_or(Path::new("."))
            .join(format!("eval-{name}"))
    });
    if !is_main {
        return Ok(());
    }
    let title = format!("{} — {}", state.model, args.data.display());
    let report = write_evaluation(&out, &state.classes, &ev, &title)?;
    say!(
        "{} images ({} skipped): loss {:.4}, top-1 {:.2}%, top-5 {:.2}%\n\n{}\nreport, metrics.json, confusion.csv and confusion.png in {}",
        ev.targets.len(),
        ev.skipped.len(),
        ev.loss,
        100.0 * ev.top1,
        100.0 * ev.top5,
        report.to_text(),
        out.display()
    );
    Ok(())
}

fn predict(args: &PredictArgs) -> Result<()> {
    let opts = PredictOptions {
        checkpoint: args.checkpoint.clone(),
        inputs: args.inputs.clone(),
        out: args.out.clone(),
        topk: args.topk,
        logits: args.logits,
        batch_size: args.infer.batch_size,
        device: args.infer.device.resolve()?,
        workers: workers(args.infer.workers),
    };
    let s = crate::predict::predict(&opts)?;
    for (p, e) in &s.skipped {
        crate::report::progress::warn_unreadable(p, e);
    }
    const SHOWN: usize = 20;
    let width = s
        .predictions
        .iter()
        .take(SHOWN)
        .map(|p| p.path.display().to_string().len())
        .max()
        .unwrap_or(4)
        .min(70);
    say!("{:<width$}  {:<24} {:>8}", "path", "predicted", "prob");
    for p in s.predictions.iter().take(SHOWN) {
        let path = p.path.display().to_string();
        let path = if path.len() > width {
            format!("...{}", &path[path.len() - width + 3..])
        } else {
            path
        };
        say!(
            "{:<width$}  {:<24} {:>7.2}%",
            path,
            s.classes[p.top[0].0],
            100.0 * p.top[0].1
        );
    }
    if s.predictions.len() > SHOWN {
        say!("... and {} more", s.predictions.len() - SHOWN);
    }
    let acc = s
        .accuracy()
        .map(|(a, n)| format!("; accuracy {:.2}% on {n} labelled images", 100.0 * a))
        .unwrap_or_default();
    say!(
        "{} images predicted, {} skipped{acc}; CSV: {}",
        s.predictions.len(),
        s.skipped.len(),
        args.out.display()
    );
    Ok(())
}

enum Setup {
    /// Start the workers of this node and wait for them.
    Launch(LaunchSpec),
    /// One rank of a job (launched by us, torchrun, srun or mpirun).
    Worker(DistSetup),
    Single,
}

fn dist_setup(a: &DistArgs, cfg: &TrainConfig) -> Result<Setup> {
    let timeout = std::time::Duration::from_secs(a.dist_timeout.max(1));
    if !(a.bucket_mb > 0.0) {
        return Err(user_error(format!("--bucket-mb must be positive, got {}", a.bucket_mb)));
    }
    if let Some(mut env) = dist_env::from_process_env()? {
        if let Some(addr) = &a.master_addr {
            env.master_addr = addr.clone();
        }
        if let Some(port) = a.master_port {
            env.master_port = port;
        }
        return Ok(Setup::Worker(DistSetup {
            env,
            timeout,
            bucket_mb: a.bucket_mb,
            grad_compress: a.grad_compress.unwrap_or(WirePrecision::Off),
            sync_bn: cfg.sync_bn,
        }));
    }
    if std::env::var_os(launcher::LAUNCHED_VAR).is_some() {
        return Err(user_error("launched as a worker but RANK/WORLD_SIZE are missing"));
    }
    let cuda = cfg.device.resolve()?.is_cuda();
    let gpus = tch::Cuda::device_count() as usize;
    let nproc = match a.nproc_per_node {
        Some(0) => return Err(user_error("--nproc-per-node must be at least 1")),
        Some(n) => n,
        None if cuda => gpus.max(1),
        None => 1,
    };
    if cuda && a.devices.is_none() && nproc > gpus {
        return Err(user_error(format!(
            "--nproc-per-node {nproc} is more than the {gpus} visible GPUs (NCCL needs one GPU per rank)"
        )));
    }
    if let Some(d) = &a.devices {
        if d.len() != nproc {
            return Err(user_error(format!(
                "--devices lists {} devices for {nproc} local ranks",
                d.len()
            )));
        }
        if let Some(bad) = d.iter().find(|&&i| cuda && i >= gpus) {
            return Err(user_error(format!("--devices: no CUDA device {bad} ({gpus} visible)")));
        }
    }
    if a.nnodes == 0 || a.node_rank >= a.nnodes {
        return Err(user_error(format!(
            "--node-rank {} must be less than --nnodes {}",
            a.node_rank, a.nnodes
        )));
    }
    if nproc == 1 && a.nnodes == 1 {
        return Ok(Setup::Single);
    }
    if a.nnodes > 1 && a.master_addr.is_none() {
        return Err(user_error("--nnodes > 1 needs --master-addr (the address of node 0)"));
    }
    let master_port = match a.master_port {
        Some(p) => p,
        None if a.nnodes == 1 => launcher::free_port()?,
        None => dist_env::DEFAULT_MASTER_PORT,
    };
    Ok(Setup::Launch(LaunchSpec {
        nproc_per_node: nproc,
        nnodes: a.nnodes,
        node_rank: a.node_rank,
        master_addr: a.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
        master_port,
        devices: a.devices.clone(),
    }))
}

/// The launcher's exit code, passed through `main` without another message.
#[derive(Debug)]
struct ExitCode(i32);

impl std::fmt::Display for ExitCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "workers failed (exit code {})", self.0)
    }
}

impl std::error::Error for ExitCode {}

fn bench(a: &BenchArgs) -> Result<()> {
    let device = a.run.device.resolve()?;
    if a.batch_size == 0 || a.steps == 0 {
        return Err(user_error("--batch-size and --steps must be at least 1"));
    }
    let window = a.steps.min(10);
    let o = crate::bench::BenchOptions {
        model: a.model,
        batch_size: a.batch_size,
        img_size: a.img_size,
        amp: a.amp.autocast_kind(device)?,
        channels_last: a.run.channels_last.unwrap_or(device.is_cuda()),
        device,
        steps: a.steps - a.steps % window,
        warmup: a.warmup,
        window,
    };
    let mem = |b: Option<u64>| {
        b.map(|b| format!(", peak memory {:.2} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default()
    };
    say!(
        "{} batch {} at {}px, {:?}, amp {:?}, channels_last {}: {} timed steps in windows of {window}",
        o.model,
        o.batch_size,
        o.img_size,
        o.device,
        o.amp,
        o.channels_last,
        o.steps
    );
    let ours = crate::bench::run(&o)?;
    say!(
        "ringtrain: {} img/s{}",
        rate(ours.images_per_s),
        mem(ours.peak_memory_bytes)
    );
    if a.run.vs_pytorch {
        let python = reference_python(&a.run.python);
        let script = reference_script("torch_step.py")?;
        let theirs = crate::bench::run_pytorch(&o, &python, &script)?;
        say!(
            "pytorch:   {} img/s{}",
            rate(theirs.images_per_s),
            mem(theirs.peak_memory_bytes)
        );
        say!(
            "ratio ringtrain / pytorch: {:.3}",
            ours.images_per_s / theirs.images_per_s
        );
    }
    Ok(())
}

fn version() -> String {
    let mut s = format!(
        "ringtrain {}\nlibtorch {}",
        env!("CARGO_PKG_VERSION"),
        shim::torch_version()
    );
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    s += &format!(
        "\nbuilt with: CUDA {}, NCCL {}",
        yes_no(shim::built_with_cuda()),
        yes_no(nccl_available())
    );
    match shim::cuda_version() {
        Some(v) => s += &format!("\nCUDA {v} ({} device(s) visible)", tch::Cuda::device_count()),
        None => s += "\nCUDA not available",
    }
    if let Some(v) = shim::cudnn_version() {
        s += &format!("\ncuDNN {v}");
    }
    s
}

fn dispatch(cli: Cli) -> Result<()> {
    crate::report::progress::set_quiet(cli.quiet);
    if cli.version {
        println!("{}", version());
        return Ok(());
    }
    match cli.command {
        Some(Command::Train(args)) => {
            let cfg = train_config(&args)?;
            let dist = match dist_setup(&args.dist, &cfg)? {
                Setup::Launch(spec) => {
                    cfg.validate()?; // reject bad input once, before starting any worker
                    let argv: Vec<String> = std::env::args().skip(1).collect();
                    let code = launcher::launch(&spec, &argv)?;
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(anyhow::Error::new(ExitCode(code)))
                    };
                }
                Setup::Worker(d) => Some(d),
                Setup::Single => None,
            };
            finish_run(crate::train::run(&cfg, dist.as_ref())?)
        }
        Some(Command::Demo(args)) => demo(&args),
        Some(Command::Eval(args)) => eval(&args),
        Some(Command::Predict(args)) => predict(&args),
        Some(Command::Bench(args)) => bench(&args),
        Some(Command::BenchData(args)) => bench_data(&args),
        Some(Command::Split(a)) => {
            let counts = crate::data::split::split(&a.src, &a.dst, a.val_ratio, a.seed, a.link)?;
            for (class, train, val) in &counts.per_class {
                say!("{class:<28} train {train:>6}  val {val:>6}");
            }
            let (t, v) = counts.per_class.iter().fold((0, 0), |(t, v), c| (t + c.1, v + c.2));
            say!("{t} train and {v} val images in {}", a.dst.display());
            Ok(())
        }
        Some(Command::Stats(a)) => {
            let s = crate::data::stats::pixel_stats(&ImageFolder::scan(&a.data, "--data")?)?;
            for (p, e) in &s.unreadable {
                crate::report::progress::warn_unreadable(p, e);
            }
            let f = |v: [f64; 3]| format!("{:.6},{:.6},{:.6}", v[0], v[1], v[2]);
            say!(
                "{} images, {} pixels ({} unreadable skipped)",
                s.images,
                s.pixels,
                s.unreadable.len()
            );
            say!("mean {}\nstd  {}", f(s.mean), f(s.std));
            say!("ringtrain train ... --mean {} --std {}", f(s.mean), f(s.std));
            say!(
                "transforms.Normalize(mean=[{}], std=[{}])",
                f(s.mean).replace(',', ", "),
                f(s.std).replace(',', ", ")
            );
            Ok(())
        }
        None => Err(user_error("no command given; try `ringtrain --help`")),
    }
}

/// Runs the CLI; returns the process exit code (2 for user mistakes, 1 for other failures).
pub fn main() -> i32 {
    // A file-size limit (ulimit -f) then fails the write with EFBIG, which ends in a clear error
    // with the previous checkpoint intact, instead of killing the process with SIGXFSZ.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // A bug still ends in one line that says where, not a backtrace (RUST_BACKTRACE=1 shows it).
    if std::env::var_os("RUST_BACKTRACE").is_none() {
        std::panic::set_hook(Box::new(|info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            eprintln!("error: internal error{at}: {} (please report it)", first_line(&msg));
        }));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            eprintln!("{}", one_line_usage_error(&e.to_string()));
            return 2;
        }
        Err(e) => e.exit(), // --help
    };
    if std::env::var_os("TORCH_CPP_LOG_LEVEL").is_none() {
        shim::set_torch_log_level(3);
    }
    match dispatch(cli) {
        Ok(()) => 0,
        Err(e) if e.is::<ExitCode>() => e.downcast_ref::<ExitCode>().map(|c| c.0).unwrap_or(1),
        Err(e) if is_user_error(&e) => {
            eprintln!("error: {e}");
            2
        }
        Err(e) => {
            eprintln!("error: {}", first_line(&format!("{e:#}")));
            1
        }
    }
}

/// The first line of a message: libtorch's errors append a C++ stack trace after it.
fn first_line(msg: &str) -> &str {
    let line = msg.lines().next().unwrap_or("").trim_end();
    line.split(" (Exception raised from").next().unwrap_or(line)
}

/// clap's usage error as one line: the error, its tip and possible values, without the usage
/// block and the pointer to --help.
fn one_line_usage_error(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .collect::<Vec<_>>()
        .join(" ")
}
