//! TorchScript: the evaluation forward pass traced by libtorch's tracer while ringtrain's own
//! forward runs, as `torch.jit.trace` records an nn.Module: the weights (and the normalisation's
//! constants) are the module's parameters and buffers under their state_dict names, none is a
//! constant of the graph, so `.to()`, `.half()` and `state_dict()` work on the loaded file; the
//! metadata are its extra files. The file is read back
//! and run at two batch sizes before it is kept: a shape fixed by the trace would show there.
use std::path::Path;

use anyhow::{Context, Result};
use tch::{CModule, Tensor};

use super::{ExportGraph, NamedWeight};
use crate::atomic;
use crate::shim::{self, TracedWeight};

pub fn write(graph: &ExportGraph, metadata: &[(String, String)], out: &Path) -> Result<()> {
    let named = graph.weights();
    let weights: Vec<TracedWeight> = named.iter().map(NamedWeight::traced).collect();
    let extra: Vec<(String, Vec<u8>)> = metadata.iter().map(|(k, v)| (k.clone(), v.as_bytes().to_vec())).collect();
    atomic::write_file_by_path(out, |tmp| {
        tch::no_grad(|| {
            shim::jit_trace_save(&weights, &graph.example_input(2), &mut |x| graph.forward(x), tmp, &extra)
        })
        .context("tracing the model")?;
        check(graph, tmp)
    })
}

/// The saved file gives the eager model's outputs at batch 1 and 3 (the trace was made at 2).
fn check(graph: &ExportGraph, file: &Path) -> Result<()> {
    let module = CModule::load(file).context("reading the traced module back")?;
    for batch in [1, 3] {
        let x = graph.example_input(batch);
        let (want, got) = tch::no_grad(|| -> Result<(Tensor, Tensor)> {
            Ok((graph.forward(&x), module.forward_ts(&[&x])?))
        })?;
        // The same operations on the same kernels: anything beyond rounding is a fixed shape.
        let bound = if graph.options.half { 1e-2 } else { 1e-4 };
        super::same_outputs("the traced graph", &got, &want, batch, bound)?;
    }
    Ok(())
}
