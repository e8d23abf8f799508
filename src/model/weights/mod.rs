//! Where `--pretrained` weights come from, read into one state_dict (torchvision's or timm's names):
//! - a file: safetensors, or a PyTorch checkpoint (`pth`: read without unpickling);
//! - `torchvision:NAME`: torchvision's published ImageNet weights (`torchvision`), from the
//!   torch hub cache or downloaded into it (`download`);
//! - `hf-hub:ORG/NAME`: timm's weights on the Hugging Face hub (`hf_hub`), under timm's names
//!   (`model::timm` maps them).
//! Published weights also say how they were evaluated: their input size and resize become the
//! run's defaults.
pub mod download;
pub mod hf_hub;
pub mod pth;
pub mod torchvision;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::Result;
use tch::Tensor;

use super::ModelKind;
use crate::bail_user;
use crate::error::UserError;

/// Tensors by torchvision's names, on the CPU.
pub type StateDict = BTreeMap<String, Tensor>;

/// A `--pretrained` value, parsed once at the edge.
#[derive(Debug, Clone, PartialEq, serde_with::SerializeDisplay, serde_with::DeserializeFromStr)]
pub enum WeightsSource {
    File(PathBuf),
    Torchvision(&'static torchvision::Weights),
    HfHub(hf_hub::Repo),
}

impl FromStr for WeightsSource {
    type Err = UserError;

    fn from_str(s: &str) -> Result<Self, UserError> {
        if let Some(name) = s.strip_prefix("torchvision:") {
            return torchvision::lookup(name).map(WeightsSource::Torchvision).map_err(UserError);
        }
        if let Some(repo) = s.strip_prefix("hf-hub:") {
            return hf_hub::Repo::parse(repo).map(WeightsSource::HfHub).map_err(UserError);
        }
        if s.is_empty() {
            return Err(UserError("--pretrained needs a file, torchvision:NAME or hf-hub:ORG/NAME".into()));
        }
        Ok(WeightsSource::File(PathBuf::from(s)))
    }
}

impl fmt::Display for WeightsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightsSource::File(p) => write!(f, "{}", p.display()),
            WeightsSource::Torchvision(w) => f.write_str(&w.spec()),
            WeightsSource::HfHub(r) => write!(f, "hf-hub:{}", r.as_str()),
        }
    }
}

/// How published weights were evaluated: what a run that starts from them defaults to.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalTransform {
    pub img_size: u32,
    pub resize: u32,
    /// The resize filter the weights were measured with when it is not ringtrain's bilinear.
    pub bicubic: bool,
    pub mean: Option<Vec<f64>>,
    pub std: Option<Vec<f64>>,
}

/// What `WeightsSource::read` found.
pub struct Loaded {
    pub weights: StateDict,
    /// Where they came from on this machine, and from which key of a checkpoint dict.
    pub path: PathBuf,
    pub key: Option<String>,
    /// Other dicts of tensors at the checkpoint's top (an EMA) `--pretrained-key` could pick.
    pub others: Vec<String>,
    /// How published weights were evaluated (None for a file).
    pub eval: Option<EvalTransform>,
}

impl WeightsSource {
    /// The architecture the weights are for, when the source says it.
    pub fn model(&self) -> Option<ModelKind> {
        match self {
            WeightsSource::File(_) => None,
            WeightsSource::Torchvision(w) => Some(w.model),
            WeightsSource::HfHub(r) => r.model_by_name(),
        }
    }

    /// The evaluation transform published weights were measured with: torchvision's from the
    /// table; the hub's from timm's config, which is fetched for it.
    pub fn eval_transform(&self) -> Result<Option<EvalTransform>> {
        Ok(match self {
            WeightsSource::File(_) => None,
            WeightsSource::Torchvision(w) => Some(EvalTransform {
                img_size: w.crop,
                resize: w.resize,
                bicubic: w.interpolation == torchvision::Interpolation::Bicubic,
                mean: None,
                std: None,
            }),
            WeightsSource::HfHub(r) => hf_hub::fetch(r)?.config.eval_transform(),
        })
    }

