//! `ringtrain export`: a checkpoint as one file that a server runs without ringtrain, with the
//! class names and the evaluation's preprocessing written into it, and a `labels.txt` beside it.
//!
//! The exported graph is the model's evaluation forward pass with a dynamic batch dimension, at
//! the checkpoint's evaluation size. `--with-preprocess` puts the normalisation inside it (uint8
//! NHWC images in, as decoded, resized and centre-cropped), `--with-resize` the resize and crop
//! too (ONNX: images of any size in), `--softmax` the probabilities at its end, `--half` runs it
//! in fp16.
pub mod onnx;
pub mod torchscript;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::Result;
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use crate::bail_user;
use crate::data::augment::transform::Interpolation;
use crate::data::load::normalize::Normalizer;
use crate::model::Model;
use crate::shim::TracedWeight;
use crate::train::lifecycle::checkpoint::{self, CheckpointState};

crate::flag_enum! {
    /// The file formats `--format` names.
    pub enum ExportFormat("invalid --format") {
        /// ONNX, standard operators only (ONNX Runtime, TensorRT, OpenVINO, Triton).
        Onnx = "onnx",
        /// libtorch's traced module (`torch.jit.load`, LibTorch's `torch::jit::load`).
        TorchScript = "torchscript",
    }
}

/// The ONNX opsets `--opset` takes.
pub const OPSETS: std::ops::RangeInclusive<i64> = 13..=22;
pub const DEFAULT_OPSET: i64 = 17;
/// The oldest opset `--with-resize` writes (and its default): Resize's antialiasing came with it.
pub const RESIZE_OPSET: i64 = 18;

pub struct ExportOptions {
    /// A checkpoint directory (e.g. runs/x/best).
    pub checkpoint: PathBuf,
    pub format: ExportFormat,
    pub out: PathBuf,
    /// The ONNX opset (ONNX only).
    pub opset: i64,
    pub half: bool,
    pub with_preprocess: bool,
    /// The evaluation's resize and crop inside the graph too (ONNX only).
    pub with_resize: bool,
    pub softmax: bool,
}

/// The evaluation's resize of the shorter side and centre crop, inside an ONNX graph: any image
/// size in, the crop out (`onnx::resize`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InGraphResize {
    /// The shorter side's length after the resize (the checkpoint's resize_size).
    pub shorter_side: u32,
    pub interpolation: Interpolation,
}

/// What the exported graph takes and gives, beside the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphOptions {
    /// fp16 weights and arithmetic (and a float16 input without `with_preprocess`).
    pub half: bool,
    /// uint8 [N, H, W, 3] in, normalised inside; else the normalised float [N, 3, H, W].
    pub with_preprocess: bool,
    /// Probabilities out instead of logits.
    pub softmax: bool,
    /// uint8 [N, H, W, 3] of any size in, resized and cropped before the normalisation (with
    /// `with_preprocess`; written by the ONNX writer, not traced).
    pub resize: Option<InGraphResize>,
}

/// A weight of the exported graph under the name the file gives it.
pub struct NamedWeight {
    pub name: String,
    pub tensor: Tensor,
    /// A buffer (running statistics, the normalisation's constants), else a parameter.
    pub buffer: bool,
}

impl NamedWeight {
    /// The weight as the shim's tracer takes it.
    pub fn traced(&self) -> TracedWeight<'_> {
        TracedWeight { name: &self.name, tensor: &self.tensor, buffer: self.buffer }
    }
}

/// The evaluation forward pass `export` writes: `model` in eval mode after the graph options'
/// preprocessing, and before their softmax.
pub struct ExportGraph<'a> {
    pub model: &'a Model,
    pub options: GraphOptions,
    /// The checkpoint's normalisation as x·scale + shift on 0-255 pixels ([1, 3, 1, 1] each):
    /// ringtrain's loader's constants (`Normalizer`) and arithmetic.
    scale: Tensor,
    shift: Tensor,
    /// The input's height and width (the evaluation's centre crop).
    pub size: i64,
}

impl<'a> ExportGraph<'a> {
    /// The graph of `model`, whose weights stop requiring gradients: a tracer records the
    /// tensors it was not given as constants, and refuses any that needs a gradient.
    pub fn new(model: &'a Model, options: GraphOptions, mean: [f64; 3], std: [f64; 3], size: u32) -> Self {
        for (_, t) in model.vs.variables() {
            let _ = t.set_requires_grad(false);
        }
        let normalizer = Normalizer::new(mean, std, Device::Cpu);
        let (scale, shift) = normalizer.constants();
        ExportGraph {
            model,
            options,
            scale: scale.shallow_clone(),
            shift: shift.shallow_clone(),
            size: size as i64,
        }
    }

