//! The weights PyTorch users have, read without Python and without unpickling: `torch.save`
//! files in every form training scripts write them, hostile pickles, torchvision's weights from
//! the torch hub cache or a download checked against its hash, and timm's weights from a
//! Hugging Face hub (here a local server standing in for both).
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

use common::http::{Answer, Server};
use ringtrain::model::weights::{self, download, WeightsSource};
use ringtrain::model::{Model, ModelKind, ModelOptions};
use tch::{Device, Tensor};

fn py(args: &[&str]) -> String {
    common::run_python_script("checkpoints.py", args)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `ringtrain ARGS` with these environment variables set (and the caches' own unset, so the
/// machine's caches are never read or written).
fn ringtrain_env(args: &[std::ffi::OsString], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringtrain"));
    for k in ["TORCH_HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE"] {
        c.env_remove(k);
    }
    c.env("RINGTRAIN_TORCHVISION_URL", "http://127.0.0.1:9/models"); // nothing listens there
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(args).output().unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Three classes of the demo's shapes, 4 images each, 36 px.
fn shapes(root: &Path) {
    common::Shapes { size: 36, seed: 6, first: 0 }.write(root, &["circle", "cross", "ring"], 4);
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// The resolved configuration a run saved.
fn run_config(run: &Path) -> toml::Table {
    std::fs::read_to_string(run.join("config.toml")).unwrap().parse().unwrap()
}

/// A user's mistake: exit 2, one line on stderr, no panic.
fn refused(o: &Output) -> String {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn every_form_of_torch_save_reads_as_its_state_dict() {
    let d = tempfile::tempdir().unwrap();
    py(&["files", s(d.path())]);
    let reference = d.path().join("reference.safetensors");
    for (file, key) in [
        ("plain.pth", None),
        ("legacy.pth", None),
        ("ddp.pth", None),
        ("compiled.pth", None),
        ("imagenet.pth.tar", Some("state_dict")),
        ("timm_train.pth", Some("state_dict")),
        ("lightning.ckpt", Some("state_dict")),
        ("whole_module.pth", None),
    ] {
        let out = d.path().join(format!("{file}.safetensors"));
        let o = common::ringtrain(&common::argv(
            "convert {} --out {} --model resnet18",
            &[&d.path().join(file), &out],
        ));
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{file}: {stdout}\n{stderr}");
        assert!(stdout.contains("122 tensors"), "{file}: {stdout}");
        if let Some(k) = key {
            assert!(stdout.contains(&format!("[{k}]")), "{file}: {stdout}");
        }
        // Bit-identical tensors, dtypes kept (num_batches_tracked stays int64).
        py(&["same", s(&out), s(&reference)]);
    }
    let o = common::ringtrain(&common::argv("convert {} {}", &[&d.path().join("timm_train.pth"), &d.path().join("x.st")]));
    assert!(text(&o).0.contains("also holds state_dict_ema"), "{:?}", text(&o));
    let ema = d.path().join("ema.st");
    let o = common::ringtrain(&common::argv(
        "convert {} --out {} --pretrained-key state_dict_ema",
        &[&d.path().join("timm_train.pth"), &ema],
    ));
    assert!(o.status.success(), "{:?}", text(&o));
    py(&["same", s(&ema), s(&d.path().join("ema.safetensors"))]);

    // Keys that are not there, or hold no weights, are named with what there is.
    let e = refused(&common::ringtrain(&common::argv(
        "convert {} {} --pretrained-key nope",
        &[&d.path().join("imagenet.pth.tar"), &d.path().join("y.st")],
    )));
    assert!(e.contains("--pretrained-key nope") && e.contains("arch, args, best_acc1, epoch, optimizer, state_dict"), "{e}");
    let e = refused(&common::ringtrain(&common::argv(
        "convert {} {} --pretrained-key epoch",
        &[&d.path().join("imagenet.pth.tar"), &d.path().join("y.st")],
    )));
    assert!(e.contains("--pretrained-key epoch") && e.contains("holds an int there, not a state_dict"), "{e}");
    let e = refused(&common::ringtrain(&common::argv(
        "convert {} {} --pretrained-key optimizer --model resnet18",
        &[&d.path().join("imagenet.pth.tar"), &d.path().join("y.st")],
    )));
    assert!(e.contains("no tensor name matches resnet18"), "{e}");
    assert!(!d.path().join("y.st").exists());
}

/// The ImageNet example's checkpoint of a DDP run, fine-tuned with the stem frozen: the run
/// reads the weights under `state_dict`, without `module.`, and the frozen tensors keep them.
#[test]
fn the_imagenet_examples_checkpoint_fine_tunes() {
    let d = tempfile::tempdir().unwrap();
    py(&["files", s(d.path())]);
    let data = d.path().join("data");
    shapes(&data);
    let out = d.path().join("run");
    let o = common::ringtrain(&common::argv(
        "train --data {} --val {} --out {} --pretrained {} --model resnet18 --img-size 32 --epochs 1 --batch-size 6 \
         --freeze conv1,bn1,layer1,layer2,layer3,layer4 --device cpu",
        &[&data, &data, &out, &d.path().join("imagenet.pth.tar")],
    ));
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("imagenet.pth.tar [state_dict]") && stdout.contains(r#"re-initialised head ["fc.bias", "fc.weight"]; missing []"#),
        "{stdout}"
    );
    let reference: HashMap<String, Tensor> = Tensor::read_safetensors(d.path().join("reference.safetensors")).unwrap().into_iter().collect();
    let after: HashMap<String, Tensor> = Tensor::read_safetensors(out.join("last/model.safetensors")).unwrap().into_iter().collect();
    let mut kept = 0;
    for (name, t) in &after {
        if !name.starts_with("fc.") && !name.ends_with("num_batches_tracked") {
            assert!(t.equal(&reference[name]), "{name} is frozen but differs from the checkpoint's");
            kept += 1;
        }
    }
    assert_eq!(kept, 100, "resnet18 has 100 tensors outside fc that are not counters");
}

/// Pickles that run code when unpickled (os.system, eval, subprocess.Popen) are refused by
/// the name of what they call, and nothing runs: the file they would create never appears. A
/// hostile value beside the weights is left alone and the weights load.
#[test]
fn hostile_pickles_are_refused_and_nothing_runs() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("PWNED");
    py(&["hostile", s(d.path()), s(&marker)]);
    let convert = |file: &str| common::ringtrain(&common::argv("convert {} {}", &[&d.path().join(file), &d.path().join("out.st")]));
    for (file, global) in [
        ("root_system.pth", "posix.system"),
        ("root_eval.pth", "eval"),
        ("root_popen.pth", "Popen"),
    ] {
        let e = refused(&convert(file));
        assert!(e.contains(file) && e.contains(global) && e.contains("not a dict of weights"), "{e}");
    }
    let e = refused(&convert("weight.pth"));
    assert!(e.contains("conv1.weight is built by posix.system"), "{e}");
    // A file with no tensor holds no weights, whatever else it holds.
    let e = refused(&convert("only_call.pth"));
    assert!(e.contains("holds no tensors") && e.contains("conv1.weight: a value built by posix.system"), "{e}");
    let e = refused(&convert("no_tensors.pth"));
    assert!(e.contains("holds no tensors") && e.contains("epoch: an int, lr: a float"), "{e}");
    let e = refused(&convert("truncated.pth"));
    assert!(e.contains("truncated.pth") && e.contains("nor a readable PyTorch checkpoint"), "{e}");
    let e = refused(&convert("short_storage.pth"));
    assert!(e.contains("fc.weight cannot be read"), "{e}");
    assert!(!d.path().join("out.st").exists(), "a refused file wrote output");

    let o = convert("side.pth");
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(!marker.exists(), "unpickling ran the hostile call");
}

/// `torchvision:NAME` from the torch hub cache (`TORCH_HOME`), with no network: the
/// architecture and the evaluation resize come from the weights; another input size keeps
/// their resize ratio.
#[test]
fn torchvision_weights_come_from_the_torch_hub_cache() {
    let d = tempfile::tempdir().unwrap();
    py(&["files", s(d.path())]);
    let torch_home = d.path().join("torch");
    let cached = torch_home.join("hub/checkpoints/resnet18-f37072fd.pth");
    std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
    std::fs::copy(d.path().join("plain.pth"), &cached).unwrap();
    let data = d.path().join("data");
    shapes(&data);
    let out = d.path().join("run");
    let o = ringtrain_env(
        &common::argv(
            "train --data {} --val {} --out {} --pretrained torchvision:resnet18 --img-size 64 --epochs 1 --batch-size 6 --device cpu",
            &[&data, &data, &out],
        ),
        &[("TORCH_HOME", &torch_home)],
    );
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("from {}", cached.display())), "{stdout}");
    let cfg = run_config(&out);
    assert_eq!(cfg["model"].as_str(), Some("resnet18"), "{cfg}");
    assert_eq!(cfg["pretrained"].as_str(), Some("torchvision:resnet18.IMAGENET1K_V1"), "{cfg}");
    assert_eq!(cfg["eval_resize"].as_integer(), Some(73), "256 * 64 / 224, rounded: {cfg}");

    // Without the cached file, the download is tried and its failure says where to put it.
    let e = refused(&ringtrain_env(
        &common::argv("convert torchvision:resnet34 {}", &[&d.path().join("r34.st")]),
        &[("TORCH_HOME", &torch_home)],
    ));
    let place = torch_home.join("hub/checkpoints/resnet34-b627a593.pth");
    assert!(e.contains("cannot download") && e.contains(&format!("place it at {}", place.display())), "{e}");
    let e = refused(&ringtrain_env(&common::argv("convert torchvision:resnet51 {}", &[&d.path().join("x.st")]), &[]));
    assert!(e.contains("closest: resnet50"), "{e}");
    let e = refused(&ringtrain_env(
        &common::argv("train --data {} --model resnet50 --pretrained torchvision:resnet18 --device cpu", &[&data]),
        &[("TORCH_HOME", &torch_home)],
    ));
    assert!(e.contains("holds resnet18 weights, not resnet50"), "{e}");
}

/// The download as torchvision's weights take it, against a local server: a file whose hash
/// is not the one its name carries is refused, a body cut half-way is refused, and neither
/// leaves anything in the cache; the right file lands there, where PyTorch's own torch.hub
/// finds it without downloading.
#[test]
fn downloads_are_checked_and_leave_nothing_behind_when_they_fail() {
    let d = tempfile::tempdir().unwrap();
    py(&["files", s(d.path())]);
    let bytes = std::fs::read(d.path().join("plain.pth")).unwrap();
    let server = Server::start(HashMap::from([
        ("/models/resnet18-f37072fd.pth".to_string(), Answer::File { body: bytes.clone(), headers: vec![] }),
        ("/models/resnet34-b627a593.pth".to_string(), Answer::CutHalfWay { body: bytes.clone() }),
    ]));
    let torch_home = d.path().join("torch");
    let checkpoints = torch_home.join("hub/checkpoints");
    let base_url = format!("{}/models", server.url());
    let run = |spec: &str| {
        ringtrain_env(
            &common::argv(&format!("convert {spec} {{}}"), &[&d.path().join("out.st")]),
            &[("TORCH_HOME", &torch_home), ("RINGTRAIN_TORCHVISION_URL", Path::new(&base_url))],
        )
    };
    let e = refused(&run("torchvision:resnet18"));
    assert!(e.contains("expected f37072fd") && e.contains("refused, nothing was kept"), "{e}");
    let e = refused(&run("torchvision:resnet34"));
    assert!(e.contains("nothing was kept"), "{e}");
    let left: Vec<_> = std::fs::read_dir(&checkpoints).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "the cache keeps {left:?}");
    assert!(!d.path().join("out.st").exists());

    // The right file: its name carries the prefix of its own hash.
    let prefix = sha256(&bytes)[..8].to_string();
    let name = format!("resnet18-{prefix}.pth");
    let server = Server::start(HashMap::from([(
        format!("/{name}"),
        Answer::File { body: bytes.clone(), headers: vec![] },
    )]));
    let dest = checkpoints.join(&name);
    download::fetch(&format!("{}/{name}", server.url()), &dest, download::Expect::Sha256Prefix(&prefix), "test").unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
    drop(server);
    // PyTorch finds it by name in the same cache and downloads nothing (the URL is dead).
    let code = format!(
        "import os, torch; os.environ['TORCH_HOME'] = {th:?}; \
         sd = torch.hub.load_state_dict_from_url('http://127.0.0.1:9/{name}', check_hash=True); print(len(sd))",
        th = torch_home.to_str().unwrap()
    );
    assert_eq!(common::run_python_code(&code).trim(), "122");
}

/// The hub's answers for `repo`'s files: config.json directly, model.safetensors by a
/// redirect to its storage, as the Hugging Face hub answers.
fn hub_routes(repo: &str, config: &[u8], weights: &[u8], served_weights: &[u8]) -> HashMap<String, Answer> {
    let sha = sha256(weights);
    let commit = "0123456789abcdef0123456789abcdef01234567".to_string();
    let h = |k: &str, v: &str| (k.to_string(), v.to_string());
    HashMap::from([
        (
            format!("/{repo}/resolve/main/config.json"),
            Answer::File {
                body: config.to_vec(),
                headers: vec![h("X-Repo-Commit", &commit), h("ETag", "\"a3f2c1\"")],
            },
        ),
        (
            format!("/{repo}/resolve/main/model.safetensors"),
            Answer::Redirect {
                location: format!("/lfs/{sha}"),
                headers: vec![h("X-Repo-Commit", &commit), h("X-Linked-Etag", &format!("\"{sha}\""))],
            },
        ),
        (format!("/lfs/{sha}"), Answer::File { body: served_weights.to_vec(), headers: vec![] }),
    ])
}

/// timm's resnet18 from a hub (a local server): downloaded into the hub's cache layout, which
/// huggingface_hub reads back; then used from that cache with the server gone, its evaluation
/// transform (64 px, crop_pct 0.8, mean and std 0.5) becoming the run's, and its logits
/// timm's. A blob whose hash is not the hub's, and a family whose names are not torchvision's,
/// are refused.
#[test]
fn timm_weights_come_from_the_hub_and_its_cache() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().join("timm");
    std::fs::create_dir_all(&t).unwrap();
    py(&["timm_hub", s(&t)]);
    let (config, weights) = (std::fs::read(t.join("config.json")).unwrap(), std::fs::read(t.join("model.safetensors")).unwrap());
    let hf_home = d.path().join("hf");
    let repo = "timm/resnet18.test";

    // A blob that is not what the hub's hash says: refused, no blob kept.
    let mut wrong = weights.clone();
    let last = wrong.len() - 1;
    wrong[last] ^= 1;
    let server = Server::start(hub_routes(repo, &config, &weights, &wrong));
    let e = refused(&ringtrain_env(
        &common::argv(&format!("convert hf-hub:{repo} {{}}"), &[&d.path().join("x.st")]),
        &[("HF_HOME", &hf_home), ("HF_ENDPOINT", Path::new(&server.url()))],
    ));
    assert!(e.contains("refused, nothing was kept"), "{e}");
    let blobs = hf_home.join("hub/models--timm--resnet18.test/blobs");
    let kept: Vec<PathBuf> = std::fs::read_dir(&blobs).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(kept.iter().all(|p| std::fs::read(p).unwrap() == config), "only config.json may be kept: {kept:?}");
    drop(server);

    let server = Server::start(hub_routes(repo, &config, &weights, &weights));
    let out = d.path().join("converted.safetensors");
    let o = ringtrain_env(
        &common::argv(&format!("convert hf-hub:{repo} {{}}"), &[&out]),
        &[("HF_HOME", &hf_home), ("HF_ENDPOINT", Path::new(&server.url()))],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    py(&["same", s(&out), s(&t.join("model.safetensors"))]);
    assert!(server.requests().iter().any(|r| r.starts_with("GET /lfs/")), "{:?}", server.requests());
    drop(server);
    // huggingface_hub finds both files in its cache.
    let code = format!(
        "from huggingface_hub import try_to_load_from_cache as c; \
         print(all(isinstance(c({repo:?}, f, cache_dir={hub:?}), str) for f in ('model.safetensors', 'config.json')))",
        hub = hf_home.join("hub").to_str().unwrap()
    );
    assert_eq!(common::run_python_code(&code).trim(), "True");

    // Offline now: training reads the cache, takes the weights' transform and architecture.
    let data = d.path().join("data");
    shapes(&data);
    let run = d.path().join("run");
    let o = ringtrain_env(
        &common::argv(
            &format!("train --data {{}} --val {{}} --out {{}} --pretrained hf-hub:{repo} --epochs 1 --batch-size 6 --device cpu"),
            &[&data, &data, &run],
        ),
        &[("HF_HOME", &hf_home), ("HF_ENDPOINT", Path::new("http://127.0.0.1:9"))],
    );
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("pretrained: resizing bicubic, as these weights were evaluated"),
        "the note on the resize filter: {stdout}"
    );
    let cfg = run_config(&run);
    assert_eq!(
        (cfg["model"].as_str(), cfg["img_size"].as_integer(), cfg["eval_resize"].as_integer()),
        (Some("resnet18"), Some(64), Some(80)),
        "{cfg}"
    );
    assert_eq!((cfg["mean"][0].as_float(), cfg["std"][2].as_float()), (Some(0.5), Some(0.5)), "{cfg}");
    assert_eq!(cfg["interpolation"].as_str(), Some("bicubic"), "{cfg}");
    // The checkpoint keeps it for eval and predict.
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("best/state.json")).unwrap()).unwrap();
    assert_eq!(state["interpolation"], "bicubic");

    // The same weights in a ringtrain resnet18 give timm's logits (bound of the torchvision
    // parity tests).
    std::env::set_var("HF_HOME", &hf_home);
    let loaded = WeightsSource::HfHub(weights::hf_hub::Repo::parse(repo).unwrap()).read(None).unwrap();
    let mut model = Model::build(ModelKind::ResNet18, 5, Device::Cpu, ModelOptions::defaults(ModelKind::ResNet18));
    let r = model.load_pretrained(&loaded.weights, repo, false).unwrap();
    assert!(r.missing.is_empty() && r.reinitialized_head.is_empty(), "{r:?}");
    let io: HashMap<String, Tensor> = Tensor::read_safetensors(t.join("io.safetensors")).unwrap().into_iter().collect();
    let got = tch::no_grad(|| model.forward(&io["x"], false));
    let rel = common::rel_max_diff(&got, &io["logits"]);
    eprintln!("timm resnet18 weights in ringtrain: logits differ from timm's by {rel:.1e} of the largest");
    assert!(rel <= 1e-5, "logits differ from timm's by {rel:.1e} of the largest");

    // An architecture ringtrain does not build, and a variant of one it does that timm made
    // with another option: refused by name.
    for (cfg, want) in [
        (&br#"{"architecture": "swin_tiny_patch4_window7_224", "pretrained_cfg": {}}"#[..], "does not build timm's swin_tiny_patch4_window7_224"),
        (br#"{"architecture": "vit_base_patch16_224", "model_args": {"qk_norm": true}, "pretrained_cfg": {}}"#, "created with qk_norm=true"),
        (br#"{"architecture": "vit_base_patch16_224", "global_pool": "avg", "pretrained_cfg": {}}"#, "global_pool='avg'"),
    ] {
        let hub = d.path().join(format!("hf-{}", want.len()));
        let server = Server::start(hub_routes("timm/other.test", cfg, &weights, &weights));
        let e = refused(&ringtrain_env(
            &common::argv("convert hf-hub:timm/other.test {}", &[&d.path().join("v.st")]),
            &[("HF_HOME", &hub), ("HF_ENDPOINT", Path::new(&server.url()))],
        ));
        assert!(e.contains(want), "{e}");
    }
}

/// Loading is strict, as `load_state_dict` is: torchvision's resnet34 weights into `--model
/// resnet18` are refused in one line that names resnet34, before any training; with
/// `--pretrained-partial` the tensors that fit load, on purpose, and the run says which did not.
#[test]
fn weights_of_another_architecture_are_refused_by_its_name() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("resnet34.safetensors");
    common::run_python_code(&format!(
        "import torch, torchvision; from safetensors.torch import save_file; torch.manual_seed(0); \
         save_file({{k: v.contiguous() for k, v in torchvision.models.resnet34().state_dict().items()}}, {:?})",
        s(&file)
    ));
    let data = d.path().join("data");
    shapes(&data);
    let run = d.path().join("run");
    let args = |extra: &str| {
        common::argv(
            &format!("train --data {{}} --out {{}} --model resnet18 --pretrained {{}} --epochs 1 --batch-size 6 --img-size 32 --device cpu {extra}"),
            &[&data, &run, &file],
        )
    };
    let e = refused(&common::ringtrain(&args("")));
    assert!(e.contains("does not fit resnet18") && e.contains("looks like resnet34") && e.contains("--pretrained-partial"), "{e}");
    assert!(e.contains("unexpected layer") && e.contains("(80)"), "{e}");
    assert!(!run.join("last").exists(), "a refused run trained");
    let o = common::ringtrain(&args("--pretrained-partial"));
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("unexpected [\"layer1.2.bn1.bias\""), "{out}");
}

