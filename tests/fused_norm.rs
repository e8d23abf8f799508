//! `--fused-norm` on the CPU: the fused kernels' numerics under Triton's interpreter against
//! PyTorch, the C++ launcher against the orchestration those numerics were checked with, and the
//! fallback to the unfused ops wherever the kernels do not apply. On a GPU the battery
//! (bench/gpu_battery.py) runs the compiled kernels themselves.
mod common;

use common::*;
use ringtrain::model::fused;
use tch::{Kind, Tensor};

/// kernels/bn_act.py, run by Triton's interpreter: forward and backward of BatchNorm (+ add) +
/// ReLU against F.batch_norm, add and relu through autograd, in fp32, fp16 and bf16, on shapes
/// that leave ragged tiles and reduction parts (tests/py/fused_bn_act.py states the bounds).
#[test]
fn fused_kernels_match_pytorch_under_the_interpreter() {
    let out = run_python_script("fused_bn_act.py", &[]);
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["cases"], 48, "{out}");
    assert!(v["max_parts"].as_u64().unwrap() > 3, "{out}");
    // The fp32 kernels sit within a few fp32 roundings of fp64 (the script's bound is 2e-5).
    for name in ["y", "dx", "dw", "db", "dres"] {
        let e = v["worst"][format!("{name}_float32")].as_f64().unwrap();
        assert!(e < 2e-5, "{name}: {e} of the fp64 reference\n{out}");
    }
}

fn channels_last(shape: [i64; 4], kind: Kind, seed: i64) -> Tensor {
    tch::manual_seed(seed);
    ringtrain::shim::to_channels_last(&Tensor::randn(shape, (Kind::Float, tch::Device::Cpu)).to_kind(kind)).unwrap()
}

/// csrc/fused_norm.cpp's forward and backward, recorded instead of launched, make the very
/// launches (kernel variant, grid, arguments by name, scalar values) that kernels/bn_act.py's
/// orchestration makes, the one the interpreter test checks against PyTorch; and its autograd
/// Function returns gradients of the inputs' shapes and dtypes, with one for the residual only
/// when there is one.
#[test]
fn the_shim_launches_what_the_checked_orchestration_launches() {
    let cases: &[([i64; 4], Kind, &str, bool, i64)] = &[
        ([2, 67, 5, 7], Kind::BFloat16, "bf16", true, 3),
        ([2, 67, 5, 7], Kind::Half, "f16", false, 1),
        ([4, 64, 14, 14], Kind::Half, "f16", true, 132),
        ([3, 256, 7, 7], Kind::Float, "f32", false, 8),
        ([1, 130, 3, 11], Kind::BFloat16, "bf16", false, 2),
    ];
    for &(shape, kind, key, has_res, sms) in cases {
        let c = shape[1];
        let x = channels_last(shape, kind, 1);
        let res = has_res.then(|| channels_last(shape, kind, 2));
        let dy = channels_last(shape, kind, 3);
        let (w, b) = (
            Tensor::ones([c], (Kind::Float, tch::Device::Cpu)),
            Tensor::zeros([c], (Kind::Float, tch::Device::Cpu)),
        );
        let (rm, rv) = (w.zeros_like(), w.ones_like());
        let (ours, grads) = fused::record_launches(&x, [&w, &b, &rm, &rv], res.as_ref(), &dy, sms).unwrap();
        let args: Vec<String> = shape
            .iter()
            .map(|d| d.to_string())
            .chain([key.to_string(), (has_res as u8).to_string(), sms.to_string()])
            .collect();
        let mut argv = vec!["--plan"];
        argv.extend(args.iter().map(String::as_str));
        let theirs = run_python_script("fused_bn_act.py", &argv);
        assert_eq!(
            ours.trim_end(),
            theirs.trim_end(),
            "{shape:?} {key} residual {has_res} sms {sms}"
        );
        assert_eq!(ours.lines().count(), 6, "{ours}");
        let [dx, dw, db, dres] = grads;
        assert_eq!(dx.as_ref().unwrap().size(), shape.to_vec());
        assert_eq!(dx.as_ref().unwrap().kind(), kind);
        assert_eq!((dw.unwrap().size(), db.unwrap().kind()), (vec![c], Kind::Float));
        assert_eq!(dres.is_some(), has_res);
    }
    // The variants with vector loads are taken exactly when C is a multiple of 16.
    let x = channels_last([2, 64, 3, 3], Kind::Half, 1);
    let w = Tensor::ones([64], (Kind::Float, tch::Device::Cpu));
    let (text, _) = fused::record_launches(&x, [&w, &w, &w, &w], None, &x, 4).unwrap();
    assert!(
        text.lines().next().unwrap().starts_with("bn_stats_partial.f16.a16 "),
        "{text}"
    );
}

