//! Where a training step's time goes, read from a Chrome trace of libtorch's profiler: the one
//! `ringtrain bench --profile` writes, or torch.profiler's `export_chrome_trace` (the same Kineto
//! format, so both are read and grouped by this one code). The steps are the trace's
//! `ProfilerStep#N` scopes (torch.profiler's `prof.step()`, ringtrain's own annotations).
//!
//! The timeline divided is the device's: on a GPU the kernels, copies and memsets launched from
//! inside the steps (matched to their launch by correlation id), from the first one's start to the
//! last one's end; on the CPU the operators of every thread inside the steps, each instant given
//! to the innermost operator running then (its self time). An instant where several run at once
//! (streams, threads) is shared equally among them, except communication, which counts only
//! where nothing else runs (exposed communication: overlapped all-reduce costs no step time).
//! Where nothing runs is "idle". So the classes and idle add up to the step time of the trace.
//!
//! Each kernel or operator is classed by its name and the names of the operators it ran inside
//! (its launching `aten::` op, autograd node, `Optimizer.step`), by the first of these rules
//! (`classify`) that matches any of them: communication, optimizer, Triton's generated kernels (by their
//! prefix: pointwise, reduction, or normalisation when their fused ops name one), convolutions,
//! matrix multiplies, normalisation, reductions, copies, pointwise. The host's share is told
//! apart: the time per step some CPU thread spends inside an operator or a CUDA API call.
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

use crate::bail_user;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    ConvForward,
    ConvDataGrad,
    ConvWeightGrad,
    /// A convolution's backward where the trace does not tell data from weight gradient (the
    /// CPU computes both in one operator; some cuDNN kernels name neither).
    ConvBackward,
    MatMul,
    Norm,
    Pointwise,
    Reduction,
    Optimizer,
    Copy,
    Communication,
    Other,
    Idle,
}

impl Class {
    pub const ALL: [Class; 13] = [
        Class::ConvForward,
        Class::ConvDataGrad,
        Class::ConvWeightGrad,
        Class::ConvBackward,
        Class::MatMul,
        Class::Norm,
        Class::Pointwise,
        Class::Reduction,
        Class::Optimizer,
        Class::Copy,
        Class::Communication,
        Class::Other,
        Class::Idle,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Class::ConvForward => "convolution forward",
            Class::ConvDataGrad => "convolution data gradient",
            Class::ConvWeightGrad => "convolution weight gradient",
            Class::ConvBackward => "convolution backward (data + weight)",
            Class::MatMul => "matrix multiply, attention",
            Class::Norm => "normalisation",
            Class::Pointwise => "pointwise",
            Class::Reduction => "reductions, pooling, loss",
            Class::Optimizer => "optimizer, loss scaling",
            Class::Copy => "copies and casts",
            Class::Communication => "communication (exposed)",
            Class::Other => "other",
            Class::Idle => "idle (nothing running)",
        }
    }
}

/// Substrings (lowercase) that put a name in a class, in the order they are tried.
const COMMUNICATION: &[&str] = &[
    "nccl",
    "gloo",
    "c10d::",
    "record_param_comms",
    "allreduce",
    "all_reduce",
    "allgather",
];
const OPTIMIZER: &[&str] = &[
    "optimizer.",
    "_fused_sgd",
    "_fused_adam",
    "multi_tensor_apply",
    "_foreach_",
    "_amp_foreach_non_finite",
    "_amp_update_scale",
];
const CONV_BACKWARD: &[&str] = &[
    "convolution_backward",
    "convolutionbackward",
    "conv_depthwise2d_backward",
];
const CONV: &[&str] = &["convolution", "conv2d", "conv_depthwise", "conv3d"];
const MATMUL: &[&str] = &[
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::matmul",
    "aten::linear",
    "addmmbackward",
    "mmbackward",
    "gemm",
    "cublas",
    "scaled_dot_product",
    "attention",
    "flash",
];
const NORM: &[&str] = &[
    "batch_norm",
    "batchnorm",
    "layer_norm",
    "layernorm",
    "group_norm",
    "groupnorm",
    "rms_norm",
    "welford",
    "bn_fw",
    "bn_bw",
    "bn_stats_",
    "bn_act_",
    "bn_relu",
    "ln_forward",
    "ln_backward",
];
const REDUCTION: &[&str] = &[
    "reduce_kernel",
    "aten::sum",
    "aten::mean",
    "aten::max",
    "aten::argmax",
    "aten::topk",
    "pool",
    "softmax",
    "nll_loss",
    "nllloss",
    "cross_entropy",
    "aten::norm",
    "linalg_vector_norm",
    "sumbackward",
    "meanbackward",
];
const COPY: &[&str] = &[
    "memcpy",
    "memset",
    "copy",
    "aten::to",
    "aten::contiguous",
    "aten::clone",
    "aten::cat",
    "aten::stack",
    "fill_",
    "zero_",
    "nchwtonhwc",
    "nhwctonchw",
    "aten::index",
    "gather",
    "scatter",
];
const POINTWISE: &[&str] = &[
    "elementwise",
    "relu",
    "threshold",
    "aten::add",
    "aten::sub",
    "aten::mul",
    "aten::div",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "dropout",
    "clamp",
    "aten::where",
    "aten::pow",
    "aten::sqrt",
    "aten::exp",
    "aten::neg",
    "aten::lerp",
    "hardswish",
    "addcmul",
    "addcdiv",
    "addbackward",
    "mulbackward",
    "accumulategrad",
    "scale_add",
];

