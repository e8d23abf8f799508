//! torchvision's reference-script flags (`references/classification/train.py`): each with
//! torchvision's meaning, its pair among ringtrain's flags refused when they disagree, and the
//! schedule, the weight-decay groups and the moving average's timing against torch's own.
mod common;

use std::collections::HashMap;

use ringtrain::config::{resolve, SchedKind, TrainConfig, WarmupMethod};
use ringtrain::model::{Model, ModelKind};
use ringtrain::train::step::ema::TorchvisionTiming;
use ringtrain::train::step::schedule::{LrSchedule, PlateauState};
use tch::Device;

fn config(toml: &str) -> TrainConfig {
    resolve(None, toml.parse().unwrap()).unwrap()
}

/// The ResNet-50 V2 recipe's crops: training at 176, evaluating 224 of 232, as torchvision's
/// --val-crop-size stays 224; --img-size keeps evaluating at its own size.
#[test]
fn crop_sizes_take_torchvisions_meaning() {
    let c = config("model = \"resnet50\"\ntrain_crop_size = 176\nval_resize_size = 232");
    assert_eq!((c.img_size, c.val_crop_size(), c.eval_resize()), (176, 224, 232));
    let shown = |t: ringtrain::data::augment::transform::Transform| format!("{t:?}");
    assert_eq!(shown(c.eval_transform()), shown(ringtrain::data::augment::transform::Transform::eval(224, 232, Default::default())));
    let c = config("model = \"resnet50\"\nimg_size = 176");
    assert_eq!((c.val_crop_size(), c.eval_resize()), (176, 201));
    let c = config("model = \"resnet50\"\ntrain_crop_size = 176\nval_crop_size = 160");
    assert_eq!((c.img_size, c.val_crop_size(), c.eval_resize()), (176, 160, 183));
    // The same value under both names is one setting; the saved config has ringtrain's names.
    let c = config("img_size = 176\ntrain_crop_size = 176\neval_resize = 232\nval_resize_size = 232");
    assert_eq!((c.img_size, c.val_crop_size(), c.eval_resize()), (176, 176, 232));
    let saved = c.to_toml().unwrap();
    assert!(!saved.contains("train_crop_size") && !saved.contains("val_resize_size"), "{saved}");
    // The flags override the file's setting under either name.
    let file: toml::Table = "img_size = 224".parse().unwrap();
    let c = resolve(Some(file), "train_crop_size = 160".parse().unwrap()).unwrap();
    assert_eq!((c.img_size, c.val_crop_size()), (160, 224));
}

/// --lr-warmup-epochs brings torchvision's warm-up (ConstantLR unless told); --warmup-epochs
/// keeps ringtrain's ramp.
#[test]
fn warmup_names_and_their_shapes() {
    let c = config("lr_warmup_epochs = 5");
    assert_eq!((c.warmup_epochs, c.lr_warmup_method), (5.0, Some(WarmupMethod::Constant)));
    let c = config("lr_warmup_epochs = 5\nlr_warmup_method = \"linear\"");
    assert_eq!(c.lr_warmup_method, Some(WarmupMethod::Linear));
    let c = config("warmup_epochs = 5");
    assert_eq!(c.lr_warmup_method, None);
}

/// LR at the first step of every epoch against torch's LinearLR / ConstantLR, then
/// CosineAnnealingLR (T_max = epochs − warm-up, eta_min = --lr-min) or StepLR, in SequentialLR
/// stepped once an epoch as torchvision's script does.
#[test]
fn schedule_matches_torchs_sequential_lr_epoch_by_epoch() {
    let (epochs, warmup, spe) = (12, 3, 7);
    for (method, main) in [("linear", "cosine"), ("constant", "cosine"), ("linear", "step"), ("constant", "step")] {
        let code = format!(
            r#"
import torch
p = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([p], lr=0.5)
warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters={warmup}) if "{method}" == "linear" else torch.optim.lr_scheduler.ConstantLR(opt, factor=0.01, total_iters={warmup})
main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max={epochs} - {warmup}, eta_min=0.002) if "{main}" == "cosine" else torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.1)
s = torch.optim.lr_scheduler.SequentialLR(opt, schedulers=[warm, main], milestones=[{warmup}])
for e in range({epochs}):
    print(repr(opt.param_groups[0]["lr"]))
    opt.step()
    s.step()
