//! timm's weights on the Hugging Face hub (`hf-hub:timm/resnet50.a1_in1k`): `model.safetensors`
//! and timm's `config.json` (architecture, evaluation transform), kept in the hub's own cache
//! layout (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`:
//! `models--ORG--NAME/{blobs,snapshots,refs}`), so `huggingface_hub` and ringtrain share files.
//! A cached snapshot is used without asking the network; `HF_ENDPOINT` points elsewhere (a
//! mirror, a test's server), as it does for `huggingface_hub`.
//!
//! Which architectures load: those `ringtrain models` lists under timm's names or with timm's
//! tensors (`model::timm`: ResNet and ResNet-D, ConvNeXt, EfficientNet B0–B3 and its `tf_`
//! ports, MobileNetV3, ViT and DeiT, RegNetX/Y), as timm registers them: a config whose
//! `model_args` or `global_pool` asks for another variant is refused by the option's name.
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Deserialize;

use super::download::{self, Expect};
use super::EvalTransform;
use crate::bail_user;
use crate::model::{timm, Arch, ModelKind};

const WEIGHTS_FILE: &str = "model.safetensors";
const CONFIG_FILE: &str = "config.json";

/// `ORG/NAME` on the hub, checked to be a repository name (no path tricks).
#[derive(Debug, Clone, PartialEq)]
pub struct Repo(String);

impl Repo {
    pub fn parse(s: &str) -> Result<Repo, String> {
        let ok_part = |p: &str| {
            !p.is_empty() && p != "." && p != ".." && p.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        match s.split_once('/') {
            Some((org, name)) if ok_part(org) && ok_part(name) => Ok(Repo(s.to_string())),
            _ => Err(format!("'hf-hub:{s}' is not a hub repository: expected hf-hub:ORG/NAME, as hf-hub:timm/resnet50.a1_in1k")),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The architecture timm's name starts with (`resnet50` of `timm/resnet50.a1_in1k`), when it
    /// is one whose weights load here.
    pub fn model_by_name(&self) -> Option<ModelKind> {
        let name = self.0.split_once('/')?.1;
        timm::kind_of_timm(name.split('.').next()?)
    }
}

/// timm's `config.json`: the fields ringtrain uses.
#[derive(Debug, Clone, Deserialize)]
pub struct TimmConfig {
    pub architecture: String,
    #[serde(default)]
    pub pretrained_cfg: PretrainedCfg,
    /// The head's pooling when the weights were saved with another than the architecture's.
    #[serde(default)]
    pub global_pool: Option<String>,
    /// Arguments the model was created with beyond its registered ones.
    #[serde(default)]
    pub model_args: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PretrainedCfg {
    pub input_size: Option<Vec<u32>>,
    pub crop_pct: Option<f64>,
    pub interpolation: Option<String>,
    pub mean: Option<Vec<f64>>,
    pub std: Option<Vec<f64>>,
}

/// The repository's files on this machine.
pub struct HubFiles {
    pub weights: PathBuf,
    pub config: TimmConfig,
}

/// The hub's cache folder.
pub fn hub_cache() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    match std::env::var_os("HF_HOME") {
        Some(h) => PathBuf::from(h).join("hub"),
        None => download::cache_home().join("huggingface").join("hub"),
    }
}

fn endpoint() -> String {
    std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".to_string())
}

/// The weights and config of `repo`, from the cache or downloaded into it; refused when the
/// architecture is not one whose names are torchvision's.
pub fn fetch(repo: &Repo) -> Result<HubFiles> {
    let what = format!("--pretrained hf-hub:{}", repo.as_str());
    let config_path = file(repo, CONFIG_FILE, &what)?;
    let config: TimmConfig = match std::fs::read(&config_path).map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => bail_user!("{what}: {} is not timm's config.json ({e})", config_path.display()),
        Err(e) => bail_user!("{what}: cannot read {} ({e})", config_path.display()),
    };
    let Some(kind) = timm::kind_of_timm(&config.architecture) else {
        bail_user!(
            "{what}: ringtrain does not build timm's {}; it builds timm's ResNet(-D), ConvNeXt, EfficientNet, MobileNetV3, ViT, DeiT and RegNet models listed by ringtrain models",
            config.architecture
        );
    };
    config.check_variant(kind, &what)?;
    let weights = file(repo, WEIGHTS_FILE, &what)?;
    Ok(HubFiles { weights, config })
}

/// `repo`'s `name` at `main`: the cached snapshot's, else downloaded.
fn file(repo: &Repo, name: &str, what: &str) -> Result<PathBuf> {
    let dir = hub_cache().join(format!("models--{}", repo.as_str().replace('/', "--")));
    if let Some(p) = cached(&dir, name) {
        return Ok(p);
    }
    if std::env::var_os("HF_HUB_OFFLINE").is_some_and(|v| v != "0") {
        bail_user!("{what}: {name} is not in the hub cache {} and HF_HUB_OFFLINE is set", dir.display());
    }
    let url = format!("{}/{}/resolve/main/{name}", endpoint().trim_end_matches('/'), repo.as_str());
    // The hub says which commit `main` is and the file's hash in the headers of its first
    // answer (a redirect to the storage, for a large file): read them before following it.
    let head = match download::agent(false).head(&url).call() {
        Ok(r) => r,
        Err(e) => bail_user!(
            "{what}: cannot reach {url} ({e}); without a network, copy the hub cache folder {} from a machine that has it",
            dir.display()
        ),
    };
    let status = head.status();
    if status.as_u16() == 401 || status.as_u16() == 404 {
        bail_user!("{what}: the hub has no {name} in {} ({status})", repo.as_str());
    }
    if !(status.is_success() || status.is_redirection()) {
        bail_user!("{what}: {url} answered {status}");
    }
    let header = |k: &str| head.headers().get(k).and_then(|v| v.to_str().ok()).map(str::to_string);
    let commit = header("x-repo-commit").filter(|c| is_hex(c));
    let etag = header("x-linked-etag").or_else(|| header("etag")).map(|e| e.trim_start_matches("W/").trim_matches('"').to_string());
    let (Some(commit), Some(etag)) = (commit, etag.filter(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))) else {
        bail_user!("{what}: {url} did not say its commit and hash (X-Repo-Commit, ETag): is HF_ENDPOINT the hub?");
    };
    // A large file's ETag is its SHA-256; a small one's is git's hash of it, which says
    // nothing we can check a download against.
    let expect = if etag.len() == 64 && is_hex(&etag) { Expect::Sha256(&etag) } else { Expect::Unchecked };
    let blob = dir.join("blobs").join(&etag);
    if !blob.is_file() {
        download::fetch(&url, &blob, expect, what)?;
    }
    let snapshot = dir.join("snapshots").join(&commit);
    link(&blob, &snapshot.join(name), what)?;
    let refs = dir.join("refs");
    std::fs::create_dir_all(&refs)
        .and_then(|_| crate::atomic::write_file(&refs.join("main"), commit.as_bytes()).map_err(std::io::Error::other))
        .map_err(|e| crate::error::user_error(format!("{what}: cannot write {} ({e})", refs.display())))?;
    Ok(snapshot.join(name))
}

/// `refs/main` → `snapshots/COMMIT/name`, when both are there.
fn cached(dir: &Path, name: &str) -> Option<PathBuf> {
    let commit = std::fs::read_to_string(dir.join("refs").join("main")).ok()?;
    let commit = commit.trim();
    let p = dir.join("snapshots").join(commit).join(name);
    (is_hex(commit) && p.is_file()).then_some(p)
}

/// `at` becomes a relative symbolic link to `blob`, as the hub's cache has them; replaced in
/// one rename.
fn link(blob: &Path, at: &Path, what: &str) -> Result<()> {
    let dir = at.parent().expect("a snapshot file has a folder");
    let target = Path::new("../..").join("blobs").join(blob.file_name().expect("a blob has a name"));
    let tmp = dir.join(format!(".{}.link-{}", at.file_name().unwrap().to_string_lossy(), std::process::id()));
    let r = std::fs::create_dir_all(dir)
        .and_then(|_| {
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&target, &tmp)
        })
        .and_then(|_| std::fs::rename(&tmp, at));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        bail_user!("{what}: cannot link {} in the hub cache ({e})", at.display());
    }
    Ok(())
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit())
}

