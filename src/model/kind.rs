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
    /// The architectures `--model` names: torchvision's builder names, timm's names for the
    /// networks timm has and torchvision has not (or builds otherwise), and three small
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
        ConvNextBase = "convnext_base",
        ConvNextLarge = "convnext_large",
        EfficientNetB0 = "efficientnet_b0",
        EfficientNetB1 = "efficientnet_b1",
        EfficientNetB2 = "efficientnet_b2",
        EfficientNetB3 = "efficientnet_b3",
        EfficientNetV2S = "efficientnet_v2_s",
        /// timm's ports of TensorFlow's EfficientNets: "same" padding, BatchNorm eps 1e-3.
        TfEfficientNetB0 = "tf_efficientnet_b0",
        TfEfficientNetB1 = "tf_efficientnet_b1",
        TfEfficientNetB2 = "tf_efficientnet_b2",
        TfEfficientNetB3 = "tf_efficientnet_b3",
        MobileNetV3Small = "mobilenet_v3_small",
        MobileNetV3Large = "mobilenet_v3_large",
        /// timm's MobileNetV3: torchvision's network with BatchNorm eps 1e-5.
        MobileNetV3Large100 = "mobilenetv3_large_100",
        MobileNetV3Small100 = "mobilenetv3_small_100",
        VitB16 = "vit_b_16",
        VitTiny16 = "vit_tiny_patch16_224",
        VitSmall16 = "vit_small_patch16_224",
        VitSmall32 = "vit_small_patch32_224",
        VitBase16 = "vit_base_patch16_224",
        VitBase32 = "vit_base_patch32_224",
        VitBase16At384 = "vit_base_patch16_384",
        VitLarge16 = "vit_large_patch16_224",
        /// No class token: tokens averaged, layer scale, no qkv bias.
        VitMedium16Gap = "vit_medium_patch16_gap_256",
        DeitTiny16 = "deit_tiny_patch16_224",
        DeitSmall16 = "deit_small_patch16_224",
        DeitBase16 = "deit_base_patch16_224",
        DeitBase16At384 = "deit_base_patch16_384",
        RegNetY400mf = "regnet_y_400mf",
        RegNetY800mf = "regnet_y_800mf",
        RegNetY1_6gf = "regnet_y_1_6gf",
        RegNetY3_2gf = "regnet_y_3_2gf",
        RegNetX002 = "regnetx_002",
        RegNetX004 = "regnetx_004",
        RegNetX006 = "regnetx_006",
        RegNetX008 = "regnetx_008",
        RegNetX016 = "regnetx_016",
        RegNetX032 = "regnetx_032",
        RegNetX040 = "regnetx_040",
        RegNetX064 = "regnetx_064",
        RegNetX080 = "regnetx_080",
        RegNetX120 = "regnetx_120",
        RegNetX160 = "regnetx_160",
        RegNetX320 = "regnetx_320",
        RegNetY002 = "regnety_002",
        RegNetY004 = "regnety_004",
        RegNetY006 = "regnety_006",
        RegNetY008 = "regnety_008",
        RegNetY016 = "regnety_016",
        RegNetY032 = "regnety_032",
        RegNetY040 = "regnety_040",
        RegNetY064 = "regnety_064",
        RegNetY080 = "regnety_080",
        RegNetY120 = "regnety_120",
        RegNetY160 = "regnety_160",
        RegNetY320 = "regnety_320",
        /// ResNet-D (timm): deep 3×3 stem, average-pool downsampling.
        ResNet50d = "resnet50d",
        ResNet101d = "resnet101d",
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
        resnet_d: false,
    }
}

/// torchvision's RegNetY: one group width throughout.
fn regnet(depths: [usize; 4], widths: [i64; 4], group_width: i64) -> Arch {
    Arch::RegNet(RegNetSpec {
        depths,
        widths,
        group_widths: [group_width; 4],
        se: true,
    })
}

/// timm's RegNets as timm's `generate_regnet` and `adjust_widths_groups_comp` make them
/// (stage depths, widths and group widths written out; `se`: RegNetY).
fn timm_regnet(se: bool, depths: [usize; 4], widths: [i64; 4], group_widths: [i64; 4]) -> Arch {
    Arch::RegNet(RegNetSpec {
        depths,
        widths,
        group_widths,
        se,
    })
}

