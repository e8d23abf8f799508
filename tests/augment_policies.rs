//! The augmentation policies against torchvision.transforms.v2 (`tests/py/augment_reference.py`):
//! every operation of every policy's space at every magnitude bin and both signs on uint8
//! images, the magnitude bins themselves, each policy's choices as a distribution over many
//! draws (and that a policy with one operation dropped fails that comparison), ColorJitter's
//! hue and its draws, and repeated
//! augmentation's order against timm's `RepeatAugSampler` (torchvision's `RASampler` with its
//! defaults). timm's RandAugment against timm: its operations against timm's own functions on
//! PIL images, its choices in distribution.
mod common;

use std::collections::{BTreeMap, HashSet};

use rand::SeedableRng;
use ringtrain::data::augment::jitter::ColorJitter;
use ringtrain::data::augment::ops::{self, Image, Op, Sampling};
use ringtrain::data::augment::pil::Filter;
use ringtrain::data::augment::policy::{AutoAugment, Draw, Policy, Step};
use ringtrain::data::augment::timm_rand::{TimmOp, TimmRand, TimmRandSpec, TimmStep};
use ringtrain::data::augment::transform::{Interpolation, Transform};
use ringtrain::data::load::loader::{Loader, LoaderOptions, Shard};
use ringtrain::data::load::order::{repeated_len, repeated_order};

fn policy(kind: AutoAugment) -> Policy {
    Policy::torchvision(kind)
}

/// Per operation and sampling: values compared, values that differ, the largest difference.
#[derive(Default, Debug)]
struct Tally {
    values: usize,
    differ: usize,
    max: u8,
    cases: usize,
}

impl Tally {
    fn add(&mut self, got: &[u8], want: &[u8]) {
        self.cases += 1;
        for (a, b) in got.iter().zip(want) {
            self.values += 1;
            if a != b {
                self.differ += 1;
                self.max = self.max.max(a.abs_diff(*b));
            }
        }
    }
}

