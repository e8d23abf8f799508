//! A multi-threaded batch loader: a producer thread walks the epoch's sample order batch by
//! batch, decodes and transforms each batch's images in parallel on a worker pool that lives as
//! long as the loader (no per-epoch respawn), and hands uint8 NHWC batches to the training loop
//! through a bounded queue (`prefetch` batches at most, so memory stays flat).
//!
//! Randomness of a sample's augmentation comes from (seed, epoch, sample index) alone, so results
//! do not depend on the number of threads or on timing; the shuffle from (seed, epoch).
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use anyhow::{Context, Result};
use rand::seq::SliceRandom;
use rayon::prelude::*;
use tch::{Device, Kind, Tensor};

use super::buffers::Buffers;
use super::cache::{Budget, Cache};
use super::normalize::{HostNormalize, Normalizer};
use super::on_device::{DeviceSet, DeviceSetOptions};
use super::order::{repeated_len, repeated_order, stream_order, torch_permutation};
use super::sample::{load_sample, Batch};
use crate::data::augment::transform::Transform;
use crate::data::source::Samples;
use crate::seeds;

pub struct Loader {
    samples: Arc<Samples>,
    transform: Transform,
    batch_size: usize,
    shuffle: bool,
    shuffle_buffer: usize,
    shard_streams: usize,
    drop_last: bool,
    seed: u64,
    prefetch: usize,
    skip_unreadable: bool,
    shard: Option<Shard>,
    normalize: Option<HostNormalize>,
    pin_memory: bool,
    whole_jpeg: bool,
    cache: Option<Arc<Cache>>,
    repeats: Option<usize>,
    torch_sampler_seed: Option<u64>,
    /// `--data-on-device`: the whole set on the device; batches are made there, not by the pool.
    on_device: Option<DeviceSet>,
    pool: Arc<rayon::ThreadPool>,
    buffers: Arc<Buffers>,
}

/// This rank's part of every epoch, as PyTorch's DistributedSampler: the epoch's permutation
/// (the same on all ranks), padded by repetition to a multiple of `world` when `pad` (training:
/// equal shards), then every `world`-th sample from `rank`. Without `pad` (validation) shards
/// may differ by one and no sample is counted twice.
#[derive(Debug, Clone, Copy)]
pub struct Shard {
    pub rank: usize,
    pub world: usize,
    pub pad: bool,
}

#[derive(Clone)]
pub struct LoaderOptions {
    pub batch_size: usize,
    pub shuffle: bool,
    /// Tar shards and parquet row groups are shuffled as streams: the shards' order, dealt to
    /// `shard_streams` streams, each through a buffer of `shuffle_buffer` samples
    /// (`order::stream_order`).
    pub shuffle_buffer: usize,
    pub shard_streams: usize,
    pub drop_last: bool,
    pub seed: u64,
    pub workers: usize,
    pub prefetch: usize,
    /// Leave out (and report in `Batch::unreadable`) images that fail to decode, instead of failing.
    pub skip_unreadable: bool,
    /// Under data parallelism: this rank's shard.
    pub shard: Option<Shard>,
    /// Normalise in the workers (for a CPU device): batches are then f32 [B,3,H,W].
    pub normalize: Option<HostNormalize>,
    /// Build batches in pinned host memory (for a CUDA device), so their copy to it can be
    /// asynchronous. Falls back to ordinary memory where pinning is impossible.
    pub pin_memory: bool,
    /// Decode every JPEG whole, as PIL does (`--torchvision-compat`), instead of at 1/8 size
    /// when the transform shrinks it 8× or more.
    pub whole_jpeg: bool,
    /// Keep each decoded image in RAM within this budget (`--cache`).
    pub cache: Option<Arc<Budget>>,
    /// Repeated augmentation (`--ra-sampler --ra-reps N`): each image N times an epoch, in
    /// torchvision's `RASampler` order (`order::repeated_order`), the epoch cut as it cuts it
    /// (with N = 1 too); None is off.
    pub repeats: Option<usize>,
    /// Shuffle with `torch.randperm` seeded seed + epoch (PyTorch's samplers' order) instead of
    /// the permutation drawn from `seed`.
    pub torch_sampler_seed: Option<u64>,
}

/// WebDataset's usual buffer (`.shuffle(1000)`). Here it holds sample numbers, not images: its
/// size costs no memory, only how far a rank's reads jump within its shards.
pub const DEFAULT_SHUFFLE_BUFFER: usize = 1000;

