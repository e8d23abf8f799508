//! The traced graph's aten operators as standard ONNX operators, one function per operator family.
//! Sizes that ONNX must be told (a Reshape's target, an adaptive pool's windows) come from the
//! sizes the tracer saw; the batch is the one size left free: it is dimension 0 of the input and
//! of every activation, and no operator of ringtrain's networks moves it elsewhere for long
//! (a Reshape never names it: it is copied, `0`, or inferred, `-1`).
use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use tch::{Kind, Tensor};

use super::proto::{data_type, AttributeProto, NodeProto, TensorProto};
use super::traced::{Constant, Node, TracedGraph, ValueId};

/// ONNX nodes and initializers being written for a traced graph.
pub struct Translation<'g> {
    g: &'g TracedGraph,
    opset: i64,
    pub nodes: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
    /// The ONNX name of each traced tensor translated so far.
    names: HashMap<ValueId, String>,
    /// The weights' sizes (the tracer's sizes are those of the values it computed).
    weight_sizes: HashMap<ValueId, Vec<i64>>,
    /// prim::ListConstruct's outputs: the listed values.
    lists: HashMap<ValueId, Vec<ValueId>>,
    fresh: usize,
}

/// The graph's input and output names in the ONNX file.
pub const INPUT: &str = "input";
pub const OUTPUT: &str = "output";

/// The oldest opset each operator needs beyond the oldest that `--opset` takes (13).
fn needs_opset(op: &str) -> i64 {
    match op {
        "HardSwish" => 14,
        "LayerNormalization" => 17,
        _ => 13,
    }
}

impl<'g> Translation<'g> {
    /// `weights`: the tensors the traced graph's weights name; `input`: the ONNX name of the
    /// traced graph's input (INPUT, or what nodes in front of it give).
    pub fn new(g: &'g TracedGraph, opset: i64, weights: &HashMap<&str, &Tensor>, input: &str) -> Result<Self> {
        let mut t = Translation {
            g,
            opset,
            nodes: Vec::new(),
            initializers: Vec::new(),
            names: HashMap::new(),
            weight_sizes: HashMap::new(),
            lists: HashMap::new(),
            fresh: 0,
        };
        t.names.insert(g.input, input.to_string());
        // The weights the graph reads (BatchNorm's step counts, for one, it does not).
        let read: std::collections::HashSet<ValueId> = g.nodes.iter().flat_map(|n| n.inputs.iter().copied()).collect();
        let mut used: Vec<(&ValueId, &String)> = g.weights.iter().filter(|(id, _)| read.contains(id)).collect();
        used.sort_by(|a, b| a.1.cmp(b.1));
        for (&id, name) in used {
            let tensor = weights.get(name.as_str()).with_context(|| format!("the traced weight {name} is unknown"))?;
            t.initializers.push(initializer(name, tensor));
            t.names.insert(id, name.clone());
            t.weight_sizes.insert(id, tensor.size());
        }
        Ok(t)
    }

    pub fn run(&mut self) -> Result<()> {
        for node in &self.g.nodes {
            // A user's error (an opset too old) is said as it is; anything else names the operator.
            self.node(node).map_err(|e| match crate::error::is_user_error(&e) {
                true => e,
                false => e.context(format!("translating {} to ONNX", node.kind)),
            })?;
        }
        if self.names.get(&self.g.output).map(String::as_str) != Some(OUTPUT) {
            let from = self.name(self.g.output)?;
            self.emit("Identity", &[&from], OUTPUT, vec![]);
        }
        Ok(())
    }

