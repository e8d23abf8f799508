//! Vision Transformer as torchvision defines it: a patch convolution (`conv_proj`), a class token,
//! learned position embeddings (`encoder.pos_embedding`), pre-norm encoder blocks
//! (`encoder.layers.encoder_layer_N`: `ln_1`, `self_attention` as `nn.MultiheadAttention` names
//! it, `ln_2`, `mlp.0`, `mlp.3`), a final LayerNorm (`encoder.ln`) and a Linear head on the
//! class token (`heads.head`). The sequence length follows the image size (any multiple of the
//! patch); weights made for another size get their position embeddings interpolated as
//! torchvision's `interpolate_embeddings` does (timm's weights: as timm's
//! `resample_abs_pos_embed`).
//!
//! timm's variants add what its published weights use: no class token with the tokens averaged
//! (`avg_pool`), the final norm after the pooling (`fc_norm`), no bias on the query-key-value
//! projection, and layer scale on both branches (`ls_1`, `ls_2`). `timm_name` says what timm
//! calls each tensor.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::layers::{self, conv2d, linear, stochastic_depth, ConvShape, ZERO};
use super::LayerMap;

pub struct VitSpec {
    pub patch: i64,
    pub layers: usize,
    pub heads: i64,
    pub hidden: i64,
    pub mlp: i64,
    pub class_token: bool,
    /// The tokens averaged for the head (timm's `global_pool='avg'`) instead of the class token.
    pub avg_pool: bool,
    /// The final LayerNorm after the pooling (`fc_norm`) instead of before it (`encoder.ln`).
    pub fc_norm: bool,
    pub qkv_bias: bool,
    /// Layer scale on both residual branches (timm's `init_values`).
    pub layer_scale: Option<f64>,
}

/// A plain ViT of `hidden` width: a class token, its output to the head.
const fn plain(patch: i64, layers: usize, heads: i64, hidden: i64) -> VitSpec {
    VitSpec {
        patch,
        layers,
        heads,
        hidden,
        mlp: 4 * hidden,
        class_token: true,
        avg_pool: false,
        fc_norm: false,
        qkv_bias: true,
        layer_scale: None,
    }
}

pub const TI_16: VitSpec = plain(16, 12, 3, 192);
pub const S_16: VitSpec = plain(16, 12, 6, 384);
pub const S_32: VitSpec = plain(32, 12, 6, 384);
pub const B_16: VitSpec = plain(16, 12, 12, 768);
pub const B_32: VitSpec = plain(32, 12, 12, 768);
pub const L_16: VitSpec = plain(16, 24, 16, 1024);
/// timm's `vit_medium_patch16_gap_256`.
pub const M_16_GAP: VitSpec = VitSpec {
    class_token: false,
    avg_pool: true,
    qkv_bias: false,
    layer_scale: Some(1e-6),
    ..plain(16, 12, 8, 512)
};

/// `nn.MultiheadAttention(hidden, heads, batch_first=True)` under its names: `in_proj_weight`,
/// `in_proj_bias`, `out_proj.weight`, `out_proj.bias`.
#[derive(Debug)]
struct Attention {
    in_w: Tensor,
    in_b: Option<Tensor>,
    out: nn::Linear,
    heads: i64,
}

impl Attention {
    fn new(p: nn::Path, e: i64, heads: i64, bias: bool) -> Self {
        // MultiheadAttention._reset_parameters: in_proj xavier_uniform, biases 0; out_proj keeps
        // nn.Linear's weight initialisation.
        Attention {
            in_w: p.var("in_proj_weight", &[3 * e, e], layers::xavier_uniform(e, 3 * e)),
            in_b: bias.then(|| p.var("in_proj_bias", &[3 * e], ZERO)),
            out: linear(&p / "out_proj", e, e, super::TORCH_WEIGHT_INIT, ZERO),
            heads,
        }
    }
}

impl Module for Attention {
    fn forward(&self, x: &Tensor) -> Tensor {
        let e = x.size()[2];
        let hd = e / self.heads;
        // [N, L, 3E] → 3 × [N, heads, L, head_dim], then softmax(qkᵀ/√d)v in one kernel. No
        // shape names N or L, so a traced graph (`ringtrain export`) takes any batch.
        let qkv = x
            .linear(&self.in_w, self.in_b.as_ref())
            .unflatten(-1, [3, self.heads, hd])
            .permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let a = Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, false, None, false);
        a.transpose(1, 2).flatten(2, 3).apply(&self.out)
    }
}

