//! The building blocks torchvision's networks share, each written once under torchvision's names:
//! `Conv2dNormActivation` (`N.0` the convolution, `N.1` the norm), BatchNorm with the eps and
//! momentum a family uses, LayerNorm2d, squeeze-excitation (`fc1`, `fc2`), stochastic depth
//! ("row" mode) and the initialisations the families draw their weights from.
use tch::nn::{self, Module, ModuleT};
use tch::Tensor;

use super::batchnorm::{batch_norm2d_with, BatchNorm2d};

/// `kaiming_normal_(mode="fan_out", nonlinearity="relu")`: torchvision's convolutions in
/// ResNet, EfficientNet and MobileNetV3; RegNet's `normal_(0, √(2/fan_out))` is the same
/// distribution (fan_out = k·k·out_channels for grouped convolutions too, as PyTorch counts it).
pub const KAIMING_FAN_OUT: nn::Init = nn::Init::Kaiming {
    dist: nn::init::NormalOrUniform::Normal,
    fan: nn::init::FanInOut::FanOut,
    non_linearity: nn::init::NonLinearity::ReLU,
};

/// `nn.init.trunc_normal_(std=s)` with torchvision's absolute bounds ±2: at the standard
/// deviations used (0.02, 0.036) that is 55σ or more, so no draw is ever cut and the
/// distribution is the normal one.
pub fn trunc_normal(std: f64) -> nn::Init {
    nn::Init::Randn { mean: 0.0, stdev: std }
}

/// `xavier_uniform_` of a `[fan_out, fan_in]` weight.
pub fn xavier_uniform(fan_in: i64, fan_out: i64) -> nn::Init {
    let b = (6.0 / (fan_in + fan_out) as f64).sqrt();
    nn::Init::Uniform { lo: -b, up: b }
}

pub const ZERO: nn::Init = nn::Init::Const(0.0);

/// The activations of torchvision's networks.
#[derive(Debug, Clone, Copy)]
pub enum Act {
    Relu,
    Silu,
    Hardswish,
    Sigmoid,
    Hardsigmoid,
    /// Exact (erf) GELU, `nn.GELU()`.
    Gelu,
}

impl Act {
    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Act::Relu => x.relu(),
            Act::Silu => x.silu(),
            Act::Hardswish => x.hardswish(),
            Act::Sigmoid => x.sigmoid(),
            Act::Hardsigmoid => x.hardsigmoid(),
            Act::Gelu => x.gelu("none"),
        }
    }
}

/// A 2-d convolution's shape; padding is torchvision's `(k - 1) / 2` unless set, or
/// TensorFlow's "same" (`tf_same`: as much as the input size needs, the odd pixel after).
#[derive(Debug, Clone, Copy)]
pub struct ConvShape {
    pub k: i64,
    pub stride: i64,
    pub groups: i64,
    pub padding: Option<i64>,
    pub tf_same: bool,
}

impl ConvShape {
    pub fn new(k: i64, stride: i64) -> Self {
        ConvShape {
            k,
            stride,
            groups: 1,
            padding: None,
            tf_same: false,
        }
    }

    pub fn tf_same(self, tf_same: bool) -> Self {
        ConvShape { tf_same, ..self }
    }

    /// TensorFlow's "same" padding of `x` for this shape (timm's `pad_same`): the output has
    /// ceil(size / stride) pixels, the padding split with the odd one after.
    pub fn pad_same(&self, x: &Tensor) -> Tensor {
        let size = x.size();
        let pad = |i: i64| (((i + self.stride - 1) / self.stride - 1) * self.stride + self.k - i).max(0);
        let (ph, pw) = (pad(size[size.len() - 2]), pad(size[size.len() - 1]));
        if ph == 0 && pw == 0 {
            return x.shallow_clone();
        }
        x.constant_pad_nd([pw / 2, pw - pw / 2, ph / 2, ph - ph / 2])
    }

    pub fn groups(self, groups: i64) -> Self {
        ConvShape { groups, ..self }
    }

    pub fn padding(self, padding: i64) -> Self {
        ConvShape {
            padding: Some(padding),
            ..self
        }
    }
}