    fn node(&mut self, n: &Node) -> Result<()> {
        let i = &n.inputs;
        let out = *n.outputs.first().context("a node without outputs")?;
        let op = n.kind.strip_prefix("aten::").unwrap_or(&n.kind);
        let op = op.strip_suffix('_').unwrap_or(op); // in-place forms compute the same
        match op {
            "prim::ListConstruct" => {
                self.lists.insert(out, i.clone());
            }
            "_convolution" | "conv2d" => self.convolution(op, i, out)?,
            "batch_norm" => self.batch_norm(i, out)?,
            "relu" => self.op("Relu", &[i[0]], out, vec![])?,
            "sigmoid" => self.op("Sigmoid", &[i[0]], out, vec![])?,
            "tanh" => self.op("Tanh", &[i[0]], out, vec![])?,
            "hardswish" => self.op("HardSwish", &[i[0]], out, vec![])?,
            "hardsigmoid" => {
                let attrs = vec![AttributeProto::float("alpha", 1.0 / 6.0), AttributeProto::float("beta", 0.5)];
                self.op("HardSigmoid", &[i[0]], out, attrs)?;
            }
            "silu" => {
                let x = self.name(i[0])?;
                let s = self.temp("sigmoid");
                self.emit("Sigmoid", &[&x], &s, vec![]);
                let y = self.out_name(out);
                self.emit("Mul", &[&x, &s], &y, vec![]);
            }
            "gelu" => self.gelu(i, out)?,
            "dropout" | "feature_dropout" | "alpha_dropout" => {
                if self.bool(i[2])? {
                    bail!("dropout in training mode was traced");
                }
                self.alias(i[0], out)?;
            }
            "contiguous" | "clone" | "detach" => self.alias(i[0], out)?,
            "to" | "type_as" => self.cast_to_traced(i[0], out)?,
            "add" | "sub" => self.add_or_sub(op, i, out)?,
            "mul" | "div" => {
                let b = self.operand(i[1], i[0])?;
                let a = self.name(i[0])?;
                let y = self.out_name(out);
                self.emit(if op == "mul" { "Mul" } else { "Div" }, &[&a, &b], &y, vec![]);
            }
            "matmul" => self.op("MatMul", &[i[0], i[1]], out, vec![])?,
            "linear" => self.linear(i, out)?,
            "flatten" => self.flatten(i, out)?,
            "unflatten" => self.unflatten(i, out)?,
            "permute" => {
                let rank = self.rank(i[0])?;
                let perm: Vec<i64> = self.ints(i[1])?.iter().map(|&d| wrap(d, rank)).collect();
                self.op("Transpose", &[i[0]], out, vec![AttributeProto::ints("perm", &perm)])?;
            }
            "transpose" => {
                let rank = self.rank(i[0])?;
                let (a, b) = (wrap(self.int(i[1])?, rank), wrap(self.int(i[2])?, rank));
                let mut perm: Vec<i64> = (0..rank).collect();
                perm.swap(a as usize, b as usize);
                self.op("Transpose", &[i[0]], out, vec![AttributeProto::ints("perm", &perm)])?;
            }
            "adaptive_avg_pool2d" => self.adaptive_avg_pool(i, out)?,
            "avg_pool2d" => self.avg_pool(i, out)?,
            "max_pool2d" => self.max_pool(i, out)?,
            "layer_norm" => self.layer_norm(i, out)?,
            "softmax" => {
                let rank = self.rank(i[0])?;
                let axis = AttributeProto::int("axis", wrap(self.int(i[1])?, rank));
                let from = self.g.tensor(i[0])?.dtype.clone();
                match from == self.g.tensor(out)?.dtype {
                    true => self.op("Softmax", &[i[0]], out, vec![axis])?,
                    false => {
                        let s = self.temp("softmax");
                        let x = self.name(i[0])?;
                        self.emit("Softmax", &[&x], &s, vec![axis]);
                        self.cast_named(&s, out)?;
                    }
                }
            }
            "mean" => {
                let rank = self.rank(i[0])?;
                let axes: Vec<i64> = self.ints(i[1])?.iter().map(|&d| wrap(d, rank)).collect();
                let keep = self.bool(i[2])?;
                let x = self.name(i[0])?;
                let y = self.out_name(out);
                self.reduce_mean(&x, &axes, keep, &y);
            }
            "narrow" => {
                let rank = self.rank(i[0])?;
                let (dim, start, length) = (wrap(self.int(i[1])?, rank), self.int(i[2])?, self.int(i[3])?);
                let x = self.name(i[0])?;
                let (s, e, a) = (self.int64s(&[start]), self.int64s(&[start + length]), self.int64s(&[dim]));
                let y = self.out_name(out);
                self.emit("Slice", &[&x, &s, &e, &a], &y, vec![]);
            }
            "select" => {
                let rank = self.rank(i[0])?;
                let dim = wrap(self.int(i[1])?, rank);
                let index = self.int64_scalar(self.int(i[2])?);
                let x = self.name(i[0])?;
                let y = self.out_name(out);
                self.emit("Gather", &[&x, &index], &y, vec![AttributeProto::int("axis", dim)]);
            }
            "expand_as" => {
                let like = self.name(i[1])?;
                let shape = self.temp("shape");
                self.emit("Shape", &[&like], &shape, vec![]);
                let x = self.name(i[0])?;
                let y = self.out_name(out);
                self.emit("Expand", &[&x, &shape], &y, vec![]);
            }
            "cat" => {
                let parts = self.lists.get(&i[0]).context("cat of something other than a list")?.clone();
                let rank = self.rank(out)?;
                let axis = wrap(self.int(i[1])?, rank);
                let names = parts.iter().map(|&p| self.name(p)).collect::<Result<Vec<_>>>()?;
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let y = self.out_name(out);
                self.emit("Concat", &refs, &y, vec![AttributeProto::int("axis", axis)]);
            }
            "constant_pad_nd" => self.pad(i, out)?,
            "scaled_dot_product_attention" => self.attention(i, out)?,
            _ => bail!("the operator {} has no ONNX translation in ringtrain yet (please report it)", n.kind),
        }
        Ok(())
    }

