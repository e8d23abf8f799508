//! An ONNX file `ringtrain export` wrote, run by ONNX Runtime for `ringtrain predict` (and for
//! export's own check of the file): its C API through the `ort` crate, the library loaded when
//! first needed (ORT_DYLIB_PATH, else the onnxruntime package installed beside the torch
//! ringtrain runs on, else the system's). The classes and the evaluation transform come from the
//! file's metadata, so the file is checked against its checkpoint with the same images and the
//! same preprocessing.
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Result;
use ort::environment::Environment;
use ort::session::Session;
use ort::value::{PrimitiveTensorElementType, TensorElementType, TensorRef, ValueType};
use tch::{Kind, Tensor};

use crate::bail_user;
use crate::data::augment::transform::{Interpolation, Transform};
use crate::error::user_error;

/// An exported file: `--checkpoint` names a file ending in .onnx (a checkpoint is a directory).
pub fn is_onnx_file(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// What the graph takes, from its input's element type.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Input {
    /// uint8 [N, H, W, 3] pixels, normalised inside (`--with-preprocess`; of any size, resized
    /// inside too, with `--with-resize`).
    Pixels,
    /// Normalised float32 [N, 3, H, W].
    Float,
    /// Normalised float16 [N, 3, H, W] (`--half`).
    Half,
}

/// The file's metadata that predicting needs (`export::metadata` wrote them).
#[derive(Debug, Clone)]
pub struct ExportedMeta {
    pub classes: Vec<String>,
    pub input_size: u32,
    pub resize_size: u32,
    pub interpolation: Interpolation,
    pub mean: [f64; 3],
    pub std: [f64; 3],
    /// Every JPEG decoded whole (`jpeg_decode` = whole).
    pub whole_jpeg: bool,
    /// The output is probabilities already.
    pub softmax: bool,
    /// The graph resizes and crops images of any size itself (`--with-resize`).
    pub resize_in_graph: bool,
}

impl ExportedMeta {
    /// The file's evaluation transform, with `interpolation` for its filter when given.
    pub fn eval_transform(&self, interpolation: Option<Interpolation>) -> Transform {
        Transform::eval(self.input_size, self.resize_size, interpolation.unwrap_or(self.interpolation))
    }
}

/// An ONNX graph of one input and one output in ONNX Runtime, on the CPU.
pub struct OnnxSession {
    session: Session,
    input: Input,
}

impl OnnxSession {
    /// Opens `path` with `threads` threads for each operator; `what` names it in errors.
    pub fn open(path: &Path, what: &str, threads: usize) -> Result<Self> {
        let env = runtime()?;
        let cannot = |e: String| user_error(format!("{what} {}: ONNX Runtime cannot load it: {e}", path.display()));
        let session = Session::builder(env)
            .map_err(|e| cannot(e.to_string()))?
            .with_intra_threads(threads.max(1))
            .map_err(|e| cannot(e.to_string()))?
            .commit_from_file(path)
            .map_err(|e| cannot(e.to_string()))?;
        let (input, output) = match (session.inputs(), session.outputs()) {
            ([i], [o]) => (i, o),
            _ => bail_user!("{what} {}: not a graph of one input and one output", path.display()),
        };
        let input = match input.dtype() {
            ValueType::Tensor { ty: TensorElementType::Uint8, .. } => Input::Pixels,
            ValueType::Tensor { ty: TensorElementType::Float32, .. } => Input::Float,
            ValueType::Tensor { ty: TensorElementType::Float16, .. } => Input::Half,
            other => bail_user!("{what} {}: an input of {other} is not one ringtrain writes", path.display()),
        };
        if !matches!(
            output.dtype(),
            ValueType::Tensor { ty: TensorElementType::Float32 | TensorElementType::Float16, .. }
        ) {
            bail_user!("{what} {}: its output is not float32 or float16", path.display());
        }
        Ok(OnnxSession { session, input })
    }

