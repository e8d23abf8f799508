//! Data parallelism with DistributedDataParallel's semantics, on c10d collectives:
//! - start: every parameter and buffer is broadcast from rank 0, so all replicas start equal;
//! - before each training forward: BatchNorm buffers are broadcast from rank 0
//!   (DDP's `broadcast_buffers=True`);
//! - during backward: gradients are averaged over ranks by bucketed all-reduce, overlapped with
//!   the rest of backward as PyTorch's reducer does. Buckets hold about `bucket_mb` MB of
//!   gradients (the first only 1 MiB, so communication starts early), in reverse parameter order
//!   (the order backward produces them). Each parameter's `.grad` is a view into its bucket's
//!   flat buffer (PyTorch's `gradient_as_bucket_view`) with the parameter's own strides
//!   (channels_last weights get channels_last gradients), so backward writes straight into what
//!   is all-reduced: no copies in or out. Autograd hooks (`reducer`, in the shim) launch each
//!   bucket's all-reduce as soon as its last gradient is accumulated, in bucket order; after
//!   backward the host only waits for what is still in flight: the exposed part, which
//!   `take_comm_time` reports. Micro-batches that do not end an optimizer step (`--accum-steps`)
//!   launch nothing (DDP's `no_sync`). At world size 1 the average is the identity: no buckets,
//!   no hooks, no collective, gradients stay as in a plain run.
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tch::{nn, Device, Kind, Tensor};

use crate::shim::CudaTimer;

use super::process_group::ProcessGroup;
use super::reducer::{Reducer, Timed};

/// Gradient bytes per all-reduce bucket, in MB (`--bucket-mb`; PyTorch DDP's bucket_cap_mb).
pub const DEFAULT_BUCKET_MB: f64 = 25.0;
/// The first bucket's cap (PyTorch's `_DEFAULT_FIRST_BUCKET_BYTES`): the last layers' gradients
/// start travelling while backward has most of its work ahead.
pub const FIRST_BUCKET_BYTES: usize = 1024 * 1024;

crate::flag_enum! {
    /// `--grad-compress`: the precision gradients travel in during the all-reduce (fp32 unless
    /// asked).
    #[derive(Default)]
    pub enum WirePrecision("invalid --grad-compress") {
        #[default]
        Off = "off",
        Bf16 = "bf16",
        Fp16 = "fp16",
    }
}

impl WirePrecision {
    /// The dtype on the wire; None for fp32.
    pub fn kind(self) -> Option<Kind> {
        match self {
            WirePrecision::Off => None,
            WirePrecision::Bf16 => Some(Kind::BFloat16),
            WirePrecision::Fp16 => Some(Kind::Half),
        }
    }
}

pub struct Ddp {
    /// Launches and waits for the buckets' all-reduces; None at world size 1. (Declared before
    /// `pg`: dropped first, it waits for its collectives and removes its hooks.)
    reducer: Option<Reducer>,
    /// Shared with the rest of the rank (epoch sums, the stop agreement, SyncBatchNorm).
    pg: Rc<ProcessGroup>,
    /// Indices into the parameter list, one Vec per bucket.
    buckets: Vec<Vec<usize>>,
    /// One flat fp32 buffer per bucket; the parameters' gradients are views into it. With
    /// `--grad-compress` they travel in half precision, as Horovod's `Compression.fp16`:
    /// pre-divided by the world size in fp32, sent narrow, widened back to fp32.
    flats: Vec<Tensor>,
    /// The all-reduce's exposed time since the last `take_comm_time`, from the end of backward
    /// to the averaged gradients: wall time on the CPU; on CUDA the compute stream's time, by
    /// CUDA events (NCCL's wait does not block the host, so wall time would read about 0).
    comm_time: Cell<Duration>,
    /// CUDA: timers of steps whose events the stream has not reached yet.
    pending_timers: RefCell<Vec<CudaTimer>>,
}