    // ---- the operator families ----

    fn convolution(&mut self, op: &str, i: &[ValueId], out: ValueId) -> Result<()> {
        let (stride, padding, dilation) = (self.ints(i[3])?, self.ints(i[4])?, self.ints(i[5])?);
        let groups = match op {
            "conv2d" => self.int(i[6])?,
            _ => {
                if self.bool(i[6])? {
                    bail!("transposed convolutions are not translated");
                }
                self.int(i[8])?
            }
        };
        let kernel = &self.sizes(i[1])?[2..];
        let attrs = vec![
            AttributeProto::ints("kernel_shape", kernel),
            AttributeProto::ints("strides", &stride),
            AttributeProto::ints("pads", &[padding.clone(), padding].concat()),
            AttributeProto::ints("dilations", &dilation),
            AttributeProto::int("group", groups),
        ];
        let mut inputs = vec![i[0], i[1]];
        if !self.is_none(i[2]) {
            inputs.push(i[2]);
        }
        self.op("Conv", &inputs, out, attrs)
    }

    fn batch_norm(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        if self.bool(i[5])? {
            bail!("batch norm in training mode was traced");
        }
        let info = self.g.tensor(i[0])?.clone();
        let channels = info.sizes[1];
        let x = self.name(i[0])?;
        let scale = self.weight_or(i[1], 1.0, channels, &info.dtype)?;
        let bias = self.weight_or(i[2], 0.0, channels, &info.dtype)?;
        let (mean, var) = (self.name(i[3])?, self.name(i[4])?);
        let eps = self.float(i[7])?;
        let y = self.out_name(out);
        let attrs = vec![AttributeProto::float("epsilon", eps as f32)];
        self.emit("BatchNormalization", &[&x, &scale, &bias, &mean, &var], &y, attrs);
        Ok(())
    }

    fn layer_norm(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        self.require("LayerNormalization")?;
        let info = self.g.tensor(i[0])?.clone();
        let shape = self.ints(i[1])?;
        let width: i64 = shape.iter().product();
        let x = self.name(i[0])?;
        let scale = self.weight_or(i[2], 1.0, width, &info.dtype)?;
        let bias = self.weight_or(i[3], 0.0, width, &info.dtype)?;
        let eps = self.float(i[4])?;
        let y = self.out_name(out);
        let axis = -(shape.len() as i64);
        let attrs = vec![AttributeProto::int("axis", axis), AttributeProto::float("epsilon", eps as f32)];
        self.emit("LayerNormalization", &[&x, &scale, &bias], &y, attrs);
        Ok(())
    }