#[test]
fn every_operation_at_every_bin_equals_torchvision_v2() {
    let dir = tempfile::tempdir().unwrap();
    let img = common::shared_data("plant-seedlings/test/Maize/d8ae9a82b.png");
    common::run_python_script("augment_reference.py", &["ops", dir.path().to_str().unwrap(), img.to_str().unwrap()]);
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("cases.json")).unwrap()).unwrap();
    let data = std::fs::read(dir.path().join("data.bin")).unwrap();
    let images: Vec<(usize, usize, &[u8])> = index["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let (w, h, at) = (i["w"].as_u64().unwrap() as usize, i["h"].as_u64().unwrap() as usize, i["offset"].as_u64().unwrap() as usize);
            (w, h, &data[at..at + w * h * 3])
        })
        .collect();
    let mut tally: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let mut bins_off = Vec::new();
    let mut shifted = std::collections::BTreeSet::new();
    for case in index["cases"].as_array().unwrap() {
        let name = case["op"].as_str().unwrap();
        let (w, h, input) = images[case["image"].as_u64().unwrap() as usize];
        let magnitude = case["magnitude"].as_f64().unwrap();
        let at = case["offset"].as_u64().unwrap() as usize;
        let want = &data[at..at + w * h * 3];
        if name == "Hue" {
            // ColorJitter's hue (`adjust_hue`), the one adjustment of no policy.
            let mut got = input.to_vec();
            ops::hue(&mut Image { w, h, px: &mut got }, magnitude);
            tally.entry(("Hue".to_string(), "-".to_string())).or_default().add(&got, want);
            continue;
        }
        let op = Op::from_name(name).unwrap_or_else(|| panic!("unknown operation {name}"));
        let sampling = match case["interpolation"].as_str().unwrap() {
            "nearest" => Sampling::Nearest,
            _ => Sampling::Bilinear,
        };
        // The bins: ours against the value torchvision took, a few float32 steps apart at most.
        let kind: AutoAugment = case["policy"].as_str().unwrap().parse().unwrap();
        let step = Step {
            op,
            bin: case["bin"].as_u64().map(|b| b as usize),
            negative: case["negative"].as_bool().unwrap(),
        };
        let ours = policy(kind).magnitude(step, (w, h));
        if (ours - magnitude).abs() > 1e-6 * magnitude.abs().max(1.0) {
            bins_off.push(format!("{kind} {name} bin {:?} (w {w}, h {h}): ours {ours}, torchvision {magnitude}", step.bin));
        }
        // Translations take the whole pixels (Python's int()). torch's float32 linspace can
        // land a step under a whole number where the exact value is whole (TrivialAugmentWide's
        // bin 15 of 0..32: 15.999999, so 15 px); ours is the exact value in float32 (16 px).
        if matches!(op, Op::TranslateX | Op::TranslateY) && ours.trunc() != magnitude.trunc() {
            if ours.fract() == 0.0 && (ours - magnitude).abs() < 1e-5 {
                shifted.insert(format!("{kind} {name} bin {:?}", step.bin));
            } else {
                bins_off.push(format!("{kind} {name} bin {:?}: {ours} and {magnitude} are other whole pixels", step.bin));
            }
        }
        let mut got = input.to_vec();
        ops::apply(op, magnitude, &mut Image { w, h, px: &mut got }, sampling);
        tally.entry((name.to_string(), format!("{sampling:?}"))).or_default().add(&got, want);
    }
    assert!(bins_off.is_empty(), "magnitude bins differ:\n{}", bins_off.join("\n"));
    eprintln!("translations a pixel further than torchvision's, its bin a float32 step under a whole number: {shifted:?}");
    let mut failures = Vec::new();
    for ((name, sampling), t) in &tally {
        eprintln!("{name:>12} {sampling:>8}: {} cases, {} of {} values differ, by {} at most", t.cases, t.differ, t.values, t.max);
        if name == "Hue" {
            // Float32 HSV both ways, in the same operations: a value that lands on a whole
            // number after × 255.999 can truncate either side.
            if t.max > 1 || t.differ as f64 > 1e-3 * t.values as f64 {
                failures.push(format!("Hue: {} of {} values differ, by {} at most (bound: 1, share 0.001)", t.differ, t.values, t.max));
            }
            continue;
        }
        let op = Op::from_name(name).unwrap();
        // Integer operations, and float ones whose every step is one IEEE operation on integers
        // (brightness's product, autocontrast's quotient): exact. Blends: torch fuses the
        // second product into the sum in its vector loops (as ours does: exact here), but not
        // in its scalar ones, which a torch without vector kernels runs everywhere
        // (ATEN_CPU_CAPABILITY=default: colour 0.15 % of the values a level apart, truncated
        // from either side of a whole number). Geometric: coordinates in float32 through
        // another order of operations (torch's affine grid is a matrix product), so a bilinear
        // value at .5 can round the other way (0.07–0.09 % here), and nearest could take the
        // neighbouring pixel at a tie (none here).
        let (max, share) = match op {
            Op::Identity | Op::Posterize | Op::Solarize | Op::Invert | Op::Equalize | Op::AutoContrast | Op::Brightness => (0, 0.0),
            Op::Color | Op::Contrast | Op::Sharpness => (1, 5e-3),
            _ if sampling == "Bilinear" => (1, 2e-3),
            _ => (255, 1e-3),
        };
        if t.max > max || t.differ as f64 > share * t.values as f64 {
            failures.push(format!("{name} ({sampling}): {} of {} values differ, by {} at most (bound: {max}, share {share})", t.differ, t.values, t.max));
        }
    }
    assert!(failures.is_empty(), "operations differ from torchvision's:\n{}", failures.join("\n"));
}

/// A draw's category, as the reference names it: its operations with their signed magnitudes.
fn key(p: &Policy, steps: &[Step], size: (usize, usize)) -> String {
    steps
        .iter()
        .map(|&s| format!("{}:{:.4}", s.op.name(), p.magnitude(s, size)))
        .collect::<Vec<_>>()
        .join("|")
}

/// Two samples of categories from the same distribution: each category's share (and each
/// operation's share of all steps) within `Z` standard errors of the pooled share. With a few
/// hundred categories a true match exceeds 5.5 standard errors in one with odds under 1e-5.
const Z: f64 = 5.5;

