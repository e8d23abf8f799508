//! Mixup/CutMix and the soft-target loss against timm's own code (tests/py/timm_reference.py) and
//! torchvision's v2 MixUp/CutMix, which train.py's own copies equal (tests/py/torchvision_reference.py):
//! Rust draws the parameters and mixes; the reference replays the same random draws on the same
//! tensors.
mod common;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use ringtrain::data::augment::mixup::{soft_target_cross_entropy, MixDraws, MixParams, MixStyle, Mixup, MixupConfig};
use serde_json::json;
use tch::{Device, Kind, Tensor};

struct Case {
    name: &'static str,
    cfg: MixupConfig,
    batch: i64,
    channels_last: bool,
    /// Which draws this case wants (the test walks one seeded RNG until it gets them).
    want: fn(&MixDraws, &MixParams) -> bool,
}

fn cfg(mixup_alpha: f64, cutmix_alpha: f64, prob: f64, label_smoothing: f64) -> MixupConfig {
    MixupConfig {
        style: MixStyle::Timm,
        mixup_alpha,
        cutmix_alpha,
        prob,
        switch_prob: 0.5,
        label_smoothing,
        num_classes: 10,
        correct_lam: true,
    }
}

const H: i64 = 12;
const W: i64 = 16;

fn mixing(d: &MixDraws, _: &MixParams) -> bool {
    d.beta.is_some_and(|b| b != 1.0)
}

/// A CutMix box that the image border clips, so correct_lam matters.
fn clipped_cutmix(d: &MixDraws, p: &MixParams) -> bool {
    let (Some(lam), Some((yl, yh, xl, xh))) = (d.beta, p.cutmix) else {
        return false;
    };
    let r = (1.0 - lam).sqrt();
    let full = ((H as f64 * r) as i64) * ((W as f64 * r) as i64);
    (yh - yl) * (xh - xl) < full && yh > yl && xh > xl
}

fn cases() -> Vec<Case> {
    let with_correct = |mut c: MixupConfig, correct_lam| {
        c.correct_lam = correct_lam;
        c
    };
    vec![
        Case {
            name: "mixup_only",
            cfg: cfg(0.8, 0.0, 1.0, 0.0),
            batch: 8,
            channels_last: false,
            want: mixing,
        },
        Case {
            name: "cutmix_only",
            cfg: cfg(0.0, 1.0, 1.0, 0.0),
            batch: 8,
            channels_last: false,
            want: clipped_cutmix,
        },
        Case {
            name: "cutmix_uncorrected_lam",
            cfg: with_correct(cfg(0.0, 1.0, 1.0, 0.0), false),
            batch: 8,
            channels_last: false,
            want: clipped_cutmix,
        },
        Case {
            name: "switch_to_cutmix",
            cfg: cfg(0.8, 1.0, 1.0, 0.0),
            batch: 6,
            channels_last: false,
            want: |d, p| mixing(d, p) && p.cutmix.is_some(),
        },
        Case {
            name: "switch_to_mixup",
            cfg: cfg(0.8, 1.0, 1.0, 0.0),
            batch: 6,
            channels_last: false,
            want: |d, p| mixing(d, p) && p.cutmix.is_none(),
        },
        Case {
            name: "prob_below_one_unmixed",
            cfg: cfg(0.8, 1.0, 0.6, 0.1),
            batch: 6,
            channels_last: false,
            want: |d, _| d.u_mix >= 0.6,
        },
        Case {
            name: "prob_below_one_mixed",
            cfg: cfg(0.8, 1.0, 0.6, 0.1),
            batch: 6,
            channels_last: false,
            want: mixing,
        },
        Case {
            name: "odd_batch_mixup",
            cfg: cfg(0.8, 0.0, 1.0, 0.0),
            batch: 7,
            channels_last: false,
            want: mixing,
        },
        Case {
            name: "odd_batch_cutmix",
            cfg: cfg(0.0, 1.0, 1.0, 0.0),
            batch: 7,
            channels_last: false,
            want: mixing,
        },
        Case {
            name: "label_smoothing_mixup",
            cfg: cfg(0.8, 0.0, 1.0, 0.1),
            batch: 8,
            channels_last: false,
            want: mixing,
        },
        Case {
            name: "label_smoothing_cutmix_channels_last",
            cfg: cfg(0.0, 1.0, 1.0, 0.1),
            batch: 8,
            channels_last: true,
            want: mixing,
        },
    ]
}