/// Streams a sharded source's epoch is dealt to (MosaicML's canonical nodes): runs of up to this
/// many ranks, or any number dividing it, read disjoint shards.
pub const DEFAULT_SHARD_STREAMS: usize = 64;

impl LoaderOptions {
    /// Every image once, in folder order, unreadable ones skipped (and reported), uint8 batches
    /// in ordinary memory: evaluation's and prediction's loader. Others change fields of it
    /// (`LoaderOptions { shuffle: true, ..LoaderOptions::in_order(b, w) }`).
    pub fn in_order(batch_size: usize, workers: usize) -> Self {
        LoaderOptions {
            batch_size,
            shuffle: false,
            shuffle_buffer: DEFAULT_SHUFFLE_BUFFER,
            shard_streams: DEFAULT_SHARD_STREAMS,
            drop_last: false,
            seed: 0,
            workers,
            prefetch: 4,
            skip_unreadable: true,
            shard: None,
            normalize: None,
            pin_memory: false,
            whole_jpeg: false,
            cache: None,
            repeats: None,
            torch_sampler_seed: None,
        }
    }

    /// Batches as `normalize`'s device wants them: normalised by the workers for the CPU,
    /// uint8 in pinned memory for CUDA.
    pub fn for_device(self, normalize: &Normalizer) -> Self {
        LoaderOptions {
            normalize: normalize.for_workers(),
            pin_memory: normalize.pin_memory(),
            ..self
        }
    }
}

impl Loader {
    pub fn new(samples: impl Into<Samples>, transform: Transform, o: LoaderOptions) -> Result<Self> {
        let samples: Samples = samples.into();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(o.workers.max(1))
            .thread_name(|i| format!("ringtrain-data-{i}"))
            .build()
            .context("starting data worker threads")?;
        // A raw pack is decoded already: nothing to cache.
        let cache = o.cache.filter(|_| !samples.decoded());
        Ok(Loader {
            cache: cache.map(|b| Arc::new(Cache::new(samples.len(), b))),
            on_device: None,
            samples: Arc::new(samples),
            transform,
            batch_size: o.batch_size,
            shuffle: o.shuffle,
            shuffle_buffer: o.shuffle_buffer,
            shard_streams: o.shard_streams,
            drop_last: o.drop_last,
            seed: o.seed,
            prefetch: o.prefetch.max(1),
            skip_unreadable: o.skip_unreadable,
            shard: o.shard,
            normalize: o.normalize,
            pin_memory: o.pin_memory,
            whole_jpeg: o.whole_jpeg,
            repeats: o.repeats.map(|r| r.max(1)),
            torch_sampler_seed: o.torch_sampler_seed,
            pool: Arc::new(pool),
            // The queued batches, the one the consumer holds and the one before it.
            buffers: Arc::new(Buffers::new(o.prefetch.max(1) + 2)),
        })
    }

    pub fn samples(&self) -> &Samples {
        &self.samples
    }

    pub fn num_samples(&self) -> usize {
        self.samples.len()
    }

    /// `--data-on-device`: decodes the whole set once onto `normalize`'s device; from then on
    /// every batch is made there (`on_device.rs`), already normalised where it was resampled.
    /// Returns the bytes it takes there.
    pub fn put_on_device(&mut self, normalize: &Normalizer) -> Result<u64> {
        let o = DeviceSetOptions {
            seed: self.seed,
            device: normalize.device(),
            skip_unreadable: self.skip_unreadable,
            whole_jpeg: self.whole_jpeg,
        };
        let set = DeviceSet::load(&self.samples, &self.transform, o, normalize.shallow_clone(), &self.pool)?;
        let bytes = set.bytes();
        self.on_device = Some(set);
        Ok(bytes)
    }

    /// Samples this rank sees per epoch.
    pub fn shard_len(&self) -> usize {
        let n = self.samples.len();
        if self.repeats.is_some() {
            return repeated_len(n, self.shard.map_or(1, |s| s.world));
        }
        match self.shard {
            None => n,
            Some(Shard { world, pad: true, .. }) => n.div_ceil(world),
            Some(Shard {
                rank,
                world,
                pad: false,
            }) => (n + world - 1 - rank) / world,
        }
    }