    /// GELU: ONNX's operator from opset 20, before it the formula (erf, or tanh's approximation).
    fn gelu(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        let approximate = match i.get(1).map(|&v| self.g.constant(v)).transpose()? {
            Some(Constant::Str(s)) => s.clone(),
            _ => "none".to_string(),
        };
        if self.opset >= 20 {
            let attrs = vec![AttributeProto::string("approximate", &approximate)];
            return self.op("Gelu", &[i[0]], out, attrs);
        }
        let dtype = self.g.tensor(i[0])?.dtype.clone();
        let x = self.name(i[0])?;
        let inner = match approximate.as_str() {
            "none" => {
                // erf(x / √2)
                let r = self.scalar(std::f64::consts::FRAC_1_SQRT_2, &dtype)?;
                let scaled = self.temp("gelu");
                self.emit("Mul", &[&x, &r], &scaled, vec![]);
                let e = self.temp("gelu");
                self.emit("Erf", &[&scaled], &e, vec![]);
                e
            }
            "tanh" => {
                // tanh(√(2/π) (x + 0.044715 x³))
                let c = self.scalar(0.044715, &dtype)?;
                let k = self.scalar((2.0 / std::f64::consts::PI).sqrt(), &dtype)?;
                let (x2, x3, cx3, sum, ks, th) = (
                    self.temp("gelu"),
                    self.temp("gelu"),
                    self.temp("gelu"),
                    self.temp("gelu"),
                    self.temp("gelu"),
                    self.temp("gelu"),
                );
                self.emit("Mul", &[&x, &x], &x2, vec![]);
                self.emit("Mul", &[&x2, &x], &x3, vec![]);
                self.emit("Mul", &[&x3, &c], &cx3, vec![]);
                self.emit("Add", &[&x, &cx3], &sum, vec![]);
                self.emit("Mul", &[&sum, &k], &ks, vec![]);
                self.emit("Tanh", &[&ks], &th, vec![]);
                th
            }
            other => bail!("GELU's approximation {other:?}"),
        };
        // 0.5 x (1 + inner)
        let (one, half) = (self.scalar(1.0, &dtype)?, self.scalar(0.5, &dtype)?);
        let (plus, hx) = (self.temp("gelu"), self.temp("gelu"));
        self.emit("Add", &[&inner, &one], &plus, vec![]);
        self.emit("Mul", &[&x, &half], &hx, vec![]);
        let y = self.out_name(out);
        self.emit("Mul", &[&hx, &plus], &y, vec![]);
        Ok(())
    }

    fn add_or_sub(&mut self, op: &str, i: &[ValueId], out: ValueId) -> Result<()> {
        let mut b = self.operand(i[1], i[0])?;
        let alpha = match i.get(2).map(|&v| self.g.constant(v)).transpose()? {
            Some(Constant::Int(a)) => *a as f64,
            Some(Constant::Float(a)) => *a,
            _ => 1.0,
        };
        if alpha != 1.0 {
            let dtype = self.g.tensor(out)?.dtype.clone();
            let a = self.scalar(alpha, &dtype)?;
            let scaled = self.temp("alpha");
            self.emit("Mul", &[&b, &a], &scaled, vec![]);
            b = scaled;
        }
        let a = self.name(i[0])?;
        let y = self.out_name(out);
        self.emit(if op == "add" { "Add" } else { "Sub" }, &[&a, &b], &y, vec![]);
        Ok(())
    }

    /// x Wᵀ + b: Gemm for a matrix, else MatMul by the transposed weight (then the bias).
    fn linear(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        let rank = self.g.tensor(i[0])?.sizes.len();
        let (x, w) = (self.name(i[0])?, self.name(i[1])?);
        let bias = (!self.is_none(i[2])).then(|| self.name(i[2])).transpose()?;
        let y = self.out_name(out);
        if rank == 2 {
            let mut inputs = vec![x.as_str(), w.as_str()];
            inputs.extend(bias.as_deref());
            self.emit("Gemm", &inputs, &y, vec![AttributeProto::int("transB", 1)]);
            return Ok(());
        }
        let wt = self.temp("weight_t");
        self.emit("Transpose", &[&w], &wt, vec![AttributeProto::ints("perm", &[1, 0])]);
        match bias {
            Some(b) => {
                let xw = self.temp("matmul");
                self.emit("MatMul", &[&x, &wt], &xw, vec![]);
                self.emit("Add", &[&xw, &b], &y, vec![]);
            }
            None => self.emit("MatMul", &[&x, &wt], &y, vec![]),
        }
        Ok(())
    }

