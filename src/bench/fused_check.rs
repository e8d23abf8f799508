//! `ringtrain fused-check` (hidden; the GPU battery runs it): the compiled fused BatchNorm +
//! (add) + ReLU kernels, LayerNorm kernels and ConvNeXt's scale-add kernels, forward and
//! backward through autograd, on ResNet's and ConvNeXt's shapes and odd ones in fp16, bf16 and
//! fp32, with everything in and out written to one safetensors file. The battery then recomputes
//! each case with PyTorch (fp64, and its unfused ops in the same dtype) on the same GPU and holds
//! the kernels to the bounds the interpreter tests hold them to on the CPU (tests/py/fused_bn_act.py,
//! fused_layer_norm.py, fused_scale_add.py).
use std::path::Path;

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

use crate::bail_user;
use crate::model::fused;

/// (N, C, H, W), dtype, with a residual.
const CASES: &[([i64; 4], Kind, bool)] = &[
    ([8, 64, 56, 56], Kind::Half, true),
    ([8, 256, 14, 14], Kind::BFloat16, false),
    ([16, 2048, 7, 7], Kind::BFloat16, true),
    ([2, 67, 5, 7], Kind::Half, true),
    ([3, 130, 9, 11], Kind::BFloat16, false),
    ([4, 128, 28, 28], Kind::Float, true),
    ([3, 64, 9, 9], Kind::Float, false),
];

/// LayerNorm cases: an NHWC activation (N, H, W, C), dtype. ConvNeXt-T's and -L's widths, and
/// odd ones.
const LN_CASES: &[([i64; 4], Kind)] = &[
    ([8, 56, 56, 96], Kind::BFloat16),
    ([8, 14, 14, 384], Kind::Half),
    ([4, 7, 7, 768], Kind::BFloat16),
    ([2, 7, 7, 1536], Kind::BFloat16),
    ([2, 5, 7, 67], Kind::Half),
    ([3, 9, 11, 130], Kind::Float),
];

/// Scale-add cases (the end of a ConvNeXt block): the block's output (N, H, W, C), its dtype and
/// the residual stream's.
const SCALE_ADD_CASES: &[([i64; 4], Kind, Kind)] = &[
    ([8, 56, 56, 96], Kind::BFloat16, Kind::Float),
    ([8, 14, 14, 384], Kind::Half, Kind::Half),
    ([4, 7, 7, 768], Kind::BFloat16, Kind::BFloat16),
    ([2, 5, 7, 67], Kind::Half, Kind::Float),
    ([3, 9, 11, 130], Kind::Float, Kind::Float),
];

