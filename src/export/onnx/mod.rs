//! ONNX, written by ringtrain: the evaluation forward pass traced by libtorch's tracer (as for
//! TorchScript), then each recorded aten operator written as standard ONNX operators
//! (`translate`), the weights as initializers under their state_dict names, the metadata as the
//! model's metadata_props. Batch is the input's and output's free dimension, `batch`.
pub mod proto;
pub mod traced;
pub mod translate;

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use tch::Tensor;

use super::{ExportGraph, NamedWeight};
use crate::atomic;
use crate::shim::{self, TracedWeight};
use proto::{
    Dimension, GraphProto, ModelProto, OperatorSetIdProto, StringStringEntryProto, TensorShapeProto, TensorTypeProto,
    TypeProto, ValueInfoProto,
};
use traced::TracedGraph;
use translate::{Translation, INPUT, OUTPUT};

/// The name the files give the batch dimension.
pub const BATCH: &str = "batch";

pub fn write(graph: &ExportGraph, metadata: &[(String, String)], opset: i64, out: &Path) -> Result<()> {
    let model = model(graph, metadata, opset)?;
    atomic::write_file_by_path(out, |tmp| Ok(std::fs::write(tmp, model.to_bytes())?))
}

/// The ONNX model of `graph`.
pub fn model(graph: &ExportGraph, metadata: &[(String, String)], opset: i64) -> Result<ModelProto> {
    let named = graph.weights();
    let weights: Vec<TracedWeight> = named.iter().map(NamedWeight::traced).collect();
    let text = tch::no_grad(|| shim::jit_trace_graph(&weights, &graph.example_input(2), &mut |x| graph.forward(x)))
        .context("tracing the model")?;
    let traced = TracedGraph::parse(&text)?;
    let by_name: HashMap<&str, &Tensor> = named.iter().map(|w| (w.name.as_str(), &w.tensor)).collect();
    let mut t = Translation::new(&traced, opset, &by_name)?;
    t.run()?;
    let input = declare(INPUT, &traced, traced.input)?;
    let output = declare(OUTPUT, &traced, traced.output)?;
    Ok(ModelProto {
        ir_version: ir_version(opset),
        producer_name: "ringtrain".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: String::new(),
        graph: Some(GraphProto {
            node: t.nodes,
            name: "ringtrain".into(),
            initializer: t.initializers,
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

/// The IR version of the ONNX release that introduced `opset` (what its readers expect).
fn ir_version(opset: i64) -> i64 {
    match opset {
        ..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        _ => 10,
    }
}