fn any(names: &[String], patterns: &[&str]) -> bool {
    names.iter().any(|n| patterns.iter().any(|p| n.contains(p)))
}

/// The class of a kernel or operator: `chain` holds the lowercase names of the operators it ran
/// inside (outermost first) and, last, its own (a kernel's name cut before its template
/// arguments).
pub fn classify(chain: &[String]) -> Class {
    let own = chain.last().map(String::as_str).unwrap_or("");
    if any(chain, COMMUNICATION) {
        return Class::Communication;
    }
    if any(chain, OPTIMIZER) {
        return Class::Optimizer;
    }
    // torch.compile's kernels: convolutions and matrix multiplies stay cuDNN's and cuBLAS's (or
    // `triton_tem` templates); the rest is named after the ops fused into it.
    if let Some(t) = chain.iter().find(|n| n.starts_with("triton_")) {
        return if NORM.iter().any(|p| t.contains(p)) || t.contains("_native_norm") {
            Class::Norm
        } else if t.starts_with("triton_tem") {
            Class::MatMul
        } else if t.starts_with("triton_poi") {
            Class::Pointwise
        } else if t.starts_with("triton_red") || t.starts_with("triton_per") {
            Class::Reduction
        } else {
            Class::Other
        };
    }
    if any(chain, CONV_BACKWARD) {
        return if own.contains("wgrad") {
            Class::ConvWeightGrad
        } else if own.contains("dgrad") {
            Class::ConvDataGrad
        } else {
            Class::ConvBackward
        };
    }
    if any(chain, CONV) {
        return Class::ConvForward;
    }
    for (patterns, class) in [
        (MATMUL, Class::MatMul),
        (NORM, Class::Norm),
        (REDUCTION, Class::Reduction),
        (COPY, Class::Copy),
        (POINTWISE, Class::Pointwise),
    ] {
        if any(chain, patterns) {
            return class;
        }
    }
    Class::Other
}

/// A kernel's name without `void `, template arguments and parameters, for classing and tables:
/// `void at::native::vectorized_elementwise_kernel<4, ...>(...)` →
/// `at::native::vectorized_elementwise_kernel`.
pub fn short_name(name: &str) -> String {
    let n = name
        .strip_prefix("void ")
        .unwrap_or(name)
        .replace("(anonymous namespace)::", "");
    let end = n.find(['<', '(']).unwrap_or(n.len());
    n[..end].trim().to_string()
}

/// One trace's step, divided.
#[derive(Debug, Clone)]
pub struct StepProfile {
    /// "CUDA" or "CPU": whose timeline was divided.
    pub device: &'static str,
    pub steps: usize,
    /// Milliseconds per step of each class, idle included (every class, 0 where none ran).
    pub classes: Vec<(Class, f64)>,
    /// Milliseconds per step some host thread spent inside an operator or a CUDA API call.
    pub host_ms: f64,
    /// Each kernel's (GPU) or operator's (CPU) own time per step by name and class (one name can
    /// run in several: `aten::add_` in a convolution's backward and alone), largest first: on the
    /// CPU an operator's self time (its children's left out), as torch.profiler's
    /// `self_cpu_time_total`.
    pub by_name: Vec<(String, Class, f64)>,
}

impl StepProfile {
    pub fn ms(&self, class: Class) -> f64 {
        self.classes.iter().find(|(c, _)| *c == class).map_or(0.0, |x| x.1)
    }