fn same_distribution(ours: &BTreeMap<String, usize>, theirs: &BTreeMap<String, usize>) -> Result<(), String> {
    let marginal = |m: &BTreeMap<String, usize>| {
        let mut ops: BTreeMap<String, usize> = BTreeMap::new();
        for (k, &c) in m {
            for step in k.split('|').filter(|s| !s.is_empty()) {
                *ops.entry(format!("op {}", step.split(':').next().unwrap())).or_default() += c;
            }
        }
        ops
    };
    let mut worst = Vec::new();
    for (a, b) in [(ours.clone(), theirs.clone()), (marginal(ours), marginal(theirs))] {
        let (na, nb) = (a.values().sum::<usize>() as f64, b.values().sum::<usize>() as f64);
        let keys: HashSet<&String> = a.keys().chain(b.keys()).collect();
        for k in keys {
            let (ca, cb) = (*a.get(k).unwrap_or(&0) as f64, *b.get(k).unwrap_or(&0) as f64);
            let p = (ca + cb) / (na + nb);
            let se = (p * (1.0 - p) * (1.0 / na + 1.0 / nb)).sqrt();
            let z = (ca / na - cb / nb).abs() / se;
            if z > Z {
                worst.push(format!("{k:?}: ours {ca}/{na}, the reference's {cb}/{nb} ({z:.1} standard errors)"));
            }
        }
    }
    match worst.is_empty() {
        true => Ok(()),
        false => Err(worst.join("\n")),
    }
}

const DRAWS: usize = 8000;
const SIZE: (usize, usize) = (45, 40);

fn counts(v: &serde_json::Value) -> BTreeMap<String, usize> {
    v.as_object().unwrap().iter().map(|(k, c)| (k.clone(), c.as_u64().unwrap() as usize)).collect()
}

/// Mean and mean square of `v` against `w`'s, within `Z` standard errors.
fn same_moments(what: &str, ours: &[f64], theirs: &[f64]) {
    for power in [1, 2] {
        let m = |v: &[f64]| {
            let x: Vec<f64> = v.iter().map(|a| a.powi(power)).collect();
            let mean = x.iter().sum::<f64>() / x.len() as f64;
            let var = x.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / x.len() as f64;
            (mean, var / x.len() as f64)
        };
        let ((ma, va), (mb, vb)) = (m(ours), m(theirs));
        let z = (ma - mb).abs() / (va + vb).sqrt();
        assert!(z < Z, "{what}: moment {power} ours {ma}, the reference's {mb} ({z:.1} standard errors)");
    }
}

