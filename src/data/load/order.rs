//! The orders of a training epoch: a sharded source's (tar shards, parquet row groups),
//! WebDataset's, each rank its own shards front to back through a shuffle buffer; repeated
//! augmentation's, `RASampler`'s; and PyTorch's samplers' permutation, drawn by libtorch.
use rand::seq::SliceRandom;
use rand::Rng;

use crate::seeds;

/// One rank's samples for a training epoch, in WebDataset's order: the shards in an order drawn
/// from (seed, epoch), every `world`-th of them from `rank` on, their samples read front to
/// back through a shuffle buffer of `buffer` samples (seeded by seed, epoch and rank), cut or
/// repeated to `len` so that every rank takes the same number of steps. `shard_of(i)` is sample
/// i's shard; samples of one shard keep their index order.
pub fn stream_order(
    n: usize,
    shard_of: impl Fn(usize) -> usize,
    seed: u64,
    epoch: u64,
    (rank, world): (usize, usize),
    buffer: usize,
    len: usize,
) -> Vec<usize> {
    let mut per_shard: Vec<Vec<usize>> = Vec::new();
    for i in 0..n {
        let s = shard_of(i);
        if s >= per_shard.len() {
            per_shard.resize_with(s + 1, Vec::new);
        }
        per_shard[s].push(i);
    }
    // Shards whose every sample went to validation take no turn: each rank's shards hold samples.
    let mut order: Vec<usize> = (0..per_shard.len()).filter(|&s| !per_shard[s].is_empty()).collect();
    order.shuffle(&mut seeds::shard_order(seed, epoch));
    let mut rng = seeds::shuffle_buffer(seed, epoch, rank as u64);
    let (mut buf, mut out) = (Vec::with_capacity(buffer + 1), Vec::with_capacity(len));
    for &s in order.iter().skip(rank).step_by(world) {
        for &i in &per_shard[s] {
            buf.push(i);
            if buf.len() >= buffer.max(1) {
                out.push(buf.swap_remove(rng.gen_range(0..buf.len())));
            }
        }
    }
    buf.shuffle(&mut rng);
    out.append(&mut buf);
    if out.is_empty() {
        return out;
    }
    let have = out.len();
    if have < len {
        let again: Vec<usize> = out.iter().cycle().take(len - have).copied().collect();
        out.extend(again);
    }
    out.truncate(len);
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
    fn stream_order_covers_each_ranks_shards_and_evens_lengths() {
        // 5 shards of unequal size over 2 ranks.
        let sizes = [4, 4, 4, 4, 3];
        let shard_of: Vec<usize> = sizes.iter().enumerate().flat_map(|(s, &k)| std::iter::repeat_n(s, k)).collect();
        let n = shard_of.len();
        let len = n.div_ceil(2);
        let a = stream_order(n, |i| shard_of[i], 7, 3, (0, 2), 4, len);
        let b = stream_order(n, |i| shard_of[i], 7, 3, (1, 2), 4, len);
        assert_eq!((a.len(), b.len()), (len, len));
        // Each rank's samples come from its own shards only (3 and 2 of them: 11 or 12 samples
        // and 7 or 8): the longer stream is cut to 10, the shorter one repeats its first.
        let shards = |o: &[usize]| o.iter().map(|&i| shard_of[i]).collect::<std::collections::BTreeSet<_>>();
        assert!(shards(&a).is_disjoint(&shards(&b)));
        let held = |o: &[usize]| shards(o).iter().map(|&s| sizes[s]).sum::<usize>();
        let distinct = |o: &[usize]| o.iter().collect::<std::collections::BTreeSet<_>>().len();
        for o in [&a, &b] {
            assert_eq!(distinct(o), held(o).min(len));
        }
        // The same draw again; another epoch draws another shard order or buffer.
        assert_eq!(a, stream_order(n, |i| shard_of[i], 7, 3, (0, 2), 4, len));
        assert_ne!(a, stream_order(n, |i| shard_of[i], 7, 4, (0, 2), 4, len));
        // Shards emptied by a validation split take no turn: samples of shards 0 and 2 only, over
        // 2 ranks, give each rank one shard.
        let held = [0, 0, 2, 2, 2];
        assert_eq!(shard_count(held.len(), |i| held[i]), 2);
        for rank in 0..2 {
            let o = stream_order(held.len(), |i| held[i], 7, 0, (rank, 2), 4, 3);
            assert_eq!(o.len(), 3, "rank {rank}");
        }
        // A buffer of one keeps the shards' own order.
        let one = stream_order(n, |i| shard_of[i], 7, 3, (0, 1), 1, n);
        for w in one.windows(2) {
            assert!(shard_of[w[0]] != shard_of[w[1]] || w[0] < w[1]);
        }
    }
}
