//! `ringtrain bench`: the training step alone, on synthetic inputs, measured as
//! `bench/torch_step.py` measures PyTorch's (same model, batch, precision, memory format,
//! optimizer): images/s is the median over timed windows after a warm-up; peak device memory
//! from the CUDA caching allocator. `--vs-pytorch` runs that script in the same invocation and
//! prints the ratio. `data` measures the input pipeline the same way (`ringtrain bench-data`).
pub mod data;
pub mod reference;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Deserialize;
use tch::{Device, Kind, Reduction, Tensor};

use crate::model::{Model, ModelKind};
use crate::shim;
use crate::train::amp::GradScaler;
use crate::train::optim::{Optimizer, Placement};

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
}

#[derive(Debug, Clone, Deserialize)]
pub struct BenchResult {
    pub images_per_s: f64,
    pub peak_memory_bytes: Option<u64>,
}

pub fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// One training step as both benchmarks time it: forward and cross-entropy under autocast,
/// backward (through the fp16 GradScaler when fp16), SGD with momentum 0.9 on the fused kernel.
pub struct TrainStep {
    pub model: Model,
    opt: Optimizer,
    scaler: Option<GradScaler>,
    amp: Option<Kind>,
    device: Device,
}

impl TrainStep {
    pub fn new(model: ModelKind, num_classes: i64, device: Device, amp: Option<Kind>, channels_last: bool) -> Result<Self> {
        let model = Model::new(model, num_classes, device);
        if channels_last {
            shim::var_store_to_channels_last(&model.vs)?;
        }
        let named: Vec<(String, Tensor)> = model
            .vs
            .variables()
            .into_iter()
            .filter(|(_, v)| v.requires_grad())
            .collect();
        let cfg = crate::config::TrainConfig {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
            ..Default::default()
        };
        let no_decay = Default::default();
        let placement = Placement {
            head_prefix: model.head_prefix(),
            head_lr_mult: 1.0,
            no_decay: &no_decay,
        };
        let opt = Optimizer::new(&cfg, &named, &placement);
        Ok(TrainStep {
            model,
            opt,
            scaler: (amp == Some(Kind::Half)).then(|| GradScaler::new(device, None)),
            amp,
            device,
        })
    }

    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<()> {
        let loss = {
            let _autocast = self.amp.map(|k| shim::autocast(self.device, k)).transpose()?;
            self.model
                .forward(x, true)
                .cross_entropy_loss::<Tensor>(y, None, Reduction::Mean, -100, 0.0)
                .to_kind(Kind::Float)
        };
        self.opt.zero_grad()?;
        match &self.scaler {
            Some(s) => s.scale_loss(&loss).f_backward()?,
            None => loss.f_backward()?,
        }
        let found_inf = match self.scaler.as_mut() {
            Some(s) => Some(s.unscale(&self.opt.params().map(|p| p.grad()).collect::<Vec<_>>(), &crate::dist::process_group::ProcessGroup::single(self.device))?),
            None => None,
        };
        self.opt.step(0.1, found_inf.as_ref())?;
        if let Some(s) = self.scaler.as_mut() {
            s.update();
        }
        Ok(())
    }
}

pub fn run(o: &BenchOptions) -> Result<BenchResult> {
    tch::manual_seed(0);
    if o.device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(true);
    }
    let mut step = TrainStep::new(o.model, 1000, o.device, o.amp, o.channels_last)?;
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
            sync(o.device);
            if let Some(t) = t0 {
                rates.push((o.window * o.batch_size) as f64 / t.elapsed().as_secs_f64());
            }
            t0 = Some(Instant::now());
        }
        step.step(&x, &y)?;
    }
    sync(o.device);
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
    Ok(BenchResult {
        images_per_s: median,
        peak_memory_bytes,
    })
}

/// Runs `bench/torch_step.py` with the same settings in `python`.
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
    Ok(serde_json::from_value(run_reference(python, script, &args)?)?)
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
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
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