impl ModelKind {
    pub fn arch(self) -> Arch {
        use ModelKind::*;
        let convnext = |depths, dims| Arch::ConvNext(ConvNextSpec { depths, dims });
        let resnet_d = |layers| {
            Arch::ResNet(ResNetSpec {
                resnet_d: true,
                ..resnet(Block::Bottleneck, layers)
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
            ConvNextTiny => convnext([3, 3, 9, 3], [96, 192, 384, 768]),
            ConvNextSmall => convnext([3, 3, 27, 3], [96, 192, 384, 768]),
            ConvNextBase => convnext([3, 3, 27, 3], [128, 256, 512, 1024]),
            ConvNextLarge => convnext([3, 3, 27, 3], [192, 384, 768, 1536]),
            EfficientNetB0 => Arch::EfficientNet(efficientnet::b(1.0, 1.0)),
            EfficientNetB1 => Arch::EfficientNet(efficientnet::b(1.0, 1.1)),
            EfficientNetB2 => Arch::EfficientNet(efficientnet::b(1.1, 1.2)),
            EfficientNetB3 => Arch::EfficientNet(efficientnet::b(1.2, 1.4)),
            EfficientNetV2S => Arch::EfficientNet(efficientnet::v2_s()),
            TfEfficientNetB0 => Arch::EfficientNet(efficientnet::tf(efficientnet::b(1.0, 1.0))),
            TfEfficientNetB1 => Arch::EfficientNet(efficientnet::tf(efficientnet::b(1.0, 1.1))),
            TfEfficientNetB2 => Arch::EfficientNet(efficientnet::tf(efficientnet::b(1.1, 1.2))),
            TfEfficientNetB3 => Arch::EfficientNet(efficientnet::tf(efficientnet::b(1.2, 1.4))),
            MobileNetV3Small => Arch::MobileNetV3(&mobilenet::SMALL),
            MobileNetV3Large => Arch::MobileNetV3(&mobilenet::LARGE),
            MobileNetV3Small100 => Arch::MobileNetV3(&mobilenet::SMALL_TIMM),
            MobileNetV3Large100 => Arch::MobileNetV3(&mobilenet::LARGE_TIMM),
            VitB16 | VitBase16 | DeitBase16 | VitBase16At384 | DeitBase16At384 => Arch::Vit(&vit::B_16),
            VitTiny16 | DeitTiny16 => Arch::Vit(&vit::TI_16),
            VitSmall16 | DeitSmall16 => Arch::Vit(&vit::S_16),
            VitSmall32 => Arch::Vit(&vit::S_32),
            VitBase32 => Arch::Vit(&vit::B_32),
            VitLarge16 => Arch::Vit(&vit::L_16),
            VitMedium16Gap => Arch::Vit(&vit::M_16_GAP),
            // torchvision's BlockParams.from_init_params(depth, w_0, w_a, w_m, group_width).
            RegNetY400mf => regnet([1, 3, 6, 6], [48, 104, 208, 440], 8),
            RegNetY800mf => regnet([1, 3, 8, 2], [64, 144, 320, 784], 16),
            RegNetY1_6gf => regnet([2, 6, 17, 2], [48, 120, 336, 888], 24),
            RegNetY3_2gf => regnet([2, 5, 13, 1], [72, 216, 576, 1512], 24),
            RegNetX002 => timm_regnet(false, [1, 1, 4, 7], [24, 56, 152, 368], [8; 4]),
            RegNetX004 => timm_regnet(false, [1, 2, 7, 12], [32, 64, 160, 384], [16; 4]),
            RegNetX006 => timm_regnet(false, [1, 3, 5, 7], [48, 96, 240, 528], [24; 4]),
            RegNetX008 => timm_regnet(false, [1, 3, 7, 5], [64, 128, 288, 672], [16; 4]),
            RegNetX016 => timm_regnet(false, [2, 4, 10, 2], [72, 168, 408, 912], [24; 4]),
            RegNetX032 => timm_regnet(false, [2, 6, 15, 2], [96, 192, 432, 1008], [48; 4]),
            RegNetX040 => timm_regnet(false, [2, 5, 14, 2], [80, 240, 560, 1360], [40; 4]),
            RegNetX064 => timm_regnet(false, [2, 4, 10, 1], [168, 392, 784, 1624], [56; 4]),
            RegNetX080 => timm_regnet(false, [2, 5, 15, 1], [80, 240, 720, 1920], [80, 120, 120, 120]),
            RegNetX120 => timm_regnet(false, [2, 5, 11, 1], [224, 448, 896, 2240], [112; 4]),
            RegNetX160 => timm_regnet(false, [2, 6, 13, 1], [256, 512, 896, 2048], [128; 4]),
            RegNetX320 => timm_regnet(false, [2, 7, 13, 1], [336, 672, 1344, 2520], [168; 4]),
            RegNetY002 => timm_regnet(true, [1, 1, 4, 7], [24, 56, 152, 368], [8; 4]),
            RegNetY004 => timm_regnet(true, [1, 3, 6, 6], [48, 104, 208, 440], [8; 4]),
            RegNetY006 => timm_regnet(true, [1, 3, 7, 4], [48, 112, 256, 608], [16; 4]),
            RegNetY008 => timm_regnet(true, [1, 3, 8, 2], [64, 128, 320, 768], [16; 4]),
            RegNetY016 => timm_regnet(true, [2, 6, 17, 2], [48, 120, 336, 888], [24; 4]),
            RegNetY032 => timm_regnet(true, [2, 5, 13, 1], [72, 216, 576, 1512], [24; 4]),
            RegNetY040 => timm_regnet(true, [2, 6, 12, 2], [128, 192, 512, 1088], [64; 4]),
            RegNetY064 => timm_regnet(true, [2, 7, 14, 2], [144, 288, 576, 1296], [72; 4]),
            RegNetY080 => timm_regnet(true, [2, 4, 10, 1], [168, 448, 896, 2016], [56; 4]),
            RegNetY120 => timm_regnet(true, [2, 5, 11, 1], [224, 448, 896, 2240], [112; 4]),
            RegNetY160 => timm_regnet(true, [2, 4, 11, 1], [224, 448, 1232, 3024], [112; 4]),
            RegNetY320 => timm_regnet(true, [2, 5, 12, 1], [232, 696, 1392, 3712], [232; 4]),
            ResNet50d => resnet_d([3, 4, 6, 3]),
            ResNet101d => resnet_d([3, 4, 23, 3]),
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
    /// transforms' crop size; timm's default weights' for the networks only timm has); the
    /// CIFAR-stem variants and LeNet take 32 px.
    pub fn default_img_size(self) -> u32 {
        match self {
            ModelKind::EfficientNetB1 => 240,
            ModelKind::EfficientNetB2 => 288,
            ModelKind::EfficientNetB3 => 300,
            ModelKind::EfficientNetV2S => 384,
            ModelKind::TfEfficientNetB1 => 240,
            ModelKind::TfEfficientNetB2 => 260,
            ModelKind::TfEfficientNetB3 => 300,
            ModelKind::VitBase16At384 | ModelKind::DeitBase16At384 => 384,
            ModelKind::VitMedium16Gap | ModelKind::ResNet101d => 256,
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
            ModelKind::ConvNextBase => Some(0.5),
            ModelKind::ConvNextLarge => Some(0.5),
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
            ModelKind::TfEfficientNetB2 | ModelKind::TfEfficientNetB3 => Some(0.3),
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

    /// A network under timm's name that torchvision does not build (or builds otherwise): its
    /// weights are written under timm's tensor names, always. The families both have
    /// (ResNet, ConvNeXt, EfficientNet B0–B3) write timm's names when the run started from
    /// timm's weights, torchvision's otherwise.
    pub fn is_timm(self) -> bool {
        use ModelKind::*;
        match self.arch() {
            Arch::Vit(_) => self != VitB16,
            Arch::RegNet(_) => !matches!(self, RegNetY400mf | RegNetY800mf | RegNetY1_6gf | RegNetY3_2gf),
            Arch::ResNet(s) => s.resnet_d,
            _ => matches!(
                self,
                TfEfficientNetB0 | TfEfficientNetB1 | TfEfficientNetB2 | TfEfficientNetB3 | MobileNetV3Large100 | MobileNetV3Small100
            ),
        }
    }
}
