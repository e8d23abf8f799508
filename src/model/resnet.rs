//! ResNet as torchvision defines it (v1.5: stride on the 3×3 conv of a bottleneck), with the same
//! parameter names (`conv1.weight`, `layer1.0.bn1.running_mean`, `fc.bias`, ...) and the same
//! initialisation (Kaiming normal, fan-out, for convs; BN weight 1, bias 0). ResNeXt and Wide
//! ResNet are the same network with grouped or wider 3×3 convolutions in the bottleneck.
//! ResNet-D (timm's `resnet50d`, under timm's names, which extend torchvision's) has a deep stem
//! (three 3×3 convolutions, `conv1.0`, `conv1.3`, `conv1.6`, with BatchNorm and ReLU between)
//! and downsamples its shortcuts by average pooling before the 1×1 convolution
//! (`downsample.1`, `downsample.2`).
use tch::nn::{self, ModuleT};
use tch::Tensor;

use super::batchnorm::{batch_norm2d, BatchNorm2d};
use super::LayerMap;

#[derive(Debug, Clone, Copy)]
pub enum Block {
    Basic,
    Bottleneck,
}

#[derive(Debug, Clone)]
pub struct ResNetSpec {
    pub block: Block,
    pub layers: [usize; 4],
    pub widths: [i64; 4],
    /// 3×3 stride-1 stem without max-pool (for 32×32 inputs) instead of 7×7 stride 2 + max-pool.
    pub cifar_stem: bool,
    /// torchvision's `groups` and `width_per_group`: a bottleneck's 3×3 convolution has
    /// `planes · width_per_group / 64 · groups` channels in `groups` groups (1 and 64: ResNet;
    /// 32 and 4: ResNeXt-50 32×4d; 1 and 128: Wide ResNet-50-2).
    pub groups: i64,
    pub width_per_group: i64,
    /// ResNet-D: deep stem, average-pool downsampling.
    pub resnet_d: bool,
}

/// How a block ends its branches: BatchNorm then ReLU (or add then ReLU), fused with
/// `--fused-norm` (model/fused.rs).
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockOptions {
    pub fused_norm: bool,
}

impl Block {
    fn expansion(self) -> i64 {
        match self {
            Block::Basic => 1,
            Block::Bottleneck => 4,
        }
    }
}

fn conv(p: nn::Path, cin: i64, cout: i64, k: i64, stride: i64, padding: i64) -> nn::Conv2D {
    grouped_conv(p, cin, cout, k, stride, padding, 1)
}

fn grouped_conv(p: nn::Path, cin: i64, cout: i64, k: i64, stride: i64, padding: i64, groups: i64) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        groups,
        bias: false,
        ws_init: nn::Init::Kaiming {
            dist: nn::init::NormalOrUniform::Normal,
            fan: nn::init::FanInOut::FanOut,
            non_linearity: nn::init::NonLinearity::ReLU,
        },
        ..Default::default()
    };
    nn::conv2d(p, cin, cout, k, cfg)
}

fn bn(p: nn::Path, c: i64) -> BatchNorm2d {
    batch_norm2d(p, c)
}

fn downsample(p: nn::Path, cin: i64, cout: i64, stride: i64, avg: bool) -> Option<nn::SequentialT> {
    if stride == 1 && cin == cout {
        return None;
    }
    if !avg {
        return Some(nn::seq_t().add(conv(&p / "0", cin, cout, 1, stride, 0)).add(bn(&p / "1", cout)));
    }
    // timm's downsample_avg: AvgPool2d(2, stride, ceil_mode, count_include_pad=False) (nothing
    // at stride 1, its place `0` kept), then the 1×1 convolution and its norm.
    let pool = nn::func(move |x| match stride {
        1 => x.shallow_clone(),
        s => x.avg_pool2d([2, 2], [s, s], [0, 0], true, false, None),
    });
    Some(nn::seq_t().add(pool).add(conv(&p / "1", cin, cout, 1, 1, 0)).add(bn(&p / "2", cout)))
}

fn shortcut(ds: &Option<nn::SequentialT>, x: &Tensor, train: bool) -> Tensor {
    match ds {
        Some(ds) => x.apply_t(ds, train),
        None => x.shallow_clone(),
    }
}