#[test]
fn each_policys_choices_match_torchvision_in_distribution() {
    let (w, h) = SIZE;
    let reference: serde_json::Value =
        serde_json::from_str(&common::run_python_script("augment_reference.py", &["draws", &DRAWS.to_string(), &w.to_string(), &h.to_string()])).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    // ColorJitter(0.4, 0.4, 0.4, 0.1): the order of its four adjustments and their factors.
    let cj = ColorJitter::from_flag(&[0.4, 0.4, 0.4, 0.1]).unwrap().unwrap();
    let r = &reference["color_jitter"];
    let mut orders: BTreeMap<String, usize> = BTreeMap::new();
    let mut factors: Vec<[f64; 4]> = Vec::new();
    for _ in 0..DRAWS {
        let (order, f) = cj.draw(&mut rng);
        *orders.entry(order.iter().map(|k| k.to_string()).collect()).or_default() += 1;
        factors.push(f.map(Option::unwrap));
    }
    same_distribution(&orders, &counts(&r["orders"])).unwrap_or_else(|e| panic!("color jitter's order:\n{e}"));
    let theirs: Vec<Vec<f64>> = serde_json::from_value(r["factors"].clone()).unwrap();
    for k in 0..4 {
        let ours: Vec<f64> = factors.iter().map(|f| f[k]).collect();
        let theirs: Vec<f64> = theirs.iter().map(|f| f[k]).collect();
        same_moments(&format!("color jitter's factor {k}"), &ours, &theirs);
    }
    for kind in AutoAugment::ALL.iter().copied() {
        let p = policy(kind);
        let draws: Vec<Draw> = (0..DRAWS).map(|_| p.draw(&mut rng)).collect();
        if kind == AutoAugment::Augmix {
            let r = &reference["augmix"];
            let mut steps: BTreeMap<String, usize> = BTreeMap::new();
            let mut depths: BTreeMap<String, usize> = BTreeMap::new();
            let (mut original, mut chain) = (Vec::new(), Vec::new());
            for d in &draws {
                let Draw::Mix { original: o, chains } = d else { panic!("AugMix draws a mixture") };
                original.push(*o as f64);
                chain.push(chains[0].0 as f64);
                for (_, s) in chains {
                    *depths.entry(s.len().to_string()).or_default() += 1;
                    for st in s {
                        *steps.entry(key(&p, &[*st], SIZE)).or_default() += 1;
                    }
                }
            }
            same_distribution(&steps, &counts(&r["steps"])).unwrap_or_else(|e| panic!("augmix operations:\n{e}"));
            same_distribution(&depths, &counts(&r["depths"])).unwrap_or_else(|e| panic!("augmix chain depths:\n{e}"));
            let floats = |v: &serde_json::Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
            same_moments("augmix original's weight", &original, &floats(&r["original"]));
            same_moments("augmix first chain's weight", &chain, &floats(&r["chain"]));
            continue;
        }
        let chains: Vec<Vec<Step>> = draws
            .into_iter()
            .map(|d| match d {
                Draw::Chain(s) => s,
                Draw::Mix { .. } => panic!("{kind} draws a chain"),
            })
            .collect();
        let tally = |chains: &[Vec<Step>]| {
            let mut m: BTreeMap<String, usize> = BTreeMap::new();
            for c in chains {
                *m.entry(key(&p, c, SIZE)).or_default() += 1;
            }
            m
        };
        let theirs = counts(&reference[kind.name()]);
        same_distribution(&tally(&chains), &theirs).unwrap_or_else(|e| panic!("{kind}:\n{e}"));
        // The comparison has the power to see a policy without one of its operations: drop the
        // first operation with a magnitude the policy drew from every draw, and it fails.
        let dropped = chains.iter().flatten().find(|s| s.bin.is_some()).unwrap().op;
        let without: Vec<Vec<Step>> = chains.iter().map(|c| c.iter().copied().filter(|s| s.op != dropped).collect()).collect();
        assert!(
            same_distribution(&tally(&without), &theirs).is_err(),
            "{kind} without {dropped:?} passed as torchvision's"
        );
    }
}

#[test]
fn repeated_augmentation_gives_each_rank_what_repeat_aug_sampler_gives_it() {
    // 1000 samples: RASampler keeps 768 an epoch over the ranks (1000 // 256 * 256).
    let n = 1000;
    let mut perm: Vec<usize> = (0..n).collect();
    use rand::seq::SliceRandom;
    perm.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(3));
    let perm_text = perm.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    for (reps, world) in [(3, 1), (3, 2), (3, 3), (4, 4), (2, 8), (1, 1), (1, 2)] {
        let code = format!(
            r#"import json, torch
from timm.data.distributed_sampler import RepeatAugSampler
perm = torch.tensor([{perm_text}])
torch.randperm = lambda n, generator=None: perm.clone()
print(json.dumps([list(RepeatAugSampler(list(range({n})), num_replicas={world}, rank=r, num_repeats={reps})) for r in range({world})]))"#
        );
        let theirs: Vec<Vec<usize>> = serde_json::from_str(&common::run_python_code(&code)).unwrap();
        let mut keys = HashSet::new();
        for (rank, want) in theirs.iter().enumerate() {
            let got = repeated_order(&perm, reps, (rank, world));
            assert_eq!(got.len(), repeated_len(n, world), "reps {reps}, world {world}, rank {rank}");
            let samples: Vec<usize> = got.iter().map(|k| k % n).collect();
            assert_eq!(&samples, want, "reps {reps}, world {world}, rank {rank}");
            // Every copy draws its own augmentation: no key twice in the epoch, over all ranks.
            for k in got {
                assert!(keys.insert(k), "key {k} twice (reps {reps}, world {world})");
            }
        }
    }
}

