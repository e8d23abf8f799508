//! Host batch tensors written again once nothing else holds them. A fresh 12 MB batch (64
//! images of 128 px as f32) faults in every page on its first write: 92 % of the loader's page
//! faults when the workers normalise for a CPU device, about a tenth of its time. A reused one
//! is already mapped. Not for pinned memory: PyTorch's pinned allocator already reuses its
//! blocks, and knows when an asynchronous copy from one has finished.
use std::sync::Mutex;

use tch::{Device, Kind, Tensor};

use crate::shim::storage_use_count;

pub struct Buffers {
    /// Every tensor handed out and kept, each the only handle on its TensorImpl: the consumer
    /// gets an alias, so the storage's count is 1 again once the consumer's handles and views
    /// are all gone.
    kept: Mutex<Vec<Tensor>>,
    cap: usize,
}

impl Buffers {
    /// Keeps at most `cap` buffers (the batches that can be alive at once: the queued ones, the
    /// one the consumer holds and the one before it).
    pub fn new(cap: usize) -> Self {
        Buffers { kept: Mutex::new(Vec::new()), cap }
    }

    /// An uninitialised CPU tensor of `shape` and `kind`: a kept one nothing else holds, or a
    /// new one, kept while there is room (a free one of another shape, such as an epoch's
    /// short last batch, makes room).
    pub fn take(&self, shape: &[i64], kind: Kind) -> Tensor {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let free = |t: &Tensor| storage_use_count(t) == 1;
        if let Some(t) = kept.iter().find(|t| free(t) && t.size() == shape && t.kind() == kind) {
            return t.alias();
        }
        let t = Tensor::empty(shape, (kind, Device::Cpu));
        if kept.len() >= self.cap {
            match kept.iter().position(free) {
                Some(i) => drop(kept.swap_remove(i)),
                None => return t,
            }
        }
        let out = t.alias();
        kept.push(t);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_only_when_nothing_holds_it() {
        let b = Buffers::new(2);
        let first = b.take(&[2, 3], Kind::Float);
        let ptr = first.data_ptr();
        let view = first.permute([1, 0]);
        drop(first);
        // A view still reads it: a new buffer.
        let second = b.take(&[2, 3], Kind::Float);
        assert_ne!(second.data_ptr(), ptr);
        drop(view);
        // Now free: the same memory again; another shape or kind gets other memory.
        let again = b.take(&[2, 3], Kind::Float);
        assert_eq!(again.data_ptr(), ptr);
        drop(again);
        assert_ne!(b.take(&[3, 2], Kind::Float).data_ptr(), ptr);
        // Full (two kept, `second` still held): another shape evicts the free one and is kept.
        let third = b.take(&[4], Kind::Uint8);
        let kept: Vec<Vec<i64>> = b.kept.lock().unwrap().iter().map(|t| t.size()).collect();
        assert_eq!(kept, [vec![2, 3], vec![4]]);
        // tch's shallow clones share the handle's TensorImpl, and still count as holding it.
        let clone = third.shallow_clone();
        drop(third);
        assert_ne!(b.take(&[4], Kind::Uint8).data_ptr(), clone.data_ptr());
        drop(second);
    }
}