impl Ddp {
    /// Buckets over `params` (in this order, reversed), the gradients made views into them, and
    /// hooks that launch each bucket during backward unless `overlap` is off.
    pub fn new(
        pg: Rc<ProcessGroup>,
        params: &[Tensor],
        bucket_mb: f64,
        wire: WirePrecision,
        overlap: bool,
    ) -> Result<Self> {
        let bytes: Vec<usize> = params.iter().map(|p| p.numel() * 4).collect();
        let buckets = assign_buckets(&bytes, FIRST_BUCKET_BYTES, (bucket_mb * 1024.0 * 1024.0) as usize);
        let mut flats = Vec::with_capacity(buckets.len());
        let mut bucket_of = vec![0; params.len()];
        for (b, bucket) in buckets.iter().enumerate().filter(|_| pg.world_size > 1) {
            let total: i64 = bucket.iter().map(|&i| params[i].numel() as i64).sum();
            let flat = Tensor::zeros([total], (Kind::Float, params[bucket[0]].device()));
            let mut offset = 0;
            for &i in bucket {
                let p = &params[i];
                let n = p.numel() as i64;
                crate::shim::set_grad(p, &bucket_view(&flat, offset, p))?;
                bucket_of[i] = b;
                offset += n;
            }
            flats.push(flat);
        }
        let reducer = match flats.is_empty() {
            true => None,
            false => Some(Reducer::new(&pg, params, &bucket_of, &flats, wire.kind(), overlap)?),
        };
        Ok(Ddp {
            reducer,
            pg,
            buckets,
            flats,
            comm_time: Cell::new(Duration::ZERO),
            pending_timers: RefCell::new(Vec::new()),
        })
    }

    /// Whether the gradients live in the buckets (then zero them with `zero_grad`, never set
    /// them to None, which would detach them from the buckets).
    pub fn owns_grads(&self) -> bool {
        !self.flats.is_empty()
    }

    /// Zeroes the gradients in place.
    pub fn zero_grad(&self) {
        for f in &self.flats {
            let _ = f.shallow_clone().zero_();
        }
    }

    /// Time spent averaging gradients since the last call (on CUDA this waits for the stream to
    /// reach the last step's end: call it where the host waits anyway, as at an epoch's end).
    pub fn take_comm_time(&self) -> Result<Duration> {
        self.collect_timers(true)?;
        Ok(self.comm_time.replace(Duration::ZERO))
    }

    /// Adds the CUDA timers the stream has passed (all of them with `wait`) to `comm_time`.
    fn collect_timers(&self, wait: bool) -> Result<()> {
        let mut pending = self.pending_timers.borrow_mut();
        let mut still = Vec::new();
        for t in pending.drain(..) {
            match t.elapsed(wait)? {
                Some(d) => self.comm_time.set(self.comm_time.get() + d),
                None => still.push(t),
            }
        }
        *pending = still;
        Ok(())
    }

    pub fn pg(&self) -> &ProcessGroup {
        &self.pg
    }

    pub fn world_size(&self) -> usize {
        self.pg.world_size
    }

    /// Every variable of the store (parameters and buffers, by sorted name) from rank 0.
    pub fn broadcast_state(&self, vs: &nn::VarStore) -> Result<()> {
        let vars = vs.variables();
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        tch::no_grad(|| -> Result<()> {
            for n in names {
                self.pg.broadcast(&vars[n], 0)?;
            }
            Ok(())
        })
    }

    /// Non-trainable tensors (BN running statistics) from rank 0.
    pub fn broadcast_buffers(&self, buffers: &[Tensor]) -> Result<()> {
        if buffers.is_empty() {
            return Ok(());
        }
        tch::no_grad(|| {
            let flat = Tensor::cat(&buffers.iter().map(|b| b.view(-1)).collect::<Vec<_>>(), 0);
            self.pg.broadcast(&flat, 0)?;
            copy_back(&flat, buffers);
            Ok(())
        })
    }

    /// Before a micro-batch's backward; `ends_step`: the optimizer steps after it, so its
    /// gradients are all-reduced (launched from the hooks as they are ready). Otherwise they
    /// only accumulate.
    pub fn begin_backward(&self, ends_step: bool) -> Result<()> {
        match &self.reducer {
            Some(r) => r.prepare(ends_step),
            None => Ok(()),
        }
    }

    /// After the step's last backward: the gradients averaged over all ranks, in place in the
    /// buckets. Waits only for what backward has not hidden; `timed`: that wait is added to
    /// `take_comm_time` (not inside a CUDA graph's capture, where timing events cannot go).
    pub fn finish_grad_sync(&self, timed: bool) -> Result<()> {
        let Some(reducer) = &self.reducer else {
            return Ok(());
        };
        if !timed {
            return reducer.finish();
        }
        let t0 = Instant::now();
        let timer = match self.pg.device {
            Device::Cuda(i) => Some(CudaTimer::start(i)?),
            _ => None,
        };
        let result = reducer.finish();
        match timer {
            Some(t) => {
                t.stop()?;
                self.pending_timers.borrow_mut().push(t);
                self.collect_timers(false)?; // earlier steps' timers, without waiting
            }
            None => self.comm_time.set(self.comm_time.get() + t0.elapsed()),
        }
        result
    }

    /// The last backward's event log (gradients ready, buckets launched), for tests and
    /// diagnosis; empty at world size 1.
    pub fn last_events(&self) -> Vec<Timed> {
        self.reducer.as_ref().map(|r| r.events()).unwrap_or_default()
    }

