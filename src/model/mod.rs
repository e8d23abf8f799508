//! Models by name, with torchvision's parameter and buffer names, and their state_dict as
//! safetensors (so PyTorch can `load_state_dict` ours and we can load theirs).
pub mod alexnet;
pub mod batchnorm;
pub mod convnext;
pub mod efficientnet;
pub mod fused;
pub mod kind;
pub mod layers;
pub mod lenet;
pub mod mobilenet;
pub mod regnet;
pub mod resnet;
pub mod timm;
pub mod vit;
pub mod weights;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

pub use kind::{Arch, ModelKind};
pub use timm::Names;

/// What `load_pretrained` did.
#[derive(Debug, Default)]
pub struct PretrainedReport {
    pub loaded: usize,
    /// Model tensors the file lacks (left as initialised).
    pub missing: Vec<String>,
    /// File tensors the model has no place for (ignored).
    pub unexpected: Vec<String>,
    /// Head tensors whose shape differs (another class count): re-initialised.
    pub reinitialized_head: Vec<String>,
    /// A ViT's position embedding made for another image size: interpolated to this one.
    pub interpolated: Vec<String>,
    /// The prefix every name of the file had, taken off (`model.` of a Lightning module).
    pub prefix: Option<String>,
    /// Whose names the file had.
    pub names: Option<Names>,
}

/// PyTorch's own initialisation of `nn.Linear` and `nn.Conv2d` (their `reset_parameters`),
/// which torchvision keeps for AlexNet, LeNet and ResNet's `fc`: weights
/// `kaiming_uniform_(a=√5)` = U(±1/√fan_in), biases U(±1/√fan_in). tch's defaults differ (weights
/// √6 times wider, conv biases zero); with them a from-scratch ResNet started with a head 2.4×
/// too large.
pub const TORCH_WEIGHT_INIT: nn::Init = nn::Init::Kaiming {
    dist: nn::init::NormalOrUniform::Uniform,
    fan: nn::init::FanInOut::FanIn,
    non_linearity: nn::init::NonLinearity::ExplicitGain(0.577_350_269_189_625_8), // √(2/(1+5))
};

pub fn torch_bias(fan_in: i64) -> nn::Init {
    let b = 1.0 / (fan_in as f64).sqrt();
    nn::Init::Uniform { lo: -b, up: b }
}

/// `nn.Linear(cin, cout)` with PyTorch's initialisation.
pub fn torch_linear<'a, T: std::borrow::Borrow<nn::Path<'a>>>(p: T, cin: i64, cout: i64) -> nn::Linear {
    let cfg = nn::LinearConfig {
        ws_init: TORCH_WEIGHT_INIT,
        bs_init: Some(torch_bias(cin)),
        bias: true,
    };
    nn::linear(p, cin, cout, cfg)
}

/// `nn.Conv2d(cin, cout, k, stride, padding)` (with bias) with PyTorch's initialisation.
pub fn torch_conv2d<'a, T: std::borrow::Borrow<nn::Path<'a>>>(
    p: T,
    cin: i64,
    cout: i64,
    k: i64,
    stride: i64,
    padding: i64,
) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        ws_init: TORCH_WEIGHT_INIT,
        bs_init: torch_bias(cin * k * k),
        ..Default::default()
    };
    nn::conv2d(p, cin, cout, k, cfg)
}

/// How a network is built beyond its architecture: the input size (which sets a ViT's sequence
/// length) and its regularisation (None: torchvision's default for the architecture).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelOptions {
    pub img_size: u32,
    pub drop_path: Option<f64>,
    pub dropout: Option<f64>,
    /// Normalisation through the fused kernels where they apply (`--fused-norm`): BatchNorm +
    /// (add) + ReLU in the ResNet family, the blocks' LayerNorm in ConvNeXt.
    pub fused_norm: bool,
}

impl ModelOptions {
    /// The architecture's own input size and regularisation.
    pub fn defaults(kind: ModelKind) -> Self {
        ModelOptions {
            img_size: kind.default_img_size(),
            drop_path: None,
            dropout: None,
            fused_norm: false,
        }
    }
}

/// Which layer of the network each parameter belongs to, for `--layer-decay` (BEiT's and timm's
/// layer-wise learning rates): the stem is layer 0, block i (in forward order) layer i + 1, and
/// everything after the last block (final norm, head) the last layer.
#[derive(Debug, Clone, Default)]
pub struct LayerMap {
    pub stem: Vec<String>,
    /// Each block's name prefixes.
    pub blocks: Vec<Vec<String>>,
}

