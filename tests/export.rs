//! `ringtrain export` checked by PyTorch and ONNX Runtime: `torch.jit.load` of the TorchScript
//! file, and ONNX Runtime on the ONNX file (which onnx's full checker passes), give ringtrain's
//! eval outputs at batch 1 and 7 for one network of every family; the files' weights are the
//! model's, their metadata the checkpoint's; with `--with-preprocess` uint8 images give
//! `ringtrain predict`'s logits on those images' files; `--softmax` and `--half` are checked
//! against them; `ringtrain predict` on the ONNX file (through ONNX Runtime's C API) gives the
//! checkpoint's predictions; bad input is one line and exit 2.
mod common;

use std::collections::HashMap;
use std::path::Path;

use ringtrain::export::{onnx, torchscript, ExportGraph, GraphOptions, DEFAULT_OPSET};
use ringtrain::model::{Model, ModelKind, ModelOptions};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

/// One network of each family (its code path: blocks, heads, TensorFlow's "same" padding at an
/// odd size, ViT with a class token and with averaged tokens), at a small input size.
const CASES: &[(&str, u32)] = &[
    ("lenet5", 32),
    ("alexnet", 64),
    ("resnet10-tiny", 32),
    ("resnet18", 32),
    ("resnet50d", 32),
    ("convnext_tiny", 32),
    ("efficientnet_b0", 32),
    ("tf_efficientnet_b0", 33),
    ("efficientnet_v2_s", 32),
    ("mobilenet_v3_small", 32),
    ("vit_tiny_patch16_224", 32),
    ("vit_medium_patch16_gap_256", 32),
    ("regnet_y_400mf", 32),
    ("regnetx_002", 32),
];

/// The opsets written beside the default (17) for some networks: the oldest (13; a ViT's
/// LayerNormalization needs 17), ReduceMean's axes as an input (18), GELU as one operator (20),
/// the newest.
const ONNX_OPSETS: &[(&str, i64)] = &[
    ("resnet50d", 13),
    ("vit_tiny_patch16_224", 16),
    ("vit_medium_patch16_gap_256", 18),
    ("vit_medium_patch16_gap_256", 20),
    ("mobilenet_v3_small", 22),
];

/// The same graph run by the same kernels in libtorch and in PyTorch: beyond rounding, relative
/// to the largest output (the issue's bound). ONNX Runtime's kernels differ from libtorch's, and
/// are held to the same bound.
const SAME: f64 = 1e-4;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `kind` at `size` with every weight random: BatchNorm's running statistics (at their initial 0
/// and 1 an evaluation would not read them) and what starts at zero or near it (a ViT's head,
/// layer scales of 1e-6, which would hide what they scale).
fn random_model(kind: ModelKind, size: u32, classes: i64) -> Model {
    tch::manual_seed(0);
    let opts = ModelOptions { img_size: size, ..ModelOptions::defaults(kind) };
    let model = Model::build(kind, classes, Device::Cpu, opts);
    tch::no_grad(|| {
        for (name, mut t) in model.vs.variables() {
            if name.ends_with("running_var") {
                let _ = t.copy_(&(t.rand_like() + 0.5));
            } else if name.ends_with("running_mean") {
                let _ = t.copy_(&(t.randn_like() * 0.2));
            } else if t.abs().max().double_value(&[]) < 1e-3 {
                let _ = t.copy_(&(t.randn_like() * 0.1));
            }
        }
    });
    model
}

