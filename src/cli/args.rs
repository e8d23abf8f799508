//! The command line's arguments, as clap parses them. Every `train` option is a `TrainConfig`
//! key: its flag is an `Option` here (only the flags given override a `--config` file) and its
//! default, shown in the help, is `TrainConfig::default()`'s (`defaults.rs`).
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::config::{Metric, OptimizerKind, SchedInterval, SchedKind, WarmupMethod};
use crate::data::augment::erasing::EraseMode;
use crate::data::augment::mixup::MixStyle;
use crate::data::augment::policy::PolicyName;
use crate::data::augment::transform::Interpolation;
use crate::data::load::cache::CacheMode;
use crate::device::DeviceSpec;
use crate::dist::ddp::{WirePrecision, DEFAULT_BUCKET_MB};
use crate::dist::plan::DistOptions;
use crate::dist::process_group::Backend;
use crate::export::ExportFormat;
use crate::model::weights::WeightsSource;
use crate::model::ModelKind;
use crate::train::step::amp::AmpMode;

#[derive(Parser)]
#[command(
    name = "ringtrain",
    about = "Train image classifiers on folders of images.",
    disable_version_flag = true
)]
pub struct Cli {
    /// Print ringtrain's version and those of libtorch, CUDA and cuDNN.
    #[arg(short = 'V', long)]
    pub version: bool,
    /// Print errors only.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Train a network on an ImageFolder directory (<dir>/<class>/<image>).
    Train(TrainArgs),
    /// Find a learning rate before training: the LR range test (as fastai's and Lightning's
    /// lr_find) on your data, model and optimizer.
    ///
    /// Takes train's flags. Over --steps optimizer steps (cycling through the data) the LR rises
    /// exponentially from --start-lr to --end-lr; the loss of each step is smoothed (moving
    /// average, beta 0.98, bias-corrected) and the test stops early once the smoothed loss
    /// exceeds 4 times its minimum. The suggested --lr is where the smoothed loss falls fastest
    /// against log(lr), leaving out the first tenth of the steps and the last 5 points; it is
    /// printed with the train command to run. Writes only lr_find.csv and lr_find.png into
    /// --out; the model is thrown away. Runs in one process, at the global --batch-size; flags
    /// about the run itself (--epochs, the schedule, checkpoints) only pass on to the command.
    LrFind(LrFindArgs),
    /// Draw the first training batch as the step receives it (crop, flip, --auto-augment,
    /// erasing, Mixup/CutMix), each image with its label or mixed labels, into a PNG (--out):
    /// train's flags, one process (rank 0's batch), nothing trained.
    ShowBatch(ShowBatchArgs),
    /// Bring a recipe: `recipe from-torchvision -- torchrun ... train.py --model resnet50 ...`
    /// writes the configuration of torchvision's reference command, naming every flag it
    /// cannot carry over.
    #[command(subcommand)]
    Recipe(RecipeCommand),
    /// Generate the built-in shapes data set and train on it: the quickest end-to-end check.
    Demo(DemoArgs),
    /// Evaluate a checkpoint on an ImageFolder directory: loss, top-1/5, per-class report,
    /// confusion matrix (CSV and PNG), all metrics as JSON.
    Eval(EvalArgs),
    /// Predict the classes of images: files, flat folders, or ImageFolder trees (then with accuracy).
    Predict(PredictArgs),
    /// Write a checkpoint as a file servers run without ringtrain (ONNX or TorchScript), with a
    /// dynamic batch dimension, the class names and preprocessing in its metadata, and a
    /// labels.txt beside it.
    ///
    /// The file takes the evaluation's input size (the checkpoint's centre crop): normalised
    /// float [N, 3, H, W], or with --with-preprocess uint8 [N, H, W, 3] pixels, resized and
    /// cropped as `ringtrain eval` does (with --with-resize, of any size). It is run at two
    /// batch sizes against the checkpoint before it is kept (ONNX in ONNX Runtime, where it
    /// loads). `ringtrain predict --checkpoint FILE.onnx` predicts with the file.
    Export(ExportArgs),
    /// Compare training runs: each run's best validation top-1 (its epoch, macro-F1), epochs,
    /// time and images/s, then the configuration keys that differ between them.
    ///
    /// Reads each run directory's config.toml and metrics.csv, so a run still in progress can be
    /// compared too. `out` and `overwrite` are left out of the keys compared.
    Compare(CompareArgs),
    /// Measure the training step alone on synthetic data (optionally against PyTorch's).
    Bench(BenchArgs),
    /// Measure the input pipeline on an ImageFolder directory, alone or feeding the training
    /// step (optionally against PyTorch's DataLoader).
    BenchData(BenchDataArgs),
    /// Where each training step's time goes, from Chrome traces of libtorch's profiler, side
    /// by side: ringtrain bench --profile's, or torch.profiler's (export_chrome_trace, with
    /// prof.step() marking the steps).
    ///
    /// Milliseconds per step by class (convolution forward, data and weight gradients, matrix
    /// multiplies, normalisation, pointwise, reductions, optimizer, copies, exposed
    /// communication, idle), the host's busy time, and the largest kernels or operators.
    TraceTable(TraceTableArgs),
    /// The fused BatchNorm kernels on this GPU, forward and backward, written for the GPU
    /// battery to check against PyTorch (bench/gpu_battery.py).
    #[command(hide = true)]
    FusedCheck(FusedCheckArgs),
    /// Split an ImageFolder tree into <out>/train and <out>/val, stratified per class.
    Split(SplitArgs),
    /// Exact per-channel mean and std over all pixels of a folder, as Normalize arguments.
    Stats(StatsArgs),
    /// Pack an ImageFolder tree into one file, its images decoded once (raw) or as their
    /// files' bytes (encoded); --data and --val of every command take the pack.
    Pack(PackArgs),
    /// List every architecture --model takes: parameters at 1000 classes, the input size its
    /// torchvision (or timm's) weights were made for, its head, its stochastic depth and
    /// dropout, whether timm's weights of it load from --pretrained hf-hub:ORG/NAME and whose
    /// tensor names its files carry; then torchvision's weights that --pretrained
    /// torchvision:NAME takes.
    Models,
    /// Convert weights (a PyTorch checkpoint, torchvision:NAME, hf-hub:ORG/NAME) to one
    /// safetensors file with the names they have (torchvision's; timm's for hf-hub), without
    /// Python and without unpickling.
    Convert(ConvertArgs),
    /// Check this machine for training, in one screen to paste into a bug report.
    ///
    /// ringtrain and libtorch (and how it was found), CUDA, cuDNN, NCCL, the driver, the GPUs and
    /// their peer access, CPU, memory, /dev/shm, the network interface the ranks would use, the
    /// launcher variables set (torchrun, Slurm, Open MPI) and the free space under --out.
    Doctor(DoctorArgs),
    /// Print a shell's completion script.
    ///
    /// bash: `ringtrain completions bash > /etc/bash_completion.d/ringtrain`; zsh: `ringtrain
    /// completions zsh > ~/.zfunc/_ringtrain`; fish: `ringtrain completions fish >
    /// ~/.config/fish/completions/ringtrain.fish`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `ringtrain man > ringtrain.1; man ./ringtrain.1`.
    Man,
}