/// The cases as torchvision's train.py mixes: every batch mixed, one of the two at random.
fn torchvision_cases() -> Vec<Case> {
    let tv = |mixup_alpha, cutmix_alpha, label_smoothing| MixupConfig {
        style: MixStyle::Torchvision,
        ..cfg(mixup_alpha, cutmix_alpha, 1.0, label_smoothing)
    };
    // A box the border clips: smaller than its two half-sides either side of the centre.
    fn clipped(d: &MixDraws, p: &MixParams) -> bool {
        let (Some(lam), Some((yl, yh, xl, xh))) = (d.beta, p.cutmix) else {
            return false;
        };
        let r = 0.5 * (1.0 - lam).sqrt();
        let full = 4 * ((H as f64 * r) as i64) * ((W as f64 * r) as i64);
        (yh - yl) * (xh - xl) < full && yh > yl && xh > xl
    }
    vec![
        Case {
            name: "torchvision_mixup",
            cfg: tv(0.2, 0.0, 0.0),
            batch: 8,
            channels_last: false,
            want: mixing,
        },
        Case {
            name: "torchvision_cutmix_clipped",
            cfg: tv(0.0, 1.0, 0.0),
            batch: 8,
            channels_last: false,
            want: clipped,
        },
        Case {
            name: "torchvision_cutmix_inside",
            cfg: tv(0.2, 1.0, 0.1),
            batch: 6,
            channels_last: false,
            want: |d, p| mixing(d, p) && p.cutmix.is_some_and(|(yl, yh, xl, xh)| yl > 0 && xl > 0 && yh < H && xh < W),
        },
        Case {
            name: "torchvision_mixup_smoothed_odd_batch",
            cfg: tv(0.2, 1.0, 0.1),
            batch: 7,
            channels_last: false,
            want: |d, p| mixing(d, p) && p.cutmix.is_none(),
        },
        Case {
            name: "torchvision_cutmix_smoothed_channels_last",
            cfg: tv(0.2, 1.0, 0.1),
            batch: 5,
            channels_last: true,
            want: |d, p| mixing(d, p) && p.cutmix.is_some(),
        },
    ]
}

fn get(tensors: &[(String, Tensor)], name: &str) -> Tensor {
    tensors
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} missing from timm's output"))
        .1
        .shallow_clone()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a - b).abs().max().double_value(&[])
}

#[test]
fn mixup_and_cutmix_match_timm() {
    match_reference(cases(), ("timm_reference.py", &["mixup"]));
}

#[test]
fn mixup_and_cutmix_match_torchvision() {
    match_reference(torchvision_cases(), ("torchvision_reference.py", &["mixup"]));
}

