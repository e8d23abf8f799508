//! torchvision's ImageNet weights for every architecture ringtrain builds, as torchvision 0.26
//! publishes them: the file (its name ends in the first hex digits of its SHA-256, which
//! torchvision checks and so do we), the evaluation transform they were measured with, and
//! their top-1. `DEFAULT` is torchvision's `Weights.DEFAULT`, the best of each architecture
//! (`pretrained=True` of old scripts meant `IMAGENET1K_V1`). A test compares this table with
//! torchvision's own.
use crate::model::ModelKind;
use ModelKind::*;
use Interpolation::*;

/// How the evaluation transform resized: torchvision's `interpolation` of the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    Bilinear,
    Bicubic,
}

/// One of torchvision's published weights.
#[derive(Debug, PartialEq)]
pub struct Weights {
    pub model: ModelKind,
    /// torchvision's enum member: `IMAGENET1K_V1`, `IMAGENET1K_SWAG_E2E_V1` ...
    pub variant: &'static str,
    /// torchvision's `DEFAULT` for this architecture.
    pub default: bool,
    /// The file name under the download URL and in the torch hub cache.
    pub file: &'static str,
    /// `CenterCrop` size: the input size.
    pub crop: u32,
    /// `Resize` of the shorter side before the crop.
    pub resize: u32,
    pub interpolation: Interpolation,
    /// ImageNet-1K top-1 (%) torchvision reports.
    pub top1: f64,
}

const fn w(
    model: ModelKind,
    variant: &'static str,
    default: bool,
    file: &'static str,
    crop: u32,
    resize: u32,
    interpolation: Interpolation,
    top1: f64,
) -> Weights {
    Weights { model, variant, default, file, crop, resize, interpolation, top1 }
}