#[derive(Args)]
pub struct CompareArgs {
    /// Run directories (--out of ringtrain train), one or more.
    #[arg(value_name = "RUN_DIR", required = true)]
    pub runs: Vec<PathBuf>,
    /// Also draw the runs' validation top-1 and loss per epoch into this PNG, one colour per run.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
}

#[derive(Args)]
pub struct TraceTableArgs {
    /// Chrome trace files (.json, or .json.gz), one column each.
    #[arg(value_name = "TRACE", required = true)]
    pub traces: Vec<PathBuf>,
    /// Each column's name, in the traces' order [default: the file names].
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// How many of each trace's largest kernels or operators to list.
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Also write every figure (classes, step, host, each kernel or operator) to this CSV file.
    #[arg(long, value_name = "FILE.csv")]
    pub csv: Option<PathBuf>,
}

#[derive(Args)]
pub struct FusedCheckArgs {
    /// The safetensors file to write every case's inputs and outputs to.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value = "auto")]
    pub device: DeviceSpec,
}

#[derive(Args)]
pub struct DoctorArgs {
    /// The run directory (or any folder) whose disk should have room for checkpoints.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also check that this data can be read: a remote location (s3://, gs://, az://,
    /// http(s)://) is listed and the start of its first object read; a local one is opened.
    #[arg(long)]
    pub data: Option<PathBuf>,
}

#[derive(Args)]
pub struct ConvertArgs {
    /// The weights: a .pth/.pt/.bin or safetensors file, torchvision:NAME[.VARIANT] or
    /// hf-hub:ORG/NAME.
    #[arg(value_name = "IN")]
    pub input: WeightsSource,
    /// The safetensors file to write (replaced atomically if it exists).
    #[arg(long, value_name = "OUT", required_unless_present = "out_positional")]
    pub out: Option<PathBuf>,
    /// --out given as a second positional argument, as earlier versions took it.
    #[arg(value_name = "OUT", hide = true, conflicts_with = "out")]
    pub out_positional: Option<PathBuf>,
    /// The dict of a PyTorch checkpoint that holds the weights [default: found by its usual
    /// names].
    #[arg(long, value_name = "KEY")]
    pub pretrained_key: Option<String>,
    /// Also check the names and shapes against this architecture: every tensor it needs is
    /// there, except a head for another class count.
    #[arg(long)]
    pub model: Option<ModelKind>,
}

/// A command's input images, in any form training takes.
#[derive(Args)]
pub struct SourceArgs {
    /// Images: <dir>/<class>/<image>, a pack (ringtrain pack), WebDataset tar shards
    /// ('train-{000000..000146}.tar', a .tar file or a folder of them), Hugging Face parquet
    /// files ('data/test-*.parquet'), or with --labels a folder of images.
    #[arg(long)]
    pub data: PathBuf,
    /// A CSV file labelling --data's images, one row each, header first: the image (its path
    /// under --data, with or without the extension, or its file name) and its class name (or
    /// number: integer labels are the classes 0…max); columns separated by , ; tab or |.
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// The label file's (parquet files') image column by name (tar shards: the image member's
    /// extension) [default: the first column; in tar shards any image extension; in parquet
    /// files image].
    #[arg(long)]
    pub image_column: Option<String>,
    /// The label file's (parquet files') label column by name (tar shards: the label member's
    /// extension) [default: the second column; in tar shards cls; in parquet files label].
    #[arg(long)]
    pub label_column: Option<String>,
    #[command(flatten)]
    pub fetch: FetchArgs,
}

/// Where data fetched from object stores and web servers is kept on local disk.
#[derive(Args, Clone, Debug, Default)]
pub struct FetchArgs {
    /// Keep the objects read from s3://, gs://, az:// and http(s):// locations in DIR, for the
    /// next epoch and the next run (the ranks of a node may share it: each object is fetched
    /// once) [default: a temporary folder, removed at exit].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// The most the cache may hold, e.g. 500G or 800M (least recently used objects go first)
    /// [default: 80 % of --cache-dir's free space; 16G, or half the free space, for the
    /// temporary folder].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub cache_max: Option<u64>,
}

