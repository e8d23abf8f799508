//! Packs (`ringtrain pack`), the RAM cache and the data on the device, against the folder
//! pipeline they replace: the same samples, the same batches (bit for bit where nothing is
//! resampled differently, within a stated bound where it is), whatever the thread count.
mod common;

use std::path::{Path, PathBuf};

use ringtrain::data::augment::transform::{Interpolation, Transform};
use ringtrain::data::load::cache::Budget;
use ringtrain::data::load::loader::{Loader, LoaderOptions};
use ringtrain::data::load::normalize::Normalizer;
use ringtrain::data::source::pack::{self as packed_file, Store};
use ringtrain::data::source::Dataset;
use ringtrain::data::tools::pack::{self, PackOptions};
use tch::{Device, Kind, Tensor};

/// `write_folder`'s images in a temporary directory: (the directory, the ImageFolder in it).
fn folder() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    write_folder(&data);
    (d, data)
}

/// Three classes of PNGs of several sizes, and photo-like 640×480 JPEGs (a 32 px crop of those
/// is decoded at 1/8 size by the folder pipeline).
fn write_folder(root: &Path) {
    for c in 0..3u32 {
        let dir = root.join(format!("class{c}"));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..6u32 {
            let (w, h) = (40 + 7 * i, 30 + 5 * ((i + c) % 4));
            image::RgbImage::from_fn(w, h, |x, y| {
                image::Rgb([(x * 5 + c * 60) as u8, (y * 7 + i * 11) as u8, ((x * y) % 251) as u8])
            })
            .save(dir.join(format!("{i}.png")))
            .unwrap();
        }
        image::RgbImage::from_fn(640, 480, |x, y| {
            let n = ((x * 7919 + y * 104_729 + c) % 97) as u8;
            image::Rgb([(x / 3) as u8 / 2 + n / 4, (y / 2) as u8 + n / 3, 255 - (x / 3) as u8])
        })
        .save(dir.join("photo.jpg"))
        .unwrap();
    }
}

fn packed(data: &Path, out: &Path, store: Store, max_side: Option<u32>) -> PathBuf {
    let o = PackOptions {
        store,
        max_side,
        workers: 2,
    };
    let s = pack::write(data, out, &o).unwrap();
    assert!(s.unreadable.is_empty());
    out.to_path_buf()
}

fn train_transform(size: u32) -> Transform {
    Transform::random_resized_crop(size, Interpolation::Bilinear)
}

fn options(workers: usize) -> LoaderOptions {
    LoaderOptions {
        shuffle: true,
        seed: 11,
        prefetch: 2,
        skip_unreadable: false,
        ..LoaderOptions::in_order(5, workers)
    }
}

/// The uint8 batches of `epochs` epochs, as (pixels, labels).
fn batches(l: &Loader, epochs: &[u64]) -> Vec<(Vec<u8>, Vec<i64>)> {
    epochs
        .iter()
        .flat_map(|&e| l.epoch(e).map(|b| b.unwrap()).collect::<Vec<_>>())
        .map(|b| {
            (
                Vec::<u8>::try_from(b.images.flatten(0, -1)).unwrap(),
                Vec::<i64>::try_from(&b.labels).unwrap(),
            )
        })
        .collect()
}

/// `options(workers)`, every JPEG decoded whole.
fn whole(workers: usize) -> LoaderOptions {
    LoaderOptions {
        whole_jpeg: true,
        ..options(workers)
    }
}

fn loader(data: &Path, t: &Transform, o: LoaderOptions) -> Loader {
    Loader::new(Dataset::open(data, "--data").unwrap().samples, t.clone(), o).unwrap()
}

/// Mean and largest absolute difference of two runs of batches (labels must be equal).
fn difference(a: &[(Vec<u8>, Vec<i64>)], b: &[(Vec<u8>, Vec<i64>)]) -> (f64, u8) {
    assert_eq!(a.len(), b.len());
    let (mut sum, mut n, mut worst) = (0.0, 0usize, 0u8);
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.1, y.1, "the same samples in the same order");
        for (p, q) in x.0.iter().zip(&y.0) {
            sum += p.abs_diff(*q) as f64;
            worst = worst.max(p.abs_diff(*q));
            n += 1;
        }
    }
    (sum / n as f64, worst)
}