/// `nn.Conv2d` with the weight initialisation `ws` and a bias initialised by `bias` (None: no
/// bias).
pub fn conv2d(p: nn::Path, cin: i64, cout: i64, s: ConvShape, ws: nn::Init, bias: Option<nn::Init>) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride: s.stride,
        padding: if s.tf_same { 0 } else { s.padding.unwrap_or((s.k - 1) / 2) },
        groups: s.groups,
        bias: bias.is_some(),
        ws_init: ws,
        bs_init: bias.unwrap_or(ZERO),
        ..Default::default()
    };
    nn::conv2d(p, cin, cout, s.k, cfg)
}

/// `nn.Linear(cin, cout)` initialised from `ws` and `bs`.
pub fn linear(p: nn::Path, cin: i64, cout: i64, ws: nn::Init, bs: nn::Init) -> nn::Linear {
    nn::linear(
        p,
        cin,
        cout,
        nn::LinearConfig {
            ws_init: ws,
            bs_init: Some(bs),
            bias: true,
        },
    )
}

/// `nn.LayerNorm(dim, eps)` (weight 1, bias 0) over the last dimension.
pub fn layer_norm(p: nn::Path, dim: i64, eps: f64) -> nn::LayerNorm {
    nn::layer_norm(
        p,
        vec![dim],
        nn::LayerNormConfig {
            eps,
            ..Default::default()
        },
    )
}

/// The normalisation of a family's `Conv2dNormActivation`.
#[derive(Debug, Clone, Copy)]
pub enum NormKind {
    Batch {
        eps: f64,
        momentum: f64,
    },
    /// ConvNeXt's LayerNorm2d: LayerNorm over the channels of an NCHW map.
    Layer2d {
        eps: f64,
    },
}

impl NormKind {
    /// `nn.BatchNorm2d`'s defaults.
    pub const BATCH: NormKind = NormKind::Batch {
        eps: 1e-5,
        momentum: 0.1,
    };
}

#[derive(Debug)]
pub enum Norm2d {
    Batch(BatchNorm2d),
    Layer(nn::LayerNorm),
}

pub fn norm2d(p: nn::Path, c: i64, kind: NormKind) -> Norm2d {
    match kind {
        NormKind::Batch { eps, momentum } => Norm2d::Batch(batch_norm2d_with(p, c, eps, momentum)),
        NormKind::Layer2d { eps } => Norm2d::Layer(layer_norm(p, c, eps)),
    }
}

impl ModuleT for Norm2d {
    fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        match self {
            Norm2d::Batch(bn) => bn.forward_t(x, train),
            // torchvision's LayerNorm2d: to NHWC, normalise the last dimension, back.
            Norm2d::Layer(ln) => x.permute([0, 2, 3, 1]).apply(ln).permute([0, 3, 1, 2]),
        }
    }
}

/// torchvision's `Conv2dNormActivation`: convolution (`p.0`, biased only when asked), norm
/// (`p.1`), optional activation.
#[derive(Debug)]
pub struct ConvNormAct {
    conv: nn::Conv2D,
    /// The shape, for TensorFlow's "same" padding before the convolution.
    tf_same: Option<ConvShape>,
    norm: Norm2d,
    act: Option<Act>,
}

/// `Conv2dNormActivation` as ResNet-style families start it: a Kaiming-normal (fan-out)
/// convolution without bias.
pub fn conv_norm_act(p: nn::Path, cin: i64, cout: i64, s: ConvShape, norm: NormKind, act: Option<Act>) -> ConvNormAct {
    conv_norm_act_init(p, cin, cout, s, norm, act, KAIMING_FAN_OUT, None)
}

/// `conv_norm_act` with the weight initialisation `ws` and a bias (ConvNeXt's stem).
#[allow(clippy::too_many_arguments)]
pub fn conv_norm_act_init(
    p: nn::Path,
    cin: i64,
    cout: i64,
    s: ConvShape,
    norm: NormKind,
    act: Option<Act>,
    ws: nn::Init,
    bias: Option<nn::Init>,
) -> ConvNormAct {
    ConvNormAct {
        conv: conv2d(&p / "0", cin, cout, s, ws, bias),
        tf_same: s.tf_same.then_some(s),
        norm: norm2d(&p / "1", cout, norm),
        act,
    }
}