impl FetchArgs {
    pub fn options(&self) -> crate::data::remote::CacheOptions {
        crate::data::remote::CacheOptions {
            dir: self.cache_dir.clone(),
            max_bytes: self.cache_max,
        }
    }
}

/// A size in bytes: a number, with K, M, G or T (powers of 1024) after it.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['b', 'B']);
    let (number, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, ""),
    };
    let scale: u64 = match unit.to_ascii_uppercase().as_str() {
        "" => 1,
        "K" | "KI" => 1 << 10,
        "M" | "MI" => 1 << 20,
        "G" | "GI" => 1 << 30,
        "T" | "TI" => 1 << 40,
        _ => return Err(format!("'{s}' is not a size such as 500G or 800M")),
    };
    match number.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok((n * scale as f64) as u64),
        _ => Err(format!("'{s}' is not a size such as 500G or 800M")),
    }
}

impl SourceArgs {
    pub fn spec(&self) -> crate::data::source::DataSpec {
        crate::data::source::DataSpec {
            path: self.data.clone(),
            labels: self.labels.clone(),
            columns: crate::data::source::Columns {
                image: self.image_column.clone(),
                label: self.label_column.clone(),
            },
            strict: false,
        }
    }
}

#[derive(Args)]
pub struct PackArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The pack file to write (replaced atomically if it exists).
    #[arg(long)]
    pub out: PathBuf,
    /// raw: decoded RGB8 pixels, nothing to decode while training; encoded: the files' own
    /// bytes (lossless, compact).
    #[arg(long, value_enum, default_value = "raw")]
    pub store: crate::data::source::pack::Store,
    /// With --store raw: resize images whose shorter side is longer than this to it (aspect
    /// kept, antialiased bilinear) [default: none: as decoded].
    #[arg(long)]
    pub max_side: Option<u32>,
    /// Threads [default: available cores].
    #[arg(long)]
    pub workers: Option<usize>,
}

#[derive(Args)]
pub struct SplitArgs {
    /// The ImageFolder tree to split (<dir>/<class>/<image>).
    #[arg(long, alias = "src")]
    pub data: PathBuf,
    /// A new directory (never overwritten): <out>/train and <out>/val.
    #[arg(long, alias = "dst")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 0.2)]
    pub val_ratio: f64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Hard-link the files instead of copying them.
    #[arg(long)]
    pub link: bool,
}

#[derive(Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Args)]
pub struct BenchArgs {
    #[arg(long, default_value = "resnet50")]
    pub model: ModelKind,
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 224)]
    pub img_size: u32,
    /// auto (fp16 on CUDA, off on CPU), off, bf16, fp16.
    #[arg(long, default_value = "auto")]
    pub amp: AmpMode,
    /// Timed steps after the warm-up.
    #[arg(long, default_value_t = 50)]
    pub steps: usize,
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Replay the step as one CUDA graph (captured after the first eager steps; CUDA only).
    #[arg(long)]
    pub cuda_graphs: bool,
    /// Normalisation through the fused kernels where they apply (as train's flag, with train's
    /// default).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub fused_norm: Option<bool>,
    /// Also profile --profile-steps steps after the timed ones (libtorch's Kineto profiler) and
    /// write DIR/trace.json (Chrome trace: Perfetto, chrome://tracing, TensorBoard) and
    /// DIR/profile.txt, the time per step by kernel class (printed too). With --vs-pytorch the
    /// PyTorch reference is profiled the same way into DIR/pytorch/.
    #[arg(long, value_name = "DIR")]
    pub profile: Option<PathBuf>,
    /// Steps in the profile.
    #[arg(long, default_value_t = 5)]
    pub profile_steps: usize,
    #[command(flatten)]
    pub run: BenchRunArgs,
}

/// What `bench` and `bench-data` share: where and how the step runs, and the PyTorch reference.
#[derive(Args)]
pub struct BenchRunArgs {
    /// channels_last memory format [default: on for CUDA, off on the CPU].
    #[arg(long)]
    pub channels_last: Option<bool>,
    #[arg(long, default_value = "auto")]
    pub device: DeviceSpec,
    /// Also run the PyTorch reference (bench/torch_step.py, bench/torch_loader.py) with the same
    /// settings and print the ratio (`bench`: ringtrain runs before and after it, the ratio takes
    /// the mean of its two rates, and a device whose speed moved meanwhile is named).
    #[arg(long)]
    pub vs_pytorch: bool,
    /// Python with torch and torchvision for --vs-pytorch [default: $RINGTRAIN_PYTHON, else python3].
    #[arg(long)]
    pub python: Option<String>,
}

#[derive(Args)]
pub struct BenchDataArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[arg(long, default_value_t = 224)]
    pub img_size: u32,
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Data threads (PyTorch: DataLoader worker processes) [default: available cores].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Passes over the data (the first batch is not timed).
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// Feed this model's training step (SGD) too, as training does.
    #[arg(long)]
    pub model: Option<ModelKind>,
    /// With --model: auto (fp16 on CUDA, off on CPU), off, bf16, fp16.
    #[arg(long, default_value = "auto")]
    pub amp: AmpMode,
    /// The RAM cache, as in training; when on, the epochs after the first are timed.
    #[arg(long, value_enum, default_value = "off")]
    pub cache: CacheMode,
    /// The whole set on the device, each batch made there (its loading is not timed).
    #[arg(long)]
    pub data_on_device: bool,
    /// An augmentation policy after the crop and flip, as train's (the PyTorch side adds
    /// torchvision's on its PIL images, as its reference recipe does, or timm's RandAugment
    /// for a rand-… string).
    #[arg(long)]
    pub auto_augment: Option<PolicyName>,
    #[command(flatten)]
    pub run: BenchRunArgs,
}

