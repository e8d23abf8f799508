//! `--fused-norm` on the CPU: the fused kernels' numerics (BatchNorm + ReLU, LayerNorm) under
//! Triton's interpreter against PyTorch, the C++ launcher against the orchestration those
//! numerics were checked with, and the fallback to the unfused ops wherever the kernels do not
//! apply. On a GPU the battery
//! (bench/gpu_battery.py) runs the compiled kernels themselves.
mod common;

use common::*;
use ringtrain::model::fused;
use tch::{Kind, Tensor};

/// The kernels, run by Triton's interpreter, forward and backward against PyTorch in fp32, fp16
/// and bf16 on shapes that leave ragged tiles and reduction parts (each script states its bounds):
/// kernels/bn_act.py against F.batch_norm, add and relu through autograd; kernels/layer_norm.py
/// against F.layer_norm as eager PyTorch runs it under autocast (fp32 inside, the activations'
/// dtype outside); kernels/scale_add.py against eager's layer scale, stochastic depth factors and
/// residual add, with the residual stream in the activations' dtype or fp32.
#[test]
fn fused_kernels_match_pytorch_under_the_interpreter() {
    let scripts: [(&str, u64, &[&str]); 3] = [
        ("fused_bn_act.py", 51, &["y", "dx", "dw", "db", "dres"]),
        ("fused_layer_norm.py", 39, &["y", "dx", "dw", "db"]),
        ("fused_scale_add.py", 43, &["out", "dz", "dgamma"]),
    ];
    for (script, cases, names) in scripts {
        let out = run_python_script(script, &[]);
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(v["cases"], cases, "{script}: {out}");
        // More parts than the second stage reads at a time (kernels/launch.py's BLOCK_P = 32).
        assert!(v["max_parts"].as_u64().unwrap() > 32, "{script}: {out}");
        // The fp32 kernels sit within a few fp32 roundings of fp64 (the scripts' bound is 2e-5).
        for name in names {
            let e = v["worst"][format!("{name}_float32")].as_f64().unwrap();
            assert!(e < 2e-5, "{script}: {name}: {e} of the fp64 reference\n{out}");
        }
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

/// csrc/fused_norm.cpp's LayerNorm, recorded instead of launched, makes the launches of
/// kernels/layer_norm.py's orchestration (the one the interpreter test checks), reading an NHWC
/// activation as its [M, C] rows; its gradients have the inputs' shapes and dtypes.
#[test]
fn the_shim_launches_what_the_checked_layer_norm_orchestration_launches() {
    let cases: &[([i64; 4], Kind, &str, i64)] = &[
        ([2, 5, 7, 67], Kind::BFloat16, "bf16", 3),
        ([4, 14, 14, 96], Kind::Half, "f16", 132),
        ([1, 3, 3, 768], Kind::Float, "f32", 8),
        ([2, 2, 2, 1536], Kind::BFloat16, "bf16", 1),
        ([3, 9, 9, 16], Kind::Half, "f16", 2),
    ];
    for &(shape, kind, key, sms) in cases {
        let c = shape[3];
        let m = shape[0] * shape[1] * shape[2];
        let opts = (Kind::Float, tch::Device::Cpu);
        let x = Tensor::randn(shape, opts).to_kind(kind);
        let dy = Tensor::randn(shape, opts).to_kind(kind);
        let (w, b) = (Tensor::ones([c], opts), Tensor::zeros([c], opts));
        let (ours, [dx, dw, db]) = fused::record_layer_norm_launches(&x, &w, &b, &dy, sms).unwrap();
        let args = [m.to_string(), c.to_string(), key.to_string(), sms.to_string()];
        let mut argv = vec!["--plan"];
        argv.extend(args.iter().map(String::as_str));
        let theirs = run_python_script("fused_layer_norm.py", &argv);
        assert_eq!(ours.trim_end(), theirs.trim_end(), "{shape:?} {key} sms {sms}");
        assert_eq!(ours.lines().count(), 4, "{ours}");
        assert_eq!((dx.size(), dx.kind()), (shape.to_vec(), kind));
        assert_eq!((dw.size(), db.kind()), (vec![c], Kind::Float));
    }
    // Refused by name: a layout that is not rows of C, more channels than the widest tile,
    // parameters in another dtype.
    let w = Tensor::ones([8], (Kind::Float, tch::Device::Cpu));
    let rows = Tensor::randn([2, 3, 3, 8], (Kind::Half, tch::Device::Cpu));
    // An NCHW activation seen as NHWC, as ConvNeXt's permute gives it without channels_last.
    let strided = Tensor::randn([2, 8, 3, 3], (Kind::Half, tch::Device::Cpu)).permute([0, 2, 3, 1]);
    assert!(!strided.is_contiguous());
    let err = fused::record_layer_norm_launches(&strided, &w, &w, &strided, 4).unwrap_err();
    assert!(
        format!("{err}").contains("not contiguous with its channels last"),
        "{err}"
    );
    let wide = Tensor::randn([2, 4097], (Kind::Half, tch::Device::Cpu));
    let w_wide = Tensor::ones([4097], (Kind::Float, tch::Device::Cpu));
    let err = fused::record_layer_norm_launches(&wide, &w_wide, &w_wide, &wide, 4).unwrap_err();
    assert!(format!("{err}").contains("more channels than the widest"), "{err}");
    let wh = w.to_kind(Kind::Half);
    let err = fused::record_layer_norm_launches(&rows, &wh, &w, &rows, 4).unwrap_err();
    assert!(format!("{err}").contains("not fp32 vectors"), "{err}");
}

/// csrc/fused_norm.cpp's scale-add (the end of a ConvNeXt block), recorded instead of launched,
/// makes the launches of kernels/scale_add.py's orchestration, reading the block's NHWC output
/// and its channels_last input as the same rows; its gradients have the inputs' shapes and
/// dtypes (the input's cast back from fp32 by autograd when it is not fp32).
#[test]
fn the_shim_launches_what_the_checked_scale_add_orchestration_launches() {
    let cases: &[([i64; 4], Kind, Kind, i64)] = &[
        ([2, 5, 7, 67], Kind::BFloat16, Kind::Float, 3),
        ([4, 14, 14, 96], Kind::Half, Kind::Half, 132),
        ([1, 3, 3, 768], Kind::Float, Kind::Float, 8),
        ([3, 9, 9, 16], Kind::BFloat16, Kind::BFloat16, 2),
    ];
    let key = |k: Kind| match k {
        Kind::Half => "f16",
        Kind::BFloat16 => "bf16",
        _ => "f32",
    };
    for &([n, h, w, c], z_kind, stream_kind, sms) in cases {
        let opts = (Kind::Float, tch::Device::Cpu);
        let z = Tensor::randn([n, h, w, c], opts).to_kind(z_kind);
        let stream = channels_last([n, c, h, w], stream_kind, 1);
        let gamma = Tensor::ones([c, 1, 1], opts);
        let keep = Tensor::ones([n], opts);
        let dout = channels_last([n, c, h, w], Kind::Float, 2);
        let (ours, [dz, dstream, dgamma]) =
            fused::record_scale_add_launches(&z, &stream, &gamma, &keep, &dout, sms).unwrap();
        let args = [n, h, w, c].map(|d| d.to_string());
        let mut argv = vec!["--plan"];
        argv.extend(args.iter().map(String::as_str));
        let sms_arg = sms.to_string();
        argv.extend([key(z_kind), key(stream_kind), sms_arg.as_str()]);
        let theirs = run_python_script("fused_scale_add.py", &argv);
        assert_eq!(
            ours.trim_end(),
            theirs.trim_end(),
            "{:?} {z_kind:?} {stream_kind:?} sms {sms}",
            [n, h, w, c]
        );
        assert_eq!(ours.lines().count(), 3, "{ours}");
        assert_eq!((dz.size(), dz.kind()), (vec![n, h, w, c], z_kind));
        assert_eq!((dstream.size(), dstream.kind()), (vec![n, c, h, w], stream_kind));
        assert_eq!((dgamma.size(), dgamma.kind()), (vec![c, 1, 1], Kind::Float));
    }
    // Refused by name: an NCHW input, an input in a third dtype, factors not one per sample.
    let opts = (Kind::Float, tch::Device::Cpu);
    let z = Tensor::randn([2, 3, 3, 8], opts).to_kind(Kind::Half);
    let (gamma, keep, dout) = (
        Tensor::ones([8, 1, 1], opts),
        Tensor::ones([2], opts),
        channels_last([2, 8, 3, 3], Kind::Float, 3),
    );
    let refused = |stream: &Tensor, keep: &Tensor| {
        format!(
            "{}",
            fused::record_scale_add_launches(&z, stream, &gamma, keep, &dout, 4).unwrap_err()
        )
    };
    let nchw = Tensor::randn([2, 8, 3, 3], opts);
    assert!(refused(&nchw, &keep).contains("not channels_last in the output's shape"));
    let bf16 = channels_last([2, 8, 3, 3], Kind::BFloat16, 4);
    assert!(refused(&bf16, &keep).contains("neither fp32 nor in its output's dtype"));
    let stream = channels_last([2, 8, 3, 3], Kind::Float, 5);
    assert!(refused(&stream, &Tensor::ones([3], opts)).contains("one fp32 value per sample"));
}

/// A ConvNeXt built with `--fused-norm` computes on the CPU exactly what one without computes,
/// in training and in evaluation: the kernels refuse a CPU tensor, and each block's LayerNorm
/// and scale-add fall back to the unfused ops.
#[test]
fn a_fused_convnext_falls_back_on_the_cpu_bit_for_bit() {
    use ringtrain::model::{kind::ModelKind, Model, ModelOptions};
    let kind = ModelKind::ConvNextTiny;
    let build = |fused_norm| {
        // Without stochastic depth, whose draws the tests' shared generator would make differ.
        let opts = ModelOptions {
            img_size: 32,
            fused_norm,
            drop_path: Some(0.0),
            ..ModelOptions::defaults(kind)
        };
        Model::build(kind, 3, tch::Device::Cpu, opts)
    };
    // The same weights in both (the tests share tch's global generator, so no seed would do).
    let (plain, mut fused_model) = (build(false), build(true));
    fused_model.vs.copy(&plain.vs).unwrap();
    let x = ringtrain::shim::to_channels_last(&Tensor::randn([2, 3, 32, 32], (Kind::Float, tch::Device::Cpu))).unwrap();
    for train in [true, false] {
        let (a, b) = (plain.forward(&x, train), fused_model.forward(&x, train));
        assert!(
            a.equal(&b),
            "the fused model's fallback computed otherwise (train {train})"
        );
    }
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
/// read on a file of that format made by the interpreted kernels (BatchNorm + ReLU, LayerNorm,
/// scale-add cases): it passes it, and fails it with the case and tensor named once one gradient
/// element is off by 8 units in fp16's last place.
#[test]
fn the_batterys_reading_of_fused_check_passes_good_kernels_and_catches_bad_ones() {
    for (script, named) in [
        ("fused_bn_act.py", "case 0 [2, 67, 5, 7] float16: dx"),
        ("fused_layer_norm.py", "case ln0 [2, 5, 7, 67] float16: dx"),
        ("fused_scale_add.py", "case sa0 [2, 5, 7, 67] float16: dz"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = run_python_script(script, &["--battery-check", dir.path().to_str().unwrap()]);
        let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(v["cases"], 3, "{script}: {out}");
        let caught = v["caught"]
            .as_str()
            .unwrap_or_else(|| panic!("{script}: a wrong gradient passed: {out}"));
        assert!(caught.starts_with(named), "{script}: {caught}");
    }
}
