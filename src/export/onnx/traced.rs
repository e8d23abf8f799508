//! The traced graph as the shim describes it (`shim::jit_trace_graph`): the forward pass as
//! libtorch's tracer recorded it, aten operator by operator, with every tensor's dtype and sizes
//! as traced and every constant's value.
use std::collections::{HashMap, HashSet};

use anyhow::{bail, Context, Result};

/// A value of the traced graph, by the tracer's number.
pub type ValueId = u64;

#[derive(Debug, Clone, PartialEq)]
pub enum Constant {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Device(String),
}

/// A tensor's element type and sizes as traced (the batch included, at the traced size).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// c10's name: Float, Half, BFloat16, Double, Byte, Long, Bool.
    pub dtype: String,
    pub sizes: Vec<i64>,
}

#[derive(Debug, Clone)]
pub struct Node {
    /// The operator, e.g. aten::_convolution, prim::ListConstruct.
    pub kind: String,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

#[derive(Debug, Default)]
pub struct TracedGraph {
    pub input: ValueId,
    pub output: ValueId,
    /// The weights' values by their state_dict names.
    pub weights: HashMap<ValueId, String>,
    pub constants: HashMap<ValueId, Constant>,
    /// The tensors' dtypes and sizes: the input's and each node output's.
    pub tensors: HashMap<ValueId, TensorInfo>,
    /// The nodes that the output depends on, in the graph's order.
    pub nodes: Vec<Node>,
}

impl TracedGraph {
    pub fn parse(text: &str) -> Result<Self> {
        let mut g = TracedGraph::default();
        let (mut input, mut output) = (None, None);
        for (n, line) in text.lines().enumerate() {
            parse_line(&mut g, line, &mut input, &mut output)
                .with_context(|| format!("traced graph line {}: {line}", n + 1))?;
        }
        g.input = input.context("the traced graph has no input")?;
        g.output = output.context("the traced graph has no output")?;
        g.keep_what_the_output_needs();
        Ok(g)
    }

    /// Drops the nodes the output does not depend on (the tracer records every operation).
    fn keep_what_the_output_needs(&mut self) {
        let mut needed: HashSet<ValueId> = HashSet::from([self.output]);
        let mut kept = Vec::new();
        for node in std::mem::take(&mut self.nodes).into_iter().rev() {
            if node.outputs.iter().any(|o| needed.contains(o)) {
                needed.extend(node.inputs.iter().copied());
                kept.push(node);
            }
        }
        kept.reverse();
        self.nodes = kept;
    }

    pub fn tensor(&self, v: ValueId) -> Result<&TensorInfo> {
        self.tensors.get(&v).with_context(|| format!("value {v} is not a traced tensor"))
    }

    pub fn constant(&self, v: ValueId) -> Result<&Constant> {
        self.constants.get(&v).with_context(|| format!("value {v} is not a constant"))
    }
}

fn parse_line(
    g: &mut TracedGraph,
    line: &str,
    input: &mut Option<ValueId>,
    output: &mut Option<ValueId>,
) -> Result<()> {
    let words: Vec<&str> = line.split(' ').collect();
    let id = |i: usize| -> Result<ValueId> { Ok(words.get(i).context("too short")?.parse()?) };
    let ints = |from: usize| -> Result<Vec<i64>> { words[from..].iter().map(|w| Ok(w.parse()?)).collect() };
    match words[0] {
        "input" | "value" => {
            let info = TensorInfo { dtype: words.get(2).context("no dtype")?.to_string(), sizes: ints(3)? };
            if words[0] == "input" {
                *input = Some(id(1)?);
            }
            g.tensors.insert(id(1)?, info);
        }
        "weight" => {
            g.weights.insert(id(1)?, words.get(2).context("no name")?.to_string());
        }
        "const" => {
            let value = match *words.get(2).context("no kind")? {
                "none" => Constant::None,
                "bool" => Constant::Bool(words.get(3) == Some(&"1")),
                "int" => Constant::Int(words.get(3).context("no value")?.parse()?),
                "float" => Constant::Float(words.get(3).context("no value")?.parse()?),
                "str" => Constant::Str(words.get(3).context("no value")?.to_string()),
                "ints" => Constant::Ints(ints(3)?),
                "floats" => Constant::Floats(words[3..].iter().map(|w| Ok(w.parse()?)).collect::<Result<_>>()?),
                "device" => Constant::Device(words.get(3).context("no value")?.to_string()),
                other => bail!("unknown constant kind {other}"),
            };
            g.constants.insert(id(1)?, value);
        }
        "node" => {
            let at_in = words.iter().position(|w| *w == "in").context("no inputs")?;
            let at_out = words.iter().position(|w| *w == "out").context("no outputs")?;
            let ids = |r: std::ops::Range<usize>| -> Result<Vec<ValueId>> {
                words[r].iter().map(|w| Ok(w.parse()?)).collect()
            };
            g.nodes.push(Node {
                kind: words.get(1).context("no kind")?.to_string(),
                inputs: ids(at_in + 1..at_out)?,
                outputs: ids(at_out + 1..words.len())?,
            });
        }
        "output" => *output = Some(id(1)?),
        other => bail!("unknown line kind {other}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_and_drops_what_the_output_does_not_need() {
        let text = "input 1 Float 2 3 4 4\nweight 2 fc.weight\nconst 3 ints 1 1\n\
                    const 4 float 1.0000000000000001e-05\nnode aten::relu in 1 out 5\nvalue 5 Float 2 3 4 4\n\
                    node aten::sigmoid in 1 out 6\nvalue 6 Float 2 3 4 4\nconst 7 none\nconst 8 str tanh\noutput 5\n";
        let g = TracedGraph::parse(text).unwrap();
        assert_eq!((g.input, g.output), (1, 5));
        assert_eq!(g.nodes.len(), 1);
        assert_eq!(g.nodes[0].kind, "aten::relu");
        assert_eq!(g.weights[&2], "fc.weight");
        assert_eq!(g.constants[&3], Constant::Ints(vec![1, 1]));
        assert_eq!(g.constants[&4], Constant::Float(1e-5));
        assert_eq!(g.constants[&7], Constant::None);
        assert_eq!(g.constants[&8], Constant::Str("tanh".into()));
        assert_eq!(g.tensor(5).unwrap().sizes, vec![2, 3, 4, 4]);
        assert!(TracedGraph::parse("node aten::relu in 1 out 2\n").is_err());
    }
}
