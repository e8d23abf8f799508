//! The command line: `ringtrain train`, `ringtrain demo`, `ringtrain --version`.
//! Every `train` option can also come from a TOML file (`--config`); flags override the file.
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::config::{self, OptimizerKind, SchedKind, TrainConfig};
use crate::data::demo;
use crate::error::{is_user_error, user_error};
use crate::shim;

#[derive(Parser)]
#[command(name = "ringtrain", about = "Train image classifiers on folders of images.", disable_version_flag = true)]
struct Cli {
    /// Print ringtrain's version and those of libtorch, CUDA and cuDNN.
    #[arg(short = 'V', long)]
    version: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a network on an ImageFolder directory (<dir>/<class>/<image>).
    Train(TrainArgs),
    /// Generate the built-in shapes data set and train on it: the quickest end-to-end check.
    Demo(DemoArgs),
}

/// Flags given on the command line; only those present override the config file.
#[serde_with::skip_serializing_none]
#[derive(Args, Serialize, Default)]
struct TrainArgs {
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
    model: Option<String>,
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
    device: Option<String>,
    /// Progress line every N steps, 0 for epoch summaries only [50].
    #[arg(long)]
    log_every: Option<usize>,
}

#[derive(Args)]
struct DemoArgs {
    /// Run directory; the generated images go to <out>/data.
    #[arg(long, default_value = "runs/demo")]
    out: PathBuf,
    /// auto | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    #[arg(long, default_value_t = 15)]
    epochs: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn train_config(args: &TrainArgs) -> Result<TrainConfig> {
    let file = args.config.as_deref().map(config::read_toml).transpose()?;
    let flags = toml::Table::try_from(args).map_err(|e| user_error(format!("invalid flags: {e}")))?;
    config::resolve(file, flags)
}

/// Images per class and size of the demo data set.
const DEMO_TRAIN_PER_CLASS: usize = 600;
const DEMO_VAL_PER_CLASS: usize = 60;
const DEMO_IMAGE_SIZE: u32 = 36;

fn demo(args: &DemoArgs) -> Result<()> {
    let data = args.out.join("data");
    let stamp = data.join(format!(".demo-{}x{}-{}-{}", DEMO_TRAIN_PER_CLASS, DEMO_VAL_PER_CLASS, DEMO_IMAGE_SIZE, args.seed));
    if !stamp.exists() {
        let t = std::time::Instant::now();
        if data.exists() {
            std::fs::remove_dir_all(&data)?;
        }
        demo::generate(&data, DEMO_TRAIN_PER_CLASS, DEMO_VAL_PER_CLASS, DEMO_IMAGE_SIZE, args.seed)?;
        std::fs::write(&stamp, b"")?;
        println!(
            "demo: wrote {} shape images ({} classes) to {} in {:.1}s",
            (DEMO_TRAIN_PER_CLASS + DEMO_VAL_PER_CLASS) * demo::CLASSES.len(),
            demo::CLASSES.len(),
            data.display(),
            t.elapsed().as_secs_f64()
        );
    }
    let cfg = TrainConfig {
        data: Some(data.join("train")),
        val: Some(data.join("val")),
        out: args.out.clone(),
        model: "resnet10-tiny".into(),
        img_size: 32,
        eval_resize: Some(32),
        epochs: args.epochs,
        batch_size: 64,
        optimizer: OptimizerKind::Adamw,
        lr: 0.003,
        weight_decay: 0.05,
        warmup_epochs: if args.epochs > 1 { 1.0 } else { 0.0 },
        crop_scale: vec![0.7, 1.0],
        seed: args.seed,
        device: args.device.clone(),
        log_every: 0,
        ..Default::default()
    };
    let summary = crate::train::run(&cfg)?;
    println!("\nclassification report (best epoch {}):\n{}", summary.best_epoch, summary.report.to_text());
    Ok(())
}

fn version() -> String {
    let mut s = format!("ringtrain {}\nlibtorch {}", env!("CARGO_PKG_VERSION"), shim::torch_version());
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
    if cli.version {
        println!("{}", version());
        return Ok(());
    }
    match cli.command {
        Some(Command::Train(args)) => {
            let cfg = train_config(&args)?;
            let summary = crate::train::run(&cfg)?;
            println!("\nclassification report (best epoch {}):\n{}", summary.best_epoch, summary.report.to_text());
            Ok(())
        }
        Some(Command::Demo(args)) => demo(&args),
        None => Err(user_error("no command given; try `ringtrain --help`")),
    }
}

/// Runs the CLI; returns the process exit code (2 for user mistakes, 1 for other failures).
pub fn main() -> i32 {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => 0,
        Err(e) if is_user_error(&e) => {
            eprintln!("error: {e}");
            2
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}