#[test]
fn an_encoded_pack_gives_the_folders_batches_bit_for_bit() {
    let (d, data) = folder();
    let p = packed(&data, &d.path().join("enc.pack"), Store::Encoded, None);
    let set = Dataset::open(&p, "--data").unwrap();
    assert_eq!(set.classes, ["class0", "class1", "class2"]);
    assert_eq!(set.len(), 21);
    let eval = Transform::eval(32, 36, Interpolation::Bilinear);
    for t in [train_transform(32), eval] {
        let want = batches(&loader(&data, &t, options(2)), &[0, 1]);
        assert!(want == batches(&loader(&p, &t, options(2)), &[0, 1]), "{t:?}");
        assert!(want == batches(&loader(&p, &t, options(1)), &[0, 1]), "{t:?}, 1 thread");
    }
}

#[test]
fn a_raw_pack_is_the_folder_decoded_once() {
    let (d, data) = folder();
    let raw = packed(&data, &d.path().join("raw.pack"), Store::Raw, None);
    let t = train_transform(32);
    // Decoded whole (as the raw pack was): bit for bit, with 1 or 3 threads.
    let folder_whole = batches(&loader(&data, &t, whole(2)), &[0, 1]);
    assert!(folder_whole == batches(&loader(&raw, &t, options(1)), &[0, 1]));
    assert!(folder_whole == batches(&loader(&raw, &t, options(3)), &[0, 1]));
    // Against the folder's default (small crops of the 640×480 JPEGs decoded at 1/8 size):
    // the decoder's tolerance (`decode.rs`): within 1 level on average, 16 at worst.
    let (mean, worst) = difference(&batches(&loader(&data, &t, options(2)), &[0, 1]), &folder_whole);
    assert!(mean <= 1.0 && worst <= 16, "mean {mean}, worst {worst}");

    // Shrunk to a shorter side of 48 at packing: the PNGs (shorter side 30–45) are untouched,
    // the JPEGs resized twice. Evaluation's Resize(36) + CenterCrop(32) of the pack against the
    // folder's: measured mean 0.04, worst 3 levels; bound: mean 1, worst 32. (Training crops
    // as small as 8 % of a 64×48 image lose the detail --max-side removed: pick it above the
    // training size.)
    let small = packed(&data, &d.path().join("small.pack"), Store::Raw, Some(48));
    let pack = packed_file::Pack::open(&small, "--data").unwrap();
    let shrunk = pack
        .index
        .records
        .iter()
        .filter(|r| (r.width, r.height) == (64, 48))
        .count();
    assert_eq!(shrunk, 3, "640×480 → 64×48, torchvision's Resize(48)");
    let eval = Transform::eval(32, 36, Interpolation::Bilinear);
    let (mean, worst) = difference(
        &batches(&loader(&data, &eval, whole(2)), &[0]),
        &batches(&loader(&small, &eval, options(2)), &[0]),
    );
    eprintln!("raw pack at --max-side 48 against the folder, evaluation crops: mean {mean:.3}, worst {worst}");
    assert!(mean <= 1.0 && worst <= 32, "mean {mean}, worst {worst}");
}

#[test]
fn the_ram_cache_serves_later_epochs_as_the_first_decoded_them() {
    let (_d, data) = folder();
    let t = train_transform(32);
    let budget = Budget::new(u64::MAX);
    let cached = |workers| {
        loader(
            &data,
            &t,
            LoaderOptions {
                cache: Some(budget.clone()),
                ..options(workers)
            },
        )
    };
    let l = cached(2);
    let first = batches(&l, &[0, 1]);
    assert!(
        budget.used() > 3 * 640 * 480 * 3,
        "the images are cached whole: {}",
        budget.used()
    );
    // Epochs 0 and 1 again, now all from the cache: the same batches; and the same as an
    // uncached loader that decodes whole, with any thread count.
    assert!(first == batches(&l, &[0, 1]));
    assert!(first == batches(&loader(&data, &t, whole(1)), &[0, 1]));
    assert!(first == batches(&cached(3), &[0, 1]));
    // A budget too small for anything: nothing kept, the same batches.
    let none = Budget::new(10);
    let l = loader(
        &data,
        &t,
        LoaderOptions {
            cache: Some(none.clone()),
            ..whole(2)
        },
    );
    assert!(first == batches(&l, &[0, 1]));
    assert_eq!(none.used(), 0);
}

#[test]
fn a_pack_splits_as_its_folder_does() {
    let (d, data) = folder();
    let p = packed(&data, &d.path().join("raw.pack"), Store::Raw, None);
    let names = |root: &Path, s: &ringtrain::data::source::Samples| -> Vec<PathBuf> {
        (0..s.len())
            .map(|i| s.path(i).strip_prefix(root).unwrap().to_path_buf())
            .collect()
    };
    let (ft, fv) = ringtrain::data::tools::split::stratified(&Dataset::open(&data, "--data").unwrap(), 0.3, 5);
    let (pt, pv) = ringtrain::data::tools::split::stratified(&Dataset::open(&p, "--data").unwrap(), 0.3, 5);
    assert_eq!(names(&data, &ft), names(&p, &pt));
    assert_eq!(names(&data, &fv), names(&p, &pv));
    assert_eq!(fv.len(), 6);
}