    /// The normalisation's tensors, by the names an exported file gives them (buffers, so that
    /// they move with the model), when the graph normalises.
    pub fn preprocess_buffers(&self) -> Vec<(&'static str, &Tensor)> {
        match self.options.with_preprocess {
            true => vec![("preprocess.scale", &self.scale), ("preprocess.shift", &self.shift)],
            false => vec![],
        }
    }

    /// The tensors the forward pass reads, by their state_dict names, with BatchNorm's step counts
    /// (unused by the graph, but part of a state_dict that torchvision's model loads strictly)
    /// and the normalisation's buffers.
    pub fn weights(&self) -> Vec<NamedWeight> {
        let vs = &self.model.vs;
        let trainable: HashSet<usize> = vs.trainable_variables().iter().map(|t| t.data_ptr() as usize).collect();
        let mut weights: Vec<NamedWeight> = vs
            .variables()
            .into_iter()
            .map(|(name, tensor)| {
                let buffer = !trainable.contains(&(tensor.data_ptr() as usize));
                NamedWeight { name, tensor, buffer }
            })
            .collect();
        let counts: Vec<NamedWeight> = weights
            .iter()
            .filter_map(|w| w.name.strip_suffix(".running_mean"))
            .map(|p| NamedWeight {
                name: format!("{p}.num_batches_tracked"),
                tensor: Tensor::from(self.model.bn_batches),
                buffer: true,
            })
            .collect();
        weights.extend(counts);
        weights.sort_by(|a, b| a.name.cmp(&b.name));
        for (name, tensor) in self.preprocess_buffers() {
            weights.push(NamedWeight { name: name.to_string(), tensor: tensor.shallow_clone(), buffer: true });
        }
        weights
    }

    /// The kind of the model's input (after the preprocessing, if any).
    fn kind(&self) -> Kind {
        match self.options.half {
            true => Kind::Half,
            false => Kind::Float,
        }
    }

    /// An input of `batch` images for tracing: what the graph takes.
    pub fn example_input(&self, batch: i64) -> Tensor {
        let s = self.size;
        match self.options.with_preprocess {
            true => Tensor::randint(256, [batch, s, s, 3], (Kind::Uint8, Device::Cpu)),
            false => Tensor::randn([batch, 3, s, s], (self.kind(), Device::Cpu)),
        }
    }

    /// The forward pass the file holds.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let x = match self.options.with_preprocess {
            true => {
                let x = x.permute([0, 3, 1, 2]).to_kind(Kind::Float) * &self.scale + &self.shift;
                x.to_kind(self.kind())
            }
            false => x.shallow_clone(),
        };
        let y = self.model.forward(&x, false);
        match self.options.softmax {
            true => y.softmax(-1, y.kind()),
            false => y,
        }
    }

    /// What the input is, in words and shape, for the file's metadata.
    pub fn input_description(&self) -> String {
        let s = self.size;
        if let Some(r) = self.options.resize {
            return format!(
                "uint8 [N, H, W, 3]: RGB pixels 0-255 of any size (one per batch), the shorter side resized to {} \
                 ({}, antialiased) and centre-cropped to {s} inside",
                r.shorter_side, r.interpolation
            );
        }
        match (self.options.with_preprocess, self.options.half) {
            (true, _) => format!("uint8 [N, {s}, {s}, 3]: RGB pixels 0-255, resized and centre-cropped"),
            (false, half) => format!(
                "{} [N, 3, {s}, {s}]: RGB pixels / 255, minus mean, divided by std",
                if half { "float16" } else { "float32" }
            ),
        }
    }

    pub fn output_description(&self, classes: usize) -> String {
        let kind = if self.options.half { "float16" } else { "float32" };
        let what = if self.options.softmax { "probabilities" } else { "logits" };
        format!("{kind} [N, {classes}]: {what}, in the order of the classes")
    }
}

/// The metadata written into every exported file, as (key, value) text: ONNX's metadata_props,
/// TorchScript's extra files. Lists are JSON.
pub fn metadata(state: &CheckpointState, graph: &ExportGraph, checkpoint_sha256: &str) -> Vec<(String, String)> {
    vec![
        ("model".into(), state.model.name().into()),
        ("classes".into(), json(&state.classes)),
        ("input".into(), graph.input_description()),
        ("output".into(), graph.output_description(state.classes.len())),
        ("input_size".into(), graph.size.to_string()),
        ("resize_size".into(), state.eval_resize.to_string()),
        ("interpolation".into(), state.interpolation.to_string()),
        ("jpeg_decode".into(), jpeg_decode(state.config.torchvision_compat).into()),
        ("softmax".into(), graph.options.softmax.to_string()),
        ("resize_in_graph".into(), graph.options.resize.is_some().to_string()),
        ("mean".into(), json(&state.mean)),
        ("std".into(), json(&state.std)),
        ("checkpoint_sha256".into(), checkpoint_sha256.into()),
        ("ringtrain_version".into(), env!("CARGO_PKG_VERSION").into()),
    ]
}