    pub fn batches_per_epoch(&self) -> usize {
        let n = self.shard_len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// This rank's sample order for an epoch: a permutation drawn from `seed` (torch's with
    /// `torch_sampler_seed`; or the folder order; for a sharded source, its streams of shards
    /// interleaved: `order::stream_order`), then its shard (with repeated augmentation, draw
    /// keys: sample + n·copy). The order before the split does not depend on the number of
    /// ranks, so global batch k holds the same samples whatever it is.
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        let n = self.samples.len();
        let mut order: Vec<usize> = match self.samples.shard_of(0) {
            Some(_) if self.shuffle => {
                let shard_of = |i| self.samples.shard_of(i).expect("a sharded source");
                stream_order(n, shard_of, self.seed, epoch, self.shard_streams, self.shuffle_buffer)
            }
            _ => (0..n).collect(),
        };
        if self.shuffle && self.samples.shard_of(0).is_none() {
            match self.torch_sampler_seed {
                Some(seed) => order = torch_permutation(order.len(), seed.wrapping_add(epoch)),
                None => order.shuffle(&mut seeds::shuffle(self.seed, epoch)),
            }
        }
        if let Some(reps) = self.repeats {
            let (rank, world) = self.shard.map_or((0, 1), |s| (s.rank, s.world));
            return repeated_order(&order, reps, (rank, world));
        }
        match self.shard {
            None => order,
            Some(Shard { rank, world, pad }) => {
                if pad && !order.is_empty() {
                    let total = order.len().div_ceil(world) * world;
                    let extra: Vec<usize> = order.iter().cycle().take(total - order.len()).copied().collect();
                    order.extend(extra);
                }
                order.into_iter().skip(rank).step_by(world).collect()
            }
        }
    }

    /// Starts producing the batches of `epoch`; iterate the result to consume them.
    pub fn epoch(&self, epoch: u64) -> EpochIter<'_> {
        self.epoch_from(epoch, 0)
    }

    /// One pass over every image (epoch 0; in folder order for an in-order loader) calling `f` on
    /// each batch that holds a readable image: eval's and predict's loop. Returns the images that
    /// could not be read.
    pub fn each_readable_batch(&self, mut f: impl FnMut(&Batch) -> Result<()>) -> Result<Vec<(PathBuf, String)>> {
        let mut unreadable = Vec::new();
        for batch in self.epoch(0) {
            let mut batch = batch?;
            unreadable.append(&mut batch.unreadable);
            if !batch.indices.is_empty() {
                f(&batch)?;
            }
        }
        Ok(unreadable)
    }

    /// The batches of `epoch` from batch `start` on (a resumed epoch: the ones before are
    /// neither decoded nor returned; those after are exactly those of an uninterrupted epoch).
    ///
    /// Batches are built concurrently, each as one job on the worker pool (its images decoded in
    /// parallel inside it), so workers go on to the next batch while the last images of one are
    /// still being decoded; they are handed over in order. At most `prefetch` batches wait
    /// finished or in progress, plus the one the consumer holds: memory stays flat.
    pub fn epoch_from(&self, epoch: u64, start: usize) -> EpochIter<'_> {
        let order = self.order(epoch);
        if self.on_device.is_none() {
            // Remote shards are fetched ahead, in the order the batches will read them.
            self.samples.will_read(&order[(start * self.batch_size).min(order.len())..]);
        }
        if let Some(set) = &self.on_device {
            let chunks = order.chunks(self.batch_size).take(self.batches_per_epoch()).skip(start);
            return EpochIter::Device {
                set,
                batches: chunks.map(<[usize]>::to_vec).collect::<Vec<_>>().into_iter(),
                epoch,
            };
        }
        let (queue_tx, queue_rx) = sync_channel::<Receiver<Result<Batch>>>(self.prefetch.saturating_sub(1));
        let (samples, transform, pool, cache, buffers) = (
            self.samples.clone(),
            self.transform.clone(),
            self.pool.clone(),
            self.cache.clone(),
            self.buffers.clone(),
        );
        let (bs, seed, n_batches, skip, normalize, pin_memory, whole_jpeg) = (
            self.batch_size,
            self.seed,
            self.batches_per_epoch(),
            self.skip_unreadable,
            self.normalize,
            self.pin_memory,
            self.whole_jpeg,
        );
        let handle = std::thread::Builder::new()
            .name("ringtrain-loader".into())
            .spawn(move || {
                for chunk in order.chunks(bs).take(n_batches).skip(start) {
                    let (tx, rx) = sync_channel(1);
                    let (samples, transform, chunk) = (samples.clone(), transform.clone(), chunk.to_vec());
                    let (cache, buffers) = (cache.clone(), buffers.clone());
                    pool.spawn(move || {
                        let job = BatchJob {
                            samples: &samples,
                            cache: cache.as_deref(),
                            transform: &transform,
                            seed,
                            epoch,
                            skip_unreadable: skip,
                            normalize,
                            pin_memory,
                            whole_jpeg,
                            buffers: &buffers,
                        };
                        let _ = tx.send(job.make(&chunk));
                    });
                    // Blocks while `prefetch` batches are queued. A closed receiver means the
                    // consumer stopped early: stop quietly (jobs already started just finish).
                    if queue_tx.send(rx).is_err() {
                        return;
                    }
                }
            })
            .expect("spawning the loader thread");
        EpochIter::Threads {
            queue: queue_rx,
            failed: false,
            _handle: handle,
        }
    }
}