    /// flatten(start, end): the dimensions before `start` copied (0), the merged ones inferred
    /// (-1), those after `end` as traced.
    fn flatten(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        let sizes = self.g.tensor(i[0])?.sizes.clone();
        let rank = sizes.len() as i64;
        let (start, end) = (wrap(self.int(i[1])?, rank.max(1)), wrap(self.int(i[2])?, rank.max(1)));
        let mut shape = vec![0; start as usize];
        shape.push(-1);
        shape.extend(&sizes[(end as usize + 1).min(sizes.len())..]);
        self.reshape(i[0], &shape, out)
    }

    /// unflatten(dim, sizes): the dimensions before `dim` copied (0), `sizes`, the rest as traced.
    fn unflatten(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        let sizes = self.g.tensor(i[0])?.sizes.clone();
        let dim = wrap(self.int(i[1])?, sizes.len() as i64) as usize;
        if dim == 0 {
            bail!("unflatten of the batch dimension");
        }
        let mut shape = vec![0; dim];
        shape.extend(self.ints(i[2])?);
        shape.extend(&sizes[dim + 1..]);
        self.reshape(i[0], &shape, out)
    }

    fn reshape(&mut self, x: ValueId, shape: &[i64], out: ValueId) -> Result<()> {
        let x = self.name(x)?;
        let s = self.int64s(shape);
        let y = self.out_name(out);
        self.emit("Reshape", &[&x, &s], &y, vec![]);
        Ok(())
    }

    /// Output cells [⌊i·H/h⌋, ⌈(i+1)·H/h⌉) as PyTorch computes them: one average pool when the
    /// sizes divide, else each cell's mean, concatenated.
    fn adaptive_avg_pool(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        let sizes = self.g.tensor(i[0])?.sizes.clone();
        let (h, w) = (sizes[sizes.len() - 2], sizes[sizes.len() - 1]);
        let target = self.ints(i[1])?;
        let (oh, ow) = (target[0], *target.get(1).unwrap_or(&target[0]));
        if (oh, ow) == (1, 1) {
            return self.op("GlobalAveragePool", &[i[0]], out, vec![]);
        }
        if h % oh == 0 && w % ow == 0 {
            let k = [h / oh, w / ow];
            let attrs = vec![AttributeProto::ints("kernel_shape", &k), AttributeProto::ints("strides", &k)];
            return self.op("AveragePool", &[i[0]], out, attrs);
        }
        let x = self.name(i[0])?;
        let mut rows = Vec::new();
        for r in 0..oh {
            let (h0, h1) = (r * h / oh, ((r + 1) * h + oh - 1) / oh);
            let mut cells = Vec::new();
            for c in 0..ow {
                let (w0, w1) = (c * w / ow, ((c + 1) * w + ow - 1) / ow);
                let (s, e, a) = (self.int64s(&[h0, w0]), self.int64s(&[h1, w1]), self.int64s(&[2, 3]));
                let window = self.temp("window");
                self.emit("Slice", &[&x, &s, &e, &a], &window, vec![]);
                let cell = self.temp("cell");
                self.reduce_mean(&window, &[2, 3], true, &cell);
                cells.push(cell);
            }
            let row = self.temp("row");
            let refs: Vec<&str> = cells.iter().map(String::as_str).collect();
            self.emit("Concat", &refs, &row, vec![AttributeProto::int("axis", 3)]);
            rows.push(row);
        }
        let refs: Vec<&str> = rows.iter().map(String::as_str).collect();
        let y = self.out_name(out);
        self.emit("Concat", &refs, &y, vec![AttributeProto::int("axis", 2)]);
        Ok(())
    }