#[test]
fn every_family_exports_to_torchscript_and_onnx_that_pytorch_and_onnx_runtime_run_as_ringtrain() {
    let d = tempfile::tempdir().unwrap();
    let options = GraphOptions { half: false, with_preprocess: false, softmax: false, resize: None };
    let mut names = Vec::new();
    for &(name, size) in CASES {
        let kind: ModelKind = name.parse().unwrap();
        let model = random_model(kind, size, 5);
        let graph = ExportGraph::new(&model, options, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], size);
        let metadata = vec![("model".to_string(), name.to_string()), ("classes".into(), r#"["a","b"]"#.into())];
        torchscript::write(&graph, &metadata, &d.path().join(format!("{name}.pt"))).unwrap();
        // Run in ONNX Runtime against the model before it was kept (None: not skipped).
        let file = d.path().join(format!("{name}.onnx"));
        assert_eq!(onnx::write(&graph, &metadata, DEFAULT_OPSET, &file).unwrap(), None);
        for &opset in ONNX_OPSETS.iter().filter(|(n, _)| *n == name).map(|(_, o)| o) {
            match opset < 17 && name.starts_with("vit") {
                // LayerNormalization came with opset 17: named, and nothing written.
                true => {
                    let f = d.path().join(format!("{name}@{opset}.onnx"));
                    let e = onnx::write(&graph, &metadata, opset, &f).unwrap_err();
                    assert!(format!("{e:#}").contains("LayerNormalization"), "{e:#}");
                    assert!(!f.exists());
                }
                false => {
                    let f = d.path().join(format!("{name}@{opset}.onnx"));
                    assert_eq!(onnx::write(&graph, &metadata, opset, &f).unwrap(), None);
                }
            }
        }
        tch::manual_seed(1);
        let (x1, x7) = (graph.example_input(1), graph.example_input(7));
        let (y1, y7) = tch::no_grad(|| (graph.forward(&x1), graph.forward(&x7)));
        Tensor::write_safetensors(
            &[("x1", &x1), ("x7", &x7), ("y1", &y1), ("y7", &y7)],
            d.path().join(format!("{name}-io.safetensors")),
        )
        .unwrap();
        // torchvision's names (ringtrain's own), also for the networks whose files carry timm's.
        let weights: Vec<(String, Tensor)> = model.state_dict().into_iter().collect();
        Tensor::write_safetensors(&weights, d.path().join(format!("{name}-weights.safetensors"))).unwrap();
        names.push(name);
    }
    let mut args = vec!["check", s(d.path())];
    args.extend(names.iter().copied());
    let got: HashMap<String, Value> =
        serde_json::from_str(&common::run_python_script("export_reference.py", &args)).unwrap();
    for name in names {
        let r = &got[name];
        let f = |k: &str| r[k].as_f64().unwrap();
        eprintln!("{name}: batch 1 {:.1e}, batch 7 {:.1e}, float64 {:.1e}", f("batch1"), f("batch7"), f("float64"));
        for batch in ["batch1", "batch7"] {
            let off = r[batch].as_f64().unwrap();
            assert!(off <= SAME, "{name}: {batch} off by {off:.2e} of the largest logit");
        }
        assert_eq!(r["shape7"], serde_json::json!([7, 5]), "{name}");
        assert_eq!(r["tensor_constants"], false, "{name}: the graph holds a tensor as a constant");
        // In float64 the same network, to fp32's rounding.
        let off = r["float64"].as_f64().unwrap();
        assert!(off <= SAME, "{name}: the module in float64 is off by {off:.2e} of the largest logit");
        // The weights are the model's, exactly, under its state_dict's names.
        assert_eq!(r["weights"].as_f64().unwrap(), 0.0, "{name}");
        assert_eq!(r["only_in_file"], serde_json::json!([]), "{name}");
        assert_eq!(r["only_in_checkpoint"], serde_json::json!([]), "{name}");
        assert_eq!(r["extra"]["model"], name, "{name}");
        assert_eq!(r["extra"]["classes"], r#"["a","b"]"#, "{name}");
        // ONNX Runtime, the checker with full checking, and what the file holds.
        let files = r["onnx"].as_object().unwrap();
        let opsets = ONNX_OPSETS.iter().filter(|(n, o)| *n == name && (*o >= 17 || !n.starts_with("vit"))).count();
        assert_eq!(files.len(), 1 + opsets, "{name}: {:?}", files.keys());
        for (file, o) in files {
            let f = |k: &str| o[k].as_f64().unwrap();
            eprintln!("{file}: ONNX Runtime batch 1 {:.1e}, batch 7 {:.1e}", f("batch1"), f("batch7"));
            assert_eq!(o["checker"], "ok", "{file}");
            for batch in ["batch1", "batch7"] {
                let off = f(batch);
                assert!(off <= SAME, "{file}: ONNX Runtime's {batch} off by {off:.2e} of the largest logit");
            }
            assert_eq!(o["shape7"], serde_json::json!([7, 5]), "{file}");
            let opset = file.split_once('@').map_or(DEFAULT_OPSET, |(_, o)| o.parse().unwrap());
            assert_eq!(o["opset"], serde_json::json!([["", opset]]), "{file}");
            assert_eq!(o["domains"], serde_json::json!([""]), "{file}: an operator outside ONNX's own");
            assert_eq!(o["batch_dims"], serde_json::json!(["batch", "batch"]), "{file}");
            assert!(f("named_weights") > 0.0, "{file}");
            assert_eq!(o["unused_initializers"], serde_json::json!([]), "{file}");
            assert_eq!(f("weights"), 0.0, "{file}");
            assert_eq!(o["metadata"]["model"], name, "{file}");
            assert_eq!(o["metadata"]["classes"], r#"["a","b"]"#, "{file}");
            let ops: Vec<&str> = o["ops"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
            if name.starts_with("vit") {
                assert_eq!(ops.contains(&"Gelu"), opset >= 20, "{file}: {ops:?}");
            }
        }
    }
}

/// A trained checkpoint of 3 classes whose evaluation reads 36 px images as they are: resized to
/// 36 (the images' own size) and centre-cropped to 32.
fn checkpoint(root: &Path) -> std::path::PathBuf {
    checkpoint_with(root, "")
}

/// `checkpoint`, trained with more flags.
fn checkpoint_with(root: &Path, flags: &str) -> std::path::PathBuf {
    let data = root.join("data");
    common::make_folder(&data, &["circle", "square", "triangle"], 6);
    let run = root.join("run");
    let o = common::ringtrain(&common::train_args(
        &data,
        &run,
        &format!(
            "--model resnet10-tiny --img-size 32 --val-resize-size 36 --epochs 1 --batch-size 6 --device cpu \
             --workers 1 {flags}"
        ),
    ));
    assert!(o.status.success(), "{}", common::text(&o));
    run.join("last")
}

/// predict.csv's logit_<class> columns, by image path.
fn predicted_logits(csv: &Path) -> HashMap<String, Vec<f64>> {
    let mut r = csv::Reader::from_path(csv).unwrap();
    let header = r.headers().unwrap().clone();
    let logit_cols: Vec<usize> = (0..header.len()).filter(|&i| header[i].starts_with("logit_")).collect();
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            (rec[0].to_string(), logit_cols.iter().map(|&i| rec[i].parse().unwrap()).collect())
        })
        .collect()
}

#[test]
fn with_preprocess_takes_pixels_and_gives_predicts_logits_and_the_metadata_describes_it() {
    let d = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(d.path());
    let images: Vec<String> = ["circle/0.png", "square/1.png", "triangle/2.png", "square/5.png"]
        .iter()
        .map(|p| d.path().join("data").join(p).to_string_lossy().into_owned())
        .collect();
    let csv = d.path().join("predictions.csv");
    let mut args = vec!["predict".to_string(), "--checkpoint".into(), s(&ckpt).into(), "--logits".into()];
    args.extend(["--out".into(), s(&csv).into(), "--device".into(), "cpu".into()]);
    args.extend(images.iter().cloned());
    let o = common::ringtrain(&args);
    assert!(o.status.success(), "{}", common::text(&o));
    let want = predicted_logits(&csv);
    let want: Vec<Vec<f64>> = images.iter().map(|p| want[p].clone()).collect();
    let want = Tensor::from_slice2(&want);

    let export = |file: &str, flags: &str| {
        let out = d.path().join("export").join(file);
        let format = if file.ends_with(".onnx") { "onnx" } else { "torchscript" };
        let mut args = vec!["export", "--checkpoint", s(&ckpt), "--format", format, "--out", s(&out)];
        args.extend(flags.split_whitespace());
        let o = common::ringtrain(&args);
        assert!(o.status.success(), "{}", common::text(&o));
        out
    };
    let run = |file: &Path| -> (String, Tensor) {
        let mut args = vec!["pixels", s(file), "32"];
        args.extend(images.iter().map(String::as_str));
        let v: Value = serde_json::from_str(&common::run_python_script("export_reference.py", &args)).unwrap();
        // The normalisation's constants are buffers too: the module moves whole.
        assert_eq!(v["tensor_constants"], false, "{}: the graph holds a tensor as a constant", file.display());
        let rows: Vec<Vec<f64>> = serde_json::from_value(v["rows"].clone()).unwrap();
        (v["dtype"].as_str().unwrap().to_string(), Tensor::from_slice2(&rows))
    };

    for ext in ["pt", "onnx"] {
        let (dtype, logits) = run(&export(&format!("model.{ext}"), "--with-preprocess"));
        assert_eq!(dtype, "torch.float32");
        let off = common::rel_max_diff(&logits, &want);
        assert!(off <= SAME, "uint8 images through model.{ext}: off by {off:.2e} of the largest logit");

        let (_, probs) = run(&export(&format!("probs.{ext}"), "--with-preprocess --softmax"));
        let off = common::max_abs_diff(&probs, &want.softmax(-1, Kind::Double));
        assert!(off <= 1e-6, "--softmax, {ext}: off by {off:.2e} from predict's logits' softmax");

        // fp16 on the CPU: each output within 1 % of the largest of fp32's, the same top-1.
        let (dtype, half) = run(&export(&format!("half.{ext}"), "--with-preprocess --half"));
        assert_eq!(dtype, "torch.float16");
        let off = common::rel_max_diff(&half, &want);
        eprintln!("--half, {ext}: {off:.1e} of the largest logit");
        assert!(off <= 1e-2, "--half, {ext}: off by {off:.2e} of the largest logit");
        assert!(half.argmax(-1, false).equal(&want.argmax(-1, false)), "--half, {ext}, changed a top-1");
    }

    // The metadata, and labels.txt beside the file.
    let labels = std::fs::read_to_string(d.path().join("export/labels.txt")).unwrap();
    assert_eq!(labels, "circle\nsquare\ntriangle\n");
    let read = |file: &str| -> HashMap<String, Value> {
        let path = d.path().join("export").join(file);
        serde_json::from_str(&common::run_python_script("export_reference.py", &["check-metadata", s(&path)])).unwrap()
    };
    let got = read("model.pt");
    assert_eq!(got, read("model.onnx"), "the TorchScript and ONNX files' metadata differ");
    let sha = ringtrain::export::file_sha256(&ckpt.join("model.safetensors")).unwrap();
    assert_eq!(got["classes"], r#"["circle","square","triangle"]"#);
    assert_eq!(got["model"], "resnet10-tiny");
    assert_eq!(got["input_size"], "32");
    assert_eq!(got["resize_size"], "36");
    let flags = (&got["jpeg_decode"], &got["softmax"], &got["resize_in_graph"]);
    assert_eq!(flags, (&"scaled".into(), &"false".into(), &"false".into()));
    assert_eq!(got["checkpoint_sha256"], sha.as_str());
    assert!(got["input"].as_str().unwrap().starts_with("uint8 [N, 32, 32, 3]"), "{}", got["input"]);
    assert!(got["output"].as_str().unwrap().starts_with("float32 [N, 3]: logits"), "{}", got["output"]);
    let mean: Vec<f64> = serde_json::from_str(got["mean"].as_str().unwrap()).unwrap();
    assert_eq!(mean, vec![0.485, 0.456, 0.406]);

    // --out naming a directory: refused, the directory left as it was.
    let dir = d.path().join("export");
    let before = std::fs::read_dir(&dir).unwrap().count();
    common::expect_user_error(
        &["export", "--checkpoint", s(&ckpt), "--format", "torchscript", "--out", s(&dir)],
        "is a directory",
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), before);
}

/// predictions.csv's rows by image path: (predicted class, probability, top-1's class and
/// probability pairs as written).
fn predicted_rows(csv: &Path) -> HashMap<String, (String, f64)> {
    let mut r = csv::Reader::from_path(csv).unwrap();
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            (rec[0].to_string(), (rec[1].to_string(), rec[2].parse().unwrap()))
        })
        .collect()
}