impl TimmConfig {
    /// The weights are for `kind` as timm registers it: `model_args` may say the input size
    /// (the evaluation transform carries it), the class count (the head is replaced anyway),
    /// 3 input channels and the architecture's own pooling; any other option is refused.
    fn check_variant(&self, kind: ModelKind, what: &str) -> Result<()> {
        let own = match kind.arch() {
            Arch::Vit(s) if !s.avg_pool => "token",
            _ => "avg",
        };
        let fits = |k: &str, v: &serde_json::Value| match k {
            "img_size" | "num_classes" => true,
            "in_chans" => v.as_i64() == Some(3),
            "global_pool" => v.as_str() == Some(own),
            _ => false,
        };
        let other: Vec<String> = self.model_args.iter().filter(|(k, v)| !fits(k, v)).map(|(k, v)| format!("{k}={v}")).collect();
        if !other.is_empty() {
            bail_user!(
                "{what}: these weights are timm's {kind} created with {}, an option ringtrain does not build (it builds {kind} as timm registers it: 3 channels, pooling '{own}')",
                other.join(", ")
            );
        }
        if let Some(pool) = self.global_pool.as_deref().filter(|p| *p != own) {
            bail_user!("{what}: these weights are timm's {kind} with global_pool='{pool}', an option ringtrain does not build ({kind} pools '{own}')");
        }
        Ok(())
    }

    /// timm's evaluation transform: `Resize(floor(size / crop_pct))` + `CenterCrop(size)`, its
    /// filter, mean and std.
    pub fn eval_transform(&self) -> Option<EvalTransform> {
        let cfg = &self.pretrained_cfg;
        let size = *cfg.input_size.as_ref()?.last()?;
        let crop_pct = cfg.crop_pct.unwrap_or(0.875);
        Some(EvalTransform {
            img_size: size,
            resize: (size as f64 / crop_pct).floor() as u32,
            bicubic: cfg.interpolation.as_deref() == Some("bicubic"),
            mean: cfg.mean.clone().filter(|m| m.len() == 3),
            std: cfg.std.clone().filter(|s| s.len() == 3),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_are_checked() {
        assert!(Repo::parse("timm/resnet50.a1_in1k").is_ok());
        for bad in ["timm", "timm/", "../x", "timm/..", "a/b/c", "timm/res net"] {
            assert!(Repo::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Repo::parse("timm/resnet50.a1_in1k").unwrap().model_by_name(), Some(ModelKind::ResNet50));
        assert_eq!(
            Repo::parse("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k").unwrap().model_by_name(),
            Some(ModelKind::VitBase16)
        );
        assert_eq!(Repo::parse("timm/convnext_tiny.fb_in22k_ft_in1k").unwrap().model_by_name(), Some(ModelKind::ConvNextTiny));
        assert_eq!(Repo::parse("timm/vit_b_16").unwrap().model_by_name(), None);
        assert_eq!(Repo::parse("timm/mobilenet_v3_large").unwrap().model_by_name(), None);
        assert_eq!(Repo::parse("timm/swin_tiny_patch4_window7_224.ms_in1k").unwrap().model_by_name(), None);
    }
}
