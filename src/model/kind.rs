//! The architectures by name, and what each is: its family and shape, its classifier head's
//! name, the input size its torchvision weights were made for, and the regularisation
//! torchvision builds it with (stochastic depth, dropout before the head).
use super::convnext::ConvNextSpec;
use super::efficientnet::{self, EfficientNetSpec};
use super::mobilenet::{self, MobileNetV3Spec};
use super::regnet::RegNetSpec;
use super::resnet::{Block, ResNetSpec};
use super::vit::{self, VitSpec};

crate::flag_enum! {
    /// The architectures `--model` names: torchvision's builder names, plus three small
    /// variants of ringtrain's own.
    pub enum ModelKind("unknown --model") {
        ResNet18 = "resnet18",
        ResNet34 = "resnet34",
        ResNet50 = "resnet50",
        ResNet101 = "resnet101",
        ResNeXt50 = "resnext50_32x4d",
        WideResNet50 = "wide_resnet50_2",
        ConvNextTiny = "convnext_tiny",
        ConvNextSmall = "convnext_small",
        EfficientNetB0 = "efficientnet_b0",
        EfficientNetB1 = "efficientnet_b1",
        EfficientNetB2 = "efficientnet_b2",
        EfficientNetB3 = "efficientnet_b3",
        EfficientNetV2S = "efficientnet_v2_s",
        MobileNetV3Small = "mobilenet_v3_small",
        MobileNetV3Large = "mobilenet_v3_large",
        VitB16 = "vit_b_16",
        RegNetY400mf = "regnet_y_400mf",
        RegNetY800mf = "regnet_y_800mf",
        RegNetY1_6gf = "regnet_y_1_6gf",
        RegNetY3_2gf = "regnet_y_3_2gf",
        AlexNet = "alexnet",
        /// ResNet-18 with the CIFAR stem (3x3 conv, no max-pool) for 32 px images.
        ResNet18Cifar = "resnet18-cifar",
        /// The demo's model: one basic block per stage, narrow, CIFAR stem; fast on a CPU.
        ResNet10Tiny = "resnet10-tiny",
        LeNet5 = "lenet5",
    }
}