#[derive(Args)]
pub struct EvalArgs {
    /// A checkpoint directory (e.g. runs/x/best).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The images to evaluate (any form --data takes), classes among the checkpoint's.
    #[command(flatten)]
    pub source: SourceArgs,
    /// Where the report goes [default: <run>/eval-<checkpoint name>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where report.html goes (the page with the per-class table, confusion matrix and the
    /// highest-loss images) [default: --out].
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    #[command(flatten)]
    pub infer: InferArgs,
}

/// How eval and predict run the model.
#[derive(Args)]
pub struct InferArgs {
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// The evaluation resize's filter: bilinear, bicubic or nearest [default: the checkpoint's,
    /// its run's --interpolation].
    #[arg(long)]
    pub interpolation: Option<Interpolation>,
    /// auto | cpu | cuda | cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: DeviceSpec,
    /// Data worker threads [default: available cores].
    #[arg(long)]
    pub workers: Option<usize>,
}

#[derive(Args)]
pub struct PredictArgs {
    /// A checkpoint directory (e.g. runs/x/best), or an ONNX file `ringtrain export` wrote (run
    /// on the CPU by ONNX Runtime, with the classes and preprocessing of its metadata).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Image files, flat folders or ImageFolder trees; or one pack or set of tar shards.
    #[arg(value_name = "DATA", required_unless_present = "data")]
    pub inputs: Vec<PathBuf>,
    /// The same as the positional inputs, as every other command names its input (repeatable).
    #[arg(long)]
    pub data: Vec<PathBuf>,
    /// CSV of the predictions.
    #[arg(long, default_value = "predictions.csv")]
    pub out: PathBuf,
    /// Classes and probabilities listed per image.
    #[arg(long, default_value_t = 5)]
    pub topk: usize,
    /// Also write each class's raw logit (columns logit_<class>), at full float precision.
    #[arg(long)]
    pub logits: bool,
    #[command(flatten)]
    pub infer: InferArgs,
    #[command(flatten)]
    pub fetch: FetchArgs,
}

#[derive(Args)]
pub struct ExportArgs {
    /// A checkpoint directory (e.g. runs/x/best).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The file format: onnx or torchscript.
    #[arg(long)]
    pub format: ExportFormat,
    /// The file to write; labels.txt goes beside it.
    #[arg(long)]
    pub out: PathBuf,
    /// The ONNX opset to write, 13 to 22 [default: 17; 18 with --with-resize].
    #[arg(long)]
    pub opset: Option<i64>,
    /// fp16 weights and arithmetic (input and output float16).
    #[arg(long)]
    pub half: bool,
    /// Take uint8 RGB images [N, H, W, 3] and normalise them inside the graph.
    #[arg(long)]
    pub with_preprocess: bool,
    /// Take uint8 RGB images of any size [N, H, W, 3] (one size per batch), resized and
    /// centre-cropped inside the graph as the evaluation does, then normalised (ONNX at opset 18
    /// or newer, for Resize's antialiasing; bilinear or bicubic checkpoints).
    #[arg(long)]
    pub with_resize: bool,
    /// Give probabilities (softmax) instead of logits.
    #[arg(long)]
    pub softmax: bool,
}

/// How many processes, and how they meet (`dist::plan::DistOptions`).
#[derive(Args, Default, Clone)]
pub struct DistArgs {
    /// Workers on this node [default: visible GPUs on CUDA, else 1].
    #[arg(long)]
    pub nproc_per_node: Option<usize>,
    /// Nodes in the job (run the same command on each, with its --node-rank).
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Address of the node of rank 0 [default: 127.0.0.1 on one node].
    #[arg(long)]
    pub master_addr: Option<String>,
    /// Rendezvous port on the master [default: a free port (29500 across nodes)].
    #[arg(long)]
    pub master_port: Option<u16>,
    /// CUDA devices for the local ranks, e.g. 1,3 (indices among the visible ones)
    /// [default: local rank = GPU index].
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<usize>>,
    /// Seconds a collective or the rendezvous may take before it is an error.
    #[arg(long, default_value_t = crate::dist::DEFAULT_TIMEOUT.as_secs())]
    pub dist_timeout: u64,
    /// Gradient all-reduce bucket size in MB.
    #[arg(long, default_value_t = DEFAULT_BUCKET_MB)]
    pub bucket_mb: f64,
    /// All-reduce gradients in half precision: bf16 or fp16 (averaged in fp32).
    #[arg(long, default_value_t = WirePrecision::Off)]
    pub grad_compress: WirePrecision,
    /// Start the gradient all-reduce after backward instead of during it (to measure what the
    /// overlap hides).
    #[arg(long)]
    pub no_grad_overlap: bool,
    /// c10d backend: auto (NCCL on CUDA, Gloo on the CPU), nccl, or gloo (also for CUDA tensors,
    /// staged through the host: several ranks may then share one GPU).
    #[arg(long, default_value_t = Backend::Auto)]
    pub dist_backend: Backend,
    /// Restart this node's workers with --resume auto when one fails, up to N times (torchrun's
    /// --max-restarts); a rejected input (exit code 2) is never retried.
    #[arg(long, default_value_t = 0)]
    pub max_restarts: usize,
}

