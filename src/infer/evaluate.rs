//! `ringtrain eval`: a checkpoint on an ImageFolder tree of its classes, with the training run's
//! own evaluation loop; the report, metrics.json and confusion matrix go beside the checkpoint.
//! Under torchrun, srun or mpirun each rank evaluates its shard; the counts are combined so every
//! image counts exactly once, and rank 0 writes the report.
use std::path::{Path, PathBuf};

use anyhow::Result;
use tch::Device;

use crate::bail_user;
use crate::data::augment::transform::Interpolation;
use crate::data::load::loader::{Loader, LoaderOptions, Shard};
use crate::data::load::normalize::Normalizer;
use crate::data::source::{DataSpec, Dataset, SourceKind};
use crate::dist::env as dist_env;
use crate::dist::process_group::{Backend, ProcessGroup};
use crate::error::user_error;
use crate::report::classification::ClassificationReport;
use crate::report::page::command_line;
use crate::report::{write_evaluation, PageContext};
use crate::train::lifecycle::checkpoint;
use crate::train::step::eval::EvalResult;

pub struct EvaluateOptions {
    /// A checkpoint directory (e.g. runs/x/best).
    pub checkpoint: PathBuf,
    /// The images, with classes among the checkpoint's.
    pub data: DataSpec,
    /// Where the report goes; None: `<run>/eval-<checkpoint name>`.
    pub out: Option<PathBuf>,
    /// Where report.html goes; None: `out`.
    pub report: Option<PathBuf>,
    pub batch_size: usize,
    pub device: Device,
    pub workers: usize,
    /// The resize filter; None: the run's (the checkpoint's).
    pub interpolation: Option<Interpolation>,
}

pub struct Evaluation {
    /// This rank's view: loss and accuracies over all ranks, the images it could not read.
    pub result: EvalResult,
    /// The report as written (rank 0 only; the other ranks write nothing).
    pub report: Option<ClassificationReport>,
    /// The report's directory.
    pub out: PathBuf,
    /// The page (report.html).
    pub page: PathBuf,
}

pub fn evaluate(o: &EvaluateOptions) -> Result<Evaluation> {
    if o.batch_size == 0 {
        bail_user!("--batch-size must be at least 1");
    }
    let pg = match dist_env::from_process_env()? {
        Some(e) => crate::dist::join(&e, o.device, Backend::Auto, crate::dist::DEFAULT_TIMEOUT)?,
        None => ProcessGroup::single(o.device),
    };
    let device = pg.device;
    let is_main = pg.is_main();
    if !is_main {
        crate::report::progress::set_quiet(true);
    }
    let (model, state) = checkpoint::load(&o.checkpoint, device)?;
    let data = Dataset::open(o.data.clone(), "--data")?;
    // A folder or a pack has all of its classes; a label file or shards may lack some.
    if matches!(data.kind, SourceKind::Folder | SourceKind::Pack { .. }) && data.classes != state.classes {
        bail_user!(
            "--data {} has classes {:?}, the checkpoint was trained on {:?}",
            o.data.path.display(),
            data.classes,
            state.classes
        );
    }
    let data = data.onto_classes(&state.classes)?;
    let normalize = Normalizer::new(state.mean3(), state.std3(), device);
    let loader = Loader::new(
        data.samples.clone(),
        state.eval_transform(o.interpolation),
        LoaderOptions {
            shard: pg.is_distributed().then_some(Shard {
                rank: pg.rank,
                world: pg.world_size,
                pad: false,
            }),
            whole_jpeg: state.config.torchvision_compat,
            ..LoaderOptions::in_order(o.batch_size, o.workers).for_device(&normalize)
        },
    )?;
    let result = crate::train::step::eval::evaluate(&model, &loader, &normalize, &pg)?;
    let out = o.out.clone().unwrap_or_else(|| default_out(&o.checkpoint));
    let page = o.report.as_ref().unwrap_or(&out).join("report.html");
    let report = match is_main {
        true => {
            let title = format!("{} — {}", state.model, o.data.path.display());
            if let Some(dir) = &o.report {
                std::fs::create_dir_all(dir).map_err(|e| user_error(format!("cannot create --report {}: {e}", dir.display())))?;
            }
            let ctx = PageContext {
                path: &page,
                command: command_line(),
                config_toml: state.config.to_toml()?,
                history: &state.history,
                samples: Some(&data.samples),
                first_batch: None,
            };
            Some(write_evaluation(&out, &state.classes, &result, &title, Default::default(), &ctx)?)
        }
        false => None,
    };
    Ok(Evaluation { result, report, out, page })
}

/// `<run>/eval-<checkpoint name>`: beside the checkpoint, named after it.
fn default_out(checkpoint: &Path) -> PathBuf {
    let name = checkpoint
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".into());
    checkpoint
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!("eval-{name}"))
}
