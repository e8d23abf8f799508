//! PyTorch checkpoints (`torch.save`: the zip format of torch ≥ 1.6, the legacy stream before
//! it, the tar of the first releases) read without unpickling. `pytorch-reader` interprets only
//! the opcodes and globals a state_dict needs (tensors rebuilt from their storages, ordered
//! dicts, numbers, strings); it calls nothing, and any other global stays an opaque name. Here:
//! which dict of the checkpoint holds the weights, and its tensors as tch tensors with the
//! prefixes of DDP (`module.`) and `torch.compile` (`_orig_mod.`) taken off.
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::Result;
use pytorch_reader::{DType, PickleValue, PytorchReader};
use tch::{Kind, Tensor};

use crate::bail_user;

use super::StateDict;

/// Where training scripts keep the model's weights inside a checkpoint dict, most usual first:
/// the ImageNet example (`state_dict`), timm's train script (`state_dict`, `state_dict_ema`),
/// Lightning (`state_dict`), detectron-style and hand-written loops (`model`, `model_state`,
/// `model_state_dict`, `net`). The plain weights come before any EMA of them.
const WEIGHT_KEYS: &[&str] = &[
    "state_dict",
    "model_state_dict",
    "model_state",
    "model",
    "net",
    "network",
    "module",
    "weights",
    "params",
    "state_dict_ema",
    "model_ema",
    "ema",
];

/// What `read` found: the weights, and which key of the checkpoint held them (None: the root).
pub struct Checkpoint {
    pub weights: StateDict,
    pub key: Option<String>,
    /// Other dicts of tensors at the top of the checkpoint that `--pretrained-key` could pick
    /// (an EMA beside the weights, say).
    pub others: Vec<String>,
}

/// Whether `path` is a safetensors file: an 8-byte little-endian header length, then that many
/// bytes of JSON header within the file. Anything else is taken for a PyTorch checkpoint.
pub fn is_safetensors(path: &Path) -> bool {
    let mut head = [0u8; 9];
    let Ok(mut f) = std::fs::File::open(path) else { return false };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if std::io::Read::read_exact(&mut f, &mut head).is_err() {
        return false;
    }
    let n = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    head[8] == b'{' && n.checked_add(8).is_some_and(|end| end <= len)
}

/// The weights of the PyTorch checkpoint at `path`: under `key` when given, else under the
/// first of `WEIGHT_KEYS` that holds tensors, else the root when it is a state_dict, else the one
/// top-level dict that holds tensors, else the root (a whole module saved by `torch.save(model)`,
/// which `pytorch-reader` reads as its state_dict).
pub fn read(path: &Path, key: Option<&str>) -> Result<Checkpoint> {
    let shown = path.display();
    let root = match PytorchReader::read_pickle_data(path, None) {
        Ok(v) => v,
        Err(e) => bail_user!(
            "--pretrained {shown}: neither safetensors nor a readable PyTorch checkpoint ({})",
            one_line(&e.to_string())
        ),
    };
    let PickleValue::Dict(top) = &root else {
        bail_user!("--pretrained {shown}: holds {}, not a dict of weights", type_name(&root));
    };
    let holding: Vec<&String> = sorted_keys(top).into_iter().filter(|k| holds_tensors(&top[*k])).collect();
    let chosen: Option<String> = match key {
        Some(k) => match top.get(k) {
            Some(v) if holds_tensors(v) => Some(k.to_string()),
            Some(v) => bail_user!(
                "--pretrained-key {k}: {shown} holds {} there, not a state_dict (no tensors in it)",
                type_name(v)
            ),
            None => bail_user!("--pretrained-key {k}: {shown} has no such key; its keys: {}", list(sorted_keys(top))),
        },
        None => match WEIGHT_KEYS.iter().find(|k| top.get(**k).is_some_and(holds_tensors)) {
            Some(k) => Some(k.to_string()),
            None if direct_tensors(top) > 0 => None,
            None if holding.len() == 1 => Some(holding[0].clone()),
            None => None,
        },
    };
    let dict = match &chosen {
        Some(k) => match &top[k] {
            PickleValue::Dict(d) => d,
            _ => unreachable!("holds_tensors is true of dicts only"),
        },
        None => top,
    };
    refuse_globals_among_weights(dict, "", &shown.to_string())?;
    let reader = match &chosen {
        Some(k) => PytorchReader::with_top_level_key(path, k),
        None => PytorchReader::new(path),
    };
    let reader = match reader {
        Ok(r) => r,
        Err(e) => bail_user!("--pretrained {shown}: {}", one_line(&e.to_string())),
    };
    let mut weights = BTreeMap::new();
    for (name, t) in reader.tensors() {
        let bytes = match t.read() {
            Ok(b) => b,
            Err(e) => bail_user!("--pretrained {shown}: {name} cannot be read ({e})"),
        };
        let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        let tensor = Tensor::f_from_data_size(&bytes, &shape, kind(t.dtype()))
            .map_err(|e| crate::error::user_error(format!("--pretrained {shown}: {name}: {e}")))?;
        weights.insert(strip_wrappers(name).to_string(), tensor);
    }
    if weights.is_empty() {
        let keys = sorted_keys(dict);
        let found: Vec<String> = keys.iter().take(4).map(|k| format!("{k}: {}", type_name(&dict[*k]))).collect();
        let more = if keys.len() > 4 { format!(", … ({} entries)", keys.len()) } else { String::new() };
        bail_user!("--pretrained {shown}: holds no tensors, so no weights (it holds {}{more})", if found.is_empty() { "an empty dict".to_string() } else { found.join(", ") });
    }
    let others = WEIGHT_KEYS
        .iter()
        .filter(|k| Some(**k) != chosen.as_deref() && top.get(**k).is_some_and(holds_tensors))
        .map(|k| k.to_string())
        .collect();
    Ok(Checkpoint { weights, key: chosen, others })
}