"#
        );
        let want: Vec<f64> = common::run_python_code(&code).lines().map(|l| l.parse().unwrap()).collect();
        let argv = format!(
            "lr = 0.5\nepochs = {epochs}\nlr_warmup_epochs = {warmup}\nlr_warmup_method = \"{method}\"\nlr_warmup_decay = 0.01\nlr_min = 0.002\nsched = \"{main}\"\nstep_size = 4\ngamma = 0.1"
        );
        // lr_min is the flag's alias, not a key: the file says eta_min.
        let c = config(&argv.replace("lr_min", "eta_min"));
        assert_eq!(c.sched, if main == "cosine" { SchedKind::Cosine } else { SchedKind::Step });
        let s = LrSchedule::new(&c, spe);
        let got: Vec<f64> = (0..epochs).map(|e| s.lr_at(e * spe, &PlateauState::default())).collect();
        for (e, (g, w)) in got.iter().zip(&want).enumerate() {
            // torch's recursive forms against the closed forms: a few units in the last place.
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1e-3), "{method}/{main} epoch {e}: {got:?} vs {want:?}");
        }
        // Between epoch starts the linear warm-up rises and the constant one holds.
        let mid = s.lr_at(spe + spe / 2, &PlateauState::default());
        match method {
            "linear" => assert!(mid > want[1] && mid < want[2], "{mid}"),
            _ => assert_eq!(mid, want[1]),
        }
        // Once an epoch (recipe from-torchvision's setting): every step of epoch e at torch's
        // value for e, as train.py's loop runs it.
        let c = config(&format!("{}\nsched_interval = \"epoch\"", argv.replace("lr_min", "eta_min")));
        let s = LrSchedule::new(&c, spe);
        for step in 0..epochs * spe {
            let (g, w) = (s.lr_at(step, &PlateauState::default()), want[step / spe]);
            assert!((g - w).abs() <= 1e-12 * w.abs().max(1e-3), "{method}/{main} step {step}: {g} vs {w}");
        }
    }
}

/// Which parameters get which decay: ringtrain's groups against torchvision's rule on the
/// torchvision model, by name (the norm layers as torchvision.ops' split_normalization_params
/// finds them, with set_weight_decay's default classes; `bias` by the parameter's own name,
/// before the norm).
#[test]
fn decay_groups_match_torchvisions_set_weight_decay() {
    for (model, norm, bias) in [
        ("resnet18", Some(0.0), None),
        ("resnet18", Some(0.0), Some(0.5)),
        ("convnext_tiny", Some(0.0), Some(0.5)),
        ("convnext_tiny", None, Some(0.25)),
    ] {
        let py = |v: Option<f64>| v.map_or("None".to_string(), |v| v.to_string());
        let code = format!(
            r#"
import torch, torchvision
from torchvision.ops._utils import split_normalization_params
m = torchvision.models.{model}()
norm_params, _ = split_normalization_params(m)
norm_ids = {{id(p) for p in norm_params}}
norm, bias = {norm}, {bias}
for name, p in m.named_parameters():
    wd = 1e-4
    if bias is not None and name.split(".")[-1] == "bias":
        wd = bias
    elif norm is not None and id(p) in norm_ids:
        wd = norm
    print(name, repr(wd))
"#,
            norm = py(norm),
            bias = py(bias)
        );
        let want: HashMap<String, f64> = common::run_python_code(&code)
            .lines()
            .map(|l| {
                let (n, w) = l.split_once(' ').unwrap();
                (n.to_string(), w.parse().unwrap())
            })
            .collect();
        let m = Model::new(model.parse::<ModelKind>().unwrap(), 1000, Device::Cpu);
        let params = m.trainable();
        let decay = ringtrain::train::step::optim::torchvision_decay(&params, norm, bias);
        let got: HashMap<String, f64> =
            params.iter().map(|(n, _)| (n.clone(), decay.get(n).copied().unwrap_or(1e-4))).collect();
        assert_eq!(got.len(), want.len(), "{model}");
        for (name, w) in &want {
            assert_eq!(got.get(name), Some(w), "{model} norm {norm:?} bias {bias:?}: {name}");
        }
    }
}

