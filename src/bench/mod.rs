//! `ringtrain bench`: the training step alone, on synthetic inputs, measured as
//! `bench/torch_step.py` measures PyTorch's (same model, batch, precision, memory format,
//! optimizer): images/s is the median over timed windows after a warm-up; peak device memory
//! from the CUDA caching allocator. `--vs-pytorch` runs that script in the same invocation and
//! prints the ratio. `data` measures the input pipeline the same way (`ringtrain bench-data`).
pub mod data;
pub mod fused_check;
pub mod profile;
pub mod reference;
pub mod trace_table;

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use crate::config::{SchedKind, TrainConfig};
use crate::dist::process_group::ProcessGroup;
use crate::model::ModelKind;
use crate::shim;
use crate::train::step::amp::AmpMode;
use crate::train::step::meter::EpochMeter;
use crate::train::step::state::RunState;
use crate::train::step::trainer::{DdpOptions, MicroPos, Trainer};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub model: ModelKind,
    pub batch_size: usize,
    pub img_size: u32,
    /// None, BFloat16 or Half.
    pub amp: Option<Kind>,
    pub channels_last: bool,
    pub device: Device,
    pub steps: usize,
    pub warmup: usize,
    /// Steps per timed window.
    pub window: usize,
    /// `--cuda-graphs`, `--fused-norm`.
    pub flags: StepFlags,
    /// `--profile`: steps to profile after the timed ones, and where the trace goes.
    pub profile: Option<profile::ProfileOptions>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct BenchResult {
    pub images_per_s: f64,
    pub peak_memory_bytes: Option<u64>,
    #[serde(default)]
    pub profile: Option<profile::ProfiledSteps>,
}

/// How a benchmarked step runs beyond its model and precision.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepFlags {
    /// The step replayed as one CUDA graph (`--cuda-graphs`).
    pub cuda_graphs: bool,
    /// Normalisation through the fused kernels (`--fused-norm`; None: train's default).
    pub fused_norm: Option<bool>,
}

/// The training step of `train` itself (the `Trainer`: micro-step, then optimizer step, with
/// its on-device epoch sums), set up as the PyTorch reference scripts set up theirs: SGD with
/// momentum 0.9 at a constant lr 0.1, no weight decay, cross-entropy, autocast and the fp16
/// GradScaler as `amp` says.
pub struct TrainStep {
    t: Trainer,
    state: RunState,
    meter: EpochMeter,
    micro: usize,
}

impl TrainStep {
    pub fn new(
        model: ModelKind,
        img_size: u32,
        num_classes: i64,
        device: Device,
        amp: Option<Kind>,
        channels_last: bool,
        flags: StepFlags,
    ) -> Result<Self> {
        let cfg = TrainConfig {
            model,
            img_size,
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
            sched: SchedKind::Constant,
            seed: 0,
            amp: match amp {
                Some(Kind::Half) => AmpMode::Fp16,
                Some(Kind::BFloat16) => AmpMode::Bf16,
                _ => AmpMode::Off,
            },
            channels_last: Some(channels_last),
            cuda_graphs: flags.cuda_graphs,
            fused_norm: flags.fused_norm,
            ..Default::default()
        };
        let pg = Rc::new(ProcessGroup::single(device));
        let t = Trainer::new(&cfg, num_classes, 1, pg, DdpOptions::default(), None)?;
        let meter = EpochMeter::start(Default::default(), t.pg());
        Ok(TrainStep {
            t,
            state: RunState::default(),
            meter,
            micro: 0,
        })
    }

    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<()> {
        let pos = MicroPos {
            epoch: 0,
            micro: self.micro,
            micro_per_epoch: usize::MAX,
            accum: 1,
        };
        self.micro += 1;
        self.t.step(x, y, pos, &mut self.state, &mut self.meter)?;
        Ok(())
    }
}