    fn avg_pool(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        let kernel = self.ints(i[1])?;
        let stride = self.ints(i[2])?;
        let stride = if stride.is_empty() { kernel.clone() } else { stride };
        let padding = self.ints(i[3])?;
        let (ceil, include_pad) = (self.bool(i[4])?, self.bool(i[5])?);
        if i.len() > 6 && !self.is_none(i[6]) {
            bail!("avg_pool2d with a divisor_override");
        }
        let attrs = vec![
            AttributeProto::ints("kernel_shape", &kernel),
            AttributeProto::ints("strides", &stride),
            AttributeProto::ints("pads", &[padding.clone(), padding].concat()),
            AttributeProto::int("ceil_mode", ceil as i64),
            AttributeProto::int("count_include_pad", include_pad as i64),
        ];
        self.op("AveragePool", &[i[0]], out, attrs)
    }

    fn max_pool(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        let kernel = self.ints(i[1])?;
        let stride = self.ints(i[2])?;
        let stride = if stride.is_empty() { kernel.clone() } else { stride };
        let (padding, dilation, ceil) = (self.ints(i[3])?, self.ints(i[4])?, self.bool(i[5])?);
        let attrs = vec![
            AttributeProto::ints("kernel_shape", &kernel),
            AttributeProto::ints("strides", &stride),
            AttributeProto::ints("pads", &[padding.clone(), padding].concat()),
            AttributeProto::ints("dilations", &dilation),
            AttributeProto::int("ceil_mode", ceil as i64),
        ];
        self.op("MaxPool", &[i[0]], out, attrs)
    }

    /// constant_pad_nd's pads run from the last dimension back, (begin, end) each; ONNX's are
    /// all the begins, then all the ends, from the first.
    fn pad(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        let info = self.g.tensor(i[0])?.clone();
        let rank = info.sizes.len();
        let torch_pads = self.ints(i[1])?;
        let mut pads = vec![0; 2 * rank];
        for (k, pair) in torch_pads.chunks(2).enumerate() {
            let dim = rank - 1 - k;
            pads[dim] = pair[0];
            pads[rank + dim] = pair[1];
        }
        let value = match self.g.constant(i[2])? {
            Constant::Int(v) => *v as f64,
            Constant::Float(v) => *v,
            _ => 0.0,
        };
        let x = self.name(i[0])?;
        let p = self.int64s(&pads);
        let v = self.scalar(value, &info.dtype)?;
        let y = self.out_name(out);
        self.emit("Pad", &[&x, &p, &v], &y, vec![AttributeProto::string("mode", "constant")]);
        Ok(())
    }

    /// softmax(q kᵀ · scale) v, as PyTorch's math path computes it.
    fn attention(&mut self, i: &[ValueId], out: ValueId) -> Result<()> {
        if !self.is_none(i[3]) || self.bool(i[5])? {
            bail!("attention with a mask or causal attention is not translated");
        }
        let q_info = self.g.tensor(i[0])?.clone();
        let rank = q_info.sizes.len() as i64;
        let scale = match i.get(6).map(|&v| self.g.constant(v)).transpose()? {
            Some(Constant::Float(s)) => *s,
            _ => 1.0 / (*q_info.sizes.last().context("a scalar query")? as f64).sqrt(),
        };
        let (q, k, v) = (self.name(i[0])?, self.name(i[1])?, self.name(i[2])?);
        let mut perm: Vec<i64> = (0..rank).collect();
        perm.swap(rank as usize - 2, rank as usize - 1);
        let kt = self.temp("k_t");
        self.emit("Transpose", &[&k], &kt, vec![AttributeProto::ints("perm", &perm)]);
        let scores = self.temp("scores");
        self.emit("MatMul", &[&q, &kt], &scores, vec![]);
        let s = self.scalar(scale, &q_info.dtype)?;
        let scaled = self.temp("scores");
        self.emit("Mul", &[&scores, &s], &scaled, vec![]);
        let p = self.temp("attention");
        self.emit("Softmax", &[&scaled], &p, vec![AttributeProto::int("axis", -1)]);
        let y = self.out_name(out);
        self.emit("MatMul", &[&p, &v], &y, vec![]);
        Ok(())
    }

    // ---- helpers ----

    /// One node from traced values to a traced value.
    fn op(&mut self, op: &str, inputs: &[ValueId], out: ValueId, attrs: Vec<AttributeProto>) -> Result<()> {
        self.require(op)?;
        let names = inputs.iter().map(|&v| self.name(v)).collect::<Result<Vec<_>>>()?;
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let y = self.out_name(out);
        self.emit(op, &refs, &y, attrs);
        Ok(())
    }