impl From<&DistArgs> for DistOptions {
    fn from(a: &DistArgs) -> Self {
        DistOptions {
            nproc_per_node: a.nproc_per_node,
            nnodes: a.nnodes,
            node_rank: a.node_rank,
            master_addr: a.master_addr.clone(),
            master_port: a.master_port,
            devices: a.devices.clone(),
            timeout: std::time::Duration::from_secs(a.dist_timeout),
            bucket_mb: a.bucket_mb,
            grad_compress: a.grad_compress,
            overlap: !a.no_grad_overlap,
            backend: a.dist_backend,
            max_restarts: a.max_restarts,
        }
    }
}

/// Flags given on the command line; only those present override the config file. Each field is
/// a `TrainConfig` key (tested), except the launch flags, `--config` and `--resume`.
#[serde_with::skip_serializing_none]
#[derive(Args, Serialize, Default)]
pub struct TrainArgs {
    #[command(flatten)]
    #[serde(skip)]
    pub dist: DistArgs,
    #[command(flatten)]
    #[serde(skip)]
    pub fetch: FetchArgs,
    /// TOML file with any of the options below (flag names with '_' for '-') [default: none].
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Training images: <dir>/<class>/<image>, a pack (ringtrain pack), WebDataset tar shards
    /// ('train-{000000..000146}.tar', a .tar file or a folder of them), Hugging Face parquet
    /// files ('data/train-*.parquet', a file or a folder of them), or with --labels a folder of
    /// images.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Validation images (any form --data takes), classes among --data's.
    #[arg(long)]
    pub val: Option<PathBuf>,
    /// Without --val, hold out this fraction of each class.
    #[arg(long)]
    pub val_split: Option<f64>,
    /// A CSV file labelling --data's images, one row each, header first: the image (its path
    /// under --data, with or without the extension, or its file name) and its class name (or
    /// number: integer labels are the classes 0…max); columns separated by , ; tab or |.
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// A CSV file labelling --val's images (--data's folder's, when no --val is given).
    #[arg(long)]
    pub val_labels: Option<PathBuf>,
    /// The label files' (parquet files') image column by name (tar shards: the image member's
    /// extension).
    #[arg(long)]
    pub image_column: Option<String>,
    /// The label files' (parquet files') label column by name (tar shards: the label member's
    /// extension).
    #[arg(long)]
    pub label_column: Option<String>,
    /// Tar shards and parquet files: the shuffle buffer, in samples, over each stream of shards
    /// (as WebDataset's .shuffle(N)); parquet's shards are its row groups.
    #[arg(long)]
    pub shuffle_buffer: Option<usize>,
    /// Tar shards and parquet files: the streams an epoch's shards are dealt to, read side by
    /// side into one order that does not depend on the number of ranks (MosaicML's canonical
    /// nodes); up to this many ranks, or any number dividing it, read disjoint shards.
    #[arg(long)]
    pub shard_streams: Option<usize>,
    /// Each rank writes the samples of every optimizer step to <out>/samples/ (epoch, step,
    /// sample name): which images a run saw, across stops and resumptions.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub log_samples: Option<bool>,
    /// Run directory: config, checkpoints, metrics.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, help = ModelKind::names())]
    pub model: Option<ModelKind>,
    /// Training crop size in pixels; the evaluation's centre crop too, unless --val-crop-size.
    #[arg(long)]
    pub img_size: Option<u32>,
    /// torchvision's name of --img-size for training; unlike it, leaves the evaluation crop at
    /// torchvision's: --val-crop-size, else the model's input size.
    #[arg(long, value_name = "N")]
    pub train_crop_size: Option<u32>,
    /// Evaluation resize before the centre crop.
    #[arg(long)]
    pub eval_resize: Option<u32>,
    /// torchvision's name of --eval-resize.
    #[arg(long, value_name = "N")]
    pub val_resize_size: Option<u32>,
    /// The evaluation's centre crop (torchvision's): validation, eval and predict of the run's
    /// checkpoints. A ViT takes only its training crop.
    #[arg(long)]
    pub val_crop_size: Option<u32>,
    /// The filter of the training crop's resize and the evaluation resize, as PIL's (torchvision
    /// on PIL images): bilinear, bicubic (both antialiased) or nearest.
    #[arg(long)]
    pub interpolation: Option<Interpolation>,
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Images per batch over all ranks (torchvision's --batch-size and -b count one GPU's).
    #[arg(long)]
    pub batch_size: Option<usize>,
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerKind>,
    /// Peak learning rate.
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    #[arg(long)]
    pub momentum: Option<f64>,
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub nesterov: Option<bool>,
    #[arg(long, visible_alias = "wd", allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    /// LARS's trust coefficient: a tensor's step is scaled by eta·‖w‖ / (‖g‖ + weight decay·‖w‖).
    #[arg(long)]
    pub lars_eta: Option<f64>,
    /// RMSprop's smoothing constant: square_avg = alpha·square_avg + (1 - alpha)·g².
    #[arg(long)]
    pub rmsprop_alpha: Option<f64>,
    /// RMSprop's eps, added to √square_avg.
    #[arg(long)]
    pub rmsprop_eps: Option<f64>,
    #[arg(long)]
    pub label_smoothing: Option<f64>,
    /// LR schedule after the warm-up (--lr-scheduler cosineannealinglr and steplr, torchvision's
    /// names, are cosine and step).
    #[arg(long, visible_alias = "lr-scheduler", value_enum)]
    pub sched: Option<SchedKind>,
    /// Epochs of warm-up, the shape ringtrain's ramp unless --lr-warmup-method.
    #[arg(long)]
    pub warmup_epochs: Option<f64>,
    /// torchvision's name of --warmup-epochs, with torchvision's warm-up: --lr-warmup-method,
    /// else constant.
    #[arg(long, value_name = "N")]
    pub lr_warmup_epochs: Option<usize>,
    /// torchvision's warm-up: linear (LinearLR: from lr · --lr-warmup-decay to lr, rising every
    /// step) or constant (ConstantLR: lr · --lr-warmup-decay), the main schedule starting after
    /// it (SequentialLR; step counts its epochs from there).
    #[arg(long, value_enum)]
    pub lr_warmup_method: Option<WarmupMethod>,
    /// The factor of --lr-warmup-method, in (0, 1].
    #[arg(long)]
    pub lr_warmup_decay: Option<f64>,
    /// When the learning rate moves: every optimizer step, or once an epoch (each epoch at the
    /// schedule's value at its start, as torchvision's train.py steps its scheduler).
    #[arg(long, value_enum)]
    pub sched_interval: Option<SchedInterval>,
    /// The cosine's floor (torchvision's --lr-min).
    #[arg(long, visible_alias = "lr-min")]
    pub eta_min: Option<f64>,
    /// Cosine period (poly: decay length) in epochs.
    #[arg(long)]
    pub t_max: Option<f64>,
    /// Poly: the LR is eta-min + (lr - eta-min)·(1 - progress)^power after the warm-up.
    #[arg(long)]
    pub poly_power: Option<f64>,
    /// Step schedule: epochs between decays (torchvision's --lr-step-size).
    #[arg(long, visible_alias = "lr-step-size")]
    pub step_size: Option<usize>,
    /// Step and multistep schedules: the LR's factor at each decay (torchvision's --lr-gamma).
    #[arg(long, visible_alias = "lr-gamma")]
    pub gamma: Option<f64>,
    /// Clip gradients to this global L2 norm.
    #[arg(long)]
    pub clip_grad_norm: Option<f64>,
    /// RandomResizedCrop area range, e.g. 0.25,1.
    #[arg(long, value_delimiter = ',')]
    pub crop_scale: Option<Vec<f64>>,
    /// CIFAR-style training crop: Resize(img-size) + RandomCrop(img-size, padding=N), zero fill,
    /// instead of RandomResizedCrop.
    #[arg(long)]
    pub crop_padding: Option<u32>,
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub hflip: Option<bool>,
    /// Start every residual block's last BatchNorm weight at 0, so each block starts as the
    /// identity (torchvision's zero_init_residual=True; ResNets only).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub zero_init_residual: Option<bool>,
    /// Decode exactly as torchvision does, giving up speed: every JPEG whole, none at 1/8 size
    /// when the crop shrinks it 8× or more (also for eval and predict of this run).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub torchvision_compat: Option<bool>,
    /// Normalisation mean per channel (ImageNet's by default).
    #[arg(long, value_delimiter = ',')]
    pub mean: Option<Vec<f64>>,
    /// Normalisation std per channel (ImageNet's by default).
    #[arg(long, value_delimiter = ',')]
    pub std: Option<Vec<f64>>,
    /// Data worker threads.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Batches prepared ahead of the training step.
    #[arg(long)]
    pub prefetch: Option<usize>,
    /// Keep decoded images in RAM after the first epoch: auto (when the whole set fits the
    /// budget), ram (what fits), off.
    #[arg(long, value_enum)]
    pub cache: Option<CacheMode>,
    /// The RAM cache's budget in GB.
    #[arg(long)]
    pub cache_gb: Option<f64>,
    /// Keep the whole uint8 data set on the training device and cut, resize, flip and
    /// normalise each batch there (not with --random-erasing).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub data_on_device: Option<bool>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// auto | cpu | cuda | cuda:N.
    #[arg(long)]
    pub device: Option<DeviceSpec>,
    /// Progress line every N steps, 0 for epoch summaries only.
    #[arg(long)]
    pub log_every: Option<usize>,
    /// Mixed precision: auto (fp16 on CUDA, off on CPU), off, bf16, fp16.
    #[arg(long)]
    pub amp: Option<AmpMode>,
    /// Fixed fp16 loss scale (e.g. 1024) instead of dynamic scaling.
    #[arg(long)]
    pub loss_scale: Option<f64>,
    /// Where dynamic fp16 loss scaling starts (halved on each overflow, doubled after 2000 clean
    /// steps).
    #[arg(long)]
    pub init_loss_scale: Option<f64>,
    /// Reproducible CUDA kernels (cuDNN deterministic, no benchmark autotuning, deterministic
    /// cuBLAS workspace): the same result run to run and across a resume on one GPU; slower.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub deterministic: Option<bool>,
    /// channels_last memory format.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub channels_last: Option<bool>,
    /// Replace the run already in --out (its checkpoints are lost).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub overwrite: Option<bool>,
    /// Stop at the first unreadable image instead of skipping it with a warning.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub strict: Option<bool>,
    /// Print and save (reports/epoch-NNNN.txt) the per-class report after every epoch.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub report_every_epoch: Option<bool>,
    /// Synchronise BatchNorm statistics across ranks (SyncBatchNorm) when distributed.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub sync_bn: Option<bool>,
    /// Capture the whole training step (forward, backward, all-reduce, optimizer, EMA) as one
    /// CUDA graph after a few eager steps and replay it (CUDA only; not with Mixup/CutMix or
    /// --accum-steps).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub cuda_graphs: Option<bool>,
    /// Normalisation through ringtrain's fused kernels (built ahead of time; CUDA GPUs of
    /// compute capability 8.0 or newer, channels_last): BatchNorm, the residual add and ReLU of
    /// the ResNet family, ConvNeXt's block LayerNorm and end; every layer or device they do not cover
    /// runs the unfused ops, and says so once. Default: on where GPU runs showed them faster and
    /// equal (ResNets and ConvNeXts in fp16 or bf16, channels_last, compute capability 9.0; with
    /// --cuda-graphs ResNets only), off elsewhere; false turns them off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub fused_norm: Option<bool>,
    /// Fine-tune from these weights: a file (safetensors, or a PyTorch .pth/.pt/.bin checkpoint,
    /// read without unpickling), torchvision:NAME[.VARIANT] (torchvision's ImageNet weights, e.g.
    /// torchvision:resnet50; from the torch hub cache, else downloaded into it) or
    /// hf-hub:ORG/NAME (timm's weights on the Hugging Face hub: its ViT, DeiT, ConvNeXt,
    /// EfficientNet, MobileNetV3, RegNet and ResNet(-D) families, see ringtrain models).
    /// Published weights set --model, --img-size, --eval-resize, --interpolation, mean and std
    /// unless given; the head is re-initialised when the class count differs; any other tensor
    /// that does not fit is an error.
    #[arg(long, value_name = "FILE|torchvision:NAME|hf-hub:ORG/NAME")]
    pub pretrained: Option<WeightsSource>,
    /// The dict of a PyTorch checkpoint that holds the weights, e.g. state_dict_ema.
    #[arg(long, value_name = "KEY")]
    pub pretrained_key: Option<String>,
    /// Load the --pretrained tensors that fit and leave the rest as initialised, on purpose
    /// (without it, a tensor the model lacks or one the file lacks is an error).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub pretrained_partial: Option<bool>,
    /// Freeze parameters under these name prefixes, e.g. conv1,bn1,layer1.
    #[arg(long, value_delimiter = ',')]
    pub freeze: Option<Vec<String>>,
    /// Learning rate of the classifier head as a multiple of --lr (e.g. 10).
    #[arg(long)]
    pub head_lr_mult: Option<f64>,
    /// No weight decay on BatchNorm weights and biases.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub no_bn_weight_decay: Option<bool>,
    /// No weight decay on any norm's weight and bias, any bias, ConvNeXt's layer scales, ViT's
    /// position embedding and class token (as timm does).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub no_norm_bias_decay: Option<bool>,
    /// Weight decay of the normalisation layers' weights and biases (BatchNorm, LayerNorm,
    /// GroupNorm), as torchvision's set_weight_decay; usually 0.0.
    #[arg(long)]
    pub norm_weight_decay: Option<f64>,
    /// Weight decay of every parameter named bias, norms' included (torchvision's).
    #[arg(long)]
    pub bias_weight_decay: Option<f64>,
    /// Layer-wise learning-rate decay (ViT/ConvNeXt fine-tuning, e.g. 0.75): each layer below
    /// the head learns at this times the rate of the one above it.
    #[arg(long)]
    pub layer_decay: Option<f64>,
    /// Stochastic depth rate of the last block (ConvNeXt, EfficientNet, ViT), rising linearly
    /// from 0 at the first.
    #[arg(long)]
    pub drop_path: Option<f64>,
    /// Dropout before the classifier (EfficientNet, MobileNetV3, AlexNet) or in the encoder
    /// (ViT).
    #[arg(long)]
    pub dropout: Option<f64>,
    /// Mixup alpha (timm's mixup_alpha, e.g. 0.8); 0 is off.
    #[arg(long)]
    pub mixup_alpha: Option<f64>,
    /// CutMix alpha (timm's cutmix_alpha, e.g. 1.0); 0 is off.
    #[arg(long)]
    pub cutmix_alpha: Option<f64>,
    /// Probability that a batch is mixed.
    #[arg(long)]
    pub mix_prob: Option<f64>,
    /// With Mixup and CutMix both on: probability of CutMix.
    #[arg(long)]
    pub mix_switch_prob: Option<f64>,
    /// Whose Mixup/CutMix: timm (each image mixed with its mirror in the reversed batch) or
    /// torchvision (with the image before it, as train.py; with --ra-sampler that is often
    /// its own copy).
    #[arg(long, value_enum)]
    pub mix_style: Option<MixStyle>,
    /// An augmentation policy after the crop and flip, as torchvision's: ta_wide
    /// (TrivialAugmentWide), ra (RandAugment), imagenet | cifar10 | svhn (AutoAugment's
    /// policies) or augmix; or timm's RandAugment by its string (rand-m9-mstd0.5-inc1).
    #[arg(long)]
    pub auto_augment: Option<PolicyName>,
    /// ColorJitter after the flip, torchvision's: brightness,contrast,saturation[,hue], or one
    /// value for the first three (timm's --color-jitter 0.4).
    #[arg(long, value_delimiter = ',')]
    pub color_jitter: Option<Vec<f64>>,
    /// RandAugment's magnitude: a bin of 31 (0..30).
    #[arg(long)]
    pub ra_magnitude: Option<usize>,
    /// RandAugment's number of operations per image.
    #[arg(long)]
    pub ra_num_ops: Option<usize>,
    /// AugMix's severity (1..10): its operations take the bins below it.
    #[arg(long)]
    pub augmix_severity: Option<usize>,
    /// Repeated augmentation (torchvision's RASampler): each image --ra-reps times an epoch, the
    /// copies spread over the ranks, the epoch as long as without.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub ra_sampler: Option<bool>,
    /// Copies of each image per epoch with --ra-sampler.
    #[arg(long)]
    pub ra_reps: Option<usize>,
    /// Read the training images in the order PyTorch's DistributedSampler (and torchvision's
    /// RASampler) seeded with this number gives: torch.randperm from seed + epoch, sharded over
    /// the ranks as they shard it. The order no longer depends on --seed.
    #[arg(long, value_name = "SEED")]
    pub torch_sampler_seed: Option<u64>,
    /// RandomErasing probability per training image, e.g. 0.25 (torchvision's --random-erase).
    #[arg(long, visible_alias = "random-erase")]
    pub random_erasing: Option<f64>,
    /// RandomErasing fill: const (the mean colour, torchvision's value=0) or pixel (timm's noise).
    #[arg(long, value_enum)]
    pub random_erasing_mode: Option<EraseMode>,
    /// Multistep schedule: epochs at which the LR is multiplied by --gamma, e.g. 30,60,80.
    #[arg(long, value_delimiter = ',')]
    pub milestones: Option<Vec<usize>>,
    /// From this epoch (1-based) on, keep the LR at --constant-lr.
    #[arg(long)]
    pub constant_lr_from_epoch: Option<usize>,
    /// The LR from --constant-lr-from-epoch on.
    #[arg(long)]
    pub constant_lr: Option<f64>,
    /// ReduceLROnPlateau (--sched plateau): the LR factor.
    #[arg(long)]
    pub plateau_factor: Option<f64>,
    /// ReduceLROnPlateau: epochs without improvement before the LR drops.
    #[arg(long)]
    pub plateau_patience: Option<usize>,
    /// ReduceLROnPlateau: relative improvement that counts.
    #[arg(long)]
    pub plateau_threshold: Option<f64>,
    /// ReduceLROnPlateau: epochs to wait after a drop.
    #[arg(long)]
    pub plateau_cooldown: Option<usize>,
    /// ReduceLROnPlateau: the LR's floor.
    #[arg(long)]
    pub min_lr: Option<f64>,
    /// Metric that picks the best checkpoint and drives plateau and early stopping.
    #[arg(long, value_enum)]
    pub monitor: Option<Metric>,
    /// Stop after this many epochs without improvement of --monitor.
    #[arg(long)]
    pub early_stop_patience: Option<usize>,
    /// Exponential moving average of the weights with this decay (e.g. 0.9998), evaluated
    /// each epoch and saved beside the model.
    #[arg(long)]
    pub ema: Option<f64>,
    /// torchvision's average (not with --ema): updated at every --model-ema-steps-th optimizer
    /// step of an epoch, its first included, with the decay alpha = min(1, (1 - D) · batch ·
    /// steps / epochs) from D = --model-ema-decay and the global batch; through the warm-up's
    /// epochs it copies the weights. Evaluated each epoch and saved beside the model.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub model_ema: Option<bool>,
    /// Optimizer steps between --model-ema's updates.
    #[arg(long)]
    pub model_ema_steps: Option<usize>,
    /// --model-ema's decay before its adjustment.
    #[arg(long)]
    pub model_ema_decay: Option<f64>,
    /// Micro-batches per optimizer step (effective batch = batch-size × accum-steps).
    #[arg(long)]
    pub accum_steps: Option<usize>,
    /// Save last/ every N optimizer steps too, not only at epoch ends.
    #[arg(long)]
    pub save_every_steps: Option<usize>,
    /// Save last/ every M minutes too (checked every 10th step when distributed).
    #[arg(long)]
    pub save_every_minutes: Option<f64>,
    /// On SIGUSR1 (Slurm's --signal=USR1@90) or SIGTERM: save last/, requeue the Slurm job
    /// (scontrol requeue $SLURM_JOB_ID), exit 0. Run the job's command with --resume auto.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub requeue: Option<bool>,
    /// Keep the last N epochs' checkpoints as epoch-NNNN/.
    #[arg(long)]
    pub keep: Option<usize>,
    /// Continue a run: `auto` (the --out run's last/ checkpoint, or a new run if there is none)
    /// or a checkpoint directory. Model, optimizer, schedule, scaler, EMA and data position are
    /// restored, mid-epoch included. [default: none: a new run]
    #[arg(long)]
    #[serde(skip)]
    pub resume: Option<String>,
}