/// `drop`: stochastic depth on both residual branches (timm's `drop_path`; torchvision's ViT has
/// none, so it is 0 unless `--drop-path` asks).
fn encoder_block(p: nn::Path, s: &VitSpec, dropout: f64, drop: f64) -> nn::FuncT<'static> {
    let ln_1 = layers::layer_norm(&p / "ln_1", s.hidden, 1e-6);
    let attn = Attention::new(&p / "self_attention", s.hidden, s.heads, s.qkv_bias);
    let ln_2 = layers::layer_norm(&p / "ln_2", s.hidden, 1e-6);
    let scale = |name: &str| s.layer_scale.map(|v| p.var(name, &[s.hidden], nn::Init::Const(v)));
    let (ls_1, ls_2) = (scale("ls_1"), scale("ls_2"));
    let scaled = |y: Tensor, ls: &Option<Tensor>| match ls {
        Some(g) => y * g,
        None => y,
    };
    // MLPBlock: xavier_uniform weights, N(0, 1e-6) biases.
    let bias = nn::Init::Randn { mean: 0.0, stdev: 1e-6 };
    let mlp = |i: i64, cin, cout| linear(&p / "mlp" / i, cin, cout, layers::xavier_uniform(cin, cout), bias);
    let (fc1, fc2) = (mlp(0, s.hidden, s.mlp), mlp(3, s.mlp, s.hidden));
    nn::func_t(move |input, train| {
        let a = scaled(input.apply(&ln_1).apply(&attn).dropout(dropout, train), &ls_1);
        let x = stochastic_depth(&a, drop, train) + input;
        let y = x
            .apply(&ln_2)
            .apply(&fc1)
            .gelu("none")
            .dropout(dropout, train)
            .apply(&fc2)
            .dropout(dropout, train);
        stochastic_depth(&scaled(y, &ls_2), drop, train) + x
    })
}

/// The sequence length for `img_size`: one token per patch and the class token.
pub fn seq_len(s: &VitSpec, img_size: i64) -> i64 {
    (img_size / s.patch).pow(2) + s.class_token as i64
}

/// `dropout`: torchvision's `dropout` (after the position embeddings, attention and in the MLP);
/// `drop_path`: stochastic depth rising linearly over the blocks from 0 to this, as timm's.
pub fn vit(
    p: &nn::Path,
    s: &VitSpec,
    img_size: i64,
    num_classes: i64,
    dropout: f64,
    drop_path: f64,
) -> (nn::FuncT<'static>, LayerMap) {
    let fan_in = 3 * s.patch * s.patch;
    let patch = ConvShape::new(s.patch, s.patch).padding(0);
    let conv_proj = conv2d(
        p / "conv_proj",
        3,
        s.hidden,
        patch,
        layers::trunc_normal((1.0 / fan_in as f64).sqrt()),
        Some(ZERO),
    );
    let class_token = s.class_token.then(|| p.var("class_token", &[1, 1, s.hidden], ZERO));
    let e = p / "encoder";
    let pos = e.var(
        "pos_embedding",
        &[1, seq_len(s, img_size), s.hidden],
        nn::Init::Randn { mean: 0.0, stdev: 0.02 },
    );
    let mut map = LayerMap::new(&["conv_proj", "class_token", "encoder.pos_embedding"]);
    debug_assert!(s.class_token || s.avg_pool, "a ViT without a class token pools its tokens");
    let mut blocks = Vec::new();
    for i in 0..s.layers {
        let drop = drop_path * i as f64 / (s.layers as f64 - 1.0).max(1.0);
        blocks.push(encoder_block(
            &e / "layers" / format!("encoder_layer_{i}"),
            s,
            dropout,
            drop,
        ));
        map.blocks.push(vec![format!("encoder.layers.encoder_layer_{i}")]);
    }
    // The final norm: before the pooling (`encoder.ln`) or after it (`fc_norm`).
    let ln = match s.fc_norm {
        false => layers::layer_norm(&e / "ln", s.hidden, 1e-6),
        true => layers::layer_norm(p / "fc_norm", s.hidden, 1e-6),
    };
    let head = linear(p / "heads" / "head", s.hidden, num_classes, ZERO, ZERO);
    let (avg_pool, fc_norm) = (s.avg_pool, s.fc_norm);
    let net = nn::func_t(move |x, train| {
        // Shapes from the tensors, not from numbers, so a traced graph takes any batch.
        let tokens = x.apply(&conv_proj).flatten(2, 3).permute([0, 2, 1]);
        let prefix = class_token.is_some() as i64;
        let mut y = match &class_token {
            Some(t) => Tensor::cat(&[t.expand_as(&tokens.narrow(1, 0, 1)), tokens], 1),
            None => tokens,
        };
        y = (y + &pos).dropout(dropout, train);
        for b in &blocks {
            y = y.apply_t(b, train);
        }
        if !fc_norm {
            y = y.apply(&ln);
        }
        let mut pooled = match avg_pool {
            true => y.narrow(1, prefix, y.size()[1] - prefix).mean_dim(1, false, None),
            false => y.select(1, 0),
        };
        if fc_norm {
            pooled = pooled.apply(&ln);
        }
        pooled.apply(&head)
    });
    (net, map)
}