/// An architecture's family and shape.
pub enum Arch {
    ResNet(ResNetSpec),
    ConvNext(ConvNextSpec),
    EfficientNet(EfficientNetSpec),
    MobileNetV3(&'static MobileNetV3Spec),
    Vit(&'static VitSpec),
    RegNet(RegNetSpec),
    AlexNet,
    LeNet5,
}

/// torchvision's ResNet of `block`s, `layers` deep per stage.
fn resnet(block: Block, layers: [usize; 4]) -> ResNetSpec {
    ResNetSpec {
        block,
        layers,
        widths: [64, 128, 256, 512],
        cifar_stem: false,
        groups: 1,
        width_per_group: 64,
    }
}

fn regnet(depths: [usize; 4], widths: [i64; 4], group_width: i64) -> Arch {
    Arch::RegNet(RegNetSpec {
        depths,
        widths,
        group_width,
    })
}

impl ModelKind {
    pub fn arch(self) -> Arch {
        use ModelKind::*;
        let convnext = |depths| {
            Arch::ConvNext(ConvNextSpec {
                depths,
                dims: [96, 192, 384, 768],
            })
        };
        match self {
            ResNet18 => Arch::ResNet(resnet(Block::Basic, [2, 2, 2, 2])),
            ResNet34 => Arch::ResNet(resnet(Block::Basic, [3, 4, 6, 3])),
            ResNet50 => Arch::ResNet(resnet(Block::Bottleneck, [3, 4, 6, 3])),
            ResNet101 => Arch::ResNet(resnet(Block::Bottleneck, [3, 4, 23, 3])),
            // resnext50_32x4d: 32 groups of 4 channels per 64; wide_resnet50_2: twice as wide.
            ResNeXt50 => Arch::ResNet(ResNetSpec {
                groups: 32,
                width_per_group: 4,
                ..resnet(Block::Bottleneck, [3, 4, 6, 3])
            }),
            WideResNet50 => Arch::ResNet(ResNetSpec {
                width_per_group: 128,
                ..resnet(Block::Bottleneck, [3, 4, 6, 3])
            }),
            ResNet18Cifar => Arch::ResNet(ResNetSpec {
                cifar_stem: true,
                ..resnet(Block::Basic, [2, 2, 2, 2])
            }),
            ResNet10Tiny => Arch::ResNet(ResNetSpec {
                widths: [16, 32, 64, 128],
                cifar_stem: true,
                ..resnet(Block::Basic, [1, 1, 1, 1])
            }),
            ConvNextTiny => convnext([3, 3, 9, 3]),
            ConvNextSmall => convnext([3, 3, 27, 3]),
            EfficientNetB0 => Arch::EfficientNet(efficientnet::b(1.0, 1.0)),
            EfficientNetB1 => Arch::EfficientNet(efficientnet::b(1.0, 1.1)),
            EfficientNetB2 => Arch::EfficientNet(efficientnet::b(1.1, 1.2)),
            EfficientNetB3 => Arch::EfficientNet(efficientnet::b(1.2, 1.4)),
            EfficientNetV2S => Arch::EfficientNet(efficientnet::v2_s()),
            MobileNetV3Small => Arch::MobileNetV3(&mobilenet::SMALL),
            MobileNetV3Large => Arch::MobileNetV3(&mobilenet::LARGE),
            VitB16 => Arch::Vit(&vit::B_16),
            // torchvision's BlockParams.from_init_params(depth, w_0, w_a, w_m, group_width).
            RegNetY400mf => regnet([1, 3, 6, 6], [48, 104, 208, 440], 8),
            RegNetY800mf => regnet([1, 3, 8, 2], [64, 144, 320, 784], 16),
            RegNetY1_6gf => regnet([2, 6, 17, 2], [48, 120, 336, 888], 24),
            RegNetY3_2gf => regnet([2, 5, 13, 1], [72, 216, 576, 1512], 24),
            AlexNet => Arch::AlexNet,
            LeNet5 => Arch::LeNet5,
        }
    }

    /// The classifier head's name prefix, as in torchvision: its tensors are re-initialised for
    /// another class count by `--pretrained` and get `--head-lr-mult`.
    pub fn head_prefix(self) -> &'static str {
        match self.arch() {
            Arch::ResNet(_) | Arch::RegNet(_) => "fc",
            Arch::ConvNext(_) => "classifier.2",
            Arch::EfficientNet(_) => "classifier.1",
            Arch::MobileNetV3(_) => "classifier.3",
            Arch::Vit(_) => "heads.head",
            Arch::AlexNet => "classifier.6",
            Arch::LeNet5 => "fc3",
        }
    }

    /// The input size its torchvision ImageNet weights were trained and evaluated at (their
    /// transforms' crop size); the CIFAR-stem variants and LeNet take 32 px.
    pub fn default_img_size(self) -> u32 {
        match self {
            ModelKind::EfficientNetB1 => 240,
            ModelKind::EfficientNetB2 => 288,
            ModelKind::EfficientNetB3 => 300,
            ModelKind::EfficientNetV2S => 384,
            ModelKind::ResNet18Cifar | ModelKind::ResNet10Tiny | ModelKind::LeNet5 => 32,
            _ => 224,
        }
    }

    /// The smallest input the architecture's pooling leaves a feature map for.
    pub fn min_img_size(self) -> u32 {
        match self.arch() {
            Arch::AlexNet => 63,
            // The 4× stem and three 2× downsamplings.
            Arch::ConvNext(_) => 32,
            Arch::Vit(s) => s.patch as u32,
            _ => 8,
        }
    }

    /// A Vision Transformer's patch: image sizes must be multiples of it.
    pub fn patch_size(self) -> Option<u32> {
        match self.arch() {
            Arch::Vit(s) => Some(s.patch as u32),
            _ => None,
        }
    }

    /// torchvision's `stochastic_depth_prob` (None: the architecture has no stochastic depth).
    /// ViT has none in torchvision; ringtrain adds timm's, off by default.
    pub fn default_drop_path(self) -> Option<f64> {
        match self {
            ModelKind::ConvNextTiny => Some(0.1),
            ModelKind::ConvNextSmall => Some(0.4),
            _ => match self.arch() {
                Arch::EfficientNet(_) => Some(0.2),
                Arch::Vit(_) => Some(0.0),
                _ => None,
            },
        }
    }

    /// torchvision's dropout before the classifier (ViT: inside the encoder); None: the
    /// architecture has no dropout.
    pub fn default_dropout(self) -> Option<f64> {
        match self {
            ModelKind::EfficientNetB2 | ModelKind::EfficientNetB3 => Some(0.3),
            ModelKind::AlexNet => Some(0.5),
            _ => match self.arch() {
                Arch::EfficientNet(_) | Arch::MobileNetV3(_) => Some(0.2),
                Arch::Vit(_) => Some(0.0),
                _ => None,
            },
        }
    }

    /// The BatchNorm that ends every residual block, which torchvision's `zero_init_residual`
    /// starts at 0: `bn2` of a basic block, `bn3` of a bottleneck (None: not a ResNet).
    pub fn residual_bn(self) -> Option<&'static str> {
        match self.arch() {
            Arch::ResNet(s) => Some(match s.block {
                Block::Basic => "bn2",
                Block::Bottleneck => "bn3",
            }),
            _ => None,
        }
    }
}