    /// The parameter indices of each bucket, in launch order.
    pub fn buckets(&self) -> &[Vec<usize>] {
        &self.buckets
    }
}

/// PyTorch's reducer rule: walk the parameters in reverse, closing a bucket once it holds at
/// least its cap: `first_cap` bytes for the first bucket, `cap` for the others.
fn assign_buckets(bytes: &[usize], first_cap: usize, cap: usize) -> Vec<Vec<usize>> {
    let mut buckets = vec![];
    let (mut current, mut size) = (vec![], 0usize);
    for i in (0..bytes.len()).rev() {
        current.push(i);
        size += bytes[i];
        if size >= if buckets.is_empty() { first_cap.min(cap) } else { cap } {
            buckets.push(std::mem::take(&mut current));
            size = 0;
        }
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

/// The parameter's gradient as a view of `flat` from `offset`, laid out with the parameter's own
/// strides (`as_strided(p.size(), p.stride())`, as PyTorch's reducer does): a channels_last conv
/// weight gets a channels_last gradient. Autograd accumulates into `.grad` in place whatever its
/// layout, but the fused optimizers walk parameter, gradient and state as flat memory and need
/// one layout for all of them. A parameter that is not dense keeps a contiguous view.
fn bucket_view(flat: &Tensor, offset: i64, p: &Tensor) -> Tensor {
    if is_dense(&p.size(), &p.stride()) {
        flat.as_strided(p.size(), p.stride(), offset)
    } else {
        flat.narrow(0, offset, p.numel() as i64).view_as(p)
    }
}

/// Whether strides describe a layout without gaps or overlaps (a permutation of a contiguous
/// one), as `Tensor.is_non_overlapping_and_dense()`: then exactly numel elements are covered.
fn is_dense(size: &[i64], stride: &[i64]) -> bool {
    let mut dims: Vec<usize> = (0..size.len()).filter(|&d| size[d] != 1).collect();
    dims.sort_by_key(|&d| stride[d]);
    let mut expected = 1;
    for d in dims {
        if stride[d] != expected {
            return false;
        }
        expected *= size[d];
    }
    true
}

/// Splits `flat` back into `dst`'s shapes and copies in place.
fn copy_back(flat: &Tensor, dst: &[Tensor]) {
    let mut offset = 0i64;
    for d in dst {
        let n = d.numel() as i64;
        let _ = d
            .shallow_clone()
            .copy_(&flat.narrow(0, offset, n).view_as(d).to_kind(d.kind()));
        offset += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradient_views_take_the_layout_of_their_parameter() {
        let flat = Tensor::arange(2 + 2 * 3 * 4 * 5, (Kind::Float, tch::Device::Cpu));
        let w = crate::shim::to_channels_last(&Tensor::zeros([2, 3, 4, 5], (Kind::Float, tch::Device::Cpu))).unwrap();
        let g = bucket_view(&flat, 2, &w);
        assert_eq!(g.size(), w.size());
        assert_eq!(g.stride(), w.stride(), "channels_last, as the weight");
        // It covers flat[2..122] exactly, in the weight's memory order.
        let _ = g.shallow_clone().fill_(-1.0);
        assert_eq!(flat.lt(0.0).sum(Kind::Int64).int64_value(&[]), 120);
        assert_eq!(Vec::<f32>::try_from(flat.narrow(0, 0, 2)).unwrap(), vec![0.0, 1.0]);

        assert!(is_dense(&[2, 3, 4, 5], &[60, 20, 5, 1]));
        assert!(is_dense(&[2, 3, 4, 5], &[60, 1, 15, 3]));
        assert!(
            is_dense(&[8, 1, 3, 3], &[9, 1, 3, 1]),
            "size-1 dims may have any stride"
        );
        assert!(!is_dense(&[2, 3], &[6, 1]), "gaps");
        assert!(!is_dense(&[2, 3], &[0, 1]), "overlap");
    }

    #[test]
    fn buckets_close_once_full_in_reverse_parameter_order() {
        let mb = 1024 * 1024;
        let b = assign_buckets(&[4000, mb + 200_000, 40, 2 * mb, 28], mb, mb);
        assert_eq!(b, vec![vec![4, 3], vec![2, 1], vec![0]]);
        assert_eq!(assign_buckets(&[10, 10], mb, mb), vec![vec![1, 0]]);
        // A small first bucket, then larger ones (PyTorch's 1 MiB, then bucket_cap_mb).
        let b = assign_buckets(&[mb, mb, mb, mb, mb / 2, mb / 2], mb, 3 * mb);
        assert_eq!(b, vec![vec![5, 4], vec![3, 2, 1], vec![0]]);
    }
}