#[test]
fn predict_runs_an_exported_onnx_file_in_onnx_runtime_as_it_runs_the_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(d.path());
    let data = d.path().join("data");
    let predict = |model: &Path, out: &str, extra: &[&str]| -> (HashMap<String, Vec<f64>>, String) {
        let csv = d.path().join(out);
        let mut args = vec!["predict", "--checkpoint", s(model), s(&data), "--out", s(&csv), "--batch-size", "5"];
        args.extend(extra);
        let o = common::ringtrain(&args);
        assert!(o.status.success(), "{}", common::text(&o));
        let logits = if extra.contains(&"--logits") { predicted_logits(&csv) } else { HashMap::new() };
        (logits, String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let (want, ckpt_said) = predict(&ckpt, "checkpoint.csv", &["--logits", "--device", "cpu"]);
    assert_eq!(want.len(), 18);
    let accuracy = |said: &str| {
        let line = said.lines().find(|l| l.contains("accuracy"));
        line.map(|l| l.split(';').nth(1).unwrap().to_string())
    };
    let export = |file: &str, flags: &str| {
        let out = d.path().join("export").join(file);
        let mut args = vec!["export", "--checkpoint", s(&ckpt), "--format", "onnx", "--out", s(&out)];
        args.extend(flags.split_whitespace());
        let o = common::ringtrain(&args);
        assert!(o.status.success(), "{}", common::text(&o));
        out
    };
    let off = |got: &HashMap<String, Vec<f64>>| {
        assert_eq!(got.len(), want.len());
        got.iter()
            .map(|(p, g)| {
                let w = &want[p];
                let largest = w.iter().fold(0f64, |m, v| m.max(v.abs()));
                g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max) / largest
            })
            .fold(0f64, f64::max)
    };
    // fp32, normalised by ringtrain's loader or by the graph: the checkpoint's logits.
    for (file, flags) in [("model.onnx", ""), ("pixels.onnx", "--with-preprocess")] {
        let (got, said) = predict(&export(file, flags), file, &["--logits"]);
        let off = off(&got);
        eprintln!("{file}: {off:.1e} of the largest logit");
        assert!(off <= SAME, "{file}: off by {off:.2e} of the largest logit");
        assert!(accuracy(&said).is_some() && accuracy(&said) == accuracy(&ckpt_said), "{said}");
    }
    // fp16: within 1 % of the largest logit; the same top-1 wherever fp32's two best are further
    // apart than that.
    let (half, _) = predict(&export("half.onnx", "--half"), "half.csv", &["--logits"]);
    let half_off = off(&half);
    eprintln!("half.onnx: {half_off:.1e} of the largest logit");
    assert!(half_off <= 1e-2, "half.onnx: off by {half_off:.2e} of the largest logit");
    let argmax = |v: &[f64]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
    let mut clear = 0;
    for (p, w) in &want {
        let mut sorted = w.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 2.0 * half_off * sorted[0].abs().max(sorted[1].abs()) {
            assert_eq!(argmax(&half[p]), argmax(w), "half.onnx changed {p}'s top-1");
            clear += 1;
        }
    }
    assert!(clear >= want.len() / 2, "only {clear} images with a clear top-1: the check says little");
    // --softmax: the probabilities written as they come, the softmax of the checkpoint's logits.
    let probs_file = export("probs.onnx", "--softmax");
    predict(&probs_file, "probs.csv", &[]);
    for (p, (class, prob)) in predicted_rows(&d.path().join("probs.csv")) {
        let w = &want[&p];
        let z: f64 = w.iter().map(|v| (v - w[argmax(w)]).exp()).sum();
        assert!((prob - 1.0 / z).abs() <= 1e-5, "{p}: probability {prob}, the checkpoint's {}", 1.0 / z);
        assert_eq!(class, ["circle", "square", "triangle"][argmax(w)], "{p}");
    }

    // --with-resize: images of any size in. The graph's crops are torchvision's Resize +
    // CenterCrop of the PIL image within a level, at six sizes an image (bilinear, and bicubic
    // from a second checkpoint); predict hands it the images whole and gets the checkpoint's
    // predictions (these images are already the resize's size).
    let resized = export("resized.onnx", "--with-resize");
    let bicubic = checkpoint_with(&d.path().join("bicubic"), "--interpolation bicubic");
    let bicubic_file = d.path().join("export/bicubic.onnx");
    let args = ["export", "--checkpoint", s(&bicubic), "--format", "onnx", "--with-resize", "--out", s(&bicubic_file)];
    let o = common::ringtrain(&args);
    assert!(o.status.success(), "{}", common::text(&o));
    let images: Vec<String> = ["circle/0.png", "square/1.png", "triangle/2.png"]
        .iter()
        .map(|p| data.join(p).to_string_lossy().into_owned())
        .collect();
    for file in [&resized, &bicubic_file] {
        let mut args = vec!["resize-crops", s(file)];
        args.extend(images.iter().map(String::as_str));
        let v: Value = serde_json::from_str(&common::run_python_script("export_reference.py", &args)).unwrap();
        eprintln!("{}: crops {v}", file.display());
        assert!(v["worst"].as_i64().unwrap() <= 1, "{}: {v}", file.display());
    }
    let (got, said) = predict(&resized, "resized.csv", &["--logits"]);
    let resized_off = off(&got);
    eprintln!("resized.onnx: {resized_off:.1e} of the largest logit");
    assert!(resized_off <= SAME, "resized.onnx: off by {resized_off:.2e} of the largest logit");
    assert_eq!(accuracy(&said), accuracy(&ckpt_said), "{said}");

    // Bad input: one line, exit 2, no predictions.csv.
    let out = d.path().join("bad.csv");
    let bad = |model: &Path, extra: &[&str], needle: &str| {
        let mut args = vec!["predict", "--checkpoint", s(model), s(&data), "--out", s(&out)];
        args.extend(extra);
        common::expect_user_error(&args, needle);
        assert!(!out.exists());
    };
    bad(&probs_file, &["--logits"], "exported with --softmax");
    bad(&probs_file, &["--device", "cuda"], "ONNX files run on the CPU");
    bad(&resized, &["--interpolation", "bicubic"], "resizes inside its graph");
    let never = d.path().join("export/never.onnx");
    let args =
        ["export", "--checkpoint", s(&ckpt), "--format", "onnx", "--with-resize", "--opset", "17", "--out", s(&never)];
    common::expect_user_error(&args, "--with-resize needs --opset 18 or newer");
    assert!(!never.exists());
    let garbage = d.path().join("garbage.onnx");
    std::fs::write(&garbage, b"not a protobuf at all").unwrap();
    bad(&garbage, &[], "ONNX Runtime cannot load it");
    let safetensors = ckpt.join("model.safetensors");
    bad(&safetensors, &[], "is a file: give a checkpoint directory");
    // An ONNX file that another exporter wrote: no metadata to preprocess with.
    let foreign = d.path().join("foreign.onnx");
    common::run_python_code(&format!(
        "import onnx; m = onnx.load({:?}); del m.metadata_props[:]; onnx.save(m, {:?})",
        s(&export("model.onnx", "")),
        s(&foreign)
    ));
    bad(&foreign, &[], "no 'classes' in its metadata");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(["predict", "--checkpoint", s(&probs_file), s(&data), "--out", s(&out)])
        .env("ORT_DYLIB_PATH", d.path().join("no-such-library.so"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: ORT_DYLIB_PATH=") && stderr.trim_end().lines().count() == 1, "{stderr}");
}

#[test]
fn bad_export_input_is_one_line_and_exit_2_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m.pt");
    let o = s(&out);
    common::expect_user_error(
        &["export", "--checkpoint", s(d.path()), "--format", "savedmodel", "--out", o],
        "--format",
    );
    common::expect_user_error(
        &["export", "--checkpoint", s(d.path()), "--format", "torchscript", "--out", o],
        "state.json",
    );
    common::expect_user_error(
        &["export", "--checkpoint", s(&d.path().join("nope")), "--format", "torchscript", "--out", o],
        "not a checkpoint directory",
    );
    common::expect_user_error(
        &["export", "--checkpoint", s(d.path()), "--format", "onnx", "--opset", "12", "--out", o],
        "--opset 12",
    );
    common::expect_user_error(
        &["export", "--checkpoint", s(d.path()), "--format", "torchscript", "--opset", "17", "--out", o],
        "--opset is for --format onnx",
    );
    common::expect_user_error(
        &["export", "--checkpoint", s(d.path()), "--format", "torchscript", "--with-resize", "--out", o],
        "--with-resize is for --format onnx",
    );
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "something was written");
}
