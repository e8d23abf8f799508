//! EfficientNet B0–B3 and V2-S as torchvision defines them: a 3×3 stride-2 stem
//! (`features.0`), stages of MBConv (expand 1×1, depthwise, squeeze-excitation, project 1×1) or
//! FusedMBConv (one 3×3 expanding convolution, project 1×1) blocks (`features.1…`), a 1×1 head
//! convolution, then dropout and Linear (`classifier.1`). SiLU throughout; convolutions from
//! Kaiming normal (fan-out) with zero biases, the Linear from U(±1/√out) with a zero bias.
use tch::nn;

use super::layers::{conv_norm_act, inverted_residual, linear, make_divisible, residual, Act, ConvShape};
use super::layers::{conv_norm_renamed, se_renamed, InvertedResidual, NormKind, SeSpec, ZERO};
use super::LayerMap;

#[derive(Debug, Clone, Copy)]
pub enum BlockKind {
    MbConv,
    Fused,
}

/// One stage of torchvision's `inverted_residual_setting`, before width and depth scaling.
#[derive(Debug, Clone, Copy)]
pub struct Stage {
    pub block: BlockKind,
    pub expand: f64,
    pub kernel: i64,
    pub stride: i64,
    pub cin: i64,
    pub cout: i64,
    pub layers: usize,
}

pub struct EfficientNetSpec {
    pub stages: Vec<Stage>,
    pub width_mult: f64,
    pub depth_mult: f64,
    /// The head convolution's channels (None: 4× the last stage's).
    pub last_channel: Option<i64>,
    pub bn_eps: f64,
    /// TensorFlow's "same" padding (timm's `tf_efficientnet_*`).
    pub tf_same: bool,
}

const fn mb(expand: f64, kernel: i64, stride: i64, cin: i64, cout: i64, layers: usize) -> Stage {
    Stage {
        block: BlockKind::MbConv,
        expand,
        kernel,
        stride,
        cin,
        cout,
        layers,
    }
}

const fn fused(expand: f64, kernel: i64, stride: i64, cin: i64, cout: i64, layers: usize) -> Stage {
    Stage {
        block: BlockKind::Fused,
        ..mb(expand, kernel, stride, cin, cout, layers)
    }
}

/// EfficientNet-B*: B0's stages scaled by `width_mult` (channels) and `depth_mult` (blocks).
pub fn b(width_mult: f64, depth_mult: f64) -> EfficientNetSpec {
    EfficientNetSpec {
        stages: vec![
            mb(1.0, 3, 1, 32, 16, 1),
            mb(6.0, 3, 2, 16, 24, 2),
            mb(6.0, 5, 2, 24, 40, 2),
            mb(6.0, 3, 2, 40, 80, 3),
            mb(6.0, 5, 1, 80, 112, 3),
            mb(6.0, 5, 2, 112, 192, 4),
            mb(6.0, 3, 1, 192, 320, 1),
        ],
        width_mult,
        depth_mult,
        last_channel: None,
        bn_eps: 1e-5,
        tf_same: false,
    }
}

/// timm's port of TensorFlow's network: "same" padding, BatchNorm eps 1e-3.
pub fn tf(spec: EfficientNetSpec) -> EfficientNetSpec {
    EfficientNetSpec {
        bn_eps: 1e-3,
        tf_same: true,
        ..spec
    }
}

pub fn v2_s() -> EfficientNetSpec {
    EfficientNetSpec {
        stages: vec![
            fused(1.0, 3, 1, 24, 24, 2),
            fused(4.0, 3, 2, 24, 48, 4),
            fused(4.0, 3, 2, 48, 64, 4),
            mb(4.0, 3, 2, 64, 128, 6),
            mb(6.0, 3, 1, 128, 160, 9),
            mb(6.0, 3, 2, 160, 256, 15),
        ],
        width_mult: 1.0,
        depth_mult: 1.0,
        last_channel: Some(1280),
        bn_eps: 1e-3,
        tf_same: false,
    }
}

/// MBConv (an inverted residual block with SiLU and squeeze-excitation) or FusedMBConv (one
/// k×k expanding convolution, then the 1×1 projection), with stochastic depth on the residual.
fn block(p: nn::Path, s: &Stage, cin: i64, stride: i64, drop: f64, norm: NormKind, tf_same: bool) -> nn::FuncT<'static> {
    let expanded = make_divisible(cin as f64 * s.expand, 8);
    let silu = Some(Act::Silu);
    let widen = ConvShape::new(s.kernel, stride);
    let layers = match s.block {
        BlockKind::MbConv => {
            let se = SeSpec {
                squeeze: (cin / 4).max(1),
                act: Act::Silu,
                scale: Act::Sigmoid,
            };
            let b = InvertedResidual {
                cin,
                expanded,
                cout: s.cout,
                kernel: s.kernel,
                stride,
                act: Act::Silu,
                se: Some(se),
                norm,
                tf_same,
            };
            return inverted_residual(p, &b, drop);
        }
        BlockKind::Fused if expanded != cin => nn::seq_t()
            .add(conv_norm_act(&p / "block" / 0, cin, expanded, widen, norm, silu))
            .add(conv_norm_act(
                &p / "block" / 1,
                expanded,
                s.cout,
                ConvShape::new(1, 1),
                norm,
                None,
            )),
        BlockKind::Fused => nn::seq_t().add(conv_norm_act(&p / "block" / 0, cin, s.cout, widen, norm, silu)),
    };
    residual(layers, stride == 1 && cin == s.cout, drop)
}