    /// The weights' file on this machine: a file as it is; published weights from their cache,
    /// downloaded into it when absent.
    pub fn fetch(&self) -> Result<PathBuf> {
        match self {
            WeightsSource::File(p) => {
                if !p.is_file() {
                    bail_user!("--pretrained file does not exist: {}", p.display());
                }
                Ok(p.clone())
            }
            WeightsSource::Torchvision(w) => {
                let path = download::torch_hub_dir().join("checkpoints").join(w.file);
                if !path.is_file() {
                    let what = format!("--pretrained {}", w.spec());
                    download::fetch(&w.url(), &path, download::Expect::Sha256Prefix(w.hash_prefix()), &what)?;
                }
                Ok(path)
            }
            WeightsSource::HfHub(r) => Ok(hf_hub::fetch(r)?.weights),
        }
    }

    /// The state_dict: fetched, read whatever its format (`key`: the dict of a PyTorch
    /// checkpoint that holds it), wrapper prefixes (`module.`) taken off.
    pub fn read(&self, key: Option<&str>) -> Result<Loaded> {
        let (path, eval) = match self {
            // One look at the hub's cache gives both.
            WeightsSource::HfHub(r) => {
                let files = hf_hub::fetch(r)?;
                (files.weights, files.config.eval_transform())
            }
            _ => (self.fetch()?, self.eval_transform()?),
        };
        if !pth::is_safetensors(&path) {
            let c = pth::read(&path, key)?;
            return Ok(Loaded { weights: c.weights, path, key: c.key, others: c.others, eval });
        }
        if let Some(k) = key {
            bail_user!("--pretrained-key {k}: {} is a safetensors file, which has no keys to choose from", path.display());
        }
        let weights: StateDict = match Tensor::read_safetensors(&path) {
            Ok(v) => v.into_iter().map(|(k, t)| (pth::strip_wrappers(&k).to_string(), t)).collect(),
            Err(e) => bail_user!(
                "--pretrained {}: not a readable safetensors file ({})",
                path.display(),
                crate::error::first_line(&e.to_string())
            ),
        };
        if weights.is_empty() {
            bail_user!("--pretrained {}: a safetensors file with no tensors, so no weights", path.display());
        }
        Ok(Loaded { weights, path, key: None, others: Vec::new(), eval })
    }
}

/// The first name component every tensor shares, with its dot (`model.` of a Lightning module's
/// state_dict); None when they differ.
pub fn common_prefix(weights: &StateDict) -> Option<String> {
    let first = weights.keys().next()?;
    let (p, _) = first.split_once('.')?;
    let p = format!("{p}.");
    weights.keys().all(|k| k.starts_with(&p)).then_some(p)
}

/// `weights` with `prefix` taken off every name (which `common_prefix` found on all of them).
pub fn without_prefix(weights: &StateDict, prefix: &str) -> StateDict {
    weights.iter().map(|(k, t)| (k[prefix.len()..].to_string(), t.shallow_clone())).collect()
}

/// `--model` and the weights' own architecture must agree.
pub fn check_model_matches(source: &WeightsSource, model: ModelKind) -> Result<()> {
    match source.model() {
        Some(m) if m != model => bail_user!("--pretrained {source} holds {m} weights, not {model}: drop --model or name {m}"),
        _ => Ok(()),
    }
}

/// Where `ringtrain convert` and the tests read a file's weights without a model.
pub fn read_file(path: &Path, key: Option<&str>) -> Result<Loaded> {
    WeightsSource::File(path.to_path_buf()).read(key)
}

/// Writes named tensors to a safetensors file at `path`. safetensors takes contiguous CPU
/// tensors only, so each is brought there first (no copy for one that is there already).
pub fn write_tensors<'a>(named: impl IntoIterator<Item = (&'a str, &'a Tensor)>, path: &Path) -> Result<()> {
    let cpu: Vec<(&str, Tensor)> = named
        .into_iter()
        .map(|(k, t)| (k, t.detach().to_device(tch::Device::Cpu).contiguous()))
        .collect();
    Tensor::write_safetensors(&cpu, path)?;
    Ok(())
}