/// Every weight of every architecture, in `ringtrain models` order.
#[rustfmt::skip]
pub const WEIGHTS: &[Weights] = &[
    w(ResNet18, "IMAGENET1K_V1", true, "resnet18-f37072fd.pth", 224, 256, Bilinear, 69.758),
    w(ResNet34, "IMAGENET1K_V1", true, "resnet34-b627a593.pth", 224, 256, Bilinear, 73.314),
    w(ResNet50, "IMAGENET1K_V1", false, "resnet50-0676ba61.pth", 224, 256, Bilinear, 76.13),
    w(ResNet50, "IMAGENET1K_V2", true, "resnet50-11ad3fa6.pth", 224, 232, Bilinear, 80.858),
    w(ResNet101, "IMAGENET1K_V1", false, "resnet101-63fe2227.pth", 224, 256, Bilinear, 77.374),
    w(ResNet101, "IMAGENET1K_V2", true, "resnet101-cd907fc2.pth", 224, 232, Bilinear, 81.886),
    w(ResNeXt50, "IMAGENET1K_V1", false, "resnext50_32x4d-7cdf4587.pth", 224, 256, Bilinear, 77.618),
    w(ResNeXt50, "IMAGENET1K_V2", true, "resnext50_32x4d-1a0047aa.pth", 224, 232, Bilinear, 81.198),
    w(WideResNet50, "IMAGENET1K_V1", false, "wide_resnet50_2-95faca4d.pth", 224, 256, Bilinear, 78.468),
    w(WideResNet50, "IMAGENET1K_V2", true, "wide_resnet50_2-9ba9bcbe.pth", 224, 232, Bilinear, 81.602),
    w(ConvNextTiny, "IMAGENET1K_V1", true, "convnext_tiny-983f1562.pth", 224, 236, Bilinear, 82.52),
    w(ConvNextSmall, "IMAGENET1K_V1", true, "convnext_small-0c510722.pth", 224, 230, Bilinear, 83.616),
    w(ConvNextBase, "IMAGENET1K_V1", true, "convnext_base-6075fbad.pth", 224, 232, Bilinear, 84.062),
    w(ConvNextLarge, "IMAGENET1K_V1", true, "convnext_large-ea097f82.pth", 224, 232, Bilinear, 84.414),
    w(EfficientNetB0, "IMAGENET1K_V1", true, "efficientnet_b0_rwightman-7f5810bc.pth", 224, 256, Bicubic, 77.692),
    w(EfficientNetB1, "IMAGENET1K_V1", false, "efficientnet_b1_rwightman-bac287d4.pth", 240, 256, Bicubic, 78.642),
    w(EfficientNetB1, "IMAGENET1K_V2", true, "efficientnet_b1-c27df63c.pth", 240, 255, Bilinear, 79.838),
    w(EfficientNetB2, "IMAGENET1K_V1", true, "efficientnet_b2_rwightman-c35c1473.pth", 288, 288, Bicubic, 80.608),
    w(EfficientNetB3, "IMAGENET1K_V1", true, "efficientnet_b3_rwightman-b3899882.pth", 300, 320, Bicubic, 82.008),
    w(EfficientNetV2S, "IMAGENET1K_V1", true, "efficientnet_v2_s-dd5fe13b.pth", 384, 384, Bilinear, 84.228),
    w(MobileNetV3Small, "IMAGENET1K_V1", true, "mobilenet_v3_small-047dcff4.pth", 224, 256, Bilinear, 67.668),
    w(MobileNetV3Large, "IMAGENET1K_V1", false, "mobilenet_v3_large-8738ca79.pth", 224, 256, Bilinear, 74.042),
    w(MobileNetV3Large, "IMAGENET1K_V2", true, "mobilenet_v3_large-5c1a4163.pth", 224, 232, Bilinear, 75.274),
    w(VitB16, "IMAGENET1K_V1", true, "vit_b_16-c867db91.pth", 224, 256, Bilinear, 81.072),
    w(VitB16, "IMAGENET1K_SWAG_E2E_V1", false, "vit_b_16_swag-9ac1b537.pth", 384, 384, Bicubic, 85.304),
    w(VitB16, "IMAGENET1K_SWAG_LINEAR_V1", false, "vit_b_16_lc_swag-4e70ced5.pth", 224, 224, Bicubic, 81.886),
    w(RegNetY400mf, "IMAGENET1K_V1", false, "regnet_y_400mf-c65dace8.pth", 224, 256, Bilinear, 74.046),
    w(RegNetY400mf, "IMAGENET1K_V2", true, "regnet_y_400mf-e6988f5f.pth", 224, 232, Bilinear, 75.804),
    w(RegNetY800mf, "IMAGENET1K_V1", false, "regnet_y_800mf-1b27b58c.pth", 224, 256, Bilinear, 76.42),
    w(RegNetY800mf, "IMAGENET1K_V2", true, "regnet_y_800mf-58fc7688.pth", 224, 232, Bilinear, 78.828),
    w(RegNetY1_6gf, "IMAGENET1K_V1", false, "regnet_y_1_6gf-b11a554e.pth", 224, 256, Bilinear, 77.95),
    w(RegNetY1_6gf, "IMAGENET1K_V2", true, "regnet_y_1_6gf-0d7bc02a.pth", 224, 232, Bilinear, 80.876),
    w(RegNetY3_2gf, "IMAGENET1K_V1", false, "regnet_y_3_2gf-b5a9779c.pth", 224, 256, Bilinear, 78.948),
    w(RegNetY3_2gf, "IMAGENET1K_V2", true, "regnet_y_3_2gf-9180c971.pth", 224, 232, Bilinear, 81.982),
    w(AlexNet, "IMAGENET1K_V1", true, "alexnet-owt-7be5be79.pth", 224, 256, Bilinear, 56.522),
];

/// Where torchvision's files are downloaded from; `RINGTRAIN_TORCHVISION_URL` replaces it (a
/// mirror, an offline copy served on the local network, a test's server).
pub const BASE_URL: &str = "https://download.pytorch.org/models/";

impl Weights {
    /// `torchvision:resnet50.IMAGENET1K_V2`: how `--pretrained` names these weights.
    pub fn spec(&self) -> String {
        format!("torchvision:{}.{}", self.model, self.variant)
    }