/// A 200×150 image whose red channel is x and green y (bilinear sampling of it is exact), 400
/// times: the device-side RandomResizedCrop's boxes and flips read back from its pixels.
#[test]
fn device_side_crops_follow_random_resized_crop_and_flip_half_the_time() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("ramp.png");
    image::RgbImage::from_fn(200, 150, |x, y| image::Rgb([x as u8, y as u8, 0]))
        .save(&img)
        .unwrap();
    let samples: Vec<(PathBuf, usize)> = (0..400).map(|_| (img.clone(), 0)).collect();
    let s = 16; // every box is larger: sample points never reach a clamp
    let t = Transform::Train {
        size: s,
        scale: (0.25, 1.0),
        ratio: (0.75, 4.0 / 3.0),
        hflip: true,
        erase: None,
        pad: None,
        interpolation: Interpolation::Bilinear,
        color_jitter: None,
            policy: None,
    };
    // Normalised with mean 0 and std 1/255: the batch holds the resampled pixel values.
    let normalize = Normalizer::new([0.0; 3], [1.0 / 255.0; 3], Device::Cpu);
    let mut l = Loader::new(
        samples,
        t.clone(),
        LoaderOptions {
            seed: 3,
            ..LoaderOptions::in_order(100, 2)
        },
    )
    .unwrap();
    l.put_on_device(&normalize).unwrap();
    let (mut flips, mut scales, mut ratios) = (0, Vec::new(), Vec::new());
    for b in l.epoch(4) {
        let x = b.unwrap().images;
        assert_eq!(x.size(), [100, 3, s as i64, s as i64]);
        let at = |k: i64, c: i64, y: i64, xx: i64| x.double_value(&[k, c, y, xx]);
        for k in 0..100 {
            let (s1, s) = (s as f64 - 1.0, s as i64);
            // Output pixel j samples left + (j + ½)·w/S − ½: the first and last columns give w.
            let (r0, r1) = (at(k, 0, 0, 0), at(k, 0, 0, s - 1));
            let (g0, g1) = (at(k, 1, 0, 0), at(k, 1, s - 1, 0));
            let w = (r1 - r0).abs() * s as f64 / s1;
            let h = (g1 - g0) * s as f64 / s1;
            flips += (r1 < r0) as usize;
            scales.push(w * h / (200.0 * 150.0));
            ratios.push(w / h);
        }
    }
    let tol = 0.02; // the boxes are whole pixels; the pixels are floats (measured < 1e-3)
    assert!(
        scales.iter().all(|&a| (0.25 - tol..=1.0 + tol).contains(&a)),
        "{scales:?}"
    );
    assert!(
        ratios.iter().all(|&r| (0.75 - tol..=4.0 / 3.0 + tol).contains(&r)),
        "{ratios:?}"
    );
    // The distribution: the host's RandomResizedCrop (tested against torchvision's in
    // pipeline_parity.rs), 100,000 draws of another stream, against the 400 read back: means
    // of the area and of the log ratio within 4 standard errors.
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(99);
    let host: Vec<(f64, f64)> = (0..100_000)
        .map(|_| {
            let b =
                ringtrain::data::augment::transform::random_resized_crop_box(200, 150, (0.25, 1.0), (0.75, 4.0 / 3.0), &mut rng);
            (b.width * b.height / 30_000.0, (b.width / b.height).ln())
        })
        .collect();
    let stats = |v: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = v.collect();
        let m = v.iter().sum::<f64>() / v.len() as f64;
        (
            m,
            (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt(),
        )
    };
    let (want, sd) = stats(&mut host.iter().map(|h| h.0));
    let (got, _) = stats(&mut scales.iter().copied());
    assert!(
        (got - want).abs() < 4.0 * sd / 20.0,
        "mean area {got}, RandomResizedCrop's {want}"
    );
    let (want, sd) = stats(&mut host.iter().map(|h| h.1));
    let (got, _) = stats(&mut ratios.iter().map(|r| r.ln()));
    assert!(
        (got - want).abs() < 4.0 * sd / 20.0,
        "mean log ratio {got}, RandomResizedCrop's {want}"
    );
    // Flips: binomial(400, ½) within 4σ.
    assert!((160..=240).contains(&flips), "{flips} of 400 flipped");
}

