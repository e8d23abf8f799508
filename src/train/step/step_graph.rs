//! `--cuda-graphs`: the whole optimizer step (zeroed gradients, forward and loss under
//! autocast, backward with its bucket all-reduces, unscale, clip, fused optimizer step, loss
//! scale update, EMA) captured once as a CUDA graph after a few eager steps, then replayed: one
//! launch per step instead of hundreds of kernels, which is what bounds small models on a fast
//! GPU (and how `torch.compile`'s "reduce-overhead" mode beats eager).
//!
//! A replay re-runs the captured kernels on the same memory, so everything that changes from
//! step to step is read from the device: the batch (copied into static buffers), the learning
//! rate (a 0-dim tensor the fused kernels read), the loss scale and the overflow flag (the
//! GradScaler's own tensors). The host's share of a step (counting, the divergence record, the
//! epoch sums) runs after the replay on the graph's outputs, still without synchronising.
//! A batch of another shape (an epoch's short last batch) takes the eager path.
//!
//! The run's device work moves to a side stream before its first step, so that the warm-up
//! steps and the capture share one non-default stream, as PyTorch's notes on whole-network
//! capture ask: autograd's AccumulateGrad nodes keep the stream of the step that made them, and
//! the default stream cannot join a capture.
use anyhow::Result;
use tch::{Device, Kind, Tensor};

use crate::shim::CudaGraph;

/// Eager steps before the capture, on the stream it captures: cuDNN's benchmark mode has
/// picked its algorithms, cuBLAS has its workspace for the stream, the optimizer state and
/// NCCL's communicators exist, the caching allocator is warm (as torch.cuda.graph's
/// documentation advises).
pub const WARMUP_STEPS: usize = 3;

/// What the captured step leaves on the device for the host's bookkeeping.
pub struct StepOutputs {
    /// The batch's mean loss (fp32).
    pub loss: Tensor,
    /// Correct top-1 predictions in the batch (float).
    pub correct: Tensor,
    /// fp16: 1 when the step was skipped for an inf/NaN gradient.
    pub found_inf: Option<Tensor>,
}

/// How the step's work is recorded and run again.
enum Recorder {
    /// Captured once on this CUDA device, replayed.
    Cuda(usize),
    /// The same body run eagerly every step on the static buffers: how the CPU tests check that
    /// the captured step computes what the eager one does.
    #[cfg_attr(not(test), allow(dead_code))]
    EveryStep,
}

pub struct StepGraph {
    recorder: Recorder,
    warmup_left: usize,
    /// Static inputs: the batch and the learning rate, refilled before each replay.
    x: Option<Tensor>,
    y: Option<Tensor>,
    lr: Tensor,
    graph: Option<CudaGraph>,
    out: Option<StepOutputs>,
}

impl StepGraph {
    /// For training on `device`, which must be a CUDA device; from here on this thread's work
    /// on it goes to a side stream. Call it before the first training step.
    pub fn new(device: Device) -> Result<Self> {
        match device {
            Device::Cuda(i) => {
                crate::shim::cuda_use_side_stream(i)?;
                Ok(StepGraph::with(Recorder::Cuda(i), device, WARMUP_STEPS))
            }
            _ => crate::bail_user!("--cuda-graphs needs a CUDA device (--device cuda); this run is on {device:?}"),
        }
    }

    #[cfg(test)]
    pub(crate) fn every_step(device: Device, warmup: usize) -> Self {
        StepGraph::with(Recorder::EveryStep, device, warmup)
    }

    fn with(recorder: Recorder, device: Device, warmup: usize) -> Self {
        StepGraph {
            recorder,
            warmup_left: warmup,
            x: None,
            y: None,
            lr: Tensor::zeros([], (Kind::Float, device)),
            graph: None,
            out: None,
        }
    }

    /// Whether this batch runs through the graph; false while warming up (counted here) and for
    /// a batch of another shape or layout than the captured one.
    pub fn takes(&mut self, x: &Tensor, y: &Tensor) -> bool {
        if self.warmup_left > 0 {
            self.warmup_left -= 1;
            return false;
        }
        match (&self.x, &self.y) {
            (Some(sx), Some(sy)) => sx.size() == x.size() && sx.stride() == x.stride() && sy.size() == y.size(),
            _ => true,
        }
    }

    /// Copies the batch and the learning rate into the static inputs (allocated, with the
    /// batch's layout, on first use).
    pub fn load(&mut self, x: &Tensor, y: &Tensor, lr: f64) {
        let fill = |slot: &mut Option<Tensor>, src: &Tensor| {
            let dst = slot.get_or_insert_with(|| src.empty_like());
            let _ = dst.copy_(src);
        };
        fill(&mut self.x, x);
        fill(&mut self.y, y);
        let _ = self.lr.fill_(lr);
    }

    /// Runs the step: `body` (the step's device work on the static inputs: batch, labels,
    /// learning rate) is captured the first time and replayed after.
    pub fn run(&mut self, body: impl FnOnce(&Tensor, &Tensor, &Tensor) -> Result<StepOutputs>) -> Result<&StepOutputs> {
        let (x, y) = (self.x.as_ref().expect("load first"), self.y.as_ref().expect("load first"));
        match (&self.recorder, &self.graph) {
            (Recorder::EveryStep, _) => self.out = Some(body(x, y, &self.lr)?),
            (Recorder::Cuda(device), None) => {
                let graph = CudaGraph::begin(*device)?;
                // A step that fails inside the capture invalidates it: its own error says why,
                // ending the capture then only says that it was invalidated.
                let out = body(x, y, &self.lr).map_err(|e| e.context("in the step being captured as a CUDA graph"));
                let ended = graph.end();
                self.out = Some(out?);
                ended?;
                graph.replay()?; // the capture itself ran nothing
                self.graph = Some(graph);
            }
            (Recorder::Cuda(_), Some(graph)) => graph.replay()?,
        }
        Ok(self.out.as_ref().expect("set above"))
    }
}
