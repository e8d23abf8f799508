//! The orders of a training epoch: a sharded source's (tar shards, parquet row groups), streams
//! of shards read front to back through shuffle buffers, interleaved into one order whatever the
//! number of ranks; repeated augmentation's, `RASampler`'s; and PyTorch's samplers' permutation,
//! drawn by libtorch.
use rand::seq::SliceRandom;
use rand::Rng;

use crate::seeds;

/// An epoch's samples of a sharded source in one order that does not depend on the number of
/// ranks, as MosaicML's Streaming orders them: the shards, in an order drawn from (seed, epoch),
/// dealt to `streams` streams (stream c takes every `streams`-th shard from c on); each stream
/// reads its shards front to back through its own shuffle buffer of `buffer` samples (seeded by
/// seed, epoch and c), and the streams are interleaved a sample at a time (one that has run out
/// is passed over). The loader splits it over ranks as any order, rank r taking every world-th
/// sample from r on: global batch k holds the same samples whatever the number of ranks, so a
/// run resumed on another number goes on with the rest of the epoch, and while `world` divides
/// `streams` a rank reads the shards of streams r, r + world, … alone. `shard_of(i)` is sample
/// i's shard; samples of one shard keep their index order into the buffer.
pub fn stream_order(
    n: usize,
    shard_of: impl Fn(usize) -> usize,
    seed: u64,
    epoch: u64,
    streams: usize,
    buffer: usize,
) -> Vec<usize> {
    let mut per_shard: Vec<Vec<usize>> = Vec::new();
    for i in 0..n {
        let s = shard_of(i);
        if s >= per_shard.len() {
            per_shard.resize_with(s + 1, Vec::new);
        }
        per_shard[s].push(i);
    }
    // Shards whose every sample went to validation take no turn: each stream's shards hold samples.
    let mut order: Vec<usize> = (0..per_shard.len()).filter(|&s| !per_shard[s].is_empty()).collect();
    order.shuffle(&mut seeds::shard_order(seed, epoch));
    let streams = streams.max(1);
    let each: Vec<Vec<usize>> = (0..streams)
        .map(|c| {
            let mut rng = seeds::shuffle_buffer(seed, epoch, c as u64);
            let (mut buf, mut out) = (Vec::with_capacity(buffer + 1), Vec::new());
            for &s in order.iter().skip(c).step_by(streams) {
                for &i in &per_shard[s] {
                    buf.push(i);
                    if buf.len() >= buffer.max(1) {
                        out.push(buf.swap_remove(rng.gen_range(0..buf.len())));
                    }
                }
            }
            buf.shuffle(&mut rng);
            out.append(&mut buf);
            out
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for k in 0..each.iter().map(Vec::len).max().unwrap_or(0) {
        out.extend(each.iter().filter_map(|stream| stream.get(k)));
    }
    out
}

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))`, the permutation PyTorch's
/// `DistributedSampler` and torchvision's `RASampler` take for seed + epoch, drawn by libtorch.
pub fn torch_permutation(n: usize, seed: u64) -> Vec<usize> {
    // libtorch's randperm fails only for a negative n or a failed allocation.
    crate::shim::torch_randperm(n, seed).expect("torch.randperm on the CPU")
}

/// Samples per rank per epoch with repeated augmentation: torchvision's `RASampler` keeps
/// floor(n // 256 * 256 / world) of them, so the epoch is no longer than without repeats.
pub fn repeated_len(n: usize, world: usize) -> usize {
    n / 256 * 256 / world
}

/// Repeated augmentation as torchvision's `RASampler` (and timm's `RepeatAugSampler` with its
/// defaults) orders an epoch: each sample of the permutation `perm` `reps` times in a row, the
/// list padded from its front to a multiple of `world`, every `world`-th entry from `rank` on
/// (so a sample's copies fall on neighbouring ranks), cut to `repeated_len`. Entries are draw
/// keys, sample + n·copy (`copy` counts the sample's earlier entries in the list), so that every
/// copy gets its own augmentation: key % n is the sample.
pub fn repeated_order(perm: &[usize], reps: usize, (rank, world): (usize, usize)) -> Vec<usize> {
    let n = perm.len();
    // Position p of the list holds sample perm[p / reps], copy p % reps. A rank reads positions
    // below repeated_len · world <= n <= n · reps, so torchvision's padding is never reached.
    (0..repeated_len(n, world))
        .map(|j| rank + j * world)
        .map(|p| perm[p / reps] + n * (p % reps))
        .collect()
}

/// The number of shards the samples `0..n` come from (those holding at least one of them).
pub fn shard_count(n: usize, shard_of: impl Fn(usize) -> usize) -> usize {
    let mut held = Vec::new();
    for i in 0..n {
        let s = shard_of(i);
        if s >= held.len() {
            held.resize(s + 1, false);
        }
        held[s] = true;
    }
    held.into_iter().filter(|&h| h).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_order_is_one_order_for_any_number_of_ranks() {
        // 8 shards of 4 samples in 4 streams: each stream 2 shards, 8 samples.
        let shard_of: Vec<usize> = (0..32).map(|i| i / 4).collect();
        let o = stream_order(32, |i| shard_of[i], 7, 3, 4, 3);
        let mut sorted = o.clone();
        sorted.sort();
        assert_eq!(sorted, (0..32).collect::<Vec<_>>(), "every sample once");
        // Split as the loader splits any order: with 2 ranks, rank r reads streams r and r + 2
        // alone (their shards are no other rank's).
        let shards = |r: usize, w: usize| {
            o.iter().skip(r).step_by(w).map(|&i| shard_of[i]).collect::<std::collections::BTreeSet<_>>()
        };
        assert!(shards(0, 2).is_disjoint(&shards(1, 2)));
        assert_eq!((shards(0, 2).len(), shards(1, 2).len()), (4, 4));
        assert!(shards(0, 4).iter().all(|s| !shards(1, 4).contains(s)));
        // The same draw again; another epoch draws another order.
        assert_eq!(o, stream_order(32, |i| shard_of[i], 7, 3, 4, 3));
        assert_ne!(o, stream_order(32, |i| shard_of[i], 7, 4, 4, 3));
        // Shards emptied by a validation split take no turn; streams without shards give nothing.
        let held = [0, 0, 2, 2, 2];
        assert_eq!(shard_count(held.len(), |i| held[i]), 2);
        let mut o = stream_order(held.len(), |i| held[i], 7, 0, 64, 4);
        o.sort();
        assert_eq!(o, [0, 1, 2, 3, 4]);
        // One stream and a buffer of one keep the shards' own order.
        let one = stream_order(32, |i| shard_of[i], 7, 3, 1, 1);
        for w in one.windows(2) {
            assert!(shard_of[w[0]] != shard_of[w[1]] || w[0] < w[1]);
        }
    }
}