/// The average's timing against torch's AveragedModel driven as torchvision's train_one_epoch
/// drives it (update when the batch index is a multiple of --model-ema-steps; reset the count
/// through the warm-up's epochs), on a one-number model whose weight is the step count.
#[test]
fn model_ema_timing_matches_torchvisions_loop() {
    let (epochs, spe, steps, warmup, decay) = (5usize, 7usize, 3usize, 2usize, 0.75f64);
    for warmup in [0, warmup] {
        let code = format!(
            r#"
import torch
from torch.optim.swa_utils import AveragedModel
m = torch.nn.Linear(1, 1, bias=False)
avg = AveragedModel(m, avg_fn=lambda a, x, n: {decay} * a + (1 - {decay}) * x, use_buffers=True)
k = 0
for epoch in range({epochs}):
    for i in range({spe}):
        k += 1
        with torch.no_grad():
            m.weight.fill_(float(k))
        if i % {steps} == 0:
            avg.update_parameters(m)
            if epoch < {warmup}:
                avg.n_averaged.fill_(0)
        print(repr(avg.module.weight.item()))
"#
        );
        let want: Vec<f64> = common::run_python_code(&code).lines().map(|l| l.parse().unwrap()).collect();
        let timing = TorchvisionTiming {
            steps,
            warmup_epochs: warmup as f64,
        };
        let (mut avg, mut k, mut got) = (0.0f64, 0.0f64, Vec::new());
        for epoch in 0..epochs {
            for i in 0..spe {
                k += 1.0;
                match timing.update_at(epoch, i) {
                    Some(true) => avg = k,
                    Some(false) => avg = decay * avg + (1.0 - decay) * k,
                    None => {}
                }
                got.push(avg);
            }
        }
        assert_eq!(got.len(), want.len(), "warm-up {warmup}: {got:?} vs {want:?}");
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * w.abs(), "warm-up {warmup}, step {j}: {got:?} vs {want:?}");
        }
    }
}

/// torchvision's decay adjustment for the ResNet-50 V2 recipe: 8 GPUs × 128 images, an update
/// every 32 steps, 600 epochs, 0.99998: alpha = 2e-5 · 1024 · 32 / 600.
#[test]
fn model_ema_decay_is_adjusted_as_torchvisions() {
    let c = config("model_ema = true\nbatch_size = 1024\nepochs = 600");
    let (decay, steps) = c.model_ema_schedule().unwrap();
    assert_eq!(steps, 32);
    assert_eq!(decay, 1.0 - (1.0 - 0.99998) * (1024.0 * 32.0 / 600.0));
    let c = config("model_ema = true\nmodel_ema_decay = 0.9\nmodel_ema_steps = 1\nbatch_size = 64\nepochs = 2");
    assert_eq!(c.model_ema_schedule().unwrap().0, 0.0); // alpha capped at 1: a copy each update
    assert_eq!(config("ema = 0.999").model_ema_schedule(), None);
}

/// Pasted as torchvision's script takes it, the ResNet-50 V2 command parses (the data aside).
#[test]
fn the_resnet50_v2_command_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let argv = "train --data no/such/dir --model resnet50 --auto-augment ta_wide --random-erase 0.1 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 --train-crop-size 176 --val-resize-size 232 --model-ema --norm-weight-decay 0.0 --ra-sampler --ra-reps 4 --lr-warmup-method linear --lr-warmup-epochs 5 --lr-warmup-decay 0.01 --lr-scheduler cosineannealinglr --wd 0.00002 --lr 0.5 --batch-size 1024 --epochs 600";
    let mut args: Vec<String> = argv.split(' ').map(String::from).collect();
    args.extend(["--out".into(), dir.path().join("run").to_str().unwrap().to_string()]);
    let out = common::ringtrain(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Everything but the missing data is accepted.
    assert!(stderr.contains("--data directory (or pack) does not exist"), "{stderr}");
}

#[test]
fn conflicting_pairs_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "eval_resize = 256\nval_resize_size = 232\n").unwrap();
    let base = ["train", "--data", "no/such/dir"];
    let cases: &[(&[&str], &str)] = &[
        (&["--img-size", "224", "--train-crop-size", "176"], "--img-size 224 and --train-crop-size 176"),
        (&["--eval-resize", "256", "--val-resize-size", "232"], "--eval-resize 256 and --val-resize-size 232"),
        (&["--warmup-epochs", "2", "--lr-warmup-epochs", "5"], "--warmup-epochs 2.0 and --lr-warmup-epochs 5"),
        (&["--config", file.to_str().unwrap()], "in the --config file"),
        (&["--model", "vit_b_16", "--train-crop-size", "176"], "--val-crop-size 224 differs from the training crop"),
        (&["--model", "vit_b_16", "--val-crop-size", "192"], "takes one input size"),
        (&["--ema", "0.999", "--model-ema"], "--model-ema (torchvision's average) and --ema"),
        (&["--model-ema-steps", "8"], "--model-ema-steps sets torchvision's average: give --model-ema too"),
        (&["--no-bn-weight-decay", "--norm-weight-decay", "0.01"], "--no-bn-weight-decay"),
        (&["--no-norm-bias-decay", "--bias-weight-decay", "0.01"], "--no-norm-bias-decay"),
        (&["--lr-warmup-method", "linear"], "--lr-warmup-method linear needs a warm-up"),
        (&["--warmup-epochs", "2", "--lr-warmup-decay", "0.1"], "--lr-warmup-decay is the factor of --lr-warmup-method"),
        (&["--lr-warmup-epochs", "2", "--lr-warmup-decay", "0"], "--lr-warmup-decay must be in (0, 1]"),
        (&["--model-ema", "--cuda-graphs"], "--cuda-graphs"),
        (&["--val-crop-size", "240", "--eval-resize", "232"], "--eval-resize 232 must be at least --val-crop-size 240"),
    ];
    for (flags, needle) in cases {
        common::expect_user_error(&[&base[..], flags].concat(), needle);
    }
    // Agreeing pairs are one setting each.
    let ok: &[&[&str]] = &[
        &["--img-size", "176", "--train-crop-size", "176"],
        &["--no-bn-weight-decay", "--norm-weight-decay", "0"],
        &["--no-norm-bias-decay", "--norm-weight-decay", "0.0", "--bias-weight-decay", "0"],
    ];
    for flags in ok {
        let out = common::ringtrain(&[&base[..], flags].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--data directory (or pack) does not exist"), "{flags:?}: {stderr}");
    }
}