    /// Milliseconds per step of the divided timeline: the sum of the classes.
    pub fn step_ms(&self) -> f64 {
        self.classes.iter().map(|c| c.1).sum()
    }
}

#[derive(Debug, Clone)]
struct Ev {
    name: String,
    cat: String,
    tid: String,
    ts: f64,
    end: f64,
    correlation: Option<i64>,
}

/// A trace event as the file has it: only the fields read here are parsed (a CPU trace of a
/// large network holds millions of events), its strings borrowed where they have no escapes.
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(borrow, default)]
    ph: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    cat: Option<Cow<'a, str>>,
    /// A number, or a name ("PyTorch Profiler").
    #[serde(default)]
    pid: Option<Value>,
    #[serde(default)]
    tid: Option<Value>,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    args: Option<RawArgs>,
}

#[derive(Deserialize)]
struct RawArgs {
    #[serde(default)]
    correlation: Option<i64>,
}

/// Chrome's trace format: an object with `traceEvents`, or the bare array.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawTrace<'a> {
    Object {
        #[serde(borrow, rename = "traceEvents")]
        events: Vec<RawEvent<'a>>,
    },
    Array(#[serde(borrow)] Vec<RawEvent<'a>>),
}

/// The complete events ("ph": "X") of a trace's text.
fn events(text: &str) -> std::result::Result<Vec<Ev>, serde_json::Error> {
    let raw = match serde_json::from_str::<RawTrace>(text)? {
        RawTrace::Object { events } | RawTrace::Array(events) => events,
    };
    let id = |v: &Option<Value>| match v {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    Ok(raw
        .into_iter()
        .filter(|e| e.ph.as_deref() == Some("X"))
        .filter_map(|e| {
            let (ts, dur) = (e.ts?, e.dur?);
            Some(Ev {
                name: e.name.as_deref().unwrap_or("").to_string(),
                cat: e.cat.as_deref().unwrap_or("").to_string(),
                tid: format!("{}/{}", id(&e.pid), id(&e.tid)),
                ts,
                end: ts + dur.max(0.0),
                correlation: e.args.and_then(|a| a.correlation),
            })
        })
        .collect())
}

/// A step's host scope. On CUDA, Kineto mirrors each scope on the GPU's timeline
/// (`gpu_user_annotation`, from the step's first kernel to its last): not a step of its own.
fn is_step(e: &Ev) -> bool {
    e.name.starts_with("ProfilerStep#") && e.cat != "gpu_user_annotation"
}

fn is_gpu(e: &Ev) -> bool {
    matches!(e.cat.as_str(), "kernel" | "gpu_memcpy" | "gpu_memset")
}

/// Host-side scopes: operators and user scopes (not the steps themselves).
fn is_host_op(e: &Ev) -> bool {
    matches!(e.cat.as_str(), "cpu_op" | "user_annotation" | "Operator") && !is_step(e)
}

fn is_api_call(e: &Ev) -> bool {
    matches!(e.cat.as_str(), "cuda_runtime" | "cuda_driver")
}

/// How the host events nest, thread by thread: each one's innermost enclosing host op, and the
/// pieces of each op's self time (start, end, op).
struct Nesting {
    parent: Vec<Option<usize>>,
    self_pieces: Vec<(f64, f64, usize)>,
}

fn nest(evs: &[Ev], wanted: impl Fn(&Ev) -> bool) -> Nesting {
    let mut by_thread: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, e) in evs.iter().enumerate() {
        if wanted(e) {
            by_thread.entry(&e.tid).or_default().push(i);
        }
    }
    let mut parent = vec![None; evs.len()];
    let mut self_pieces = Vec::new();
    for mut ids in by_thread.into_values() {
        // Outer before inner: by start, then longest first.
        ids.sort_by(|&a, &b| evs[a].ts.total_cmp(&evs[b].ts).then(evs[b].end.total_cmp(&evs[a].end)));
        // The open ops, innermost last, each with where its own (uncovered) time resumes.
        let mut open: Vec<(usize, f64)> = Vec::new();
        let close = |open: &mut Vec<(usize, f64)>, pieces: &mut Vec<(f64, f64, usize)>, upto: f64| {
            while let Some(&(top, from)) = open.last() {
                if evs[top].end > upto {
                    break;
                }
                if evs[top].end > from {
                    pieces.push((from, evs[top].end, top));
                }
                open.pop();
                if let Some(outer) = open.last_mut() {
                    outer.1 = outer.1.max(evs[top].end);
                }
            }
        };
        for id in ids {
            let e = &evs[id];
            close(&mut open, &mut self_pieces, e.ts);
            if let Some((top, from)) = open.last_mut() {
                if e.ts > *from {
                    self_pieces.push((*from, e.ts, *top));
                }
                *from = from.max(e.end.min(evs[*top].end));
                parent[id] = Some(*top);
            }
            open.push((id, e.ts));
        }
        close(&mut open, &mut self_pieces, f64::INFINITY);
    }
    Nesting { parent, self_pieces }
}