/// An uninitialised host tensor, in pinned memory when asked (so its copy to a GPU can be
/// asynchronous). Where pinning fails (no usable CUDA driver, a locked-memory limit) ordinary
/// memory works too, only slower: said once per process.
fn host_tensor(shape: &[i64], kind: Kind, pin: bool) -> Tensor {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if pin {
        match crate::shim::empty_pinned(shape, kind) {
            Ok(t) => return t,
            Err(e) => WARNED.call_once(|| {
                crate::report::progress::warn(&format!(
                    "pinned host memory is unavailable ({e:#}); batches are copied to the GPU from ordinary memory, synchronously"
                ))
            }),
        }
    }
    Tensor::empty(shape, (kind, Device::Cpu))
}

/// What building one batch needs.
struct BatchJob<'a> {
    samples: &'a Samples,
    cache: Option<&'a Cache>,
    transform: &'a Transform,
    seed: u64,
    epoch: u64,
    skip_unreadable: bool,
    normalize: Option<HostNormalize>,
    pin_memory: bool,
    whole_jpeg: bool,
    buffers: &'a Buffers,
}

impl BatchJob<'_> {
    /// Decodes and transforms the images of `indices` straight into one batch tensor (uint8
    /// [B,H,W,3], or normalised f32 [B,3,H,W]), in parallel on the current pool.
    fn make(&self, indices: &[usize]) -> Result<Batch> {
        let size = self.transform.size() as i64;
        let per = (size * size * 3) as usize;
        let n = indices.len();
        let (shape, kind) = match self.normalize {
            None => ([n as i64, size, size, 3], Kind::Uint8),
            Some(h) if h.channels_last => ([n as i64, size, size, 3], Kind::Float),
            Some(_) => ([n as i64, 3, size, size], Kind::Float),
        };
        let images = match self.pin_memory {
            true => host_tensor(&shape, kind, true),
            false => self.buffers.take(&shape, kind),
        };
        let results: Vec<Result<()>> = match self.normalize {
            None => {
                // SAFETY: a contiguous CPU tensor of exactly n * per bytes, fresh or reused
                // (`Buffers` hands one out only when nothing else holds it), that nothing else
                // references until it is returned; the workers write disjoint chunks.
                let px: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(images.data_ptr() as *mut u8, n * per) };
                px.par_chunks_mut(per)
                    .zip(indices.par_iter())
                    .map(|(out, &i)| self.load(i, out))
                    .collect()
            }
            Some(h) => {
                // SAFETY: as above, n * per f32 values.
                let px: &mut [f32] = unsafe { std::slice::from_raw_parts_mut(images.data_ptr() as *mut f32, n * per) };
                px.par_chunks_mut(per)
                    .zip(indices.par_iter())
                    .map(|(out, &i)| {
                        let mut rgb = vec![0u8; per];
                        self.load(i, &mut rgb)?;
                        h.apply(&rgb, out);
                        Ok(())
                    })
                    .collect()
            }
        };
        // channels_last: the NHWC buffer seen as [B,3,H,W].
        let images = match self.normalize {
            Some(h) if h.channels_last => images.permute([0, 3, 1, 2]),
            _ => images,
        };
        let (mut kept, mut kept_rows, mut unreadable) = (Vec::with_capacity(n), Vec::new(), Vec::new());
        for (row, (&key, r)) in indices.iter().zip(results).enumerate() {
            let i = key % self.samples.len();
            match r {
                Ok(()) => {
                    kept.push(i);
                    kept_rows.push(row as i64);
                }
                // The path goes with the warning; the reason is the decoder's own words. Data
                // that could not be fetched stops the run: every sample behind it would fail too.
                Err(e) if self.skip_unreadable && !crate::error::is_unfetchable(&e) => {
                    unreadable.push((self.samples.path(i), e.root_cause().to_string()))
                }
                Err(e) => return Err(e),
            }
        }
        let images = if unreadable.is_empty() {
            images
        } else {
            images.index_select(0, &Tensor::from_slice(&kept_rows))
        };
        let labels: Vec<i64> = kept.iter().map(|&i| self.samples.label(i) as i64).collect();
        let mut label_tensor = host_tensor(&[labels.len() as i64], Kind::Int64, self.pin_memory);
        label_tensor.copy_(&Tensor::from_slice(&labels));
        Ok(Batch {
            images,
            labels: label_tensor,
            indices: kept,
            unreadable,
        })
    }

    /// The sample of draw `key` (`Loader::order`'s entries) into `out`.
    fn load(&self, key: usize, out: &mut [u8]) -> Result<()> {
        let s = (self.seed, self.epoch);
        let i = key % self.samples.len();
        load_sample(self.samples, (i, key), self.transform, s, self.whole_jpeg, self.cache, out)
    }
}