/// CIFAR's padded crop and evaluation's resize + centre crop are made on the device from the
/// host's own resized pixels: the same uint8 batches as the host pipeline.
#[test]
fn device_side_padded_crops_and_evaluation_equal_the_host_pipeline() {
    let (_d, data) = folder();
    let normalize = Normalizer::new([0.5; 3], [0.25; 3], Device::Cpu);
    for &interpolation in Interpolation::ALL {
        let pad = Transform::Train {
            size: 24,
            scale: (0.08, 1.0),
            ratio: (0.75, 4.0 / 3.0),
            hflip: true,
            erase: None,
            pad: Some(4),
            interpolation,
            color_jitter: None,
            policy: None,
        };
        let eval = Transform::eval(24, 28, interpolation);
        for t in [pad, eval] {
            let host = batches(&loader(&data, &t, options(2)), &[0, 1, 2]);
            let mut l = loader(&data, &t, options(2));
            l.put_on_device(&normalize).unwrap();
            let dev = batches(&l, &[0, 1, 2]);
            assert!(host == dev, "{t:?}: differ by {:?}", difference(&host, &dev));
        }
    }
}

/// `--interpolation` of RandomResizedCrop on the device: nearest neighbour is one gather of the
/// pixels the host takes, the host's very batches; bicubic is torch's antialiased interpolation
/// of each box in PIL's two rounded passes, within 1 level of the host's crops (measured 0.0023
/// levels on average). The boxes shrink up to 20× (640×480 JPEGs, decoded whole on both
/// sides, to 24 px) and hold the sharpest edges (PNG values that wrap from 255 to 0), where a
/// bicubic overshoot carried from one pass into the next put one call 15 levels off.
#[test]
fn device_side_bicubic_and_nearest_crops_follow_the_host_pipeline() {
    let (_d, data) = folder();
    // Normalised with mean 0 and std 1/255: the batch holds the resampled pixel values.
    let normalize = Normalizer::new([0.0; 3], [1.0 / 255.0; 3], Device::Cpu);
    let nchw = |x: Tensor| match x.kind() {
        Kind::Uint8 => x.permute([0, 3, 1, 2]).to_kind(Kind::Float),
        _ => x,
    };
    for interpolation in [Interpolation::Bicubic, Interpolation::Nearest] {
        let t = Transform::random_resized_crop(24, interpolation);
        let host: Vec<Tensor> = loader(&data, &t, whole(2)).epoch(0).map(|b| nchw(b.unwrap().images)).collect();
        let mut l = loader(&data, &t, whole(2));
        l.put_on_device(&normalize).unwrap();
        let dev: Vec<Tensor> = l.epoch(0).map(|b| nchw(b.unwrap().images)).collect();
        let diff = (Tensor::cat(&host, 0) - Tensor::cat(&dev, 0)).abs();
        let (mean, worst) = (diff.mean(Kind::Double).double_value(&[]), diff.max().double_value(&[]));
        eprintln!("{interpolation}: device crops against the host's: mean {mean:.4}, worst {worst} levels");
        match interpolation {
            Interpolation::Nearest => assert_eq!(worst, 0.0, "nearest neighbour on the device: mean {mean}"),
            _ => assert!(worst <= 1.0 && mean <= 0.25, "{interpolation}: mean {mean}, worst {worst} levels"),
        }
    }
}

/// RandomResizedCrop on the device resamples without antialiasing, the host with PIL's filter:
/// normalised batches within a stated bound of each other (plant-seedlings-like sizes: 60 px
/// images, 48 px crops, so boxes shrink at most 1.25×).
#[test]
fn device_side_resized_crops_are_close_to_the_host_pipeline() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    for c in 0..2u32 {
        std::fs::create_dir_all(data.join(format!("c{c}"))).unwrap();
        for i in 0..8u32 {
            image::RgbImage::from_fn(60, 60, |x, y| {
                let v = (((x as f64 / 6.0).sin() + (y as f64 / 9.0 + i as f64).cos()) * 60.0 + 128.0) as u8;
                image::Rgb([v, (x * 4) as u8, (y * 4 + c * 50) as u8])
            })
            .save(data.join(format!("c{c}/{i}.png")))
            .unwrap();
        }
    }
    let t = train_transform(48);
    let normalize = Normalizer::new([0.0; 3], [1.0 / 255.0; 3], Device::Cpu);
    let host: Vec<Tensor> = loader(&data, &t, options(2))
        .epoch(0)
        .map(|b| b.unwrap().images.permute([0, 3, 1, 2]).to_kind(Kind::Float))
        .collect();
    let mut l = loader(&data, &t, options(2));
    l.put_on_device(&normalize).unwrap();
    let dev: Vec<Tensor> = l.epoch(0).map(|b| b.unwrap().images).collect();
    let diff = Tensor::cat(&host, 0) - Tensor::cat(&dev, 0);
    let mean = diff.abs().mean(Kind::Double).double_value(&[]);
    eprintln!("device crops against the host's: mean {mean:.3} levels");
    // Measured 0.27 levels of 255; bound 1.5.
    assert!(mean < 1.5, "mean {mean} levels");
}