fn basic_block(p: nn::Path, cin: i64, planes: i64, stride: i64, spec: &ResNetSpec, o: BlockOptions) -> impl ModuleT {
    let c1 = conv(&p / "conv1", cin, planes, 3, stride, 1);
    let b1 = bn(&p / "bn1", planes).fused(o.fused_norm);
    let c2 = conv(&p / "conv2", planes, planes, 3, 1, 1);
    let b2 = bn(&p / "bn2", planes).fused(o.fused_norm);
    let ds = downsample(&p / "downsample", cin, planes, stride, spec.resnet_d);
    nn::func_t(move |x, train| {
        let y = b1.forward_relu(&x.apply(&c1), None, train).apply(&c2);
        b2.forward_relu(&y, Some(&shortcut(&ds, x, train)), train)
    })
}

fn bottleneck(p: nn::Path, cin: i64, planes: i64, stride: i64, spec: &ResNetSpec, o: BlockOptions) -> impl ModuleT {
    let out = planes * 4;
    let width = planes * spec.width_per_group / 64 * spec.groups;
    let c1 = conv(&p / "conv1", cin, width, 1, 1, 0);
    let b1 = bn(&p / "bn1", width).fused(o.fused_norm);
    let c2 = grouped_conv(&p / "conv2", width, width, 3, stride, 1, spec.groups);
    let b2 = bn(&p / "bn2", width).fused(o.fused_norm);
    let c3 = conv(&p / "conv3", width, out, 1, 1, 0);
    let b3 = bn(&p / "bn3", out).fused(o.fused_norm);
    let ds = downsample(&p / "downsample", cin, out, stride, spec.resnet_d);
    nn::func_t(move |x, train| {
        let y = b1.forward_relu(&x.apply(&c1), None, train).apply(&c2);
        let y = b2.forward_relu(&y, None, train).apply(&c3);
        b3.forward_relu(&y, Some(&shortcut(&ds, x, train)), train)
    })
}

pub fn resnet(p: &nn::Path, spec: &ResNetSpec, num_classes: i64, o: BlockOptions) -> (nn::FuncT<'static>, LayerMap) {
    let w = spec.widths;
    let mut layers_seq = Vec::new();
    let c1: Box<dyn ModuleT> = if spec.cifar_stem {
        Box::new(conv(p / "conv1", 3, w[0], 3, 1, 1))
    } else if spec.resnet_d {
        // timm's deep stem: 3×3 convolutions to half, half, then all of the first width.
        let (s, half) = (p / "conv1", w[0] / 2);
        Box::new(
            nn::seq_t()
                .add(conv(&s / 0, 3, half, 3, 2, 1))
                .add(bn(&s / 1, half))
                .add_fn(|x| x.relu())
                .add(conv(&s / 3, half, half, 3, 1, 1))
                .add(bn(&s / 4, half))
                .add_fn(|x| x.relu())
                .add(conv(&s / 6, half, w[0], 3, 1, 1)),
        )
    } else {
        Box::new(conv(p / "conv1", 3, w[0], 7, 2, 3))
    };
    let b1 = bn(p / "bn1", w[0]).fused(o.fused_norm);
    let mut cin = w[0];
    let mut map = LayerMap::new(&["conv1", "bn1"]);
    for (li, (&n, &planes)) in spec.layers.iter().zip(w.iter()).enumerate() {
        let lp = p / format!("layer{}", li + 1);
        let mut seq = nn::seq_t();
        for bi in 0..n {
            let stride = if bi == 0 && li > 0 { 2 } else { 1 };
            let bp = &lp / bi;
            map.blocks.push(vec![format!("layer{}.{bi}", li + 1)]);
            seq = match spec.block {
                Block::Basic => seq.add(basic_block(bp, cin, planes, stride, spec, o)),
                Block::Bottleneck => seq.add(bottleneck(bp, cin, planes, stride, spec, o)),
            };
            cin = planes * spec.block.expansion();
        }
        layers_seq.push(seq);
    }
    let fc = super::torch_linear(p / "fc", cin, num_classes);
    let cifar = spec.cifar_stem;
    let net = nn::func_t(move |x, train| {
        let mut y = b1.forward_relu(&c1.forward_t(x, train), None, train);
        if !cifar {
            y = y.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        }
        for l in &layers_seq {
            y = y.apply_t(l, train);
        }
        y.adaptive_avg_pool2d([1, 1]).flatten(1, -1).apply(&fc)
    });
    (net, map)
}