/// What the kernels do not cover is refused by name, for the caller to run the unfused ops.
#[test]
fn calls_the_kernels_do_not_cover_are_named() {
    let w = Tensor::ones([8], (Kind::Float, tch::Device::Cpu));
    let nchw = Tensor::randn([2, 8, 3, 3], (Kind::Half, tch::Device::Cpu));
    let err = fused::record_launches(&nchw, [&w, &w, &w, &w], None, &nchw, 4).unwrap_err();
    assert!(format!("{err}").contains("not a channels_last"), "{err}");
    let x = channels_last([2, 8, 3, 3], Kind::Half, 1);
    let other = channels_last([2, 8, 3, 3], Kind::BFloat16, 1);
    let err = fused::record_launches(&x, [&w, &w, &w, &w], Some(&other), &x, 4).unwrap_err();
    assert!(format!("{err}").contains("residual"), "{err}");
    let wh = w.to_kind(Kind::Half);
    let err = fused::record_launches(&x, [&wh, &w, &w, &w], None, &x, 4).unwrap_err();
    assert!(format!("{err}").contains("not fp32"), "{err}");
    let one = channels_last([1, 8, 1, 1], Kind::Half, 1);
    let err = fused::record_launches(&one, [&w, &w, &w, &w], None, &one, 4).unwrap_err();
    assert!(format!("{err}").contains("one value per channel"), "{err}");
}

/// `--fused-norm` where the kernels cannot run (the CPU; a model outside the ResNet family) says
/// so in one line and trains exactly as without the flag: the same weights, bit for bit.
#[test]
fn fused_norm_falls_back_on_the_cpu_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    make_folder(&data, &["circle", "square", "triangle"], 8);
    let flags = "--model resnet10-tiny --img-size 32 --epochs 1 --batch-size 8 --device cpu --workers 1";
    let plain = dir.path().join("plain");
    let out = ringtrain(&train_args(&data, &plain, flags));
    assert!(out.status.success(), "{}", text(&out));
    // Left out, the flag is decided per device, silently off on the CPU, and not written down.
    assert!(!text(&out).contains("fused"), "{}", text(&out));
    assert!(!std::fs::read_to_string(plain.join("config.toml")).unwrap().contains("fused_norm"));
    let fused_run = dir.path().join("fused");
    let out = ringtrain(&train_args(&data, &fused_run, &format!("{flags} --fused-norm")));
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    let notes: Vec<&str> = said.lines().filter(|l| l.starts_with("--fused-norm:")).collect();
    assert_eq!(notes.len(), 1, "{said}");
    assert!(
        notes[0].contains("CUDA GPUs") && notes[0].contains("unfused BatchNorm runs"),
        "{said}"
    );
    let (a, b) = (weights(&plain), weights(&fused_run));
    assert_eq!(a.len(), b.len());
    for (name, t) in &a {
        assert!(t.equal(&b[name]), "{name} differs with --fused-norm on the CPU");
    }
    assert!(std::fs::read_to_string(fused_run.join("config.toml"))
        .unwrap()
        .contains("fused_norm = true"));

    let lenet = dir.path().join("lenet");
    let out = ringtrain(&train_args(
        &data,
        &lenet,
        "--model lenet5 --img-size 32 --epochs 1 --batch-size 8 --device cpu --workers 1 --fused-norm",
    ));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("--fused-norm: lenet5 has no layers the fused kernels cover"),
        "{}",
        text(&out)
    );
}

/// The GPU battery's check of `ringtrain fused-check` (bench/gpu_battery.py's fused_cases),
/// read on a file of that format made by the interpreted kernels: it passes it, and fails it with
/// the case and tensor named once one gradient element is off by 8 units in fp16's last place.
#[test]
fn the_batterys_reading_of_fused_check_passes_good_kernels_and_catches_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_python_script("fused_bn_act.py", &["--battery-check", dir.path().to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["cases"], 3, "{out}");
    let caught = v["caught"]
        .as_str()
        .unwrap_or_else(|| panic!("a wrong dx passed: {out}"));
    assert!(caught.starts_with("case 0 [2, 67, 5, 7] float16: dx"), "{caught}");
}