/// `--torch-sampler-seed`: each rank's training order is the one PyTorch's own samplers give
/// it, drawn by torch itself here (no patched randperm): `DistributedSampler(seed=5)` without
/// repeated augmentation, timm's `RepeatAugSampler` (seeded 0 + epoch, as torchvision's
/// `RASampler`) with it, over several epochs and world sizes, padding included.
#[test]
fn torch_sampler_seed_gives_each_rank_what_pytorchs_samplers_give_it() {
    let n = 1001;
    let code = format!(
        r#"import json, torch
from torch.utils.data.distributed import DistributedSampler
from timm.data.distributed_sampler import RepeatAugSampler
out = {{}}
for world in (1, 2, 3):
    for epoch in (0, 1, 7):
        plain, repeated = [], []
        for r in range(world):
            s = DistributedSampler(range({n}), num_replicas=world, rank=r, shuffle=True, seed=5)
            s.set_epoch(epoch)
            plain.append(list(s))
            s = RepeatAugSampler(range({n}), num_replicas=world, rank=r, num_repeats=4)
            s.set_epoch(epoch)
            repeated.append(list(s))
        out[f"{{world}} {{epoch}}"] = [plain, repeated]
print(json.dumps(out))"#
    );
    let theirs: BTreeMap<String, [Vec<Vec<usize>>; 2]> = serde_json::from_str(&common::run_python_code(&code)).unwrap();
    let samples: Vec<(std::path::PathBuf, usize)> = (0..n).map(|i| (format!("{i}.png").into(), 0)).collect();
    let loader = |seed: u64, repeats: Option<usize>, rank: usize, world: usize| {
        let options = LoaderOptions {
            shuffle: true,
            seed: 99, // ringtrain's own seed: unused when the order is torch's
            torch_sampler_seed: Some(seed),
            repeats,
            shard: (world > 1).then_some(Shard { rank, world, pad: true }),
            ..LoaderOptions::in_order(8, 1)
        };
        Loader::new(samples.clone(), Transform::eval(8, 8, Interpolation::Bilinear), options).unwrap()
    };
    for (key, [plain, repeated]) in &theirs {
        let (world, epoch): (usize, u64) = {
            let mut w = key.split(' ').map(|v| v.parse::<usize>().unwrap());
            (w.next().unwrap(), w.next().unwrap() as u64)
        };
        for rank in 0..world {
            let at = format!("world {world}, epoch {epoch}, rank {rank}");
            assert_eq!(loader(5, None, rank, world).order(epoch), plain[rank], "DistributedSampler, {at}");
            let keys = loader(0, Some(4), rank, world).order(epoch);
            let got: Vec<usize> = keys.iter().map(|k| k % n).collect();
            assert_eq!(got, repeated[rank], "RepeatAugSampler, {at}");
        }
    }
    // Without the option the order is ringtrain's own, drawn from --seed: not torch's.
    let options = LoaderOptions { shuffle: true, seed: 5, ..LoaderOptions::in_order(8, 1) };
    let own = Loader::new(samples, Transform::eval(8, 8, Interpolation::Bilinear), options).unwrap();
    assert_ne!(own.order(0), theirs["1 0"][0][0]);
}

