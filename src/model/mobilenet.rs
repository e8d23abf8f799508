//! MobileNetV3 small and large as torchvision defines them: a 3×3 stride-2 Hardswish stem
//! (`features.0`), inverted residual blocks (`features.1…`: expand 1×1, depthwise,
//! squeeze-excitation with a hard sigmoid, project 1×1), a 1×1 convolution to 6× channels, then
//! Linear, Hardswish, dropout, Linear (`classifier.0`, `classifier.3`). BatchNorm with eps 1e-3
//! and momentum 0.01; convolutions from Kaiming normal (fan-out), Linear layers from N(0, 0.01),
//! all biases zero.
use tch::nn;

use super::layers::{conv_norm_act, inverted_residual, linear, make_divisible, Act, ConvShape};
use super::layers::{conv_norm_renamed, se_renamed, InvertedResidual, NormKind, SeSpec, ZERO};
use super::LayerMap;

/// One row of torchvision's `inverted_residual_setting` (width multiplier 1).
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub cin: i64,
    pub kernel: i64,
    pub expanded: i64,
    pub cout: i64,
    pub se: bool,
    pub hardswish: bool,
    pub stride: i64,
}

/// torchvision's RE (ReLU) and HS (Hardswish) columns.
const RE: bool = false;
const HS: bool = true;

const fn row(cin: i64, kernel: i64, expanded: i64, cout: i64, se: bool, hardswish: bool, stride: i64) -> Row {
    Row {
        cin,
        kernel,
        expanded,
        cout,
        se,
        hardswish,
        stride,
    }
}

pub struct MobileNetV3Spec {
    pub rows: &'static [Row],
    /// The first Linear's width.
    pub last_channel: i64,
    /// torchvision's 1e-3; timm's 1e-5.
    pub bn_eps: f64,
    /// How many rows each of timm's stages (`blocks.S`) holds, the 1×1 convolution to 6×
    /// channels its last stage.
    pub timm_stages: &'static [usize],
}

pub const LARGE: MobileNetV3Spec = MobileNetV3Spec {
    rows: &[
        row(16, 3, 16, 16, false, RE, 1),
        row(16, 3, 64, 24, false, RE, 2),
        row(24, 3, 72, 24, false, RE, 1),
        row(24, 5, 72, 40, true, RE, 2),
        row(40, 5, 120, 40, true, RE, 1),
        row(40, 5, 120, 40, true, RE, 1),
        row(40, 3, 240, 80, false, HS, 2),
        row(80, 3, 200, 80, false, HS, 1),
        row(80, 3, 184, 80, false, HS, 1),
        row(80, 3, 184, 80, false, HS, 1),
        row(80, 3, 480, 112, true, HS, 1),
        row(112, 3, 672, 112, true, HS, 1),
        row(112, 5, 672, 160, true, HS, 2),
        row(160, 5, 960, 160, true, HS, 1),
        row(160, 5, 960, 160, true, HS, 1),
    ],
    last_channel: 1280,
    bn_eps: 1e-3,
    timm_stages: &[1, 2, 3, 4, 2, 3],
};

/// timm's `mobilenetv3_large_100`: torchvision's network with BatchNorm eps 1e-5 (timm's first
/// Linear is a 1×1 convolution on the pooled features, `conv_head`: the same product).
pub const LARGE_TIMM: MobileNetV3Spec = MobileNetV3Spec {
    bn_eps: 1e-5,
    ..LARGE
};

pub const SMALL: MobileNetV3Spec = MobileNetV3Spec {
    rows: &[
        row(16, 3, 16, 16, true, RE, 2),
        row(16, 3, 72, 24, false, RE, 2),
        row(24, 3, 88, 24, false, RE, 1),
        row(24, 5, 96, 40, true, HS, 2),
        row(40, 5, 240, 40, true, HS, 1),
        row(40, 5, 240, 40, true, HS, 1),
        row(40, 5, 120, 48, true, HS, 1),
        row(48, 5, 144, 48, true, HS, 1),
        row(48, 5, 288, 96, true, HS, 2),
        row(96, 5, 576, 96, true, HS, 1),
        row(96, 5, 576, 96, true, HS, 1),
    ],
    last_channel: 1024,
    bn_eps: 1e-3,
    timm_stages: &[1, 2, 3, 2, 3],
};

/// timm's `mobilenetv3_small_100`.
pub const SMALL_TIMM: MobileNetV3Spec = MobileNetV3Spec {
    bn_eps: 1e-5,
    ..SMALL
};

fn norm(spec: &MobileNetV3Spec) -> NormKind {
    NormKind::Batch {
        eps: spec.bn_eps,
        momentum: 0.01,
    }
}