impl ModuleT for ConvNormAct {
    fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        let y = match &self.tf_same {
            Some(s) => s.pad_same(x).apply(&self.conv),
            None => x.apply(&self.conv),
        };
        let y = y.apply_t(&self.norm, train);
        match self.act {
            Some(a) => a.apply(&y),
            None => y,
        }
    }
}

/// timm's name for `K.rest` of a `ConvNormAct` (convolution `0`, norm `1`): under `conv` or
/// `norm` (each family's `timm_name`).
pub fn conv_norm_renamed(rest: &str, conv: &str, norm: &str) -> Option<String> {
    let (k, rest) = rest.split_once('.')?;
    let layer = match k {
        "0" => conv,
        "1" => norm,
        _ => return None,
    };
    Some(format!("{layer}.{rest}"))
}

/// timm's name for `rest` of a squeeze-excitation in EfficientNet's and MobileNetV3's blocks
/// (`fc1`, `fc2` there `se.conv_reduce`, `se.conv_expand`).
pub fn se_renamed(rest: &str) -> String {
    format!("se.{}", rest.replace("fc1.", "conv_reduce.").replace("fc2.", "conv_expand."))
}

/// torchvision's `SqueezeExcitation`: `x · scale(fc2(act(fc1(avgpool(x)))))`, `fc1` and `fc2`
/// 1×1 convolutions with biases.
#[derive(Debug)]
pub struct SqueezeExcitation {
    fc1: nn::Conv2D,
    fc2: nn::Conv2D,
    act: Act,
    scale: Act,
}

/// `bias`: how the family initialises the two biases (zeros, or PyTorch's default uniform).
pub fn squeeze_excitation(
    p: nn::Path,
    channels: i64,
    squeeze: i64,
    act: Act,
    scale: Act,
    bias: impl Fn(i64) -> nn::Init,
) -> SqueezeExcitation {
    let one = ConvShape::new(1, 1);
    SqueezeExcitation {
        fc1: conv2d(
            &p / "fc1",
            channels,
            squeeze,
            one,
            KAIMING_FAN_OUT,
            Some(bias(channels)),
        ),
        fc2: conv2d(&p / "fc2", squeeze, channels, one, KAIMING_FAN_OUT, Some(bias(squeeze))),
        act,
        scale,
    }
}

impl Module for SqueezeExcitation {
    fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.adaptive_avg_pool2d([1, 1]).apply(&self.fc1);
        let s = self.scale.apply(&self.act.apply(&s).apply(&self.fc2));
        s * x
    }
}

/// torchvision's `stochastic_depth(x, p, "row", training)`: in training, each sample's branch is
/// dropped with probability `p` and the kept ones scaled by 1/(1 - p); in evaluation, the identity.
pub fn stochastic_depth(x: &Tensor, p: f64, train: bool) -> Tensor {
    if !train || p == 0.0 {
        return x.shallow_clone();
    }
    let mut shape = vec![1i64; x.dim()];
    shape[0] = x.size()[0];
    x * keep_factors(&shape, p, (x.kind(), x.device()))
}

/// Stochastic depth's factors of `shape` (one per sample): 0 with probability `p`, else
/// 1/(1 - p), drawn as torchvision draws them.
pub fn keep_factors(shape: &[i64], p: f64, options: (tch::Kind, tch::Device)) -> Tensor {
    let survival = 1.0 - p;
    let mut noise = Tensor::empty(shape, options);
    let _ = noise.bernoulli_float_(survival);
    if survival > 0.0 {
        let _ = noise.divide_scalar_(survival);
    }
    noise
}

/// A block's layers added back to its input when `add` (the shape is kept), through stochastic
/// depth `drop`, as torchvision's MBConv, FusedMBConv and InvertedResidual do.
pub fn residual(layers: nn::SequentialT, add: bool, drop: f64) -> nn::FuncT<'static> {
    nn::func_t(move |x, train| {
        let y = x.apply_t(&layers, train);
        match add {
            true => stochastic_depth(&y, drop, train) + x,
            false => y,
        }
    })
}

/// The squeeze-excitation of an inverted residual block: its width and activations (its biases
/// start at zero in both families that use it).
#[derive(Debug, Clone, Copy)]
pub struct SeSpec {
    pub squeeze: i64,
    pub act: Act,
    pub scale: Act,
}

