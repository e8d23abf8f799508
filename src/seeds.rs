//! Every random stream of a run, in one place. Each is keyed by the run's `--seed` and a
//! position (epoch, sample, step, rank), never by time or thread: results do not depend on the
//! number of workers, and a resumed run repeats the draws of the run it continues.
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// SplitMix64 finaliser: decorrelates nearby (seed, epoch, index) triples.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The augmentation of sample `index` in `epoch` (the loader's crops, flips, erasing).
pub fn sample(seed: u64, epoch: u64, index: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(mix(mix(seed) ^ epoch) ^ index))
}

/// The order of an epoch's samples (shared by all ranks, which then take their shards).
pub fn shuffle(seed: u64, epoch: u64) -> ChaCha8Rng {
    sample(seed, epoch, u64::MAX)
}

/// The order of a sharded source's shards in an epoch (shared by all ranks; dealt to streams).
pub fn shard_order(seed: u64, epoch: u64) -> ChaCha8Rng {
    sample(seed, epoch, u64::MAX - 1)
}

/// Stream `stream`'s shuffle buffer over its shards' samples in an epoch.
pub fn shuffle_buffer(seed: u64, epoch: u64, stream: u64) -> ChaCha8Rng {
    sample(seed ^ 0x5348_5546_4642, epoch, stream)
}

/// Which files of class `class` are held out for validation (`--val-split`, `ringtrain split`).
pub fn split(seed: u64, class: u64) -> ChaCha8Rng {
    sample(seed, 0x5917, class)
}

/// The demo data's image `index` of class `class`.
pub fn demo_image(seed: u64, class: u64, index: u64) -> ChaCha8Rng {
    sample(seed, class, index)
}

/// libtorch's generator before the weights are initialised.
pub fn init(seed: u64) -> i64 {
    seed as i64
}

/// libtorch's generator for micro-batch `micro` of `epoch` (dropout inside the step).
pub fn step(seed: u64, epoch: usize, micro: usize) -> i64 {
    (mix(mix(mix(seed ^ 0x5eed_5eed) ^ epoch as u64) ^ micro as u64) >> 1) as i64
}

/// A step's Mixup/CutMix parameters: one stream per (rank, position). Each rank draws its own,
/// as in timm where every rank seeds its own NumPy state; a fixed tag keeps the key apart from
/// the loader's.
pub fn mixup(seed: u64, rank: u64, position: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6D69_7875_7021_u64 ^ rank.rotate_left(40));
    rng.set_stream(position);
    rng
}
