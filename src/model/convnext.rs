//! ConvNeXt as torchvision defines it: a 4×4 patchify stem (`features.0`), four stages of
//! CNBlocks (`features.1, 3, 5, 7`) with LayerNorm2d + 2×2 convolutions between them
//! (`features.2, 4, 6`), then LayerNorm2d, flatten, Linear (`classifier.0`, `classifier.2`).
//! Every convolution and linear layer starts from trunc_normal(std 0.02) with zero biases, the
//! layer scales at 1e-6.
use tch::nn::{self, ModuleT};
use tch::Tensor;

use super::layers::{self, conv2d, conv_norm_act_init, conv_norm_renamed, linear, norm2d, stochastic_depth, ConvShape, NormKind, ZERO};
use super::LayerMap;

pub struct ConvNextSpec {
    pub depths: [usize; 4],
    pub dims: [i64; 4],
}

const LN: NormKind = NormKind::Layer2d { eps: 1e-6 };
const LAYER_SCALE: f64 = 1e-6;

fn init() -> nn::Init {
    layers::trunc_normal(0.02)
}

/// CNBlock: depthwise 7×7, LayerNorm (NHWC), Linear 4×, GELU, Linear, layer scale, stochastic
/// depth, residual. With `fused_norm`, where the kernels apply (model/fused.rs), the LayerNorm
/// runs as one kernel each way in the activations' dtype (the Linear after it is what lets it
/// skip autocast's fp32 output), and the layer scale, stochastic depth and residual add as
/// another.
fn block(p: nn::Path, dim: i64, drop: f64, fused_norm: bool) -> impl ModuleT {
    let b = &p / "block";
    let dw = conv2d(&b / 0, dim, dim, ConvShape::new(7, 1).groups(dim), init(), Some(ZERO));
    let ln = layers::layer_norm(&b / 2, dim, 1e-6);
    let fc1 = linear(&b / 3, dim, 4 * dim, init(), ZERO);
    let fc2 = linear(&b / 5, 4 * dim, dim, init(), ZERO);
    let scale = p.var("layer_scale", &[dim, 1, 1], nn::Init::Const(LAYER_SCALE));
    nn::func_t(move |x, train| {
        let y = x.apply(&dw).permute([0, 2, 3, 1]);
        let fused = match (fused_norm, &ln.ws, &ln.bs) {
            (true, Some(w), Some(b)) => super::fused::layer_norm(&y, w, b, 1e-6),
            _ => None,
        };
        let z = fused.unwrap_or_else(|| y.apply(&ln)).apply(&fc1).gelu("none").apply(&fc2);
        block_end(&z, x, &scale, drop, train, fused_norm)
    })
}

/// x + stochastic_depth(layer_scale · z): `z` the block's last Linear output (NHWC), `x` its
/// input. With `fused`, one kernel each way where they apply (model/fused.rs).
fn block_end(z: &Tensor, x: &Tensor, scale: &Tensor, drop: f64, train: bool, fused: bool) -> Tensor {
    if !fused {
        return stochastic_depth(&(scale * z.permute([0, 3, 1, 2])), drop, train) + x;
    }
    // The factors eager's stochastic depth draws (fp32: the layer scale promotes), drawn once, so
    // that a call the kernels refuse runs the unfused ops on the same draw.
    let n = z.size()[0];
    let dropping = train && drop > 0.0;
    let keep = match dropping {
        true => layers::keep_factors(&[n], drop, (tch::Kind::Float, z.device())),
        false => Tensor::ones([n], (tch::Kind::Float, z.device())),
    };
    if let Some(out) = super::fused::scale_add(z, x, scale, &keep) {
        return out;
    }
    let y = scale * z.permute([0, 3, 1, 2]);
    match dropping {
        true => y * keep.view([n, 1, 1, 1]) + x,
        false => y + x,
    }
}

/// `drop_path`: torchvision's `stochastic_depth_prob`, rising linearly from 0 at the first
/// block to this at the last. `fused_norm`: the blocks' LayerNorms and ends through the fused
/// kernels.
pub fn convnext(
    p: &nn::Path,
    spec: &ConvNextSpec,
    num_classes: i64,
    drop_path: f64,
    fused_norm: bool,
) -> (nn::FuncT<'static>, LayerMap) {
    let f = p / "features";
    let d = spec.dims;
    let stem = conv_norm_act_init(
        &f / 0,
        3,
        d[0],
        ConvShape::new(4, 4).padding(0),
        LN,
        None,
        init(),
        Some(ZERO),
    );
    let total: usize = spec.depths.iter().sum();
    let mut map = LayerMap::new(&["features.0"]);
    // Stages and the downsamplings between them, in torchvision's `features` order.
    let mut features = nn::seq_t();
    let mut block_id = 0;
    for (s, &n) in spec.depths.iter().enumerate() {
        let idx = 1 + 2 * s;
        for j in 0..n {
            let prob = drop_path * block_id as f64 / (total as f64 - 1.0);
            features = features.add(block(&f / idx / j, d[s], prob, fused_norm));
            // The downsampling before a stage learns at its first block's rate.
            let mut group = vec![format!("features.{idx}.{j}")];
            if s > 0 && j == 0 {
                group.push(format!("features.{}", idx - 1));
            }
            map.blocks.push(group);
            block_id += 1;
        }
        if s < 3 {
            let dp = &f / (idx + 1);
            let down = ConvShape::new(2, 2).padding(0);
            features =
                features
                    .add(norm2d(&dp / 0, d[s], LN))
                    .add(conv2d(&dp / 1, d[s], d[s + 1], down, init(), Some(ZERO)));
        }
    }
    let c = p / "classifier";
    let head_norm = norm2d(&c / 0, d[3], LN);
    let fc = linear(&c / 2, d[3], num_classes, init(), ZERO);
    let net = nn::func_t(move |x, train| {
        let y = x.apply_t(&stem, train).apply_t(&features, train);
        let y = y.adaptive_avg_pool2d([1, 1]).apply_t(&head_norm, train);
        y.flatten(1, -1).apply(&fc)
    });
    (net, map)
}

/// timm's name for the tensor ringtrain (torchvision) calls `name`; timm's layer scale
/// (`gamma`) is a vector where torchvision's is [C, 1, 1].
pub fn timm_name(name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("classifier.") {
        let (k, rest) = rest.split_once('.')?;
        return match k {
            "0" => Some(format!("head.norm.{rest}")),
            "2" => Some(format!("head.fc.{rest}")),
            _ => None,
        };
    }
    let rest = name.strip_prefix("features.")?;
    let (f, rest) = rest.split_once('.')?;
    let f: usize = f.parse().ok()?;
    if f == 0 {
        return conv_norm_renamed(rest, "stem.0", "stem.1");
    }
    if f % 2 == 0 {
        let stage = f / 2;
        return conv_norm_renamed(rest, "downsample.0", "downsample.1").map(|r| format!("stages.{stage}.{r}"));
    }
    let stage = (f - 1) / 2;
    let (j, part) = rest.split_once('.')?;
    let part = match part {
        "layer_scale" => "gamma".to_string(),
        p => {
            let p = p.strip_prefix("block.")?;
            let (k, r) = p.split_once('.')?;
            let layer = match k {
                "0" => "conv_dw",
                "2" => "norm",
                "3" => "mlp.fc1",
                "5" => "mlp.fc2",
                _ => return None,
            };
            format!("{layer}.{r}")
        }
    };
    Some(format!("stages.{stage}.blocks.{j}.{part}"))
}