/// An inverted residual block's shape: MobileNetV3's `InvertedResidual` and EfficientNet's
/// `MBConv`.
#[derive(Debug, Clone, Copy)]
pub struct InvertedResidual {
    pub cin: i64,
    pub expanded: i64,
    pub cout: i64,
    pub kernel: i64,
    pub stride: i64,
    pub act: Act,
    pub se: Option<SeSpec>,
    pub norm: NormKind,
    /// TensorFlow's "same" padding (timm's `tf_` ports).
    pub tf_same: bool,
}

/// `b` as torchvision builds it, under `p.block.N` numbered as its Sequential numbers them: 1×1
/// expansion (when it widens), depthwise k×k, squeeze-excitation, 1×1 projection; residual
/// (through stochastic depth `drop`) when the shape is kept.
pub fn inverted_residual(p: nn::Path, b: &InvertedResidual, drop: f64) -> nn::FuncT<'static> {
    let p = &p / "block";
    let mut index = 0..;
    let mut next = || &p / index.next().unwrap();
    let (act, one) = (Some(b.act), ConvShape::new(1, 1).tf_same(b.tf_same));
    let mut seq = nn::seq_t();
    if b.expanded != b.cin {
        seq = seq.add(conv_norm_act(next(), b.cin, b.expanded, one, b.norm, act));
    }
    let dw = ConvShape::new(b.kernel, b.stride).groups(b.expanded).tf_same(b.tf_same);
    seq = seq.add(conv_norm_act(next(), b.expanded, b.expanded, dw, b.norm, act));
    if let Some(se) = b.se {
        seq = seq.add(squeeze_excitation(
            next(),
            b.expanded,
            se.squeeze,
            se.act,
            se.scale,
            |_| ZERO,
        ));
    }
    seq = seq.add(conv_norm_act(next(), b.expanded, b.cout, one, b.norm, None));
    residual(seq, b.stride == 1 && b.cin == b.cout, drop)
}

/// torchvision's `_make_divisible`: `v` rounded to a multiple of `divisor`, never below it and
/// never more than 10 % down.
pub fn make_divisible(v: f64, divisor: i64) -> i64 {
    let mut new_v = divisor.max((v + divisor as f64 / 2.0) as i64 / divisor * divisor);
    if (new_v as f64) < 0.9 * v {
        new_v += divisor;
    }
    new_v
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// torchvision's row mode: per sample, all of it kept (×1/(1-p)) or all of it zero, about p
    /// of the samples dropped; evaluation and p = 0 are the identity.
    #[test]
    fn stochastic_depth_drops_whole_samples_and_rescales_the_rest() {
        tch::manual_seed(0);
        let (n, p) = (4000, 0.3);
        let x = Tensor::ones([n, 2, 3, 3], (Kind::Float, Device::Cpu));
        let y = stochastic_depth(&x, p, true);
        let per_sample = y.reshape([n, -1]);
        let (lo, hi) = (per_sample.min_dim(1, false).0, per_sample.max_dim(1, false).0);
        assert!(lo.equal(&hi), "a sample was partly dropped");
        let kept = hi.gt(0.0).sum(Kind::Float).double_value(&[]);
        let scale = 1.0 / (1.0 - p);
        assert!(
            hi.eq(0.0)
                .logical_or(&(hi - scale).abs().lt(1e-6))
                .all()
                .int64_value(&[])
                == 1
        );
        // Binomial(4000, 0.7): σ = 29; 5σ bound.
        let sigma = (n as f64 * p * (1.0 - p)).sqrt();
        assert!((kept - n as f64 * (1.0 - p)).abs() < 5.0 * sigma, "kept {kept} of {n}");
        assert!(stochastic_depth(&x, p, false).equal(&x));
        assert!(stochastic_depth(&x, 0.0, true).equal(&x));
    }

    #[test]
    fn make_divisible_is_torchvisions() {
        // torchvision: _make_divisible(v, 8) for these v.
        for (v, want) in [
            (32.0 * 1.1, 32),
            (16.0 * 1.2, 24),
            (240.0 / 4.0, 64),
            (88.0 / 4.0, 24),
            (1.0, 8),
            (36.0, 40),
        ] {
            assert_eq!(make_divisible(v, 8), want, "{v}");
        }
    }
}