/// A row as the block torchvision builds from it.
fn block(r: &Row, norm: NormKind) -> InvertedResidual {
    InvertedResidual {
        cin: r.cin,
        expanded: r.expanded,
        cout: r.cout,
        kernel: r.kernel,
        stride: r.stride,
        act: if r.hardswish { Act::Hardswish } else { Act::Relu },
        se: r.se.then(|| SeSpec {
            squeeze: make_divisible((r.expanded / 4) as f64, 8),
            act: Act::Relu,
            scale: Act::Hardsigmoid,
        }),
        norm,
        tf_same: false,
    }
}

/// `dropout`: between the two Linear layers of the classifier.
pub fn mobilenet_v3(
    p: &nn::Path,
    spec: &MobileNetV3Spec,
    num_classes: i64,
    dropout: f64,
) -> (nn::FuncT<'static>, LayerMap) {
    let f = p / "features";
    let hs = Some(Act::Hardswish);
    let first = spec.rows[0].cin;
    let stem = conv_norm_act(&f / 0, 3, first, ConvShape::new(3, 2), norm(spec), hs);
    let mut map = LayerMap::new(&["features.0"]);
    let mut blocks = nn::seq_t();
    for (i, r) in spec.rows.iter().enumerate() {
        blocks = blocks.add(inverted_residual(&f / (i + 1), &block(r, norm(spec)), 0.0));
        map.blocks.push(vec![format!("features.{}", i + 1)]);
    }
    let cin = spec.rows[spec.rows.len() - 1].cout;
    let last = 6 * cin;
    let n = spec.rows.len() + 1;
    let head_conv = conv_norm_act(&f / n, cin, last, ConvShape::new(1, 1), norm(spec), hs);
    let c = p / "classifier";
    let normal = nn::Init::Randn { mean: 0.0, stdev: 0.01 };
    let fc1 = linear(&c / 0, last, spec.last_channel, normal, ZERO);
    let fc2 = linear(&c / 3, spec.last_channel, num_classes, normal, ZERO);
    let net = nn::func_t(move |x, train| {
        x.apply_t(&stem, train)
            .apply_t(&blocks, train)
            .apply_t(&head_conv, train)
            .adaptive_avg_pool2d([1, 1])
            .flatten(1, -1)
            .apply(&fc1)
            .hardswish()
            .dropout(dropout, train)
            .apply(&fc2)
    });
    (net, map)
}

/// timm's name for the tensor ringtrain (torchvision) calls `name`. timm groups the rows into
/// stages (`blocks.S.J`); a row that does not widen is its depthwise-separable block (`conv_dw`,
/// `bn1`, `se`, `conv_pw`, `bn2`), one that does an inverted residual (`conv_pw`, `bn1`,
/// `conv_dw`, `bn2`, `se`, `conv_pwl`, `bn3`); the first Linear is `conv_head`, [O, I, 1, 1].
pub fn timm_name(spec: &MobileNetV3Spec, name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("classifier.") {
        let (k, rest) = rest.split_once('.')?;
        return match k {
            "0" => Some(format!("conv_head.{rest}")),
            "3" => Some(format!("classifier.{rest}")),
            _ => None,
        };
    }
    let rest = name.strip_prefix("features.")?;
    let (f, rest) = rest.split_once('.')?;
    let f: usize = f.parse().ok()?;
    if f == 0 {
        return conv_norm_renamed(rest, "conv_stem", "bn1");
    }
    let last_stage = spec.timm_stages.len();
    if f == spec.rows.len() + 1 {
        return conv_norm_renamed(rest, "conv", "bn1").map(|r| format!("blocks.{last_stage}.0.{r}"));
    }
    let row = spec.rows.get(f - 1)?;
    // The row's stage and place in it.
    let (mut stage, mut j) = (0, f - 1);
    while j >= *spec.timm_stages.get(stage)? {
        j -= spec.timm_stages[stage];
        stage += 1;
    }
    let rest = rest.strip_prefix("block.")?;
    let (k, r) = rest.split_once('.')?;
    let k: usize = k.parse().ok()?;
    let widens = row.expanded != row.cin;
    let layers: &[&str] = match (widens, row.se) {
        (false, true) => &["dw", "se", "pw"],
        (false, false) => &["dw", "pw"],
        (true, true) => &["pw", "dw", "se", "pwl"],
        (true, false) => &["pw", "dw", "pwl"],
    };
    let part = match (*layers.get(k)?, widens) {
        ("se", _) => se_renamed(r),
        ("dw", false) => conv_norm_renamed(r, "conv_dw", "bn1")?,
        ("pw", false) => conv_norm_renamed(r, "conv_pw", "bn2")?,
        ("pw", true) => conv_norm_renamed(r, "conv_pw", "bn1")?,
        ("dw", true) => conv_norm_renamed(r, "conv_dw", "bn2")?,
        (_, _) => conv_norm_renamed(r, "conv_pwl", "bn3")?,
    };
    Some(format!("blocks.{stage}.{j}.{part}"))
}
