//! Data parallelism with DistributedDataParallel's semantics, on c10d collectives:
//! - start: every parameter and buffer is broadcast from rank 0, so all replicas start equal;
//! - before each training forward: BatchNorm buffers are broadcast from rank 0
//!   (DDP's `broadcast_buffers=True`);
//! - after backward: gradients are averaged over ranks by bucketed all-reduce. Buckets hold about
//!   `bucket_mb` MB of gradients, in reverse parameter order (the order backward produces them);
//!   all buckets are started before the first is waited for. Each parameter's `.grad` is a view
//!   into its bucket's flat buffer (PyTorch's `gradient_as_bucket_view`), so backward writes
//!   straight into what is all-reduced: no copies in or out. At world size 1 the average is the
//!   identity: no buckets, no collective, gradients stay as in a plain run.
//!
//! What PyTorch's reducer does and this does not (yet): it launches each bucket's all-reduce from
//! autograd hooks while backward still runs, overlapping communication with computation. Here the
//! all-reduces start after backward has finished, so communication time adds to the step.
use std::cell::Cell;
use std::time::{Duration, Instant};

use anyhow::Result;
use tch::{nn, Kind, Tensor};

use super::process_group::{ProcessGroup, ReduceOp};

pub struct Ddp {
    pub pg: ProcessGroup,
    /// Indices into the parameter list, one Vec per bucket.
    buckets: Vec<Vec<usize>>,
    /// One flat fp32 buffer per bucket; the parameters' gradients are views into it.
    flats: Vec<Tensor>,
    /// All-reduce in this precision (`--grad-compress`), as Horovod's `Compression.fp16`:
    /// gradients are pre-divided by the world size in fp32, sent in half precision, and
    /// widened back to fp32.
    compress: Option<Kind>,
    /// Wall time spent in the gradient all-reduce since the last `take_comm_time`.
    comm_time: Cell<Duration>,
}

impl Ddp {
    pub fn new(pg: ProcessGroup, params: &[Tensor], bucket_mb: f64, compress: Option<Kind>) -> Result<Self> {
        let bytes: Vec<usize> = params.iter().map(|p| p.numel() * 4).collect();
        let buckets = assign_buckets(&bytes, (bucket_mb * 1024.0 * 1024.0) as usize);
        let mut flats = Vec::with_capacity(buckets.len());
        for bucket in buckets.iter().filter(|_| pg.world_size > 1) {
            let total: i64 = bucket.iter().map(|&i| params[i].numel() as i64).sum();
            let flat = Tensor::zeros([total], (Kind::Float, params[bucket[0]].device()));
            let mut offset = 0;
            for &i in bucket {
                let n = params[i].numel() as i64;
                crate::shim::set_grad(&params[i], &flat.narrow(0, offset, n).view_as(&params[i]))?;
                offset += n;
            }
            flats.push(flat);
        }
        Ok(Ddp {
            pg,
            buckets,
            flats,
            compress,
            comm_time: Cell::new(Duration::ZERO),
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

    /// Time spent averaging gradients since the last call.
    pub fn take_comm_time(&self) -> Duration {
        self.comm_time.replace(Duration::ZERO)
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
        self.comm_time.set(self.comm_time.get() + t0.elapsed());
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
    fn buckets_close_once_full_in_reverse_parameter_order() {
        let mb = 1024 * 1024;
        let b = assign_buckets(&[4000, mb + 200_000, 40, 2 * mb, 28], mb);
        assert_eq!(b, vec![vec![4, 3], vec![2, 1], vec![0]]);
        assert_eq!(assign_buckets(&[10, 10], mb), vec![vec![1, 0]]);
    }
}
