//! ONNX, written by ringtrain: the evaluation forward pass traced by libtorch's tracer (as for
//! TorchScript), then each recorded aten operator written as standard ONNX operators
//! (`translate`), the weights as initializers under their state_dict names, the metadata as the
//! model's metadata_props. Batch is the input's and output's free dimension, `batch`.
pub mod proto;
pub mod resize;
pub mod traced;
pub mod translate;

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

use super::{ExportGraph, NamedWeight};
use crate::atomic;
use crate::infer::onnx::OnnxSession;
use crate::shim::{self, TracedWeight};
use proto::{
    Dimension, GraphProto, ModelProto, OperatorSetIdProto, StringStringEntryProto, TensorShapeProto, TensorTypeProto,
    TypeProto, ValueInfoProto,
};
use traced::TracedGraph;
use translate::{Translation, INPUT, OUTPUT};

/// The name the files give the batch dimension.
pub const BATCH: &str = "batch";
/// With `--with-resize`: the traced graph's input, the crop the resize nodes give.
const CROPPED: &str = "resize.cropped";

/// Writes the file; where ONNX Runtime loads here, the file is run against the eager model
/// before it is kept. Returns why it was not run, if it was not.
pub fn write(graph: &ExportGraph, metadata: &[(String, String)], opset: i64, out: &Path) -> Result<Option<String>> {
    let model = model(graph, metadata, opset)?;
    atomic::write_file_by_path(out, |tmp| {
        std::fs::write(tmp, model.to_bytes())?;
        check(graph, tmp)
    })
}

/// The written file in ONNX Runtime gives the eager model's outputs at batch 1 and 3 (the trace
/// was made at 2). With `--with-resize`, on images already at the resize's size (its identity),
/// against the model on the crop the graph cuts from them.
fn check(graph: &ExportGraph, file: &Path) -> Result<Option<String>> {
    if let Err(e) = crate::infer::onnx::runtime() {
        return Ok(Some(e.to_string()));
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut session = OnnxSession::open(file, "the written file", threads)?;
    for batch in [1, 3] {
        let (x, crop) = match graph.options.resize {
            Some(r) => {
                let side = r.shorter_side as i64;
                let x = Tensor::randint(256, [batch, side, side, 3], (Kind::Uint8, Device::Cpu));
                // CenterCrop's offset, round((side - size) / 2) with ties to even.
                let (half, odd) = ((side - graph.size) / 2, (side - graph.size) % 2);
                let start = half + odd * (half % 2);
                let crop = x.narrow(1, start, graph.size).narrow(2, start, graph.size);
                (x, crop)
            }
            None => {
                let x = graph.example_input(batch);
                (x.shallow_clone(), x)
            }
        };
        let want = tch::no_grad(|| graph.forward(&crop));
        let got = session.run(&x)?;
        // Other kernels than libtorch's (2.1e-6 of the largest measured in fp32): a wrong
        // translation is far beyond these.
        let bound = if graph.options.half { 5e-2 } else { 1e-3 };
        super::same_outputs("the ONNX file in ONNX Runtime", &got, &want, batch, bound)?;
    }
    Ok(None)
}

/// The ONNX model of `graph`.
pub fn model(graph: &ExportGraph, metadata: &[(String, String)], opset: i64) -> Result<ModelProto> {
    let named = graph.weights();
    let weights: Vec<TracedWeight> = named.iter().map(NamedWeight::traced).collect();
    let text = tch::no_grad(|| shim::jit_trace_graph(&weights, &graph.example_input(2), &mut |x| graph.forward(x)))
        .context("tracing the model")?;
    let traced = TracedGraph::parse(&text)?;
    let by_name: HashMap<&str, &Tensor> = named.iter().map(|w| (w.name.as_str(), &w.tensor)).collect();
    let (front, front_constants, traced_input) = match graph.options.resize {
        Some(r) => {
            let (nodes, constants) = resize::nodes(&r, graph.size, INPUT, CROPPED);
            (nodes, constants, CROPPED)
        }
        None => (vec![], vec![], INPUT),
    };
    let mut t = Translation::new(&traced, opset, &by_name, traced_input)?;
    t.run()?;
    let mut input = declare(INPUT, &traced, traced.input)?;
    if graph.options.resize.is_some() {
        free_height_and_width(&mut input);
    }
    let output = declare(OUTPUT, &traced, traced.output)?;
    Ok(ModelProto {
        ir_version: ir_version(opset),
        producer_name: "ringtrain".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: String::new(),
        graph: Some(GraphProto {
            node: [front, t.nodes].concat(),
            name: "ringtrain".into(),
            initializer: [front_constants, t.initializers].concat(),
            input: vec![input],
            output: vec![output],
        }),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: opset }],
        metadata_props: metadata
            .iter()
            .map(|(key, value)| StringStringEntryProto { key: key.clone(), value: value.clone() })
            .collect(),
    })
}

/// A graph input or output: its traced type and sizes, the first (the batch) left free.
fn declare(name: &str, traced: &TracedGraph, v: traced::ValueId) -> Result<ValueInfoProto> {
    let info = traced.tensor(v)?;
    let elem_type = translate::onnx_type(&info.dtype)?;
    let dim = info
        .sizes
        .iter()
        .enumerate()
        .map(|(i, &d)| match i {
            0 => Dimension { dim_value: None, dim_param: Some(BATCH.into()) },
            _ => Dimension { dim_value: Some(d), dim_param: None },
        })
        .collect();
    Ok(ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto { elem_type, shape: Some(TensorShapeProto { dim }) }),
        }),
    })
}

/// An NHWC input's height and width left free, named `height` and `width`.
fn free_height_and_width(input: &mut ValueInfoProto) {
    let dims = input
        .r#type
        .as_mut()
        .and_then(|t| t.tensor_type.as_mut())
        .and_then(|t| t.shape.as_mut())
        .map(|s| &mut s.dim);
    for (d, name) in dims.into_iter().flat_map(|d| d.iter_mut().skip(1).take(2)).zip(["height", "width"]) {
        *d = Dimension { dim_value: None, dim_param: Some(name.into()) };
    }
}

/// The IR version of the ONNX release that introduced `opset` (what its readers expect).
fn ir_version(opset: i64) -> i64 {
    match opset {
        ..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        _ => 10,
    }
}