#[test]
fn a_pack_is_replaced_atomically_and_bad_packs_are_refused() {
    let (d, data) = folder();
    let p = packed(&data, &d.path().join("x.pack"), Store::Encoded, None);
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let bytes = std::fs::read(&p).unwrap();
    let refused = |b: &[u8], needle: &str| {
        let e = packed_file::parse_bytes(b).unwrap_err().to_string();
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    };
    refused(&bytes[..bytes.len() - 1], "truncated");
    refused(&bytes[..20], "truncated");
    refused(b"PK\x03\x04 a zip file", "not a ringtrain pack");
    let mut other = bytes.clone();
    other[8] = 2;
    refused(&other, "format version 2");
    // An index whose record names a class that does not exist.
    let at = bytes
        .windows(10)
        .position(|w| w == b"\"label\":0,")
        .expect("the first record");
    let mut bad = bytes.clone();
    bad[at + 8] = b'7';
    refused(&bad, "corrupt");
    // A stale pack: a file changed after packing.
    let png = data.join("class1/2.png");
    image::RgbImage::from_pixel(9, 9, image::Rgb([1, 2, 3]))
        .save(&png)
        .unwrap();
    let e = Dataset::open(&p, "--data").err().unwrap().to_string();
    assert!(e.contains("older than its folder") && e.contains("1 changed"), "{e}");
    // Packed again, then an image added in a nested folder, where no file changed: its
    // directory's modification time tells.
    let p = packed(&data, &d.path().join("again.pack"), Store::Raw, None);
    assert_eq!(Dataset::open(&p, "--data").unwrap().len(), 21);
    std::fs::create_dir(data.join("class1/deeper")).unwrap();
    let p2 = packed(&data, &d.path().join("nested.pack"), Store::Raw, None);
    std::fs::copy(&png, data.join("class1/deeper/new.PNG")).unwrap();
    let e = Dataset::open(&p2, "--data").err().unwrap().to_string();
    assert!(e.contains("1 added, 0 removed, 0 changed"), "{e}");
    std::fs::remove_file(data.join("class1/deeper/new.PNG")).unwrap();
    std::fs::remove_dir(data.join("class1/deeper")).unwrap();
    // Moved to where its folder is not: it stands alone.
    std::fs::rename(&data, d.path().join("elsewhere")).unwrap();
    assert_eq!(Dataset::open(&p, "--data").unwrap().len(), 21);
}

#[test]
fn train_eval_predict_and_stats_take_a_pack() {
    let d = tempfile::tempdir().unwrap();
    let (data, val) = (d.path().join("train"), d.path().join("val"));
    common::make_folder(&data, &["circle", "ring"], 8);
    common::Shapes {
        size: 36,
        seed: 3,
        first: 100,
    }
    .write(&val, &["circle", "ring"], 3);
    let (tp, vp) = (d.path().join("train.pack"), d.path().join("val.pack"));
    for (src, out, store) in [(&data, &tp, "raw"), (&val, &vp, "encoded")] {
        let o = common::ringtrain(&common::argv(
            &format!("pack --data {{}} --out {{}} --store {store}"),
            &[src, out],
        ));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let run = d.path().join("run");
    let o = common::ringtrain(&common::argv(
        "train --data {} --val {} --out {} --model resnet10-tiny --img-size 32 --epochs 2 --batch-size 4 --device cpu --workers 2",
        &[&tp, &vp, &run],
    ));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("images from the raw pack"), "{stdout}");
    let best = run.join("best");
    let o = common::ringtrain(&common::argv(
        "eval --checkpoint {} --data {} --device cpu --out {}",
        &[&best, &vp, &d.path().join("ev")],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = d.path().join("p.csv");
    let o = common::ringtrain(&common::argv(
        "predict --checkpoint {} --device cpu --out {} {}",
        &[&best, &csv, &vp],
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 1 + 6, "{text}");
    assert!(text.contains("val.pack/circle/0.png"), "{text}");
    // stats of a pack equal those of its folder.
    let stats = |p: &Path| String::from_utf8(common::ringtrain(&common::argv("stats --data {}", &[p])).stdout).unwrap();
    assert_eq!(stats(&tp), stats(&data));
}