pub fn run(o: &BenchOptions) -> Result<BenchResult> {
    if o.device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(true);
    }
    let mut step = TrainStep::new(o.model, o.img_size, 1000, o.device, o.amp, o.channels_last, o.flags)?;
    let mut x = Tensor::randn(
        [o.batch_size as i64, 3, o.img_size as i64, o.img_size as i64],
        (Kind::Float, o.device),
    );
    if o.channels_last {
        x = shim::to_channels_last(&x)?;
    }
    let y = Tensor::randint(1000, [o.batch_size as i64], (Kind::Int64, o.device));
    if let Device::Cuda(i) = o.device {
        shim::reset_cuda_peak_memory(i);
    }
    let mut rates = Vec::new();
    let mut t0: Option<Instant> = None;
    for i in 0..o.warmup + o.steps {
        if i >= o.warmup && (i - o.warmup) % o.window == 0 {
            crate::device::synchronize(o.device);
            if let Some(t) = t0 {
                rates.push((o.window * o.batch_size) as f64 / t.elapsed().as_secs_f64());
            }
            t0 = Some(Instant::now());
        }
        let _syncs = crate::device::sync_warnings(o.device, i >= o.warmup);
        step.step(&x, &y)?;
    }
    crate::device::synchronize(o.device);
    if o.steps % o.window == 0 {
        if let Some(t) = t0 {
            rates.push((o.window * o.batch_size) as f64 / t.elapsed().as_secs_f64());
        }
    }
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = rates.len();
    let median = match n {
        0 => 0.0,
        _ if n % 2 == 1 => rates[n / 2],
        _ => (rates[n / 2 - 1] + rates[n / 2]) / 2.0,
    };
    let peak_memory_bytes = match o.device {
        Device::Cuda(i) => shim::cuda_peak_memory(i),
        _ => None,
    };
    let profile = match &o.profile {
        Some(p) => Some(profile::run(|| step.step(&x, &y), o.device, p)?),
        None => None,
    };
    Ok(BenchResult {
        images_per_s: median,
        peak_memory_bytes,
        profile,
    })
}

/// Runs `bench/torch_step.py` with the same settings in `python` (profiled into `--profile`'s
/// pytorch/ folder when given).
pub fn run_pytorch(o: &BenchOptions, python: &str, script: &PathBuf) -> Result<BenchResult> {
    let args = [
        o.model.to_string(),
        o.batch_size.to_string(),
        o.img_size.to_string(),
        amp_name(o.amp).into(),
        (o.channels_last as u8).to_string(),
        device_name(o.device),
        o.steps.to_string(),
        o.warmup.to_string(),
        o.window.to_string(),
    ];
    let env: Vec<(&str, String)> = match &o.profile {
        Some(p) => vec![
            ("TORCH_STEP_PROFILE", p.dir.join("pytorch").display().to_string()),
            ("TORCH_STEP_PROFILE_STEPS", p.steps.to_string()),
        ],
        None => vec![],
    };
    Ok(serde_json::from_value(run_reference_with(python, script, &args, &env)?)?)
}

/// The reference scripts' names for a precision and a device.
pub fn amp_name(amp: Option<Kind>) -> &'static str {
    match amp {
        Some(Kind::BFloat16) => "bf16",
        Some(Kind::Half) => "fp16",
        _ => "off",
    }
}

pub fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".into(),
    }
}

/// Runs a PyTorch reference script; its last line of output is one JSON object.
pub fn run_reference(python: &str, script: &Path, args: &[String]) -> Result<serde_json::Value> {
    run_reference_with(python, script, args, &[])
}

/// `run_reference` with variables added to the script's environment.
pub fn run_reference_with(
    python: &str,
    script: &Path,
    args: &[String],
    env: &[(&str, String)],
) -> Result<serde_json::Value> {
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .with_context(|| format!("running {python} {}", script.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "the PyTorch reference failed: {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .with_context(|| format!("parsing the PyTorch reference's output: {text}"))
}