/// Classes host events by their chain of enclosing ops (API calls left out), each distinct
/// chain once.
struct Classifier<'a> {
    evs: &'a [Ev],
    parent: &'a [Option<usize>],
    seen: HashMap<String, Class>,
}

impl Classifier<'_> {
    /// The class of something named `own` that ran inside host event `inside` (and its
    /// enclosing ops); `inside` itself counts unless it is an API call.
    fn class(&mut self, inside: Option<usize>, own: &str) -> Class {
        let mut chain = vec![short_name(own).to_lowercase()];
        let mut at = inside;
        while let Some(i) = at {
            if !is_api_call(&self.evs[i]) {
                chain.push(self.evs[i].name.to_lowercase());
            }
            at = self.parent[i];
        }
        chain.reverse();
        let key = chain.join("\u{1}");
        if let Some(&c) = self.seen.get(&key) {
            return c;
        }
        let c = classify(&chain);
        self.seen.insert(key, c);
        c
    }
}

/// Divides [from, to) among `pieces` (start, end, class): at each instant equally among the
/// non-communication pieces running, communication only where nothing else runs, idle where
/// nothing does. Returns µs per class.
fn divide(pieces: &[(f64, f64, Class)], from: f64, to: f64) -> HashMap<Class, f64> {
    let mut edges: Vec<(f64, i32, usize)> = Vec::new(); // (time, +1 start / -1 end, piece)
    for (i, &(s, e, _)) in pieces.iter().enumerate() {
        let (s, e) = (s.max(from), e.min(to));
        if e > s {
            edges.push((s, 1, i));
            edges.push((e, -1, i));
        }
    }
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut out: HashMap<Class, f64> = HashMap::new();
    let mut active: Vec<usize> = Vec::new();
    let mut t = from;
    let mut give = |active: &Vec<usize>, span: f64| {
        if span <= 0.0 {
            return;
        }
        let compute: Vec<usize> = active
            .iter()
            .copied()
            .filter(|&i| pieces[i].2 != Class::Communication)
            .collect();
        let share: &[usize] = if compute.is_empty() { active } else { &compute };
        if share.is_empty() {
            *out.entry(Class::Idle).or_default() += span;
        }
        for &i in share {
            *out.entry(pieces[i].2).or_default() += span / share.len() as f64;
        }
    };
    for (time, kind, i) in edges {
        give(&active, time - t);
        t = time;
        if kind > 0 {
            active.push(i);
        } else if let Some(p) = active.iter().position(|&a| a == i) {
            active.swap_remove(p);
        }
    }
    give(&active, to - t);
    out
}

/// Total length of the union of `spans` inside the windows.
fn covered(spans: &mut [(f64, f64)], windows: &[(f64, f64)]) -> f64 {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    for &(ws, we) in windows {
        let mut reach = ws;
        for &(s, e) in spans.iter() {
            let (s, e) = (s.max(reach), e.min(we));
            if e > s {
                total += e - s;
                reach = e;
            }
        }
    }
    total
}

/// Reads a Chrome trace file (`.json`, or `.json.gz` as torch.profiler can write) and divides
/// its steps.
pub fn read(path: &Path) -> Result<StepProfile> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        if let Err(e) = std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut s) {
            bail_user!("{}: not a gzip-compressed trace: {e}", path.display());
        }
        s
    } else {
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(_) => bail_user!("{}: not a Chrome trace (not UTF-8 text)", path.display()),
        }
    };
    let evs = match events(&text) {
        Ok(evs) => evs,
        Err(e) => bail_user!("{}: not a Chrome trace (JSON with traceEvents): {e}", path.display()),
    };
    drop(text);
    match divide_steps(&evs) {
        Ok(p) => Ok(p),
        Err(e) => bail_user!("{}: {e}", path.display()),
    }
}

