//! timm's tensor names. ringtrain builds every network under torchvision's names (and, for what
//! only timm has, names in the same style); timm names the same tensors its own way. Each
//! family says what timm calls each of its tensors (`timm_name` in its file); here that becomes
//! a table both ways, so timm's weights load by name and a run started from them writes a
//! state_dict that `timm.create_model(NAME, num_classes=K)` loads with `strict=True`.
use std::collections::BTreeMap;

use super::weights::StateDict;
use super::{convnext, efficientnet, mobilenet, regnet, vit, Arch, Model, ModelKind};

crate::flag_enum! {
    /// Whose names a model's files carry.
    pub enum Names("unknown tensor names") {
        Torchvision = "torchvision",
        Timm = "timm",
    }
}

/// Whether timm has `kind`, the same network with the same tensors (`timm_name` names them):
/// not torchvision's EfficientNetV2 or MobileNetV3 (BatchNorm eps), AlexNet, LeNet or the
/// CIFAR-stem ResNets.
pub fn has_timm_names(kind: ModelKind) -> bool {
    match kind.arch() {
        Arch::ResNet(s) => !s.cifar_stem,
        Arch::EfficientNet(s) => s.last_channel.is_none(),
        Arch::MobileNetV3(_) => kind.is_timm(),
        Arch::ConvNext(_) | Arch::Vit(_) | Arch::RegNet(_) => true,
        Arch::AlexNet | Arch::LeNet5 => false,
    }
}

/// timm's name for `kind`'s tensor `name`, when timm has the network.
pub fn timm_name(kind: ModelKind, name: &str) -> Option<String> {
    if !has_timm_names(kind) {
        return None;
    }
    match kind.arch() {
        // timm's ResNets (and ResNet-D, built under its names) name theirs as torchvision does.
        Arch::ResNet(_) => Some(name.to_string()),
        Arch::ConvNext(_) => convnext::timm_name(name),
        Arch::EfficientNet(s) => efficientnet::timm_name(&s, name),
        Arch::MobileNetV3(s) => mobilenet::timm_name(s, name),
        Arch::Vit(_) => vit::timm_name(name),
        Arch::RegNet(_) => regnet::timm_name(name),
        Arch::AlexNet | Arch::LeNet5 => None,
    }
}

/// The architecture timm's `name` is here (timm's ResNets, ConvNeXts and EfficientNet B0–B3
/// have torchvision's names; the rest are ringtrain's kinds under timm's names).
pub fn kind_of_timm(name: &str) -> Option<ModelKind> {
    let timm_has = |k: ModelKind| {
        has_timm_names(k) && (k.is_timm() || matches!(k.arch(), Arch::ResNet(_) | Arch::ConvNext(_) | Arch::EfficientNet(_)))
    };
    ModelKind::ALL.iter().copied().find(|k| k.name() == name && timm_has(*k))
}

/// ringtrain's name → (timm's name, timm's shape) for every tensor of `model`, with
/// `num_batches_tracked` beside each BatchNorm's running mean.
fn table(model: &Model) -> BTreeMap<String, (String, Vec<i64>)> {
    let mut t = BTreeMap::new();
    for (name, var) in model.vs.variables() {
        let Some(theirs) = timm_name(model.kind, &name) else {
            continue;
        };
        let shape = timm_shape(model.kind, &name, &var.size());
        if let (Some(p), Some(q)) = (name.strip_suffix(".running_mean"), theirs.strip_suffix(".running_mean")) {
            t.insert(format!("{p}.num_batches_tracked"), (format!("{q}.num_batches_tracked"), vec![]));
        }
        t.insert(name, (theirs, shape));
    }
    t
}

/// timm's shape of a tensor ringtrain shapes otherwise: ConvNeXt's layer scale is a vector
/// there, MobileNetV3's first head layer a 1×1 convolution.
fn timm_shape(kind: ModelKind, name: &str, shape: &[i64]) -> Vec<i64> {
    match kind.arch() {
        Arch::ConvNext(_) if name.ends_with(".layer_scale") => vec![shape[0]],
        Arch::MobileNetV3(_) if name == "classifier.0.weight" => vec![shape[0], shape[1], 1, 1],
        _ => shape.to_vec(),
    }
}

/// `state_dict` (ringtrain's names) under timm's names and shapes.
pub fn to_timm(model: &Model, state_dict: &StateDict) -> StateDict {
    let t = table(model);
    state_dict
        .iter()
        .map(|(k, v)| match t.get(k) {
            Some((theirs, shape)) if !shape.is_empty() => (theirs.clone(), v.reshape(shape.as_slice())),
            Some((theirs, _)) => (theirs.clone(), v.shallow_clone()),
            None => (k.clone(), v.shallow_clone()),
        })
        .collect()
}

/// Whether `file` names its tensors as timm does for `model` (more of its names are timm's
/// than ringtrain's).
pub fn names_of(model: &Model, file: &StateDict) -> Names {
    names_in(&table(model), file)
}

fn names_in(table: &BTreeMap<String, (String, Vec<i64>)>, file: &StateDict) -> Names {
    let ours = file.keys().filter(|k| table.contains_key(*k)).count();
    let theirs: std::collections::HashSet<&String> = table.values().map(|(n, _)| n).collect();
    let timm = file.keys().filter(|k| theirs.contains(k)).count();
    if timm > ours {
        Names::Timm
    } else {
        Names::Torchvision
    }
}

/// `file` under ringtrain's names and shapes when it carries timm's (None: it carries
/// ringtrain's); tensors timm's table does not know keep their names (and are then unexpected).
pub fn from_timm(model: &Model, file: &StateDict) -> Option<StateDict> {
    let table = table(model);
    if names_in(&table, file) != Names::Timm {
        return None;
    }
    let vars = model.vs.variables();
    let head = format!("{}.", model.head_prefix());
    let back: BTreeMap<&String, &String> = table.iter().map(|(ours, (theirs, _))| (theirs, ours)).collect();
    let renamed = file.iter().map(|(k, v)| match back.get(k) {
        Some(ours) => {
            let t = match vars.get(*ours) {
                // timm's other shape of the same tensor (not another class count).
                Some(var) if var.size() != v.size() && var.numel() == v.numel() && !ours.starts_with(&head) => {
                    v.reshape(var.size().as_slice())
                }
                _ => v.shallow_clone(),
            };
            ((*ours).clone(), t)
        }
        None => (k.clone(), v.shallow_clone()),
    });
    Some(renamed.collect())
}
