//! MobileNetV3 small and large as torchvision defines them: a 3×3 stride-2 Hardswish stem
//! (`features.0`), inverted residual blocks (`features.1…`: expand 1×1, depthwise,
//! squeeze-excitation with a hard sigmoid, project 1×1), a 1×1 convolution to 6× channels, then
//! Linear, Hardswish, dropout, Linear (`classifier.0`, `classifier.3`). BatchNorm with eps 1e-3
//! and momentum 0.01; convolutions from Kaiming normal (fan-out), Linear layers from N(0, 0.01),
//! all biases zero.
use tch::nn;

use super::layers::{conv_norm_act, inverted_residual, linear, make_divisible, Act, ConvShape};
use super::layers::{InvertedResidual, NormKind, SeSpec, ZERO};
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
};

const NORM: NormKind = NormKind::Batch {
    eps: 1e-3,
    momentum: 0.01,
};

/// A row as the block torchvision builds from it.
fn block(r: &Row) -> InvertedResidual {
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
        norm: NORM,
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
    let stem = conv_norm_act(&f / 0, 3, first, ConvShape::new(3, 2), NORM, hs);
    let mut map = LayerMap::new(&["features.0"]);
    let mut blocks = nn::seq_t();
    for (i, r) in spec.rows.iter().enumerate() {
        blocks = blocks.add(inverted_residual(&f / (i + 1), &block(r), 0.0));
        map.blocks.push(vec![format!("features.{}", i + 1)]);
    }
    let cin = spec.rows[spec.rows.len() - 1].cout;
    let last = 6 * cin;
    let n = spec.rows.len() + 1;
    let head_conv = conv_norm_act(&f / n, cin, last, ConvShape::new(1, 1), NORM, hs);
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