/// The division of a trace's events (see the module's comment).
fn divide_steps(evs: &[Ev]) -> std::result::Result<StepProfile, String> {
    let mut windows: Vec<(f64, f64)> = evs.iter().filter(|e| is_step(e)).map(|e| (e.ts, e.end)).collect();
    if windows.is_empty() {
        return Err(
            "no ProfilerStep#N scopes: profile with torch.profiler's schedule and prof.step() \
                    (or ringtrain bench --profile)"
                .into(),
        );
    }
    windows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let steps = windows.len();
    let in_steps = |t: f64| windows.iter().any(|&(s, e)| t >= s && t < e);
    let host = nest(evs, |e| is_host_op(e) || is_api_call(e));
    let mut classes = Classifier {
        evs,
        parent: &host.parent,
        seen: HashMap::new(),
    };
    let gpu: Vec<usize> = (0..evs.len()).filter(|&i| is_gpu(&evs[i])).collect();

    let mut by_name: HashMap<(String, Class), f64> = HashMap::new();
    let (device, pieces, from, to) = if gpu.is_empty() {
        // The CPU: each host op's self time, classed by its chain.
        let mut class_of: HashMap<usize, Class> = HashMap::new();
        let mut pieces = Vec::new();
        for &(s, e, i) in host.self_pieces.iter().filter(|p| !is_api_call(&evs[p.2])) {
            let class = *class_of
                .entry(i)
                .or_insert_with(|| classes.class(host.parent[i], &evs[i].name));
            pieces.push((s, e, class));
            let inside = windows
                .iter()
                .map(|&(ws, we)| (e.min(we) - s.max(ws)).max(0.0))
                .sum::<f64>();
            *by_name.entry((evs[i].name.clone(), class)).or_default() += inside;
        }
        ("CPU", pieces, windows[0].0, windows[steps - 1].1)
    } else {
        // The GPU: what was launched inside the steps, classed by the launch's enclosing ops.
        let launches: HashMap<i64, usize> = evs
            .iter()
            .enumerate()
            .filter(|(_, e)| is_api_call(e) && in_steps(e.ts))
            .filter_map(|(i, e)| Some((e.correlation?, i)))
            .collect();
        let mut pieces = Vec::new();
        for &k in &gpu {
            let e = &evs[k];
            let Some(&launch) = e.correlation.and_then(|c| launches.get(&c)) else {
                continue;
            };
            let class = classes.class(Some(launch), &e.name);
            pieces.push((e.ts, e.end, class));
            *by_name.entry((short_name(&e.name), class)).or_default() += e.end - e.ts;
        }
        if pieces.is_empty() {
            return Err("the trace has GPU kernels, but none launched inside a ProfilerStep".into());
        }
        let from = pieces.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let to = pieces.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
        ("CUDA", pieces, from, to)
    };
    let divided = divide(&pieces, from, to);
    // The CPU's divided timeline is the steps themselves; gaps between them are not time of any.
    let between: f64 = match device {
        "CPU" => windows.windows(2).map(|w| (w[1].0 - w[0].1).max(0.0)).sum(),
        _ => 0.0,
    };
    let per_step = |us: f64| us / 1000.0 / steps as f64;
    let classes: Vec<(Class, f64)> = Class::ALL
        .iter()
        .map(|&c| {
            let us = divided.get(&c).copied().unwrap_or(0.0) - if c == Class::Idle { between } else { 0.0 };
            (c, per_step(us.max(0.0)))
        })
        .collect();
    let mut host_spans: Vec<(f64, f64)> = evs
        .iter()
        .filter(|e| is_host_op(e) || is_api_call(e))
        .map(|e| (e.ts, e.end))
        .collect();
    let host_ms = per_step(covered(&mut host_spans, &windows));
    let mut by_name: Vec<(String, Class, f64)> = by_name.into_iter().map(|((n, c), us)| (n, c, per_step(us))).collect();
    by_name.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    Ok(StepProfile {
        device,
        steps,
        classes,
        host_ms,
        by_name,
    })
}