/// How the evaluation decoded JPEGs: "whole" (every one at full size, as PIL does: runs with
/// `--torchvision-compat`), or "scaled" (one whose crop is shrunk 8x or more decoded at 1/8 of
/// its size in the DCT domain, unless the filter is nearest).
pub fn jpeg_decode(whole: bool) -> &'static str {
    match whole {
        true => "whole",
        false => "scaled",
    }
}

fn json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("strings and numbers serialise")
}

/// `--with-resize`'s resize, where ONNX can write it as the evaluation does it: Resize's
/// antialiasing came with opset 18, and its nearest neighbour is not PIL's.
fn in_graph_resize(o: &ExportOptions, state: &CheckpointState, crop: u32) -> Result<InGraphResize> {
    if o.opset < RESIZE_OPSET {
        bail_user!("--with-resize needs --opset {RESIZE_OPSET} or newer (Resize's antialiasing), not {}", o.opset);
    }
    if state.interpolation == Interpolation::Nearest {
        bail_user!(
            "--with-resize: the checkpoint resizes with nearest neighbour, which ONNX's Resize does not do as PIL \
             does; export with --with-preprocess and resize before the graph"
        );
    }
    if state.eval_resize < crop {
        bail_user!(
            "--with-resize: the checkpoint's resize ({}) is smaller than its crop ({crop})",
            state.eval_resize
        );
    }
    Ok(InGraphResize { shorter_side: state.eval_resize, interpolation: state.interpolation })
}

/// `got` (a written file's outputs at `batch` images) within `bound` of `want` (the eager
/// model's), relative to the largest of `want`; else an error that names `what`.
fn same_outputs(what: &str, got: &Tensor, want: &Tensor, batch: i64, bound: f64) -> Result<()> {
    let largest = want.abs().max().to_kind(Kind::Double).double_value(&[]).max(f64::MIN_POSITIVE);
    let off = match got.size() == want.size() {
        true => (got.to_kind(Kind::Double) - want.to_kind(Kind::Double)).abs().max().double_value(&[]) / largest,
        false => f64::INFINITY,
    };
    if off.is_nan() || off > bound {
        anyhow::bail!(
            "{what} does not reproduce the model at batch {batch} (output {:?} against {:?}, {off:.2e} of the \
             largest): a bug, please report it",
            got.size(),
            want.size()
        );
    }
    Ok(())
}

/// The hex SHA-256 of a checkpoint's weights file, to tie an exported file to its checkpoint.
pub fn file_sha256(path: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// What `export` wrote.
pub struct ExportSummary {
    pub out: PathBuf,
    pub labels: PathBuf,
    pub metadata: Vec<(String, String)>,
    /// Why an ONNX file was not run in ONNX Runtime before it was kept (it cannot be loaded here).
    pub not_run: Option<String>,
}

pub fn export(o: &ExportOptions) -> Result<ExportSummary> {
    if !OPSETS.contains(&o.opset) {
        bail_user!("--opset {} is not one ringtrain writes: {} to {}", o.opset, OPSETS.start(), OPSETS.end());
    }
    if o.out.is_dir() {
        bail_user!("--out {} is a directory: name the file to write", o.out.display());
    }
    let state = checkpoint::load_state(&o.checkpoint)?;
    let size = state.val_crop_size.unwrap_or(state.img_size);
    let resize = match o.with_resize {
        true => Some(in_graph_resize(o, &state, size)?),
        false => None,
    };
    let (mut model, state) = checkpoint::load(&o.checkpoint, Device::Cpu)?;
    if o.half {
        model.vs.half();
    }
    let options = GraphOptions {
        half: o.half,
        with_preprocess: o.with_preprocess || o.with_resize,
        softmax: o.softmax,
        resize,
    };
    let graph = ExportGraph::new(&model, options, state.mean3(), state.std3(), size);
    let sha = file_sha256(&o.checkpoint.join(checkpoint::MODEL_FILE))?;
    let metadata = metadata(&state, &graph, &sha);
    if let Some(parent) = o.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let not_run = match o.format {
        ExportFormat::TorchScript => torchscript::write(&graph, &metadata, &o.out).map(|()| None)?,
        ExportFormat::Onnx => onnx::write(&graph, &metadata, o.opset, &o.out)?,
    };
    let labels = o.out.with_file_name("labels.txt");
    crate::atomic::write_file(&labels, (state.classes.join("\n") + "\n").as_bytes())?;
    Ok(ExportSummary {
        out: o.out.clone(),
        labels,
        metadata,
        not_run,
    })
}