impl LayerMap {
    pub fn new(stem: &[&str]) -> Self {
        LayerMap {
            stem: stem.iter().map(|s| s.to_string()).collect(),
            blocks: Vec::new(),
        }
    }

    /// Stem, blocks, and what follows them.
    pub fn num_layers(&self) -> usize {
        self.blocks.len() + 2
    }

    pub fn layer_of(&self, name: &str) -> usize {
        let under = |p: &String| name == p || name.starts_with(&format!("{p}."));
        if self.stem.iter().any(under) {
            return 0;
        }
        match self.blocks.iter().position(|b| b.iter().any(under)) {
            Some(i) => i + 1,
            None => self.blocks.len() + 1,
        }
    }
}

pub struct Model {
    pub kind: ModelKind,
    pub opts: ModelOptions,
    pub vs: nn::VarStore,
    net: nn::FuncT<'static>,
    /// Where each parameter sits in the depth of the network (`--layer-decay`).
    pub layers: LayerMap,
    /// Training forward passes so far: torchvision's BN `num_batches_tracked`, kept for interop.
    pub bn_batches: i64,
    /// Whose tensor names its files carry: timm's for timm's networks and for a run started
    /// from timm's weights, else torchvision's. Reading takes either.
    pub names: Names,
}

impl Model {
    /// Builds `kind` for `num_classes` on `device` with the architecture's own input size and
    /// regularisation, initialised from tch's global RNG (seed it with `tch::manual_seed` for
    /// reproducible weights).
    pub fn new(kind: ModelKind, num_classes: i64, device: Device) -> Self {
        Self::build(kind, num_classes, device, ModelOptions::defaults(kind))
    }

    /// `new` with the input size and regularisation of `opts`.
    pub fn build(kind: ModelKind, num_classes: i64, device: Device, opts: ModelOptions) -> Self {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let drop_path = opts.drop_path.or(kind.default_drop_path()).unwrap_or(0.0);
        let dropout = opts.dropout.or(kind.default_dropout()).unwrap_or(0.0);
        let (net, layers) = match kind.arch() {
            Arch::ResNet(s) => resnet::resnet(&root, &s, num_classes, resnet::BlockOptions { fused_norm: opts.fused_norm }),
            Arch::ConvNext(s) => convnext::convnext(&root, &s, num_classes, drop_path, opts.fused_norm),
            Arch::EfficientNet(s) => efficientnet::efficientnet(&root, &s, num_classes, drop_path, dropout),
            Arch::MobileNetV3(s) => mobilenet::mobilenet_v3(&root, s, num_classes, dropout),
            Arch::Vit(s) => vit::vit(&root, s, opts.img_size as i64, num_classes, dropout, drop_path),
            Arch::RegNet(s) => regnet::regnet(&root, &s, num_classes),
            Arch::AlexNet => alexnet::alexnet(&root, num_classes, dropout),
            Arch::LeNet5 => lenet::lenet5(&root, num_classes),
        };
        Model {
            kind,
            opts,
            vs,
            net,
            layers,
            bn_batches: 0,
            names: if kind.is_timm() { Names::Timm } else { Names::Torchvision },
        }
    }

    /// torchvision's `zero_init_residual=True`: the BatchNorm weight that ends every residual
    /// block set to 0, so each block starts as the identity (Goyal et al., 2017, "Accurate,
    /// Large Minibatch SGD"). Returns the number of tensors zeroed (0 for a model without
    /// residual blocks).
    pub fn zero_init_residual(&self) -> usize {
        let Some(bn) = self.kind.residual_bn() else {
            return 0;
        };
        let suffix = format!(".{bn}.weight");
        let mut zeroed = 0;
        tch::no_grad(|| {
            for (name, mut t) in self.vs.variables() {
                if name.starts_with("layer") && name.ends_with(&suffix) {
                    let _ = t.zero_();
                    zeroed += 1;
                }
            }
        });
        zeroed
    }