/// The profiles side by side, one column per (label, profile): milliseconds per step and share
/// of the step for every class, the step, the host's busy time and, where given, the step time
/// measured by a clock around the profiled steps (`measured_ms`).
pub fn table(columns: &[(&str, &StepProfile, Option<f64>)]) -> String {
    let heads: Vec<String> = columns.iter().map(|(l, p, _)| format!("{l} ({})", p.device)).collect();
    let w = heads.iter().map(|h| h.chars().count()).max().unwrap_or(0).max(20);
    let mut s = format!("{:<38}", "ms per step (share of the step)");
    for h in &heads {
        s += &format!("  {h:>w$}");
    }
    s.push('\n');
    let cell = |ms: f64, step: f64| {
        format!(
            "  {:>w$}",
            format!("{:>10.3} {:>7.1} %", ms, 100.0 * ms / step.max(1e-12))
        )
    };
    let mut row = |label: &str, cells: String| s += &format!("{label:<38}{cells}\n");
    for class in Class::ALL {
        if columns.iter().all(|(_, p, _)| p.ms(class) == 0.0) && class != Class::Idle {
            continue;
        }
        row(
            class.label(),
            columns.iter().map(|(_, p, _)| cell(p.ms(class), p.step_ms())).collect(),
        );
    }
    row(
        "step (sum of the above)",
        columns.iter().map(|(_, p, _)| cell(p.step_ms(), p.step_ms())).collect(),
    );
    row(
        "host busy (operators, CUDA API)",
        columns.iter().map(|(_, p, _)| cell(p.host_ms, p.step_ms())).collect(),
    );
    if columns.iter().any(|c| c.2.is_some()) {
        let measured = columns
            .iter()
            .map(|(_, p, m)| m.map_or(format!("  {:>w$}", "-"), |m| cell(m, p.step_ms())));
        row("step measured by the clock", measured.collect());
    }
    row(
        "steps profiled",
        columns.iter().map(|(_, p, _)| format!("  {:>w$}", p.steps)).collect(),
    );
    s
}

/// The `n` largest kernels or operators of a profile, one line each.
pub fn top_names(p: &StepProfile, n: usize) -> String {
    p.by_name
        .iter()
        .take(n)
        .map(|(name, class, ms)| {
            let name: String = if name.chars().count() > 72 {
                name.chars().take(71).chain(['…']).collect()
            } else {
                name.clone()
            };
            format!(
                "  {ms:>10.3} ms  {:>5.1} %  {name}  [{}]\n",
                100.0 * ms / p.step_ms().max(1e-12),
                class.label()
            )
        })
        .collect()
}

/// The table of `columns`, each profile's `top` largest kernels or operators after it, and every
/// figure as CSV rows (`csv_rows`).
pub fn report(columns: &[(&str, &StepProfile, Option<f64>)], top: usize) -> (String, Vec<[String; 4]>) {
    let mut text = table(columns);
    let mut rows = Vec::new();
    for &(label, p, measured) in columns {
        if top > 0 {
            text += &format!("\n{label}: the largest kernels and operators\n{}", top_names(p, top));
        }
        rows.extend(csv_rows(label, p, measured));
    }
    (text, rows)
}

