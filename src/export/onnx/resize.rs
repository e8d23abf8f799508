//! `--with-resize`: the evaluation's resize and centre crop as ONNX operators in front of the
//! traced graph, so a server hands over decoded images of any size. The arithmetic is
//! torchvision's on a PIL image: the shorter side to `shorter_side` and the longer to
//! int(shorter_side · long / short); PIL's antialiased bilinear or bicubic (a = -0.5) filter,
//! which Resize with antialias=1 computes as PIL does (opset 18); then CenterCrop's offset
//! int(round((size - crop) / 2)), Python's round halving to even.
use super::proto::{AttributeProto, NodeProto, TensorProto};
use super::translate::initializer;
use crate::data::augment::transform::Interpolation;
use crate::export::InGraphResize;

/// The nodes (and their constants) from the graph's uint8 [N, H, W, 3] `input` to `output`,
/// uint8 [N, crop, crop, 3].
pub fn nodes(r: &InGraphResize, crop: i64, input: &str, output: &str) -> (Vec<NodeProto>, Vec<TensorProto>) {
    let ints = |name: &str, v: &[i64]| initializer(name, &tch::Tensor::from_slice(v));
    let constants = vec![
        ints("resize.hw_from", &[1]),
        ints("resize.hw_to", &[3]),
        ints("resize.shorter_side", &[r.shorter_side as i64]),
        ints("resize.crop", &[crop]),
        ints("resize.two", &[2]),
        ints("resize.axes", &[1, 2]),
    ];
    let mode = match r.interpolation {
        Interpolation::Bicubic => "cubic",
        // `export` refuses nearest neighbour (not PIL's in ONNX).
        Interpolation::Bilinear | Interpolation::Nearest => "linear",
    };
    let node = |op: &str, inputs: &[&str], out: &str, attribute: Vec<AttributeProto>| NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![out.to_string()],
        name: format!("resize.{out}"),
        op_type: op.to_string(),
        attribute,
    };
    let nodes = vec![
        node("Shape", &[input], "resize.shape", vec![]),
        node("Slice", &["resize.shape", "resize.hw_from", "resize.hw_to"], "resize.hw", vec![]),
        node("ReduceMin", &["resize.hw"], "resize.short", vec![AttributeProto::int("keepdims", 1)]),
        node("Mul", &["resize.hw", "resize.shorter_side"], "resize.scaled", vec![]),
        // Integer division of positive numbers: Python's int() of the quotient.
        node("Div", &["resize.scaled", "resize.short"], "resize.sizes", vec![]),
        node(
            "Resize",
            &[input, "", "", "resize.sizes"],
            "resize.resized",
            vec![
                AttributeProto::string("mode", mode),
                AttributeProto::int("antialias", 1),
                AttributeProto::ints("axes", &[1, 2]),
                AttributeProto::string("coordinate_transformation_mode", "half_pixel"),
                AttributeProto::float("cubic_coeff_a", -0.5),
            ],
        ),
        // start = q + (d mod 2)·(q mod 2), q = d div 2: round(d / 2) with ties to even.
        node("Sub", &["resize.sizes", "resize.crop"], "resize.spare", vec![]),
        node("Div", &["resize.spare", "resize.two"], "resize.half", vec![]),
        node("Mod", &["resize.spare", "resize.two"], "resize.odd", vec![]),
        node("Mod", &["resize.half", "resize.two"], "resize.half_odd", vec![]),
        node("Mul", &["resize.odd", "resize.half_odd"], "resize.tie", vec![]),
        node("Add", &["resize.half", "resize.tie"], "resize.start", vec![]),
        node("Add", &["resize.start", "resize.crop"], "resize.end", vec![]),
        node("Slice", &["resize.resized", "resize.start", "resize.end", "resize.axes"], output, vec![]),
    ];
    (nodes, constants)
}