/// `drop_path`: torchvision's `stochastic_depth_prob` (rising linearly over the blocks);
/// `dropout`: before the classifier.
pub fn efficientnet(
    p: &nn::Path,
    spec: &EfficientNetSpec,
    num_classes: i64,
    drop_path: f64,
    dropout: f64,
) -> (nn::FuncT<'static>, LayerMap) {
    let f = p / "features";
    let norm = NormKind::Batch {
        eps: spec.bn_eps,
        momentum: 0.1,
    };
    let width = |c: i64| make_divisible(c as f64 * spec.width_mult, 8);
    let depth = |n: usize| (n as f64 * spec.depth_mult).ceil() as usize;
    let first = width(spec.stages[0].cin);
    let silu = Some(Act::Silu);
    let stem = conv_norm_act(&f / 0, 3, first, ConvShape::new(3, 2).tf_same(spec.tf_same), norm, silu);
    let total: usize = spec.stages.iter().map(|s| depth(s.layers)).sum();
    let mut map = LayerMap::new(&["features.0"]);
    let mut blocks = nn::seq_t();
    let mut block_id = 0;
    let mut cin = first;
    for (i, s) in spec.stages.iter().enumerate() {
        let s = Stage {
            cout: width(s.cout),
            ..*s
        };
        for j in 0..depth(s.layers) {
            let prob = drop_path * block_id as f64 / total as f64;
            let stride = if j == 0 { s.stride } else { 1 };
            blocks = blocks.add(block(&f / (i + 1) / j, &s, cin, stride, prob, norm, spec.tf_same));
            map.blocks.push(vec![format!("features.{}.{j}", i + 1)]);
            cin = s.cout;
            block_id += 1;
        }
    }
    let last = spec.last_channel.unwrap_or(4 * cin);
    let last_idx = spec.stages.len() + 1;
    let head_conv = conv_norm_act(&f / last_idx, cin, last, ConvShape::new(1, 1).tf_same(spec.tf_same), norm, silu);
    let r = 1.0 / (num_classes as f64).sqrt();
    let fc = linear(
        p / "classifier" / 1,
        last,
        num_classes,
        nn::Init::Uniform { lo: -r, up: r },
        ZERO,
    );
    let net = nn::func_t(move |x, train| {
        x.apply_t(&stem, train)
            .apply_t(&blocks, train)
            .apply_t(&head_conv, train)
            .adaptive_avg_pool2d([1, 1])
            .flatten(1, -1)
            .dropout(dropout, train)
            .apply(&fc)
    });
    (net, map)
}

/// timm's name for the tensor ringtrain (torchvision) calls `name` (EfficientNet B0–B3; timm's
/// V2 is another network). A block that widens is timm's inverted residual (`conv_pw`, `bn1`,
/// `conv_dw`, `bn2`, `se`, `conv_pwl`, `bn3`), one that does not its depthwise-separable block
/// (`conv_dw`, `bn1`, `se`, `conv_pw`, `bn2`).
pub fn timm_name(spec: &EfficientNetSpec, name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("classifier.1.") {
        return Some(format!("classifier.{rest}"));
    }
    let rest = name.strip_prefix("features.")?;
    let (f, rest) = rest.split_once('.')?;
    let f: usize = f.parse().ok()?;
    if f == 0 {
        return conv_norm_renamed(rest, "conv_stem", "bn1");
    }
    if f == spec.stages.len() + 1 {
        return conv_norm_renamed(rest, "conv_head", "bn2");
    }
    let stage = spec.stages.get(f - 1).filter(|s| matches!(s.block, BlockKind::MbConv))?;
    let (j, rest) = rest.split_once('.')?;
    let (k, r) = rest.strip_prefix("block.")?.split_once('.')?;
    let widens = stage.expand != 1.0;
    let part = match (k, widens) {
        ("0", false) => conv_norm_renamed(r, "conv_dw", "bn1")?,
        ("1", false) | ("2", true) => se_renamed(r),
        ("2", false) => conv_norm_renamed(r, "conv_pw", "bn2")?,
        ("0", true) => conv_norm_renamed(r, "conv_pw", "bn1")?,
        ("1", true) => conv_norm_renamed(r, "conv_dw", "bn2")?,
        ("3", true) => conv_norm_renamed(r, "conv_pwl", "bn3")?,
        _ => return None,
    };
    Some(format!("blocks.{}.{j}.{part}", f - 1))
}