#[derive(Subcommand)]
pub enum RecipeCommand {
    /// torchvision's reference command (references/classification/train.py, as pasted: torchrun
    /// or python -m torch.distributed.run included) as ringtrain's configuration (TOML), with
    /// train.py's defaults written out, its per-process batch made global, and each flag that
    /// cannot be carried over named.
    FromTorchvision {
        /// Write the configuration here (atomically) instead of to standard output.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The command, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

/// `show-batch`: train's flags. Its --out is the PNG (`defaults.rs` gives it its own help).
#[derive(Args)]
pub struct ShowBatchArgs {
    #[command(flatten)]
    pub train: TrainArgs,
}

/// `lr-find`: train's flags, then the range test's own. Its --out is where lr_find.csv and
/// lr_find.png go (`defaults.rs` gives it its own help).
#[derive(Args)]
pub struct LrFindArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// The LR of the first step.
    #[arg(long, default_value = "1e-7")]
    pub start_lr: f64,
    /// The LR of the last step.
    #[arg(long, default_value = "10")]
    pub end_lr: f64,
    /// Optimizer steps from --start-lr to --end-lr (fastai's and Lightning's 100: enough points
    /// for the smoothing, a minute or two on a GPU).
    #[arg(long, default_value_t = 100)]
    pub steps: usize,
}

/// The demo's flags; like `train`'s, only those given override its recipe (recipes/demo.toml).
#[serde_with::skip_serializing_none]
#[derive(Args, Serialize)]
pub struct DemoArgs {
    /// Run directory; the generated images go to <out>/data.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// auto | cpu | cuda | cuda:N.
    #[arg(long)]
    pub device: Option<DeviceSpec>,
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Seed of the generated images and of the training run.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// clap's usage error as one line: the error, its tip and possible values, without the usage
/// block and the pointer to --help.
pub fn one_line_usage_error(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .collect::<Vec<_>>()
        .join(" ")
}