/// A checkpoint keeps its evaluation crop: trained at 32 px with --val-crop-size 40
/// (--val-resize-size 46), `eval` of it gives the run's own last validation loss and accuracy,
/// and `predict` the probabilities `eval` gives, image by image. The same training evaluated at
/// 32 px has another loss, so a tool that fell back to the training crop would be seen.
#[test]
fn a_checkpoint_evaluates_and_predicts_at_its_own_val_crop_size() {
    let d = tempfile::tempdir().unwrap();
    let (train, val) = (d.path().join("train"), d.path().join("val"));
    let classes = ["Charlock", "Maize", "Sugar_beet"];
    common::link_first(&common::shared_data("plant-seedlings/train"), &train, &classes, 30);
    common::link_first(&common::shared_data("plant-seedlings/test"), &val, &classes, 10);
    let flags = "--model resnet10-tiny --img-size 32 --epochs 2 --batch-size 16 --device cpu --seed 3 --workers 2";
    let run = |name: &str, crops: &str| {
        let out = d.path().join(name);
        let o = common::ringtrain(&common::train_val_args(&train, &val, &out, &format!("{flags} {crops}")));
        assert!(o.status.success(), "{}", common::text(&o));
        let last = common::metrics_rows(&out).pop().unwrap();
        (out, last)
    };
    // metrics.csv's columns: epoch, train_loss, train_top1, val_loss, val_top1, ...
    let (out, last) = run("at40", "--val-crop-size 40 --val-resize-size 46");
    let (_, at32) = run("at32", "--val-crop-size 32 --val-resize-size 37");
    assert!((last[3] - at32[3]).abs() > 1e-3, "the crop changes nothing: {} and {}", last[3], at32[3]);

    let checkpoint = out.join("last");
    let eval_dir = d.path().join("eval");
    let args = ["eval", "--checkpoint", checkpoint.to_str().unwrap(), "--data", val.to_str().unwrap()];
    let o = common::ringtrain(&[&args[..], &["--device", "cpu", "--out", eval_dir.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", common::text(&o));
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(eval_dir.join("metrics.json")).unwrap()).unwrap();
    let (loss, top1) = (m["loss"].as_f64().unwrap(), m["top1"].as_f64().unwrap());
    // metrics.csv keeps six decimals.
    assert!((loss - last[3]).abs() < 2e-6 && (top1 - last[4]).abs() < 2e-6, "eval {loss} {top1}, the run's {last:?}");

    let csv = d.path().join("pred.csv");
    let args = ["predict", "--checkpoint", checkpoint.to_str().unwrap(), "--data", val.to_str().unwrap()];
    let o = common::ringtrain(&[&args[..], &["--device", "cpu", "--out", csv.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", common::text(&o));
    let column = |path: &std::path::Path, name: &str| -> HashMap<String, f64> {
        let text = std::fs::read_to_string(path).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let at = header.iter().position(|h| *h == name).unwrap();
        lines
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[0].to_string(), f[at].parse().unwrap())
            })
            .collect()
    };
    let evaluated = column(&eval_dir.join("predictions.csv"), "probability");
    let predicted = column(&csv, "probability");
    assert_eq!(evaluated.len(), 30);
    for (path, p) in &evaluated {
        let q = predicted.get(path).unwrap_or_else(|| panic!("predict has no {path}"));
        assert!((p - q).abs() < 2e-6, "{path}: eval {p}, predict {q}");
    }
}