pub fn run(device: Device, out: &Path) -> Result<usize> {
    if let Err(why) = fused::prepare(device) {
        bail_user!("fused-check: {why}");
    }
    let mut named: Vec<(String, Tensor)> = Vec::new();
    for (i, &(shape, kind, has_res)) in CASES.iter().enumerate() {
        tch::manual_seed(1000 + i as i64);
        let c = shape[1];
        let opts = (Kind::Float, device);
        let act = |scale: f64, shift: f64| -> Result<Tensor> {
            crate::shim::to_channels_last(&(Tensor::randn(shape, opts) * scale + shift).to_kind(kind))
        };
        // A mean far from zero against the spread, as the interpreter test draws it.
        let x = act(0.5, 3.0)?.set_requires_grad(true);
        let res = if has_res {
            Some(act(1.0, 0.0)?.set_requires_grad(true))
        } else {
            None
        };
        let dy = act(1.0, 0.0)?;
        let w = (Tensor::rand([c], opts) + 0.5).set_requires_grad(true);
        let b = (Tensor::randn([c], opts) * 0.1).set_requires_grad(true);
        let (rm0, rv0) = (Tensor::randn([c], opts), Tensor::rand([c], opts) + 0.5);
        let (rm, rv) = (rm0.copy(), rv0.copy());
        let y = fused::bn_relu(&x, [&w, &b, &rm, &rv], res.as_ref(), 0.1, 1e-5)
            .with_context(|| format!("fused-check: the kernels do not cover case {i} ({shape:?} {kind:?})"))?;
        // The upstream gradient is dy exactly: d(Σ y·dy)/dy = dy (a product with 1).
        (&y * &dy).sum(Kind::Float).backward();
        let case = i.to_string();
        keep(&mut named, &case, &[("x", &x), ("dy", &dy), ("w", &w), ("b", &b), ("rm0", &rm0), ("rv0", &rv0)]);
        let grads = [x.grad(), w.grad(), b.grad()];
        let outputs = [("y", &y), ("rm", &rm), ("rv", &rv), ("dx", &grads[0]), ("dw", &grads[1]), ("db", &grads[2])];
        keep(&mut named, &case, &outputs);
        if let Some(r) = &res {
            keep(&mut named, &case, &[("res", r), ("dres", &r.grad())]);
        }
    }
    for (i, &(shape, kind)) in LN_CASES.iter().enumerate() {
        tch::manual_seed(2000 + i as i64);
        let c = shape[3];
        let opts = (Kind::Float, device);
        let x = (Tensor::randn(shape, opts) * 0.5 + 3.0)
            .to_kind(kind)
            .set_requires_grad(true);
        let dy = Tensor::randn(shape, opts).to_kind(kind);
        let w = (Tensor::rand([c], opts) + 0.5).set_requires_grad(true);
        let b = (Tensor::randn([c], opts) * 0.1).set_requires_grad(true);
        let y = fused::layer_norm(&x, &w, &b, 1e-6).with_context(|| {
            format!("fused-check: the kernels do not cover LayerNorm case {i} ({shape:?} {kind:?})")
        })?;
        (&y * &dy).sum(Kind::Float).backward();
        let grads = [x.grad(), w.grad(), b.grad()];
        keep(&mut named, &format!("ln{i}"), &[("x", &x), ("dy", &dy), ("w", &w), ("b", &b), ("y", &y)]);
        keep(&mut named, &format!("ln{i}"), &[("dx", &grads[0]), ("dw", &grads[1]), ("db", &grads[2])]);
    }
    for (i, &([n, h, w, c], z_kind, stream_kind)) in SCALE_ADD_CASES.iter().enumerate() {
        tch::manual_seed(3000 + i as i64);
        let opts = (Kind::Float, device);
        let z = Tensor::randn([n, h, w, c], opts)
            .to_kind(z_kind)
            .set_requires_grad(true);
        let stream = crate::shim::to_channels_last(&Tensor::randn([n, c, h, w], opts).to_kind(stream_kind))?
            .set_requires_grad(true);
        let gamma = (Tensor::rand([c, 1, 1], opts) + 0.5).set_requires_grad(true);
        // Stochastic depth's factors: about a third of the samples dropped, the rest scaled.
        let factors = Tensor::rand([n], opts).gt(0.3).to_kind(Kind::Float) / 0.7;
        let dout = crate::shim::to_channels_last(&Tensor::randn([n, c, h, w], opts))?;
        let y = fused::scale_add(&z, &stream, &gamma, &factors).with_context(|| {
            format!(
                "fused-check: the kernels do not cover scale-add case {i} ({:?} {z_kind:?})",
                [n, h, w, c]
            )
        })?;
        (&y * &dout).sum(Kind::Float).backward();
        let grads = [z.grad(), gamma.grad()];
        let tensors = [("z", &z), ("stream", &stream), ("gamma", &gamma), ("keep", &factors), ("dout", &dout)];
        keep(&mut named, &format!("sa{i}"), &tensors);
        keep(&mut named, &format!("sa{i}"), &[("out", &y), ("dz", &grads[0]), ("dgamma", &grads[1])]);
    }
    crate::atomic::write_file_by_path(out, |tmp| {
        let refs = named.iter().map(|(k, t)| (k.as_str(), t));
        crate::model::weights::write_tensors(refs, tmp).with_context(|| format!("writing {}", out.display()))
    })?;
    Ok(CASES.len() + LN_CASES.len() + SCALE_ADD_CASES.len())
}

/// Adds a case's tensors to the file's list, each named `{case}.{name}`.
fn keep(named: &mut Vec<(String, Tensor)>, case: &str, tensors: &[(&str, &Tensor)]) {
    named.extend(tensors.iter().map(|(name, t)| (format!("{case}.{name}"), t.shallow_clone())));
}
