//! Data parallelism with DistributedDataParallel's semantics, on c10d collectives:
//! - start: every parameter and buffer is broadcast from rank 0, so all replicas start equal;
//! - before each training forward: BatchNorm buffers are broadcast from rank 0
//!   (DDP's `broadcast_buffers=True`);
//! - after backward: gradients are averaged over ranks by bucketed all-reduce. Buckets hold about
//!   `bucket_mb` MB of gradients, in reverse parameter order (the order backward produces them);
//!   all buckets are started before the first is waited for. Each parameter's `.grad` is a view
//!   into its bucket's flat buffer (PyTorch's `gradient_as_bucket_view`) with the parameter's own
//!   strides (channels_last weights get channels_last gradients), so backward writes straight
//!   into what is all-reduced: no copies in or out. At world size 1 the average is the
//!   identity: no buckets, no collective, gradients stay as in a plain run.
//!
//! What PyTorch's reducer does and this does not (yet): it launches each bucket's all-reduce from
//! autograd hooks while backward still runs, overlapping communication with computation. Here the
//! all-reduces start after backward has finished, so communication time adds to the step.
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tch::{nn, Device, Kind, Tensor};

use crate::shim::CudaTimer;

use super::process_group::{ProcessGroup, ReduceOp};

/// Gradient bytes per all-reduce bucket, in MB (`--bucket-mb`; PyTorch DDP's bucket_cap_mb).
pub const DEFAULT_BUCKET_MB: f64 = 25.0;

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
    /// Shared with the rest of the rank (epoch sums, the stop agreement, SyncBatchNorm).
    pg: Rc<ProcessGroup>,
    /// Indices into the parameter list, one Vec per bucket.
    buckets: Vec<Vec<usize>>,
    /// One flat fp32 buffer per bucket; the parameters' gradients are views into it.
    flats: Vec<Tensor>,
    /// All-reduce in this precision (`--grad-compress`), as Horovod's `Compression.fp16`:
    /// gradients are pre-divided by the world size in fp32, sent in half precision, and
    /// widened back to fp32.
    compress: Option<Kind>,
    /// Time spent in the gradient all-reduce since the last `take_comm_time`: wall time on the
    /// CPU; on CUDA the compute stream's time from the first launch to the end of the wait, by
    /// CUDA events (NCCL's wait does not block the host, so wall time would read about 0).
    comm_time: Cell<Duration>,
    /// CUDA: timers of steps whose events the stream has not reached yet.
    pending_timers: RefCell<Vec<CudaTimer>>,
}

impl Ddp {
    pub fn new(pg: Rc<ProcessGroup>, params: &[Tensor], bucket_mb: f64, wire: WirePrecision) -> Result<Self> {
        let bytes: Vec<usize> = params.iter().map(|p| p.numel() * 4).collect();
        let buckets = assign_buckets(&bytes, (bucket_mb * 1024.0 * 1024.0) as usize);
        let mut flats = Vec::with_capacity(buckets.len());
        for bucket in buckets.iter().filter(|_| pg.world_size > 1) {
            let total: i64 = bucket.iter().map(|&i| params[i].numel() as i64).sum();
            let flat = Tensor::zeros([total], (Kind::Float, params[bucket[0]].device()));
            let mut offset = 0;
            for &i in bucket {
                let p = &params[i];
                let n = p.numel() as i64;
                crate::shim::set_grad(p, &bucket_view(&flat, offset, p))?;
                offset += n;
            }
            flats.push(flat);
        }
        Ok(Ddp {
            pg,
            buckets,
            flats,
            compress: wire.kind(),
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

    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
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

    /// Averages the gradients over all ranks, in place in the buckets.
    pub fn all_reduce_grads(&self) -> Result<()> {
        if self.pg.world_size == 1 {
            return Ok(());
        }
        let t0 = Instant::now();
        let timer = match self.pg.device {
            Device::Cuda(i) => Some(CudaTimer::start(i)?),
            _ => None,
        };
        let inv = 1.0 / self.pg.world_size as f64;
        let result = tch::no_grad(|| {
            let mut pending = Vec::with_capacity(self.flats.len());
            for flat in &self.flats {
                let wire = match self.compress {
                    Some(kind) => (flat * inv).to_kind(kind),
                    None => flat.shallow_clone(),
                };
                let work = self.pg.all_reduce_async(&wire, ReduceOp::Sum)?;
                pending.push((flat, wire, work));
            }
            for (flat, mut wire, work) in pending {
                work.wait()?;
                match self.compress {
                    Some(_) => {
                        let _ = flat.shallow_clone().copy_(&wire);
                    }
                    None => {
                        let _ = wire.g_mul_scalar_(inv);
                    }
                }
            }
            Ok(())
        });
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
}

/// PyTorch's reducer rule: walk the parameters in reverse, closing a bucket once it holds at
/// least `cap` bytes.
fn assign_buckets(bytes: &[usize], cap: usize) -> Vec<Vec<usize>> {
    let mut buckets = vec![];
    let (mut current, mut size) = (vec![], 0usize);
    for i in (0..bytes.len()).rev() {
        current.push(i);
        size += bytes[i];
        if size >= cap {
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
        let b = assign_buckets(&[4000, mb + 200_000, 40, 2 * mb, 28], mb);
        assert_eq!(b, vec![vec![4, 3], vec![2, 1], vec![0]]);
        assert_eq!(assign_buckets(&[10, 10], mb), vec![vec![1, 0]]);
    }
}