#[test]
fn a_run_with_trivial_augment_and_repeated_augmentation_trains_and_refuses_what_it_cannot_do() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    common::link_first(&common::shared_data("plant-seedlings/train"), &data, &["Charlock", "Maize", "Sugar_beet"], 100);
    let run = d.path().join("run");
    let flags = "--model resnet10-tiny --img-size 32 --batch-size 32 --epochs 1 --val-split 0.1 --device cpu --color-jitter 0.4 --auto-augment ta_wide --ra-sampler --random-erasing 0.1";
    let out = common::ringtrain(&common::train_args(&data, &run, flags));
    assert!(out.status.success(), "{}", common::text(&out));
    // 270 training images: 256 an epoch (torchvision's RASampler keeps n // 256 * 256), 8 steps.
    let rows = common::metrics_rows(&run);
    assert_eq!(rows.len(), 1, "{}", common::text(&out));
    assert!(common::text(&out).contains("8 steps per epoch"), "{}", common::text(&out));
    // One copy of each image (--ra-reps 1) is still RASampler's epoch, cut to 256 images.
    let once = common::ringtrain(&common::train_args(&data, &d.path().join("once"), &format!("{flags} --ra-reps 1")));
    assert!(common::text(&once).contains("8 steps per epoch"), "{}", common::text(&once));
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("auto_augment = \"ta_wide\"") && config.contains("ra_sampler = true"), "{config}");
    // show-batch with the run's flags draws the batch the run's first step received, the
    // picture the run kept and put into its report.
    let png = d.path().join("batch.png");
    let mut args = common::train_args(&data, &png, &format!("{flags} --mixup-alpha 0.2 --cutmix-alpha 1.0"));
    args[0] = "show-batch".into();
    let shown = common::ringtrain(&args);
    assert!(shown.status.success(), "{}", common::text(&shown));
    let again = d.path().join("again");
    let run_mixed = common::ringtrain(&common::train_args(&data, &again, &format!("{flags} --mixup-alpha 0.2 --cutmix-alpha 1.0")));
    assert!(run_mixed.status.success(), "{}", common::text(&run_mixed));
    let kept = std::fs::read(again.join("first-batch.png")).unwrap();
    assert!(kept == std::fs::read(&png).unwrap(), "show-batch's picture is not the run's first batch");
    let grid = image::load_from_memory(&kept).unwrap();
    // 32 images in a grid of 6 columns and 6 rows of 160×162-pixel cells.
    assert_eq!((grid.width(), grid.height()), (6 * 160, 6 * 162));
    let page = std::fs::read_to_string(again.join("report.html")).unwrap();
    assert!(page.contains("id=\"first-batch\"") && page.contains("First training batch"));
    let text = common::text(&shown);
    assert!(text.contains("32 of the first batch's 32 images"), "{text}");
    // With two classes too, a mixed image names both (the smoothing's share is every class's
    // floor, not the row's smaller weight).
    let two = d.path().join("two");
    common::link_first(&common::shared_data("plant-seedlings/train"), &two, &["Charlock", "Maize"], 100);
    let mut args = common::train_args(&two, &d.path().join("two.png"), &format!("{} --mixup-alpha 0.2 --label-smoothing 0.1", flags.replace(" --ra-sampler", "")));
    args[0] = "show-batch".into();
    let shown_two = common::text(&common::ringtrain(&args));
    let mixed: usize = shown_two
        .split(" px, ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no count of mixed images: {shown_two}"));
    assert!(mixed > 0, "{shown_two}");
    // Another seed, another batch.
    let other = d.path().join("other.png");
    let mut args = common::train_args(&data, &other, &format!("{flags} --seed 7"));
    args[0] = "show-batch".into();
    assert!(common::ringtrain(&args).status.success());
    assert!(std::fs::read(&other).unwrap() != kept);
    for (extra, needle) in [
        ("--auto-augment ta_wide --data-on-device", "--data-on-device does not do --auto-augment"),
        ("--ra-sampler --data-on-device", "--data-on-device does not do --ra-sampler"),
        ("--color-jitter 0.4 --data-on-device", "--data-on-device does not do --color-jitter"),
        ("--color-jitter 0.4,0.4", "--color-jitter takes 1, 3 or 4 values"),
        ("--color-jitter 0.4,0.4,0.4,0.7", "hue at most 0.5"),
        ("--auto-augment randaugment", "invalid --auto-augment 'randaugment'"),
        ("--auto-augment rand-m9-tweights", "timm's operation sets ('tweights') are not taken"),
        ("--ra-magnitude 31", "--ra-magnitude must be a bin in 0..30"),
        ("--augmix-severity 0", "--augmix-severity must be in 1..10"),
        ("--ra-sampler --batch-size 300", "--ra-sampler keeps 270 // 256 * 256 training images"),
    ] {
        let out_dir = d.path().join("refused");
        let args = common::train_args(&data, &out_dir, &format!("--img-size 32 --device cpu --val-split 0.1 {extra}"));
        common::expect_user_error(&args, needle);
    }
}