/// One epoch's batches, in order: built by the worker pool (behind a bounded queue), or on the
/// device from the set there.
pub enum EpochIter<'a> {
    Threads {
        queue: Receiver<Receiver<Result<Batch>>>,
        failed: bool,
        _handle: std::thread::JoinHandle<()>,
    },
    Device {
        set: &'a DeviceSet,
        batches: std::vec::IntoIter<Vec<usize>>,
        epoch: u64,
    },
}

impl Iterator for EpochIter<'_> {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            EpochIter::Threads { failed: true, .. } => None,
            EpochIter::Threads { queue, failed, .. } => {
                let batch = queue.recv().ok()?.recv().ok()?;
                *failed = batch.is_err(); // an error ends the epoch
                Some(batch)
            }
            EpochIter::Device { set, batches, epoch } => batches.next().map(|b| Ok(set.batch(&b, *epoch))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::augment::transform::Interpolation;

    fn folder(n_per_class: usize) -> (tempfile::TempDir, Vec<(PathBuf, usize)>) {
        let d = tempfile::tempdir().unwrap();
        let mut samples = Vec::new();
        for c in 0..3usize {
            for i in 0..n_per_class {
                let p = d.path().join(format!("{c}_{i}.png"));
                image::RgbImage::from_fn(20 + i as u32, 16, |x, y| {
                    image::Rgb([(x * 10) as u8, (y * 10) as u8, c as u8 * 80])
                })
                .save(&p)
                .unwrap();
                samples.push((p, c));
            }
        }
        (d, samples)
    }

    fn collect(l: &Loader, epoch: u64) -> Vec<(Vec<u8>, Vec<i64>)> {
        l.epoch(epoch)
            .map(|b| {
                let b = b.unwrap();
                (
                    Vec::<u8>::try_from(b.images.flatten(0, -1)).unwrap(),
                    Vec::<i64>::try_from(&b.labels).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn batches_do_not_depend_on_worker_count() {
        let (_d, samples) = folder(5);
        let t = Transform::random_resized_crop(8, Interpolation::Bilinear);
        let opts = |workers| LoaderOptions {
            shuffle: true,
            seed: 7,
            prefetch: 2,
            skip_unreadable: false,
            ..LoaderOptions::in_order(4, workers)
        };
        let a = Loader::new(samples.clone(), t.clone(), opts(1)).unwrap();
        let b = Loader::new(samples.clone(), t.clone(), opts(4)).unwrap();
        let (ea, eb) = (collect(&a, 0), collect(&b, 0));
        assert_eq!(ea.len(), 4); // 15 samples, batch 4, last batch kept
        assert_eq!(ea.last().unwrap().1.len(), 3);
        assert_eq!(ea, eb);
        assert_ne!(ea, collect(&a, 1), "a new epoch must reshuffle and re-augment");
        // Normalised by the workers (a CPU device): the same f32 batches with 1 and 4 threads.
        let host = crate::data::load::normalize::Normalizer::new([0.5; 3], [0.25; 3], Device::Cpu).for_workers();
        let f32_batches = |workers| -> Vec<Tensor> {
            let l = Loader::new(
                samples.clone(),
                t.clone(),
                LoaderOptions {
                    normalize: host,
                    ..opts(workers)
                },
            )
            .unwrap();
            l.epoch(0).map(|b| b.unwrap().images).collect()
        };
        let (fa, fb) = (f32_batches(1), f32_batches(4));
        assert_eq!(fa.len(), 4);
        assert!(fa.iter().zip(&fb).all(|(x, y)| x.kind() == Kind::Float && x.equal(y)));
    }

    #[test]
    fn pinned_memory_falls_back_to_ordinary_memory_without_a_gpu() {
        let (_d, samples) = folder(3);
        let t = Transform::eval(8, 9, Interpolation::Bilinear);
        let opts = |pin_memory| LoaderOptions {
            prefetch: 2,
            skip_unreadable: false,
            pin_memory,
            ..LoaderOptions::in_order(4, 2)
        };
        let pinned = collect(&Loader::new(samples.clone(), t.clone(), opts(true)).unwrap(), 0);
        assert_eq!(pinned, collect(&Loader::new(samples, t, opts(false)).unwrap(), 0));
    }

    #[test]
    fn drop_last_and_unshuffled_order() {
        let (_d, samples) = folder(5);
        let t = Transform::eval(8, 9, Interpolation::Bilinear);
        let l = Loader::new(
            samples,
            t,
            LoaderOptions {
                drop_last: true,
                prefetch: 1,
                skip_unreadable: false,
                ..LoaderOptions::in_order(4, 2)
            },
        )
        .unwrap();
        let e = collect(&l, 0);
        assert_eq!(e.len(), 3);
        let labels: Vec<i64> = e.iter().flat_map(|b| b.1.clone()).collect();
        assert_eq!(labels, vec![0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2]);
    }

    #[test]
    fn unreadable_files_are_skipped_and_reported_or_fail_the_batch() {
        let (d, mut samples) = folder(2);
        let bad = d.path().join("bad.png");
        std::fs::write(&bad, b"truncated").unwrap();
        samples.insert(1, (bad.clone(), 0));
        let opts = |skip| LoaderOptions {
            prefetch: 1,
            skip_unreadable: skip,
            ..LoaderOptions::in_order(10, 2)
        };
        let t = Transform::eval(8, 8, Interpolation::Bilinear);
        let l = Loader::new(samples.clone(), t.clone(), opts(true)).unwrap();
        let b = l.epoch(0).next().unwrap().unwrap();
        assert_eq!(b.indices, vec![0, 2, 3, 4, 5, 6]);
        assert_eq!(b.images.size(), vec![6, 8, 8, 3]);
        assert_eq!(b.unreadable.len(), 1);
        assert_eq!(b.unreadable[0].0, bad);
        let l = Loader::new(samples, t, opts(false)).unwrap();
        let e = format!("{:#}", l.epoch(0).next().unwrap().err().unwrap());
        assert!(e.contains("bad.png"), "{e}");
    }

    #[test]
    fn shards_partition_the_epoch_like_distributed_sampler() {
        let samples: Vec<(PathBuf, usize)> = (0..10).map(|i| (PathBuf::from(format!("{i}")), 0)).collect();
        let t = Transform::eval(8, 8, Interpolation::Bilinear);
        let make = |shard| {
            Loader::new(
                samples.clone(),
                t.clone(),
                LoaderOptions {
                    shuffle: true,
                    seed: 3,
                    prefetch: 1,
                    skip_unreadable: false,
                    shard,
                    ..LoaderOptions::in_order(2, 1)
                },
            )
            .unwrap()
        };
        let full = make(None).order(5);
        let shards: Vec<Vec<usize>> = (0..3)
            .map(|r| {
                make(Some(Shard {
                    rank: r,
                    world: 3,
                    pad: true,
                }))
                .order(5)
            })
            .collect();
        // Padded to 12: equal shards of 4, interleaved from the one permutation, the first two repeated.
        assert!(shards.iter().all(|s| s.len() == 4));
        assert_eq!(shards[0], vec![full[0], full[3], full[6], full[9]]);
        assert_eq!(shards[1], vec![full[1], full[4], full[7], full[0]]);
        let unpadded: Vec<Vec<usize>> = (0..3)
            .map(|r| {
                make(Some(Shard {
                    rank: r,
                    world: 3,
                    pad: false,
                }))
                .order(5)
            })
            .collect();
        let mut all: Vec<usize> = unpadded.concat();
        all.sort();
        assert_eq!(
            all,
            (0..10).collect::<Vec<_>>(),
            "validation shards count every sample exactly once"
        );
        assert_eq!(
            make(Some(Shard {
                rank: 2,
                world: 3,
                pad: false
            }))
            .shard_len(),
            3
        );
        assert_eq!(
            make(Some(Shard {
                rank: 0,
                world: 3,
                pad: false
            }))
            .shard_len(),
            4
        );
    }
}