    /// The graph on `x` (uint8 pixels, or floats of any kind for a float input), its output as
    /// f32 on the CPU.
    pub fn run(&mut self, x: &Tensor) -> Result<Tensor> {
        let x = match self.input {
            Input::Pixels => x.contiguous(),
            Input::Float => x.to_kind(Kind::Float).contiguous(),
            Input::Half => x.to_kind(Kind::Half).contiguous(),
        };
        match self.input {
            Input::Pixels => run_as::<u8>(&mut self.session, &x),
            Input::Float => run_as::<f32>(&mut self.session, &x),
            Input::Half => run_as::<half::f16>(&mut self.session, &x),
        }
    }
}

/// `session` on `x`, a contiguous tensor whose elements are `T`s, viewed in place; the output
/// as f32.
fn run_as<T>(session: &mut Session, x: &Tensor) -> Result<Tensor>
where
    T: PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static,
{
    let failed = |e: ort::Error| anyhow::anyhow!("ONNX Runtime failed on a batch: {e}");
    // SAFETY: `x` is contiguous, of `T`s (the caller converted it), and outlives the run.
    let data = unsafe { std::slice::from_raw_parts(x.data_ptr() as *const T, x.numel()) };
    let view = TensorRef::from_array_view((x.size(), data)).map_err(failed)?;
    let name = session.inputs()[0].name().to_string();
    let outputs = session.run(ort::inputs![name => view]).map_err(failed)?;
    let out = &outputs[0];
    Ok(match out.try_extract_tensor::<f32>() {
        Ok((shape, v)) => Tensor::from_slice(v).view(shape.to_vec().as_slice()),
        Err(_) => {
            let (shape, v) = out.try_extract_tensor::<half::f16>().map_err(failed)?;
            let v: Vec<f32> = v.iter().map(|h| h.to_f32()).collect();
            Tensor::from_slice(&v).view(shape.to_vec().as_slice())
        }
    })
}

/// An exported file with the metadata that predicting on it needs.
pub struct OnnxModel {
    session: OnnxSession,
    pub meta: ExportedMeta,
}

impl OnnxModel {
    /// Opens `path` in ONNX Runtime on the CPU with `threads` threads for each operator.
    pub fn open(path: &Path, threads: usize) -> Result<Self> {
        let session = OnnxSession::open(path, "--checkpoint", threads)?;
        let meta = read_meta(&session.session, path)?;
        Ok(OnnxModel { session, meta })
    }

    /// Whether the loader should hand over normalised float batches (else uint8 pixels).
    pub fn takes_normalised(&self) -> bool {
        self.session.input != Input::Pixels
    }

    /// A batch from the loader (uint8 [N, H, W, 3], or normalised f32 [N, 3, H, W]) → the
    /// graph's output as f32 [N, classes] on the CPU.
    pub fn forward(&mut self, images: &Tensor) -> Result<Tensor> {
        let y = self.session.run(images)?;
        let (n, classes) = (images.size()[0], self.meta.classes.len() as i64);
        if y.size() != [n, classes] {
            bail_user!("the ONNX file gave an output of shape {:?}, not [{n}, {classes}]", y.size());
        }
        Ok(y)
    }
}