/// timm's training transform's fill for its policies: ImageNet's mean colour.
const TIMM_FILL: [u8; 3] = [124, 116, 104];

fn timm(spec: &str, filter: Filter) -> TimmRand {
    TimmRand {
        spec: spec.parse().unwrap(),
        filter,
        fill: TIMM_FILL,
    }
}

/// Every operation of timm's RandAugment, plain and increasing, at magnitudes 0..12 (and up to 20
/// with mmax 20) and both signs, against timm's own level and op functions on PIL images
/// (`augment_reference.py timm_ops`): the arguments equal, and the pixels.
#[test]
fn timms_rand_augment_operations_equal_timms_own_on_pil_images() {
    let dir = tempfile::tempdir().unwrap();
    let img = common::shared_data("plant-seedlings/test/Maize/d8ae9a82b.png");
    let out = dir.path().to_str().unwrap();
    common::run_python_script("augment_reference.py", &["timm_ops", out, img.to_str().unwrap()]);
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("cases.json")).unwrap()).unwrap();
    let data = std::fs::read(dir.path().join("data.bin")).unwrap();
    let number = |v: &serde_json::Value, key: &str| v[key].as_u64().unwrap() as usize;
    let images: Vec<(usize, usize, &[u8])> = index["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let (w, h, at) = (number(i, "w"), number(i, "h"), number(i, "offset"));
            (w, h, &data[at..at + w * h * 3])
        })
        .collect();
    let mut tally: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let (mut refused, mut args_off) = (0, Vec::new());
    for case in index["cases"].as_array().unwrap() {
        let name = case["op"].as_str().unwrap();
        let increasing = case["increasing"].as_bool().unwrap();
        let op = TimmOp::ALL.into_iter().find(|o| o.name(increasing) == name);
        let op = op.unwrap_or_else(|| panic!("unknown {name}"));
        let filter = match case["filter"].as_str().unwrap() {
            "bicubic" => Filter::Bicubic,
            _ => Filter::Bilinear,
        };
        let spec = match case["mmax"].as_u64() {
            Some(m) => format!("rand-inc{}-mmax{m}", increasing as u8),
            None => format!("rand-inc{}", increasing as u8),
        };
        let t = timm(&spec, filter);
        let magnitude = case["magnitude"].as_f64().unwrap();
        let arg = t.level_arg(op, magnitude, case["negative"].as_bool().unwrap());
        let want_arg = case["args"].as_array().unwrap().first().map(|a| a.as_f64().unwrap());
        // (serde_json reads a float to within its last bit.)
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-15 * b.abs().max(1.0);
        if arg.is_some() != want_arg.is_some() || arg.zip(want_arg).is_some_and(|(a, b)| !close(a, b)) {
            args_off.push(format!("{spec} {name} at {magnitude}: ours {arg:?}, timm's {want_arg:?}"));
        }
        let (w, h, input) = images[case["image"].as_u64().unwrap() as usize];
        let mut got = input.to_vec();
        t.apply_step(TimmStep { op, arg }, &mut Image { w, h, px: &mut got });
        if case.get("refused").is_some() {
            // timm asks posterize for 0 bits (or fewer) where Pillow 11+ refuses: ours keeps
            // none, the black image earlier Pillows made (and torchvision makes).
            assert!(got.iter().all(|&v| v == 0), "{spec} {name} at {magnitude}: not black");
            refused += 1;
            continue;
        }
        let at = case["offset"].as_u64().unwrap() as usize;
        let geometric = matches!(op, TimmOp::Rotate | TimmOp::ShearX | TimmOp::ShearY)
            || matches!(op, TimmOp::TranslateXRel | TimmOp::TranslateYRel);
        let how = if geometric { format!("{filter:?}") } else { "-".into() };
        tally.entry((name.to_string(), how)).or_default().add(&got, &data[at..at + w * h * 3]);
    }
    assert!(args_off.is_empty(), "level arguments differ from timm's:\n{}", args_off.join("\n"));
    assert!(refused > 0, "no case of 0 bits");
    let mut failures = Vec::new();
    for ((name, how), t) in &tally {
        let (cases, differ, values, max) = (t.cases, t.differ, t.values, t.max);
        eprintln!("{name:>20} {how:>8}: {cases} cases, {differ} of {values} values differ, by {max} at most");
        if t.differ > 0 {
            failures.push(format!("{name} ({how}): {} of {} values differ, by {} at most", t.differ, t.values, t.max));
        }
    }
    assert!(failures.is_empty(), "operations differ from timm's on PIL:\n{}", failures.join("\n"));
}