    pub fn url(&self) -> String {
        let base = std::env::var("RINGTRAIN_TORCHVISION_URL").unwrap_or_else(|_| BASE_URL.to_string());
        format!("{}/{}", base.trim_end_matches('/'), self.file)
    }

    /// The first hex digits of the file's SHA-256, as torch.hub reads them from the file name
    /// (its `-([a-f0-9]*)\.`: the first `-` followed by hex digits and a dot).
    pub fn hash_prefix(&self) -> &'static str {
        hash_prefix(self.file).expect("every torchvision weight file name carries its hash")
    }
}

pub(crate) fn hash_prefix(file: &str) -> Option<&str> {
    file.match_indices('-').find_map(|(i, _)| {
        let rest = &file[i + 1..];
        let hex = rest.find(|c: char| !matches!(c, '0'..='9' | 'a'..='f')).unwrap_or(rest.len());
        (rest[hex..].starts_with('.')).then(|| &rest[..hex])
    })
}

/// `NAME` or `NAME.VARIANT` (`resnet50`, `resnet50.IMAGENET1K_V2`, `resnet50.DEFAULT`; also
/// torchvision's own spelling `ResNet50_Weights.IMAGENET1K_V2`). An unknown name gets the
/// closest known ones.
pub fn lookup(name: &str) -> Result<&'static Weights, String> {
    let (arch, variant) = match name.split_once('.') {
        Some((a, v)) => (a, v),
        None => (name, "DEFAULT"),
    };
    let arch_lower = arch.to_ascii_lowercase();
    let found = WEIGHTS.iter().find(|w| {
        let arch_ok = w.model.name() == arch || enum_name(w.model).eq_ignore_ascii_case(&arch_lower);
        let variant_ok = if variant.eq_ignore_ascii_case("DEFAULT") {
            w.default
        } else {
            w.variant.eq_ignore_ascii_case(variant)
        };
        arch_ok && variant_ok
    });
    found.ok_or_else(|| {
        let known: Vec<String> = WEIGHTS
            .iter()
            .flat_map(|w| [w.model.name().to_string(), format!("{}.{}", w.model, w.variant)])
            .collect();
        let mut near: Vec<(usize, &String)> = known.iter().map(|k| (edit_distance(&name.to_ascii_lowercase(), &k.to_ascii_lowercase()), k)).collect();
        near.sort();
        near.dedup_by(|a, b| a.1 == b.1);
        let closest: Vec<&str> = near.iter().take(3).map(|(_, k)| k.as_str()).collect();
        format!(
            "torchvision has no weights '{name}' for the architectures ringtrain builds; closest: {} (ringtrain models lists them all)",
            closest.join(", ")
        )
    })
}

/// torchvision's enum for an architecture, lower-cased: `resnet50_weights`.
fn enum_name(m: ModelKind) -> String {
    format!("{}_weights", m.name().replace('_', ""))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_as_torchvision_spells_them() {
        assert_eq!(lookup("resnet50").unwrap().variant, "IMAGENET1K_V2");
        assert_eq!(lookup("resnet50.IMAGENET1K_V1").unwrap().file, "resnet50-0676ba61.pth");
        assert_eq!(lookup("ResNet50_Weights.IMAGENET1K_V1").unwrap().file, "resnet50-0676ba61.pth");
        assert_eq!(lookup("vit_b_16.imagenet1k_swag_e2e_v1").unwrap().crop, 384);
        let e = lookup("resnet51").unwrap_err();
        assert!(e.contains("closest: resnet50") || e.contains("closest: resnet18"), "{e}");
        assert!(lookup("resnet18-cifar").is_err());
    }

    #[test]
    fn hash_prefixes_are_read_as_torch_hub_reads_them() {
        assert_eq!(hash_prefix("alexnet-owt-7be5be79.pth"), Some("7be5be79"));
        assert_eq!(hash_prefix("efficientnet_b0_rwightman-7f5810bc.pth"), Some("7f5810bc"));
        assert_eq!(hash_prefix("model.pth"), None);
        for w in WEIGHTS {
            assert!(w.hash_prefix().len() >= 8, "{}", w.file);
        }
    }
}
