//! RegNetY (and timm's RegNetX, the same without squeeze-excitation) as torchvision defines it: a 3×3 stride-2 stem (`stem.0`, `stem.1`), four stages
//! (`trunk_output.blockS`) of residual bottleneck blocks (`blockS-I`: `proj` when the shape
//! changes, `f.a` 1×1, `f.b` grouped 3×3, `f.se` squeeze-excitation, `f.c` 1×1), then `fc`.
//! Convolutions from N(0, √(2/fan_out)) (their biases, only in `f.se`, keep PyTorch's default),
//! Linear from N(0, 0.01) with a zero bias. The stage widths and depths are torchvision's
//! `BlockParams.from_init_params` results, written out (timm's: its `generate_regnet`'s).
//! `timm_name` says what timm calls each tensor.
use tch::nn::{self, ModuleT};

use super::layers::{conv_norm_act, conv_norm_renamed, linear, squeeze_excitation, Act, ConvShape, NormKind, ZERO};
use super::LayerMap;

pub struct RegNetSpec {
    pub depths: [usize; 4],
    pub widths: [i64; 4],
    /// Channels per group of each stage's 3×3 convolution.
    pub group_widths: [i64; 4],
    /// Squeeze-excitation in every block (RegNetY).
    pub se: bool,
}

const STEM: i64 = 32;
const SE_RATIO: f64 = 0.25;

fn block(p: nn::Path, cin: i64, cout: i64, stride: i64, group_width: i64, se: bool) -> impl ModuleT {
    let n = NormKind::BATCH;
    let relu = Some(Act::Relu);
    let proj =
        (cin != cout || stride != 1).then(|| conv_norm_act(&p / "proj", cin, cout, ConvShape::new(1, stride), n, None));
    let f = &p / "f";
    let a = conv_norm_act(&f / "a", cin, cout, ConvShape::new(1, 1), n, relu);
    let grouped = ConvShape::new(3, stride).groups(cout / group_width);
    let b = conv_norm_act(&f / "b", cout, cout, grouped, n, relu);
    let squeeze = (SE_RATIO * cin as f64).round() as i64;
    // nn.Conv2d's default bias, U(±1/√fan_in): RegNet's init leaves it.
    let se = se.then(|| squeeze_excitation(&f / "se", cout, squeeze, Act::Relu, Act::Sigmoid, super::torch_bias));
    let c = conv_norm_act(&f / "c", cout, cout, ConvShape::new(1, 1), n, None);
    nn::func_t(move |x, train| {
        let mut y = x.apply_t(&a, train).apply_t(&b, train);
        if let Some(se) = &se {
            y = y.apply(se);
        }
        let y = y.apply_t(&c, train);
        let shortcut = match &proj {
            Some(p) => x.apply_t(p, train),
            None => x.shallow_clone(),
        };
        (shortcut + y).relu()
    })
}

pub fn regnet(p: &nn::Path, spec: &RegNetSpec, num_classes: i64) -> (nn::FuncT<'static>, LayerMap) {
    let stem = conv_norm_act(
        p / "stem",
        3,
        STEM,
        ConvShape::new(3, 2),
        NormKind::BATCH,
        Some(Act::Relu),
    );
    let mut map = LayerMap::new(&["stem"]);
    let t = p / "trunk_output";
    let mut stages = nn::seq_t();
    let mut cin = STEM;
    for (s, (&depth, &width)) in spec.depths.iter().zip(&spec.widths).enumerate() {
        let group_width = spec.group_widths[s];
        let name = format!("block{}", s + 1);
        for i in 0..depth {
            let stride = if i == 0 { 2 } else { 1 };
            let bname = format!("block{}-{i}", s + 1);
            stages = stages.add(block(
                &t / name.as_str() / bname.as_str(),
                cin,
                width,
                stride,
                group_width,
                spec.se,
            ));
            map.blocks.push(vec![format!("trunk_output.{name}.{bname}")]);
            cin = width;
        }
    }
    let fc = linear(
        p / "fc",
        cin,
        num_classes,
        nn::Init::Randn { mean: 0.0, stdev: 0.01 },
        ZERO,
    );
    let net = nn::func_t(move |x, train| {
        x.apply_t(&stem, train)
            .apply_t(&stages, train)
            .adaptive_avg_pool2d([1, 1])
            .flatten(1, -1)
            .apply(&fc)
    });
    (net, map)
}

/// timm's name for the tensor ringtrain (torchvision) calls `name`.
pub fn timm_name(name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("stem.") {
        return conv_norm_renamed(rest, "stem.conv", "stem.bn");
    }
    if let Some(rest) = name.strip_prefix("fc.") {
        return Some(format!("head.fc.{rest}"));
    }
    // trunk_output.block{S}.block{S}-{I}.PART
    let rest = name.strip_prefix("trunk_output.block")?;
    let (_, rest) = rest.split_once(".block")?;
    let (stage_block, part) = rest.split_once('.')?;
    let (stage, i) = stage_block.split_once('-')?;
    let i: usize = i.parse().ok()?;
    let layer = |name: &str, rest: &str| conv_norm_renamed(rest, &format!("{name}.conv"), &format!("{name}.bn"));
    let part = if let Some(r) = part.strip_prefix("proj.") {
        layer("downsample", r)?
    } else if let Some(r) = part.strip_prefix("f.se.") {
        format!("se.{r}")
    } else {
        let r = part.strip_prefix("f.")?;
        let (which, r) = r.split_once('.')?;
        let conv = match which {
            "a" => "conv1",
            "b" => "conv2",
            "c" => "conv3",
            _ => return None,
        };
        layer(conv, r)?
    };
    Some(format!("s{stage}.b{}.{part}", i + 1))
}
