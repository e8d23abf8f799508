//! Input-pipeline throughput, the same measurement as the PyTorch reference
//! `bench/torch_loader_cpu.py`: RandomResizedCrop(size) + flip + normalise, batch 64, shuffled,
//! drop_last, two epochs, the first batch not timed.
//!
//!   cargo run --release --example loader_throughput -- DIR SIZE WORKERS
use std::time::Instant;

use ringtrain::data::folder::ImageFolder;
use ringtrain::data::loader::{Loader, LoaderOptions};
use ringtrain::data::transform::Transform;
use ringtrain::data::{Normalizer, IMAGENET_MEAN, IMAGENET_STD};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (root, size, workers): (&str, u32, usize) = (&args[1], args[2].parse()?, args[3].parse()?);
    let folder = ImageFolder::scan(root.as_ref(), "DIR")?;
    let t = Transform::Train {
        size,
        scale: (0.08, 1.0),
        ratio: (0.75, 4.0 / 3.0),
        hflip: true,
        erase: None,
    };
    let loader = Loader::new(
        folder.samples,
        t,
        LoaderOptions {
            batch_size: 64,
            shuffle: true,
            drop_last: true,
            seed: 0,
            workers,
            prefetch: 4,
            skip_unreadable: false,
            shard: None,
        },
    )?;
    let normalize = Normalizer::new(IMAGENET_MEAN, IMAGENET_STD, tch::Device::Cpu);
    let (mut n, mut t0) = (0usize, None);
    for epoch in 0..2 {
        for b in loader.epoch(epoch) {
            let b = b?;
            let x = normalize.apply(&b.images);
            if t0.is_none() {
                t0 = Some(Instant::now());
                continue;
            }
            n += x.size()[0] as usize;
        }
    }
    let dt = t0.expect("at least one batch").elapsed().as_secs_f64();
    println!(
        "ringtrain loader size={size} workers={workers}: {:.1} img/s",
        n as f64 / dt
    );
    Ok(())
}