/// The type name `pytorch-reader` gives a tensor where it stands in the pickle's structure.
const TENSOR: &str = "torch.Tensor";

/// Prefixes that wrappers add to every name: DDP's and DataParallel's `module.`, and
/// `torch.compile`'s `_orig_mod.` (in either order, any number of times).
pub fn strip_wrappers(mut name: &str) -> &str {
    loop {
        match name.strip_prefix("module.").or_else(|| name.strip_prefix("_orig_mod.")) {
            Some(rest) => name = rest,
            None => return name,
        }
    }
}

fn kind(d: DType) -> Kind {
    match d {
        DType::F64 => Kind::Double,
        DType::F32 => Kind::Float,
        DType::F16 => Kind::Half,
        DType::BF16 => Kind::BFloat16,
        DType::I64 | DType::U64 => Kind::Int64,
        DType::I32 | DType::U32 => Kind::Int,
        DType::I16 | DType::U16 => Kind::Int16,
        DType::I8 => Kind::Int8,
        DType::U8 => Kind::Uint8,
        DType::Bool => Kind::Bool,
    }
}

fn is_tensor(v: &PickleValue) -> bool {
    matches!(v, PickleValue::Unsupported(g) if g == TENSOR)
}

fn direct_tensors(d: &HashMap<String, PickleValue>) -> usize {
    d.values().filter(|v| is_tensor(v)).count()
}

/// A dict with tensors somewhere inside it (a state_dict, or a module's nested state).
fn holds_tensors(v: &PickleValue) -> bool {
    match v {
        PickleValue::Dict(d) => d.values().any(|v| is_tensor(v) || holds_tensors(v)),
        _ => false,
    }
}

/// A global where a weight belongs (beside the tensors of a dict): the file wanted something
/// built by a call the reader does not make (a numpy array, a `__reduce__`). Say which, rather
/// than leave the weight missing. Values elsewhere (an `argparse.Namespace` beside the
/// weights) are no weights and stay unread.
fn refuse_globals_among_weights(d: &HashMap<String, PickleValue>, prefix: &str, shown: &str) -> Result<()> {
    let beside_tensors = direct_tensors(d) > 0;
    for name in sorted_keys(d) {
        match &d[name] {
            PickleValue::Unsupported(global) if beside_tensors && global != TENSOR => {
                bail_user!("--pretrained {shown}: {prefix}{name} is built by {global}, not a tensor (nothing was called)")
            }
            PickleValue::Dict(inner) => refuse_globals_among_weights(inner, &format!("{prefix}{name}."), shown)?,
            _ => {}
        }
    }
    Ok(())
}

fn sorted_keys(d: &HashMap<String, PickleValue>) -> Vec<&String> {
    let mut k: Vec<&String> = d.keys().collect();
    k.sort();
    k
}

fn list(keys: Vec<&String>) -> String {
    const SHOWN: usize = 12;
    let mut s = keys.iter().take(SHOWN).map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
    if keys.len() > SHOWN {
        s.push_str(&format!(" and {} more", keys.len() - SHOWN));
    }
    if s.is_empty() {
        s.push_str("none");
    }
    s
}

/// What a value is, with its article: "an int", "a value built by posix.system".
fn type_name(v: &PickleValue) -> String {
    match v {
        PickleValue::None => "None".into(),
        PickleValue::Bool(_) => "a bool".into(),
        PickleValue::Int(_) => "an int".into(),
        PickleValue::Float(_) => "a float".into(),
        PickleValue::String(_) => "a str".into(),
        PickleValue::List(_) => "a list".into(),
        PickleValue::Dict(_) => "a dict".into(),
        PickleValue::Bytes(_) => "bytes".into(),
        PickleValue::Unsupported(g) => format!("a value built by {g}"),
    }
}

fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::strip_wrappers;

    #[test]
    fn wrapper_prefixes_come_off_in_any_order() {
        assert_eq!(strip_wrappers("module.conv1.weight"), "conv1.weight");
        assert_eq!(strip_wrappers("_orig_mod.module.fc.bias"), "fc.bias");
        assert_eq!(strip_wrappers("module.module.fc.bias"), "fc.bias");
        assert_eq!(strip_wrappers("features.module.x"), "features.module.x");
    }
}