/// Fine-tuning from a `.pth` is fine-tuning from the same weights: weights ringtrain trained,
/// saved by PyTorch as a `.pth`, fine-tune on plant seedlings to the same result, to the bit,
/// as from their safetensors (same seed).
#[test]
fn fine_tuning_from_a_pth_equals_fine_tuning_from_its_safetensors() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    common::link_first(&common::shared_data("plant-seedlings/train"), &data, &["Charlock", "Maize", "Sugar_beet"], 10);
    let base = d.path().join("base");
    let o = common::ringtrain(&common::argv(
        "train --data {} --val {} --out {} --model resnet18 --img-size 32 --epochs 1 --batch-size 10 --device cpu",
        &[&data, &data, &base],
    ));
    assert!(o.status.success(), "{:?}", text(&o));
    let st = base.join("last/model.safetensors");
    let pth = d.path().join("trained.pth");
    common::run_python_code(&format!(
        "import torch; from safetensors.torch import load_file; torch.save(load_file({:?}), {:?})",
        s(&st),
        s(&pth)
    ));
    let tune = |from: &Path, out: &Path| {
        let o = common::ringtrain(&common::argv(
            "train --data {} --val {} --out {} --pretrained {} --model resnet18 --img-size 32 --epochs 2 --batch-size 10 \
             --lr 0.01 --head-lr-mult 10 --device cpu",
            &[&data, &data, out, from],
        ));
        assert!(o.status.success(), "{:?}", text(&o));
        (std::fs::read_to_string(out.join("metrics.csv")).unwrap(), std::fs::read(out.join("last/model.safetensors")).unwrap())
    };
    let (m_st, w_st) = tune(&st, &d.path().join("from_st"));
    let (m_pth, w_pth) = tune(&pth, &d.path().join("from_pth"));
    let strip_time = |m: &str| -> Vec<String> {
        // metrics.csv's columns of time and speed differ from run to run; the rest must not.
        let mut rows = m.lines();
        let header: Vec<&str> = rows.next().unwrap().split(',').collect();
        rows.map(|r| {
            r.split(',')
                .zip(&header)
                .filter(|(_, h)| !h.contains("time") && !h.contains("per_s") && !h.contains("seconds"))
                .map(|(v, _)| v.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
    };
    assert_eq!(strip_time(&m_st), strip_time(&m_pth), "metrics differ");
    assert!(w_st == w_pth, "final weights differ");
}

/// ringtrain's table of torchvision's weights is torchvision's: every weight of every
/// architecture ringtrain builds, its file (hence URL and hash), its evaluation transform and
/// its default.
#[test]
fn the_torchvision_table_is_torchvisions() {
    let table = weights::torchvision::WEIGHTS;
    let mut archs: Vec<&str> = table.iter().map(|w| w.model.name()).collect();
    archs.dedup();
    let code = format!(
        "import json; from torchvision.models import get_model_weights as g\n\
         out = []\n\
         for n in {archs:?}:\n\
         \x20   W = g(n)\n\
         \x20   for w in W:\n\
         \x20       t = w.transforms()\n\
         \x20       out.append([n, w.name, w is W.DEFAULT, w.url, t.crop_size[0], t.resize_size[0], t.interpolation.value, \
                    list(t.mean), list(t.std), w.meta['_metrics']['ImageNet-1K']['acc@1']])\n\
         print(json.dumps(out))"
    );
    let theirs: Vec<serde_json::Value> = serde_json::from_str(&common::run_python_code(&code)).unwrap();
    assert_eq!(theirs.len(), table.len(), "torchvision has {} weights for these architectures", theirs.len());
    for (t, w) in theirs.iter().zip(table) {
        let ours = serde_json::json!([
            w.model.name(),
            w.variant,
            w.default,
            format!("{}{}", weights::torchvision::BASE_URL, w.file),
            w.crop,
            w.resize,
            format!("{:?}", w.interpolation).to_lowercase(),
            ringtrain::data::IMAGENET_MEAN,
            ringtrain::data::IMAGENET_STD,
            w.top1
        ]);
        assert_eq!(t, &ours);
    }
    // Every torchvision architecture ringtrain builds has weights in the table (timm's own come
    // from the hub).
    for &k in ModelKind::ALL {
        let own = k.is_timm() || matches!(k, ModelKind::ResNet18Cifar | ModelKind::ResNet10Tiny | ModelKind::LeNet5);
        assert_eq!(table.iter().any(|w| w.model == k), !own, "{k}");
    }
}