    fn require(&self, op: &str) -> Result<()> {
        let needed = needs_opset(op);
        if self.opset < needed {
            crate::bail_user!(
                "--opset {} is too old for the ONNX operator {op} this model needs: use --opset {needed} or newer",
                self.opset
            );
        }
        Ok(())
    }

    fn emit(&mut self, op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>) {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.to_string()],
            name: format!("{op}_{}", self.nodes.len()),
            op_type: op.to_string(),
            attribute,
        });
    }

    fn reduce_mean(&mut self, x: &str, axes: &[i64], keep: bool, y: &str) {
        let keep = AttributeProto::int("keepdims", keep as i64);
        if self.opset >= 18 {
            let a = self.int64s(axes);
            self.emit("ReduceMean", &[x, &a], y, vec![keep]);
        } else {
            self.emit("ReduceMean", &[x], y, vec![AttributeProto::ints("axes", axes), keep]);
        }
    }

    /// The traced value's own name as a node's output (the graph's output is named OUTPUT).
    fn out_name(&mut self, v: ValueId) -> String {
        let name = if v == self.g.output { OUTPUT.to_string() } else { format!("t{v}") };
        self.names.insert(v, name.clone());
        name
    }

    /// `out` is `x` (an identity in evaluation): the same name, unless `out` is the graph's output.
    fn alias(&mut self, x: ValueId, out: ValueId) -> Result<()> {
        let name = self.name(x)?;
        match out == self.g.output {
            true => self.emit("Identity", &[&name], OUTPUT, vec![]),
            false => {
                self.names.insert(out, name);
            }
        }
        Ok(())
    }

    /// `out` as `x` cast to the dtype the tracer saw for `out`.
    fn cast_to_traced(&mut self, x: ValueId, out: ValueId) -> Result<()> {
        let name = self.name(x)?;
        let from = self.g.tensor(x)?.dtype.clone();
        let to = self.g.tensor(out)?.dtype.clone();
        match from == to {
            true => self.alias(x, out),
            false => {
                let y = self.out_name(out);
                self.emit("Cast", &[&name], &y, vec![AttributeProto::int("to", onnx_type(&to)? as i64)]);
                Ok(())
            }
        }
    }

    /// `name` cast to the dtype the tracer saw for `out`.
    fn cast_named(&mut self, name: &str, out: ValueId) -> Result<()> {
        let to = onnx_type(&self.g.tensor(out)?.dtype)?;
        let y = self.out_name(out);
        self.emit("Cast", &[name], &y, vec![AttributeProto::int("to", to as i64)]);
        Ok(())
    }

    /// A traced tensor's number of dimensions.
    fn rank(&self, v: ValueId) -> Result<i64> {
        Ok(self.g.tensor(v)?.sizes.len() as i64)
    }

    fn sizes(&self, v: ValueId) -> Result<Vec<i64>> {
        match self.weight_sizes.get(&v) {
            Some(s) => Ok(s.clone()),
            None => Ok(self.g.tensor(v)?.sizes.clone()),
        }
    }

    fn name(&self, v: ValueId) -> Result<String> {
        self.names.get(&v).cloned().with_context(|| format!("value {v} is used before it is computed"))
    }

    /// An arithmetic operand: a traced tensor, or a number as a scalar of `like`'s dtype.
    fn operand(&mut self, v: ValueId, like: ValueId) -> Result<String> {
        match self.g.constants.get(&v) {
            Some(Constant::Int(n)) => self.scalar(*n as f64, &self.g.tensor(like)?.dtype.clone()),
            Some(Constant::Float(f)) => self.scalar(*f, &self.g.tensor(like)?.dtype.clone()),
            Some(c) => bail!("an operand {c:?}"),
            None => self.name(v),
        }
    }

    /// A weight, or (when the graph passes None) a constant vector of `fill`.
    fn weight_or(&mut self, v: ValueId, fill: f64, n: i64, dtype: &str) -> Result<String> {
        if !self.is_none(v) {
            return self.name(v);
        }
        let name = self.temp("fill");
        let t = Tensor::full([n], fill, (kind(dtype)?, tch::Device::Cpu));
        self.initializers.push(initializer(&name, &t));
        Ok(name)
    }

    fn scalar(&mut self, value: f64, dtype: &str) -> Result<String> {
        let name = self.temp("scalar");
        let t = Tensor::from(value).to_kind(kind(dtype)?);
        self.initializers.push(initializer(&name, &t));
        Ok(name)
    }

    fn int64s(&mut self, values: &[i64]) -> String {
        let name = self.temp("ints");
        self.initializers.push(initializer(&name, &Tensor::from_slice(values)));
        name
    }

    fn int64_scalar(&mut self, value: i64) -> String {
        let name = self.temp("index");
        self.initializers.push(initializer(&name, &Tensor::from(value)));
        name
    }

    fn temp(&mut self, what: &str) -> String {
        self.fresh += 1;
        format!("{what}_{}", self.fresh)
    }

    fn is_none(&self, v: ValueId) -> bool {
        matches!(self.g.constants.get(&v), Some(Constant::None))
    }

    fn int(&self, v: ValueId) -> Result<i64> {
        match self.g.constant(v)? {
            Constant::Int(n) => Ok(*n),
            c => bail!("expected an integer, got {c:?}"),
        }
    }

    fn float(&self, v: ValueId) -> Result<f64> {
        match self.g.constant(v)? {
            Constant::Float(f) => Ok(*f),
            Constant::Int(n) => Ok(*n as f64),
            c => bail!("expected a number, got {c:?}"),
        }
    }

    fn bool(&self, v: ValueId) -> Result<bool> {
        match self.g.constant(v)? {
            Constant::Bool(b) => Ok(*b),
            Constant::Int(n) => Ok(*n != 0),
            c => bail!("expected a bool, got {c:?}"),
        }
    }

    /// An int list: a constant, or a ListConstruct of integer constants.
    fn ints(&self, v: ValueId) -> Result<Vec<i64>> {
        match (self.g.constants.get(&v), self.lists.get(&v)) {
            (Some(Constant::Ints(l)), _) => Ok(l.clone()),
            (Some(Constant::Int(n)), _) => Ok(vec![*n]),
            (_, Some(items)) => items.iter().map(|&i| self.int(i)).collect(),
            _ => bail!("expected a list of integers"),
        }
    }
}