/// The metadata `ringtrain export` writes, each checked.
fn read_meta(session: &Session, path: &Path) -> Result<ExportedMeta> {
    let md = session
        .metadata()
        .map_err(|e| user_error(format!("--checkpoint {}: cannot read its metadata: {e}", path.display())))?;
    let get = |key: &str| -> Result<String> {
        md.custom(key).ok_or_else(|| {
            user_error(format!(
                "--checkpoint {}: no '{key}' in its metadata: predict takes the ONNX files `ringtrain export` writes",
                path.display()
            ))
        })
    };
    let bad = |key: &str, v: &str| {
        user_error(format!("--checkpoint {}: invalid '{key}' in its metadata: {v}", path.display()))
    };
    let parse = |key: &str| -> Result<u32> {
        let v = get(key)?;
        v.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(|| bad(key, &v))
    };
    let three = |key: &str| -> Result<[f64; 3]> {
        let v = get(key)?;
        serde_json::from_str::<Vec<f64>>(&v)
            .ok()
            .and_then(|v| <[f64; 3]>::try_from(v).ok())
            .ok_or_else(|| bad(key, &v))
    };
    let classes_text = get("classes")?;
    let classes: Vec<String> = serde_json::from_str(&classes_text)
        .ok()
        .filter(|c: &Vec<String>| !c.is_empty())
        .ok_or_else(|| bad("classes", &classes_text))?;
    let interpolation = get("interpolation")?;
    let jpeg = get("jpeg_decode")?;
    let softmax = get("softmax")?;
    let resize_in_graph = get("resize_in_graph")?;
    let flag = |key: &str, v: &str| match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad(key, v)),
    };
    Ok(ExportedMeta {
        classes,
        input_size: parse("input_size")?,
        resize_size: parse("resize_size")?,
        interpolation: interpolation.parse().map_err(|_| bad("interpolation", &interpolation))?,
        mean: three("mean")?,
        std: three("std")?,
        whole_jpeg: match jpeg.as_str() {
            "whole" => true,
            "scaled" => false,
            _ => return Err(bad("jpeg_decode", &jpeg)),
        },
        softmax: flag("softmax", &softmax)?,
        resize_in_graph: flag("resize_in_graph", &resize_in_graph)?,
    })
}

/// ONNX Runtime's environment, its library loaded once per process (a user's error, saying
/// what to install, where it cannot be).
pub fn runtime() -> Result<&'static Environment> {
    runtime_and_library().map(|(env, _)| env)
}

/// The library ONNX Runtime was loaded from (loading it if it was not yet), for `doctor`.
pub fn runtime_library() -> Result<&'static Path> {
    runtime_and_library().map(|(_, lib)| lib.as_path())
}

fn runtime_and_library() -> Result<&'static (Environment, PathBuf)> {
    static LOADED: OnceLock<std::result::Result<(Environment, PathBuf), String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        let found = library()?;
        let lib = found.clone().unwrap_or_else(|| PathBuf::from("libonnxruntime.so"));
        let builder = match ort::init_from(&lib) {
            Ok(b) => b,
            Err(_) if found.is_none() => {
                return Err("ONNX Runtime not found: install the onnxruntime package beside torch (pip install \
                            onnxruntime), or set ORT_DYLIB_PATH to its libonnxruntime.so"
                    .into())
            }
            Err(e) => return Err(format!("cannot load ONNX Runtime from {}: {e}", lib.display())),
        };
        let env = builder.build().map_err(|e| format!("ONNX Runtime from {}: {e}", lib.display()))?;
        Ok((env, lib))
    });
    loaded.as_ref().map_err(|e| user_error(e.clone()).into())
}

/// ONNX Runtime's shared library: ORT_DYLIB_PATH (the `ort` crate's variable), else the
/// onnxruntime package's beside the torch package whose libtorch this process runs on (one
/// site-packages); None: neither, the loader's own search is left.
fn library() -> std::result::Result<Option<PathBuf>, String> {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return match p.is_file() {
            true => Ok(Some(p)),
            false => Err(format!("ORT_DYLIB_PATH={} is not a file", p.display())),
        };
    }
    Ok(crate::doctor::loaded_library("libtorch_cpu.so")
        .and_then(|lib| Some(lib.parent()?.parent()?.parent()?.join("onnxruntime/capi")))
        .and_then(|dir| newest_library(&dir)))
}

/// libonnxruntime.so[.VERSION] in `dir`, the last by name if several.
fn newest_library(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == "libonnxruntime.so" || n.starts_with("libonnxruntime.so."))
        })
        .collect();
    found.sort();
    found.pop()
}