/// The profile as CSV rows: `label,kind,name,ms_per_step` with kind `class`, `step`, `host`,
/// `measured` (the clock's step, where given) or `name` (one row per kernel or operator).
pub fn csv_rows(label: &str, p: &StepProfile, measured_ms: Option<f64>) -> Vec<[String; 4]> {
    let mut rows: Vec<[String; 4]> = p
        .classes
        .iter()
        .map(|(c, ms)| [label.into(), "class".into(), c.label().into(), format!("{ms:.6}")])
        .collect();
    rows.push([label.into(), "step".into(), "step".into(), format!("{:.6}", p.step_ms())]);
    rows.push([
        label.into(),
        "host".into(),
        "host busy".into(),
        format!("{:.6}", p.host_ms),
    ]);
    if let Some(ms) = measured_ms {
        rows.push([label.into(), "measured".into(), "step measured by the clock".into(), format!("{ms:.6}")]);
    }
    for (name, _, ms) in &p.by_name {
        rows.push([label.into(), "name".into(), name.clone(), format!("{ms:.6}")]);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: &str, cat: &str, tid: &str, ts: f64, dur: f64, correlation: Option<i64>) -> Ev {
        Ev {
            name: name.into(),
            cat: cat.into(),
            tid: tid.into(),
            ts,
            end: ts + dur,
            correlation,
        }
    }

    fn chain(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_lowercase()).collect()
    }

    #[test]
    fn names_are_classed_by_their_operators() {
        let c = |names: &[&str]| classify(&chain(names));
        assert_eq!(
            c(&["aten::conv2d", "aten::convolution", "sm90_xmma_fprop_implicit_gemm"]),
            Class::ConvForward
        );
        let bwd = "autograd::engine::evaluate_function: ConvolutionBackward0";
        assert_eq!(
            c(&[bwd, "aten::convolution_backward", "sm90_xmma_dgrad_implicit_gemm"]),
            Class::ConvDataGrad
        );
        assert_eq!(
            c(&[bwd, "aten::convolution_backward", "sm80_xmma_wgrad_implicit_gemm"]),
            Class::ConvWeightGrad
        );
        assert_eq!(c(&[bwd, "aten::convolution_backward"]), Class::ConvBackward);
        assert_eq!(
            c(&[
                "aten::batch_norm",
                "aten::cudnn_batch_norm",
                "cudnn::bn_fw_tr_1c11_kernel_nhwc"
            ]),
            Class::Norm
        );
        assert_eq!(
            c(&["aten::relu_", "at::native::vectorized_elementwise_kernel"]),
            Class::Pointwise
        );
        // ringtrain's fused kernels (--fused-norm), by their own names as well as their ops'.
        assert_eq!(c(&["ringtrain::bn_relu", "bn_act_forward"]), Class::Norm);
        assert_eq!(c(&["ln_backward_partial"]), Class::Norm);
        assert_eq!(c(&["ringtrain::layer_norm", "ln_forward"]), Class::Norm);
        assert_eq!(c(&["scale_add_backward_partial"]), Class::Pointwise);
        assert_eq!(c(&["ringtrain::scale_add", "scale_add_forward"]), Class::Pointwise);
        assert_eq!(
            c(&[
                "Optimizer.step#SGD.step",
                "aten::_fused_sgd_",
                "multi_tensor_apply_kernel"
            ]),
            Class::Optimizer
        );
        assert_eq!(
            c(&["aten::linear", "aten::addmm", "sm90_xmma_gemm_bf16bf16"]),
            Class::MatMul
        );
        assert_eq!(c(&["aten::cross_entropy_loss", "aten::log_softmax"]), Class::Reduction);
        assert_eq!(c(&["aten::to", "aten::_to_copy", "aten::copy_"]), Class::Copy);
        assert_eq!(c(&["Memcpy HtoD (Pageable -> Device)"]), Class::Copy);
        assert_eq!(
            c(&["nccl:all_reduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]),
            Class::Communication
        );
        // torch.compile's kernels by their prefix, normalisation by the ops fused in.
        let compiled = "CompiledFunctionBackward";
        assert_eq!(
            c(&[
                compiled,
                "triton_red_fused__native_batch_norm_legit_functional_convolution_backward_1"
            ]),
            Class::Norm
        );
        assert_eq!(
            c(&[compiled, "triton_poi_fused_add_relu_threshold_backward_3"]),
            Class::Pointwise
        );
        assert_eq!(c(&[compiled, "triton_per_fused_sum_4"]), Class::Reduction);
        assert_eq!(c(&["aten::foo"]), Class::Other);
    }

    #[test]
    fn kernel_names_lose_their_templates() {
        assert_eq!(
            short_name("void at::native::(anonymous namespace)::max_pool_forward_nhwc<float>(int, float*)"),
            "at::native::max_pool_forward_nhwc"
        );
        assert_eq!(short_name("triton_poi_fused_add_0"), "triton_poi_fused_add_0");
    }

    /// A CPU trace: nested operators on one thread give self time to the innermost; the time
    /// between them inside a step is idle, and the classes add up to the steps' length.
    #[test]
    fn cpu_steps_are_divided_by_self_time() {
        let t = "1/1";
        let evs = vec![
            ev("ProfilerStep#1", "user_annotation", t, 0.0, 100.0, None),
            ev("aten::conv2d", "cpu_op", t, 0.0, 50.0, None),
            ev("aten::convolution", "cpu_op", t, 1.0, 48.0, None),
            ev("aten::mkldnn_convolution", "cpu_op", t, 2.0, 40.0, None),
            ev("aten::relu", "cpu_op", t, 60.0, 10.0, None),
            ev("Optimizer.step#SGD.step", "user_annotation", t, 75.0, 20.0, None),
            ev("aten::_foreach_add_", "cpu_op", t, 76.0, 18.0, None),
            ev("ProfilerStep#2", "user_annotation", t, 100.0, 100.0, None),
            ev("aten::batch_norm", "cpu_op", t, 100.0, 100.0, None),
        ];
        let p = divide_steps(&evs).unwrap();
        assert_eq!((p.device, p.steps), ("CPU", 2));
        assert!((p.step_ms() - 0.1).abs() < 1e-12, "{p:?}");
        assert!((p.ms(Class::ConvForward) - 0.050 / 2.0).abs() < 1e-12);
        assert!((p.ms(Class::Pointwise) - 0.010 / 2.0).abs() < 1e-12);
        assert!((p.ms(Class::Optimizer) - 0.020 / 2.0).abs() < 1e-12);
        assert!((p.ms(Class::Norm) - 0.100 / 2.0).abs() < 1e-12);
        assert!((p.ms(Class::Idle) - 0.020 / 2.0).abs() < 1e-12, "{p:?}");
        // Self times by name: mkldnn_convolution 40, convolution 48 - 40, conv2d 50 - 48.
        let own = |n: &str| p.by_name.iter().find(|x| x.0 == n).unwrap().2 * 2.0 * 1000.0;
        assert!((own("aten::mkldnn_convolution") - 40.0).abs() < 1e-9);
        assert!((own("aten::convolution") - 8.0).abs() < 1e-9);
        assert!((own("aten::conv2d") - 2.0).abs() < 1e-9);
        assert!((p.host_ms - 0.180 / 2.0).abs() < 1e-12);
    }

    /// A GPU trace: kernels belong to the step that launched them (by correlation id) and take
    /// the class of the launching operator; two streams share their overlap, communication
    /// counts only where it runs alone, and gaps are idle.
    #[test]
    fn gpu_kernels_are_divided_by_launch() {
        let (host, bwd, s7, s9) = ("1/1", "1/2", "0/7", "0/9");
        let evs = vec![
            ev("ProfilerStep#5", "user_annotation", host, 0.0, 50.0, None),
            // Its mirror on the GPU's timeline: the same step, not a second one.
            ev("ProfilerStep#5", "gpu_user_annotation", s7, 100.0, 300.0, None),
            ev("aten::conv2d", "cpu_op", host, 1.0, 5.0, None),
            ev("cudaLaunchKernel", "cuda_runtime", host, 2.0, 1.0, Some(1)),
            ev("ConvolutionBackward0", "cpu_op", bwd, 10.0, 5.0, None),
            ev("cudaLaunchKernel", "cuda_runtime", bwd, 11.0, 1.0, Some(2)),
            ev("nccl:all_reduce", "cpu_op", host, 20.0, 2.0, None),
            ev("cudaLaunchKernel", "cuda_runtime", host, 21.0, 1.0, Some(3)),
            // A launch before the steps: not counted.
            ev("cudaLaunchKernel", "cuda_runtime", host, -10.0, 1.0, Some(4)),
            ev("sm90_xmma_fprop_implicit_gemm", "kernel", s7, 100.0, 100.0, Some(1)),
            ev("sm90_xmma_wgrad_implicit_gemm", "kernel", s7, 250.0, 100.0, Some(2)),
            ev("ncclDevKernel_AllReduce", "kernel", s9, 300.0, 100.0, Some(3)),
            ev(
                "void at::native::elementwise_kernel<4>(int)",
                "kernel",
                s7,
                -5.0,
                1.0,
                Some(4),
            ),
        ];
        let p = divide_steps(&evs).unwrap();
        assert_eq!((p.device, p.steps), ("CUDA", 1));
        // From 100 to 400 µs: conv 100, idle 50, wgrad 100 (overlapped by NCCL from 300), NCCL
        // alone 50.
        assert!((p.step_ms() - 0.300).abs() < 1e-12, "{p:?}");
        assert!((p.ms(Class::ConvForward) - 0.100).abs() < 1e-12);
        assert!((p.ms(Class::ConvWeightGrad) - 0.100).abs() < 1e-12);
        assert!((p.ms(Class::Communication) - 0.050).abs() < 1e-12);
        assert!((p.ms(Class::Idle) - 0.050).abs() < 1e-12);
        assert_eq!(p.ms(Class::Pointwise), 0.0);
        assert!((p.host_ms - 0.012).abs() < 1e-12, "{p:?}");
    }

    #[test]
    fn a_trace_without_steps_is_refused_by_name() {
        let evs = vec![ev("aten::relu", "cpu_op", "1/1", 0.0, 1.0, None)];
        assert!(divide_steps(&evs).unwrap_err().contains("ProfilerStep"));
    }
}