/// Each case's draws, mixed images, targets and lambda against the reference script's; and,
/// where the reference computes one, its loss on the case's logits against ours.
fn match_reference(cases: Vec<Case>, (script, command): (&str, &[&str])) {
    tch::manual_seed(0);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let (mut inputs, mut json_cases, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    for case in cases {
        let m = Mixup::new(case.cfg.clone()).unwrap();
        let (d, p) = (0..10_000)
            .map(|_| {
                let d = m.draw(H, W, &mut rng);
                (d, m.params(&d, H, W))
            })
            .find(|(d, p)| (case.want)(d, p))
            .unwrap_or_else(|| panic!("{}: no suitable draw", case.name));
        assert_eq!(p, m.params(&d, H, W));
        let x = Tensor::randn([case.batch, 3, H, W], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(case.cfg.num_classes, [case.batch], (Kind::Int64, Device::Cpu));
        let x_in = if case.channels_last {
            ringtrain::shim::to_channels_last(&x).unwrap()
        } else {
            x.shallow_clone()
        };
        let (xm, t) = m.apply(&x_in, &y, &p);
        assert!(x_in.equal(&x), "{}: apply must not modify its input", case.name);
        let logits = Tensor::randn([case.batch, case.cfg.num_classes], (Kind::Float, Device::Cpu)) * 3.0;
        ours.push((case.name, p, xm, t, logits.shallow_clone()));
        inputs.push((format!("{}.x", case.name), x));
        inputs.push((format!("{}.y", case.name), y));
        inputs.push((format!("{}.logits", case.name), logits));
        json_cases.push(json!({
            "name": case.name,
            "cfg": case.cfg,
            "draws": {"u_mix": d.u_mix, "u_switch": d.u_switch, "beta": d.beta, "centre": d.centre},
        }));
    }
    Tensor::write_safetensors(&inputs, dir.path().join("in.safetensors")).unwrap();
    std::fs::write(
        dir.path().join("cases.json"),
        serde_json::to_string(&json_cases).unwrap(),
    )
    .unwrap();
    let args: Vec<&str> = command.iter().copied().chain([dir.path().to_str().unwrap()]).collect();
    common::run_python_script(script, &args);
    let theirs = Tensor::read_safetensors(dir.path().join("out.safetensors")).unwrap();

    for (name, p, xm, t, logits) in ours {
        let lam = get(&theirs, &format!("{name}.lam")).double_value(&[0]);
        assert_eq!(p.lam, lam, "{name}: lambda");
        let box_name = format!("{name}.box");
        let their_box = theirs
            .iter()
            .find(|(n, _)| *n == box_name)
            .map(|(_, b)| Vec::<i64>::try_from(b).unwrap());
        let our_box = p.cutmix.map(|(a, b, c, d)| vec![a, b, c, d]);
        assert_eq!(our_box, their_box, "{name}: CutMix box (yl, yh, xl, xh)");
        // The same element-wise operations (a product, a product, a sum; or a copied box) in
        // the same order on the same floats, in the same library: each rounds once, whether
        // vectorised or not, so the results are the same bits on any CPU.
        let dx = max_diff(&xm, &get(&theirs, &format!("{name}.x")));
        let dt = max_diff(&t, &get(&theirs, &format!("{name}.target")));
        eprintln!("{name}: images differ by {dx:e}, targets by {dt:e}");
        assert!(dx == 0.0, "{name}: images differ by {dx:e}");
        assert!(dt == 0.0, "{name}: targets differ by {dt:e}");
        assert_eq!(t.kind(), Kind::Float);
        // Soft targets stay distributions.
        let rows = t.sum_dim_intlist(-1, false, Kind::Double);
        assert!(
            max_diff(&rows, &rows.ones_like()) < 1e-6,
            "{name}: target rows sum to 1"
        );
        // torchvision's loss: cross_entropy(label_smoothing) on its unsmoothed targets, one sum
        // over the batch where ours sums rows first (float32 rounding apart).
        if let Some((_, want)) = theirs.iter().find(|(n, _)| *n == format!("{name}.loss")) {
            let (want, got) = (want.double_value(&[0]), soft_target_cross_entropy(&logits, &t).double_value(&[]));
            assert!((got - want).abs() <= 1e-6 * want.abs(), "{name}: loss {got}, torchvision's {want}");
        }
    }
}

#[test]
fn soft_target_cross_entropy_matches_timm() {
    tch::manual_seed(1);
    let dir = tempfile::tempdir().unwrap();
    let logits = Tensor::randn([9, 10], (Kind::Float, Device::Cpu)) * 3.0;
    let m = Mixup::new(cfg(0.8, 1.0, 1.0, 0.1)).unwrap();
    let p = m.sample(8, 8, &mut ChaCha8Rng::seed_from_u64(3));
    let y = Tensor::randint(10, [9], (Kind::Int64, Device::Cpu));
    let (_, target) = m.apply(&Tensor::zeros([9, 3, 8, 8], (Kind::Float, Device::Cpu)), &y, &p);
    Tensor::write_safetensors(
        &[("logits", &logits), ("target", &target)],
        dir.path().join("in.safetensors"),
    )
    .unwrap();
    common::run_python_script("timm_reference.py", &["soft-ce", dir.path().to_str().unwrap()]);
    let theirs = Tensor::read_safetensors(dir.path().join("out.safetensors")).unwrap();
    let want = get(&theirs, "loss").double_value(&[0]);
    let ours = soft_target_cross_entropy(&logits, &target).double_value(&[]);
    assert!(
        (ours - want).abs() <= 1e-6 * want.abs().max(1.0),
        "ours {ours}, timm {want}"
    );
}