    /// The classifier head's name prefix, as in torchvision.
    pub fn head_prefix(&self) -> &'static str {
        self.kind.head_prefix()
    }

    /// The trainable tensors with their names, in name order: the order of the optimizer's
    /// state, of the DDP buckets and of every walk that must agree across ranks and runs.
    /// Frozen tensors (`--freeze`) are left out: they get no gradient.
    pub fn trainable(&self) -> Vec<(String, Tensor)> {
        self.sorted_variables(true)
    }

    /// The tensors that get no gradient (BatchNorm running statistics, frozen parameters), in
    /// name order: what DDP broadcasts from rank 0 when BatchNorm is not synchronised.
    pub fn untrained(&self) -> Vec<Tensor> {
        self.sorted_variables(false).into_iter().map(|(_, t)| t).collect()
    }

    fn sorted_variables(&self, trainable: bool) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> =
            self.vs.variables().into_iter().filter(|(_, t)| t.requires_grad() == trainable).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Fine-tuning: loads a state_dict (torchvision's or timm's names) by name. Loading is
    /// strict, as PyTorch's `load_state_dict` is: a tensor the model lacks, or one of the model's
    /// the file lacks, is an error that names the architecture the file looks like, unless
    /// `partial` (`--pretrained-partial`), which leaves missing tensors as initialised and
    /// ignores unexpected ones. The classifier head may differ in shape (another class count):
    /// it then keeps its fresh initialisation. `origin` names the weights in errors.
    pub fn load_pretrained(&mut self, file: &weights::StateDict, origin: &str, partial: bool) -> Result<PretrainedReport> {
        let vars = self.vs.variables();
        let head = format!("{}.", self.head_prefix());
        let mut r = PretrainedReport::default();
        // A wrapper's attribute before every name (Lightning's `model.`, a `backbone.`): taken
        // off when no name matches as it is.
        let unwrapped;
        let file = match weights::common_prefix(file) {
            Some(p) if !file.keys().any(|k| vars.contains_key(k)) && timm::names_of(self, file) != Names::Timm => {
                unwrapped = weights::without_prefix(file, &p);
                r.prefix = Some(p);
                &unwrapped
            }
            _ => file,
        };
        let renamed = timm::from_timm(self, file);
        r.names = Some(if renamed.is_some() { Names::Timm } else { Names::Torchvision });
        let file = renamed.as_ref().unwrap_or(file);
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        tch::no_grad(|| -> Result<()> {
            for name in names {
                let var = &vars[name];
                let Some(src) = file.get(name) else {
                    r.missing.push(name.clone());
                    continue;
                };
                let resized = (name == "encoder.pos_embedding" && src.size() != var.size())
                    .then(|| match r.names {
                        Some(Names::Timm) => {
                            let prefix = vars.contains_key("class_token") as i64;
                            vit::resample_pos_embedding_timm(src, var.size()[1], prefix)
                        }
                        _ => vit::interpolate_pos_embedding(src, var.size()[1]),
                    })
                    .flatten();
                if resized.is_some() {
                    r.interpolated.push(name.clone());
                }
                let src = resized.as_ref().unwrap_or(src);
                if src.size() != var.size() {
                    if name.starts_with(&head) {
                        r.reinitialized_head.push(name.clone());
                        continue;
                    }
                    crate::bail_user!(
                        "--pretrained {origin}: {name} has shape {:?}, {} needs {:?} (a different architecture{}?)",
                        src.size(),
                        self.kind,
                        var.size(),
                        self.guess_architecture(file).map_or(String::new(), |k| format!(": the file looks like {k}"))
                    );
                }
                var.shallow_clone().copy_(&src.to_kind(var.kind()));
                r.loaded += 1;
            }
            Ok(())
        })?;
        r.unexpected = file
            .keys()
            .filter(|k| !vars.contains_key(*k) && !k.ends_with(".num_batches_tracked"))
            .cloned()
            .collect();
        r.unexpected.sort();
        if r.loaded == 0 {
            crate::bail_user!(
                "--pretrained {origin}: no tensor name matches {} (is it a torchvision or timm state_dict?)",
                self.kind
            );
        }
        let missing: Vec<&String> = r.missing.iter().filter(|n| !n.starts_with(&head)).collect();
        if !partial && (!missing.is_empty() || !r.unexpected.is_empty()) {
            let few = |v: &[&String]| match v.len() {
                0 => "none".to_string(),
                n if n <= 3 => v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                n => format!("{}, … ({n})", v[..3].iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
            };
            let unexpected: Vec<&String> = r.unexpected.iter().collect();
            let looks = match self.guess_architecture(file) {
                Some(k) => format!("the file looks like {k}: name --model {k}, or"),
                None => "not a state_dict of it:".to_string(),
            };
            crate::bail_user!(
                "--pretrained {origin} does not fit {}: missing {}; unexpected {}; {looks} --pretrained-partial to load the tensors that fit",
                self.kind,
                few(&missing),
                few(&unexpected),
            );
        }
        Ok(r)
    }

    /// The architecture of this family whose tensors (names and shapes, head aside) are those of
    /// `file` (ringtrain's names): what a file that does not fit was made for.
    fn guess_architecture(&self, file: &weights::StateDict) -> Option<ModelKind> {
        // One family, one head name.
        let head = format!("{}.", self.head_prefix());
        let signature = |tensors: &mut dyn Iterator<Item = (&String, &Tensor)>| {
            let mut v: Vec<(String, Vec<i64>)> = tensors
                .filter(|(k, _)| !k.starts_with(&head) && !k.ends_with(".num_batches_tracked"))
                .map(|(k, t)| (k.clone(), t.size()))
                .collect();
            v.sort();
            v
        };
        let want = signature(&mut file.iter());
        let family = std::mem::discriminant(&self.kind.arch());
        let mut kinds = ModelKind::ALL.iter().copied().filter(|k| *k != self.kind && std::mem::discriminant(&k.arch()) == family);
        kinds.find(|&kind| {
            let opts = ModelOptions { img_size: self.opts.img_size, ..ModelOptions::defaults(kind) };
            signature(&mut Model::build(kind, 1, Device::Cpu, opts).vs.variables().iter()) == want
        })
    }

    /// `--freeze conv1,bn1,layer1`: parameters under these name prefixes get no gradient (and
    /// their BatchNorms stay in eval mode). A model whose files carry timm's names takes timm's
    /// prefixes too (`stem,stages.0`). Returns how many tensors were frozen.
    pub fn freeze(&self, prefixes: &[String]) -> Result<usize> {
        let vars = self.vs.variables();
        let mut frozen = 0;
        for prefix in prefixes {
            let is_under = |name: &str| name == prefix || name.starts_with(&format!("{prefix}."));
            let under: Vec<&Tensor> = vars
                .iter()
                .filter(|(k, _)| is_under(k) || is_under(&self.file_name(k)))
                .map(|(_, v)| v)
                .collect();
            if under.is_empty() {
                crate::bail_user!("--freeze {prefix}: no parameter of {} has that name prefix", self.kind);
            }
            for v in under.into_iter().filter(|v| v.requires_grad()) {
                let _ = v.shallow_clone().set_requires_grad(false);
                frozen += 1;
            }
        }
        Ok(frozen)
    }

    pub fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        self.net.forward_t(x, train)
    }

    pub fn num_parameters(&self) -> i64 {
        self.vs.trainable_variables().iter().map(|t| t.numel() as i64).sum()
    }

    /// The state_dict as torchvision names it, on the CPU, contiguous, including
    /// `num_batches_tracked` for every BatchNorm.
    /// On a CPU model the tensors share storage with the live weights (no copy for a save):
    /// copy them to keep a snapshot.
    pub fn state_dict(&self) -> BTreeMap<String, Tensor> {
        let mut out = BTreeMap::new();
        for (name, t) in self.vs.variables() {
            if let Some(prefix) = name.strip_suffix(".running_mean") {
                out.insert(format!("{prefix}.num_batches_tracked"), Tensor::from(self.bn_batches));
            }
            out.insert(name, t.detach().to_device(Device::Cpu).contiguous());
        }
        out
    }

    /// What the model's files call its tensor `name` (ringtrain's name), for messages.
    pub fn file_name(&self, name: &str) -> String {
        match self.names {
            Names::Timm => timm::timm_name(self.kind, name).unwrap_or_else(|| name.to_string()),
            Names::Torchvision => name.to_string(),
        }
    }

    /// The state_dict under the names of `self.names`.
    pub fn named_state_dict(&self) -> BTreeMap<String, Tensor> {
        match self.names {
            Names::Torchvision => self.state_dict(),
            Names::Timm => timm::to_timm(self, &self.state_dict()),
        }
    }

    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        let sd = self.named_state_dict();
        weights::write_tensors(sd.iter().map(|(k, v)| (k.as_str(), v)), path)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Loads a state_dict (torchvision's or timm's names) from a safetensors file. Every
    /// parameter and buffer must be present with the same shape; unknown names are an error.
    pub fn load_safetensors(&mut self, path: &Path) -> Result<()> {
        let file: weights::StateDict = Tensor::read_safetensors(path)
            .with_context(|| format!("reading {}", path.display()))?
            .into_iter()
            .collect();
        let file = timm::from_timm(self, &file).unwrap_or(file);
        let vars = self.vs.variables();
        let mut missing: Vec<&String> = vars.keys().filter(|k| !file.contains_key(*k)).collect();
        missing.sort();
        let mut unexpected: Vec<&String> = file
            .keys()
            .filter(|k| !vars.contains_key(*k) && !k.ends_with(".num_batches_tracked"))
            .collect();
        unexpected.sort();
        if !missing.is_empty() || !unexpected.is_empty() {
            bail!(
                "{} does not match model {}: missing keys {:?}, unexpected keys {:?}",
                path.display(),
                self.kind,
                missing,
                unexpected
            );
        }
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        tch::no_grad(|| -> Result<()> {
            for name in names {
                let var = &vars[name];
                let src = &file[name];
                if src.size() != var.size() {
                    bail!(
                        "{}: {name} has shape {:?}, model {} expects {:?}",
                        path.display(),
                        src.size(),
                        self.kind,
                        var.size()
                    );
                }
                var.shallow_clone().copy_(&src.to_kind(var.kind()));
            }
            Ok(())
        })?;
        if let Some((_, t)) = file.iter().find(|(k, _)| k.ends_with(".num_batches_tracked")) {
            self.bn_batches = t.to_kind(Kind::Int64).int64_value(&[]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torch.nn.Linear / Conv2d initialisation: U(±1/√fan_in) for weights and biases, so the
    /// largest |value| of a big tensor lies just under the bound.
    #[test]
    fn linear_and_conv_layers_start_as_pytorch_initialises_them() {
        tch::manual_seed(0);
        for (model, classes, tensors) in [
            // Tensors of 64 values or more: the largest of n draws is under 0.8 × bound with
            // probability 0.8^n (1e-6 for n = 64).
            ("resnet18", 1000, vec![("fc.weight", 512), ("fc.bias", 512)]),
            ("alexnet", 10, vec![("features.0.weight", 3 * 11 * 11), ("features.0.bias", 3 * 11 * 11), ("classifier.1.weight", 9216), ("classifier.1.bias", 9216)]),
            ("lenet5", 10, vec![("conv2.weight", 6 * 25), ("fc1.bias", 400)]),
        ] {
            let m = Model::new(model.parse().unwrap(), classes, Device::Cpu);
            let vars = m.vs.variables();
            for (name, fan_in) in tensors {
                let bound = 1.0 / (fan_in as f64).sqrt();
                let max = vars[name].abs().max().double_value(&[]);
                assert!(max <= bound * (1.0 + 1e-6) && max > 0.8 * bound, "{model} {name}: max |w| {max}, bound {bound}");
            }
        }
    }


    #[test]
    fn parameter_counts_match_torchvision() {
        // torchvision: sum(p.numel() for p in resnetX(num_classes=1000).parameters())
        for (name, n) in [
            ("resnet18", 11_689_512),
            ("resnet50", 25_557_032),
            ("alexnet", 61_100_840),
        ] {
            assert_eq!(
                Model::new(name.parse().unwrap(), 1000, Device::Cpu).num_parameters(),
                n,
                "{name}"
            );
        }
    }

    #[test]
    fn state_dict_round_trips_through_safetensors() {
        let d = tempfile::tempdir().unwrap();
        tch::manual_seed(0);
        let mut a = Model::new("resnet10-tiny".parse().unwrap(), 5, Device::Cpu);
        a.bn_batches = 17;
        let p = d.path().join("m.safetensors");
        a.save_safetensors(&p).unwrap();
        tch::manual_seed(1);
        let mut b = Model::new("resnet10-tiny".parse().unwrap(), 5, Device::Cpu);
        b.load_safetensors(&p).unwrap();
        assert_eq!(b.bn_batches, 17);
        let x = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
        assert!(a.forward(&x, false).allclose(&b.forward(&x, false), 1e-6, 1e-6, false));
        assert!(a.state_dict().contains_key("layer1.0.bn1.num_batches_tracked"));
    }

    #[test]
    fn wrong_head_size_is_rejected() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.safetensors");
        Model::new("resnet10-tiny".parse().unwrap(), 5, Device::Cpu)
            .save_safetensors(&p)
            .unwrap();
        let e = Model::new("resnet10-tiny".parse().unwrap(), 3, Device::Cpu)
            .load_safetensors(&p)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("fc.bias has shape [5], model resnet10-tiny expects [3]"),
            "{e}"
        );
    }
}