/// torchvision's `interpolate_embeddings`: the patch positions of `pos` ([1, 1 + g², E]) resized
/// bicubically (align_corners) to the grid of `seq` tokens, the class token's kept. None when
/// either is not a square grid.
pub fn interpolate_pos_embedding(pos: &Tensor, seq: i64) -> Option<Tensor> {
    let (_, old, e) = pos.size3().ok()?;
    let side = |n: i64| Some(((n - 1) as f64).sqrt().round() as i64).filter(|g| *g > 0 && g * g == n - 1);
    let (g_old, g_new) = (side(old)?, side(seq)?);
    let token = pos.narrow(1, 0, 1);
    let grid = pos
        .narrow(1, 1, old - 1)
        .permute([0, 2, 1])
        .reshape([1, e, g_old, g_old]);
    let grid = grid
        .to_kind(Kind::Float)
        .upsample_bicubic2d([g_new, g_new], true, None, None)
        .reshape([1, e, g_new * g_new])
        .permute([0, 2, 1]);
    Some(Tensor::cat(&[token.to_kind(Kind::Float), grid], 1).to_kind(pos.kind()))
}

/// timm's `resample_abs_pos_embed`: the grid positions of `pos` ([1, prefix + g², E]) resized
/// bicubically (antialiased, corners not aligned) to the grid of `seq` tokens, the `prefix`
/// tokens' kept. None when either is not a square grid.
pub fn resample_pos_embedding_timm(pos: &Tensor, seq: i64, prefix: i64) -> Option<Tensor> {
    let (_, old, e) = pos.size3().ok()?;
    let side = |n: i64| Some(((n - prefix) as f64).sqrt().round() as i64).filter(|g| *g > 0 && g * g == n - prefix);
    let (g_old, g_new) = (side(old)?, side(seq)?);
    let grid = pos
        .narrow(1, prefix, old - prefix)
        .to_kind(Kind::Float)
        .reshape([1, g_old, g_old, e])
        .permute([0, 3, 1, 2]);
    let grid = Tensor::internal_upsample_bicubic2d_aa(&grid, [g_new, g_new], false, None, None)
        .permute([0, 2, 3, 1])
        .reshape([1, g_new * g_new, e]);
    let parts = [pos.narrow(1, 0, prefix).to_kind(Kind::Float), grid];
    Some(Tensor::cat(&parts, 1).to_kind(pos.kind()))
}

/// timm's name for the tensor ringtrain calls `name` (torchvision's names, and `ls_1`, `ls_2`,
/// `fc_norm` for what only timm's variants have).
pub fn timm_name(name: &str) -> Option<String> {
    let direct = [
        ("conv_proj.", "patch_embed.proj."),
        ("class_token", "cls_token"),
        ("encoder.pos_embedding", "pos_embed"),
        ("encoder.ln.", "norm."),
        ("fc_norm.", "fc_norm."),
        ("heads.head.", "head."),
    ];
    for (ours, theirs) in direct {
        if let Some(rest) = name.strip_prefix(ours) {
            return Some(format!("{theirs}{rest}"));
        }
    }
    let rest = name.strip_prefix("encoder.layers.encoder_layer_")?;
    let (i, part) = rest.split_once('.')?;
    let part = match part {
        "self_attention.in_proj_weight" => "attn.qkv.weight".to_string(),
        "self_attention.in_proj_bias" => "attn.qkv.bias".to_string(),
        "ls_1" => "ls1.gamma".to_string(),
        "ls_2" => "ls2.gamma".to_string(),
        p => {
            let map = [("self_attention.out_proj.", "attn.proj."), ("ln_1.", "norm1."), ("ln_2.", "norm2."), ("mlp.0.", "mlp.fc1."), ("mlp.3.", "mlp.fc2.")];
            let (ours, theirs) = map.iter().find(|(o, _)| p.starts_with(o))?;
            format!("{theirs}{}", &p[ours.len()..])
        }
    };
    Some(format!("blocks.{i}.{part}"))
}