/// timm's RandAugment's choices against `rand_augment_transform`'s over many draws: which
/// operations an image gets (with each one's probability `p`), and each operation's argument
/// (magnitude noise, sign) by its mean and mean square; one operation dropped fails.
#[test]
fn timms_rand_augment_choices_match_timm_in_distribution() {
    let configs = ["rand-m9-mstd0.5-inc1", "rand-m7-n3-p0.8-mstd101", "rand-m15-mmax20-n1-p1-mstd2-inc1"];
    let (w, h) = SIZE;
    let mut args = vec!["timm_draws".to_string(), DRAWS.to_string(), w.to_string(), h.to_string()];
    args.extend(configs.iter().map(|c| c.to_string()));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let reference = common::run_python_script("augment_reference.py", &args);
    let reference: serde_json::Value = serde_json::from_str(&reference).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for config in configs {
        let t = timm(config, Filter::Bilinear);
        let inc = t.spec.increasing;
        let draws: Vec<Vec<TimmStep>> = (0..DRAWS).map(|_| t.draw(&mut rng)).collect();
        let tally = |draws: &[Vec<TimmStep>]| {
            let mut m: BTreeMap<String, usize> = BTreeMap::new();
            for d in draws {
                *m.entry(d.iter().map(|s| s.op.name(inc)).collect::<Vec<_>>().join("|")).or_default() += 1;
            }
            m
        };
        let r = &reference[config];
        let theirs = counts(&r["counts"]);
        same_distribution(&tally(&draws), &theirs).unwrap_or_else(|e| panic!("{config}:\n{e}"));
        let takes_arg = |op: TimmOp| t.level_arg(op, 5.0, false).is_some();
        for op in TimmOp::ALL.into_iter().filter(|&op| takes_arg(op)) {
            let ours: Vec<f64> = draws.iter().flatten().filter(|s| s.op == op).map(|s| s.arg.unwrap_or(0.0)).collect();
            let theirs = r["args"][op.name(inc)].as_array().unwrap();
            let theirs: Vec<f64> = theirs.iter().map(|a| a.as_f64().unwrap()).collect();
            same_moments(&format!("{config} {}'s argument", op.name(inc)), &ours, &theirs);
        }
        let dropped = TimmOp::Rotate;
        let without: Vec<Vec<TimmStep>> =
            draws.iter().map(|d| d.iter().copied().filter(|s| s.op != dropped).collect()).collect();
        assert!(same_distribution(&tally(&without), &theirs).is_err(), "{config} without {dropped:?} passed as timm's");
    }
    // Parsed as timm parses them, written back as given; a run takes the string.
    let spec: TimmRandSpec = "rand-m9-mstd0.5-inc1".parse().unwrap();
    assert_eq!(spec.to_string(), "rand-m9-mstd0.5-inc1");
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    common::link_first(&common::shared_data("plant-seedlings/train"), &data, &["Charlock", "Maize"], 20);
    let flags = "--img-size 32 --batch-size 8 --device cpu --val-split 0.1 --auto-augment rand-m9-mstd0.5-inc1";
    let png = d.path().join("batch.png");
    let mut args = common::train_args(&data, &png, flags);
    args[0] = "show-batch".into();
    let shown = common::ringtrain(&args);
    assert!(shown.status.success() && png.exists(), "{}", common::text(&shown));
}