/// A dimension index from PyTorch's negative form.
fn wrap(d: i64, rank: i64) -> i64 {
    if d < 0 {
        d + rank
    } else {
        d
    }
}

fn kind(dtype: &str) -> Result<Kind> {
    Ok(match dtype {
        "Float" => Kind::Float,
        "Half" => Kind::Half,
        "BFloat16" => Kind::BFloat16,
        "Double" => Kind::Double,
        "Byte" => Kind::Uint8,
        "Long" => Kind::Int64,
        other => bail!("the dtype {other} is not exported"),
    })
}

/// The ONNX element type of a traced (c10) dtype name.
pub fn onnx_type(dtype: &str) -> Result<i32> {
    onnx_type_of(kind(dtype)?)
}

pub fn onnx_type_of(kind: Kind) -> Result<i32> {
    Ok(match kind {
        Kind::Float => data_type::FLOAT,
        Kind::Half => data_type::FLOAT16,
        Kind::BFloat16 => data_type::BFLOAT16,
        Kind::Double => data_type::DOUBLE,
        Kind::Uint8 => data_type::UINT8,
        Kind::Int64 => data_type::INT64,
        other => bail!("the dtype {other:?} is not exported"),
    })
}

/// A tensor's values as an ONNX initializer named `name`.
pub fn initializer(name: &str, t: &Tensor) -> TensorProto {
    let t = t.to_device(tch::Device::Cpu).contiguous();
    let kind = t.kind();
    let numel = t.numel();
    let mut raw_data = vec![0u8; numel * kind.elt_size_in_bytes()];
    t.copy_data_u8(&mut raw_data, numel);
    TensorProto {
        dims: t.size(),
        data_type: onnx_type_of(kind).expect("weights are of an exported dtype"),
        name: name.to_string(),
        raw_data,
    }
}
