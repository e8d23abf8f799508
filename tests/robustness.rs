//! Hostile inputs and faults, as a user meets them: every case runs the binary and checks the exit
//! code, one error line that names the cause (file, flag, step), no panic or backtrace, and that
//! checkpoints already in the run directory are intact. All cases run even when one fails; the
//! test prints a table of them (docs/ROBUSTNESS.md lists the same cases).
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{make_folder, ringtrain};

/// How a case must end.
enum Ends<'a> {
    /// This exit code, and stderr's only line starts with "error:" and holds every needle.
    Error(i32, &'a [&'a str]),
    /// Success, with these needles somewhere in stderr (warnings).
    Warns(&'a [&'a str]),
}

struct Suite {
    root: PathBuf,
    good: PathBuf,
    val: PathBuf,
    base_run: PathBuf,
    /// Each case: its name, and how it ended (exit code and first line) or why it failed.
    results: Vec<(String, Result<String, String>)>,
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

fn checkpoints(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    snapshot(dir)
        .into_iter()
        .filter(|(p, _)| p.starts_with("last") || p.starts_with("best"))
        .collect()
}

/// How a run ended, for the table: exit code and the first line of stderr.
fn how(o: &Output) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr);
    let first = stderr.lines().next().unwrap_or("").to_string();
    format!("exit {} | {}", o.status.code().map_or("signal".into(), |c| c.to_string()), first)
}

/// A line without the "[rank R] " that the built-in launcher puts before a worker's lines.
fn unprefixed(line: &str) -> &str {
    line.strip_prefix("[rank ").and_then(|r| r.split_once("] ")).map_or(line, |(_, rest)| rest)
}

fn judge(o: &Output, ends: &Ends<'_>) -> Result<(), String> {
    let stderr = String::from_utf8_lossy(&o.stderr);
    if stderr.contains("panicked") || stderr.contains("stack backtrace") || stderr.contains("internal error") {
        return Err(format!("panic or backtrace: {stderr}"));
    }
    match ends {
        Ends::Error(code, needles) => {
            if o.status.code() != Some(*code) {
                return Err(format!("exit {:?}, expected {code}: {stderr}", o.status.code()));
            }
            let lines: Vec<&str> = stderr.lines().map(unprefixed).filter(|l| !l.starts_with("warning:")).collect();
            if lines.len() != 1 || !lines[0].starts_with("error: ") {
                return Err(format!("expected one 'error:' line, got: {stderr}"));
            }
            match needles.iter().find(|n| !lines[0].contains(*n)) {
                Some(n) => Err(format!("{:?} lacks {n:?}", lines[0])),
                None => Ok(()),
            }
        }
        Ends::Warns(needles) => {
            if !o.status.success() {
                return Err(format!("exit {:?}: {stderr}", o.status.code()));
            }
            match needles.iter().find(|n| !stderr.contains(*n)) {
                Some(n) => Err(format!("stderr lacks {n:?}: {stderr}")),
                None => Ok(()),
            }
        }
    }
}

impl Suite {
    fn new() -> (tempfile::TempDir, Suite) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_path_buf();
        let (good, val) = (root.join("good"), root.join("val"));
        make_folder(&good, &["circle", "ring"], 6);
        make_folder(&val, &["circle", "ring"], 2);
        let base_run = root.join("base-run");
        let o = ringtrain(&tiny(&good, &val, &base_run, &["--epochs", "1"]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let s = Suite {
            root,
            good,
            val,
            base_run,
            results: Vec::new(),
        };
        (d, s)
    }

    /// A fresh directory for a case.
    fn dir(&self, name: &str) -> PathBuf {
        let p = self.root.join("cases").join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// A copy of the one-epoch base run, for cases that meet an existing run.
    fn run_copy(&self, name: &str) -> PathBuf {
        let p = self.dir(name).join("run");
        copy_dir(&self.base_run, &p);
        p
    }

    /// Runs `args`; judges the ending; checks that `keep` (a run directory) still holds the same
    /// checkpoints, and that a fresh `--out` that a failed case named holds none.
    fn case(&mut self, name: &str, args: &[String], ends: Ends<'_>, keep: Option<&Path>) {
        let out = args.iter().position(|a| a == "--out").map(|i| PathBuf::from(&args[i + 1]));
        self.case_with(name, ends, keep, || ringtrain(args), out.as_deref());
    }

    /// As `case`, for a command that `run` starts itself; `out` is its fresh run directory.
    fn case_with(&mut self, name: &str, ends: Ends<'_>, keep: Option<&Path>, run: impl FnOnce() -> Output, out: Option<&Path>) {
        let before = keep.map(checkpoints);
        let o = run();
        let mut verdict = judge(&o, &ends);
        if let (Some(dir), Some(before), true) = (keep, before, verdict.is_ok()) {
            if checkpoints(dir) != before {
                verdict = Err(format!("the checkpoints in {} changed", dir.display()));
            }
        }
        if let (Ends::Error(..), Some(out), None) = (&ends, out, keep) {
            if out.join("last").exists() {
                verdict = verdict.and(Err(format!("a failed run left a checkpoint in {}", out.display())));
            }
        }
        self.results.push((name.to_string(), verdict.map(|_| how(&o))));
    }
}

/// `train` of the tiny model on the CPU with `extra` flags.
fn tiny(data: &Path, val: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = common::train_val_args(
        data,
        val,
        out,
        "--model resnet10-tiny --img-size 32 --batch-size 4 --device cpu --log-every 1 --workers 2",
    );
    // A flag given in `extra` replaces the default's value (clap refuses a flag twice).
    let mut i = 0;
    while i < extra.len() {
        let has_value = extra.get(i + 1).is_some_and(|v| !v.starts_with("--"));
        match a.iter().position(|x| x == extra[i]) {
            Some(at) if has_value => a[at + 1] = extra[i + 1].to_string(),
            _ => {
                a.push(extra[i].to_string());
                if has_value {
                    a.push(extra[i + 1].to_string());
                }
            }
        }
        i += if has_value { 2 } else { 1 };
    }
    a
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A copy of the good data set with `bad` written as circle/<name> by `make`.
fn data_with(s: &Suite, case: &str, name: &str, make: impl FnOnce(&Path)) -> PathBuf {
    let data = s.dir(case).join("data");
    copy_dir(&s.good, &data);
    make(&data.join("circle").join(name));
    data
}

#[test]
fn hostile_inputs_and_faults_end_cleanly() {
    let (_d, mut s) = Suite::new();
    let (good, val) = (s.good.clone(), s.val.clone());
    let fresh = |s: &Suite, name: &str| s.dir(name).join("run");
    use Ends::{Error, Warns};

    // ---- the data
    let out = fresh(&s, "missing-data");
    s.case("data directory missing", &tiny(Path::new("/no/such/dir"), &val, &out, &[]), Error(2, &["/no/such/dir"]), None);
    let file = s.dir("data-is-file").join("x.txt");
    std::fs::write(&file, "x").unwrap();
    let out = fresh(&s, "data-is-file");
    s.case("data is a file but not a pack", &tiny(&file, &val, &out, &[]), Error(2, &["not a ringtrain pack", "x.txt"]), None);
    let empty = s.dir("empty-data");
    let out = fresh(&s, "empty-data-run");
    s.case("data directory empty", &tiny(&empty, &val, &out, &[]), Error(2, &["no class sub-directories"]), None);
    let d = s.dir("empty-class").join("data");
    make_folder(&d, &["circle", "ring"], 3);
    std::fs::create_dir_all(d.join("square")).unwrap();
    std::fs::write(d.join("square/notes.txt"), "no images here").unwrap();
    let out = fresh(&s, "empty-class");
    s.case("a class with no images", &tiny(&d, &val, &out, &[]), Error(2, &["class 'square' has no images"]), None);
    let v = s.dir("other-val").join("val");
    make_folder(&v, &["circle", "square"], 2);
    let out = fresh(&s, "other-val");
    s.case("validation classes differ", &tiny(&good, &v, &out, &[]), Error(2, &["validation classes differ", "ring", "square"]), None);

    // ---- packs (ringtrain pack)
    let pack_of = |s: &Suite, case: &str, data: &Path| -> PathBuf {
        let p = s.dir(case).join("data.pack");
        let a = strs(&["pack", "--data", data.to_str().unwrap(), "--out", p.to_str().unwrap(), "--workers", "1"]);
        assert!(ringtrain(&a).status.success());
        p
    };
    let packed = pack_of(&s, "pack-truncated", &good);
    let bytes = std::fs::read(&packed).unwrap();
    std::fs::write(&packed, &bytes[..bytes.len() - 100]).unwrap();
    let out = fresh(&s, "pack-truncated");
    s.case("pack truncated", &tiny(&packed, &val, &out, &[]), Error(2, &["--data", "data.pack", "truncated"]), None);
    let packed = pack_of(&s, "pack-version", &good);
    let mut bytes = std::fs::read(&packed).unwrap();
    bytes[8] = 9;
    std::fs::write(&packed, &bytes).unwrap();
    let out = fresh(&s, "pack-version");
    s.case("pack of another format version", &tiny(&packed, &val, &out, &[]), Error(2, &["data.pack", "format version 9", "version 1"]), None);
    let d = s.dir("pack-stale").join("data");
    copy_dir(&good, &d);
    let packed = pack_of(&s, "pack-stale", &d);
    image::RgbImage::from_pixel(40, 40, image::Rgb([9, 9, 9])).save(d.join("ring/new.png")).unwrap();
    let out = fresh(&s, "pack-stale");
    s.case("pack older than its folder", &tiny(&packed, &val, &out, &[]), Error(2, &["data.pack", "older than its folder", "1 added, 0 removed, 0 changed", "ringtrain pack"]), None);
    let (train_pack, val_pack) = (pack_of(&s, "pack-classes", &good), s.dir("pack-classes").join("val.pack"));
    let a = strs(&["pack", "--data", v.to_str().unwrap(), "--out", val_pack.to_str().unwrap(), "--store", "encoded"]);
    assert!(ringtrain(&a).status.success());
    let out = fresh(&s, "pack-classes");
    s.case("train and val packs of other classes", &tiny(&train_pack, &val_pack, &out, &[]), Error(2, &["validation classes differ", "square"]), None);
    let p = s.dir("pack-encoded-max-side").join("x.pack");
    let a = strs(&["pack", "--data", good.to_str().unwrap(), "--out", p.to_str().unwrap(), "--store", "encoded", "--max-side", "64"]);
    s.case("pack --max-side with --store encoded", &a, Error(2, &["--max-side", "--store raw"]), None);
    let out = fresh(&s, "on-device-erasing");
    s.case("--data-on-device with --random-erasing", &tiny(&good, &val, &out, &["--data-on-device", "--random-erasing", "0.25"]), Error(2, &["--data-on-device", "--random-erasing"]), None);

    // ---- bad image files: skipped with a warning naming them, or fatal with --strict
    type Maker = fn(&Path);
    let bad_files: [(&str, &str, Maker); 7] = [
        ("truncated JPEG", "cut.jpg", |p| {
            image::RgbImage::from_pixel(64, 64, image::Rgb([1, 2, 3])).save(p).unwrap();
            let b = std::fs::read(p).unwrap();
            std::fs::write(p, &b[..b.len() / 2]).unwrap();
        }),
        ("PNG with a bad CRC", "crc.png", |p| {
            image::RgbImage::from_pixel(16, 16, image::Rgb([1, 2, 3])).save(p).unwrap();
            let mut b = std::fs::read(p).unwrap();
            b[30] ^= 0xFF; // inside IHDR's CRC
            std::fs::write(p, b).unwrap();
        }),
        ("text file named .jpg", "text.jpg", |p| std::fs::write(p, "hello, I am not a picture").unwrap()),
        ("0-byte file", "empty.png", |p| std::fs::write(p, b"").unwrap()),
        ("PNG claiming 20000x20000 pixels", "bomb.png", |p| common::image_claiming(p, 20000, 20000)),
        ("JPEG claiming 20000x20000 pixels", "bomb.jpg", |p| common::image_claiming(p, 20000, 20000)),
        ("a dangling symlink named like an image", "gone.jpg", |p| {
            std::os::unix::fs::symlink(p.with_file_name("nowhere.jpg"), p).unwrap()
        }),
    ];
    for (i, (what, name, make)) in bad_files.iter().enumerate() {
        let data = data_with(&s, &format!("bad-{i}"), name, make);
        let needle: &str = name;
        let out = s.dir(&format!("bad-{i}")).join("run");
        s.case(&format!("{what}: skipped with a warning"), &tiny(&data, &val, &out, &["--epochs", "1"]), Warns(&["warning:", needle]), None);
        let out = s.dir(&format!("bad-{i}")).join("strict");
        s.case(&format!("{what}, --strict: the run stops"), &tiny(&data, &val, &out, &["--epochs", "1", "--strict"]), Error(1, &[needle]), None);
    }
    let data = data_with(&s, "bomb-limit", "bomb.png", |p| common::image_claiming(p, 20000, 20000));
    let out = s.dir("bomb-limit").join("run");
    s.case("decompression bomb names the pixel limit", &tiny(&data, &val, &out, &["--epochs", "1", "--strict"]), Error(1, &["bomb.png", "400000000 pixels, over the limit of 178956970"]), None);
    let d = s.dir("nothing-decodes").join("data");
    for c in ["circle", "ring"] {
        std::fs::create_dir_all(d.join(c)).unwrap();
        for i in 0..4 {
            std::fs::write(d.join(c).join(format!("{i}.png")), "not a png").unwrap();
        }
    }
    let out = fresh(&s, "nothing-decodes");
    s.case("no image decodes", &tiny(&d, &val, &out, &[]), Error(2, &["none of the", "could be read"]), None);
    let d = s.dir("symlink-loop").join("data");
    copy_dir(&good, &d);
    std::os::unix::fs::symlink(&d, d.join("circle").join("loop")).unwrap();
    let out = fresh(&s, "symlink-loop");
    s.case("symlink loop in the data tree", &tiny(&d, &val, &out, &[]), Error(2, &["symlink loop", "loop"]), None);
    let d = s.dir("option-like-names").join("data");
    make_folder(&d, &["--lr", "-rf"], 6);
    let v2 = s.dir("option-like-names").join("val");
    make_folder(&v2, &["--lr", "-rf"], 2);
    let out = fresh(&s, "option-like-names");
    s.case("class and file names that look like options", &tiny(&d, &v2, &out, &["--epochs", "1"]), Warns(&[]), None);

    // ---- flags
    let flag_cases: [(&str, &[&str], &[&str]); 26] = [
        ("unknown model", &["--model", "resnet9000"], &["unknown --model 'resnet9000'"]),
        ("negative learning rate", &["--lr", "-0.1"], &["--lr must be a positive number"]),
        ("NaN learning rate", &["--lr", "NaN"], &["--lr must be a positive number"]),
        ("batch size larger than the data set", &["--batch-size", "64"], &["--batch-size 64 is larger than the 12 training images"]),
        // Found by every worker alike: the launcher shows it once, as the whole message.
        ("batch size larger than the data set, 2 ranks", &["--batch-size", "64", "--nproc-per-node", "2"], &["--batch-size 64 is larger than the 12 training images"]),
        ("image size 0", &["--img-size", "0"], &["--img-size"]),
        ("zero epochs", &["--epochs", "0"], &["--epochs"]),
        ("validation split of 1.5 without --val", &["--val-split", "1.5"], &["--val-split"]),
        ("unknown device", &["--device", "tpu"], &["invalid --device 'tpu'"]),
        ("CUDA asked on a machine without", &["--device", "cuda"], &["--device cuda", "CUDA"]),
        ("unknown precision", &["--amp", "fp8"], &["invalid --amp 'fp8'"]),
        ("fp16 on the CPU", &["--amp", "fp16"], &["--amp fp16 needs a CUDA device"]),
        ("zero ranks", &["--nproc-per-node", "0"], &["--nproc-per-node must be at least 1"]),
        ("more CUDA ranks than GPUs", &["--nproc-per-node", "4", "--device", "cuda"], &["CUDA"]),
        ("crop padding as large as the image", &["--crop-padding", "32"], &["--crop-padding"]),
        ("unknown c10d backend", &["--dist-backend", "mpi"], &["invalid --dist-backend 'mpi'"]),
        ("NCCL on the CPU", &["--dist-backend", "nccl", "--nproc-per-node", "2"], &["--dist-backend nccl needs a CUDA device"]),
        ("initial fp16 loss scale of 0", &["--init-loss-scale", "0"], &["--init-loss-scale must be positive"]),
        ("zero-initialised residuals without residual blocks", &["--zero-init-residual", "--model", "lenet5"], &["--zero-init-residual needs a ResNet"]),
        ("ViT image size not a multiple of its patch", &["--model", "vit_b_16", "--img-size", "40"], &["--img-size 40 must be a multiple of vit_b_16's patch size 16"]),
        ("stochastic depth for a model without it", &["--drop-path", "0.1"], &["--drop-path: --model resnet10-tiny has no stochastic depth"]),
        ("dropout of 1.5", &["--model", "efficientnet_b0", "--dropout", "1.5"], &["--dropout must be in [0, 1), got 1.5"]),
        ("layer decay of 0", &["--layer-decay", "0"], &["--layer-decay must be in (0, 1], got 0"]),
        ("CUDA graphs on the CPU", &["--cuda-graphs"], &["--cuda-graphs needs a CUDA device"]),
        ("CUDA graphs with Mixup", &["--cuda-graphs", "--mixup-alpha", "0.2"], &["--cuda-graphs cannot capture --mixup-alpha"]),
        ("CUDA graphs with gradient accumulation", &["--cuda-graphs", "--accum-steps", "2"], &["--cuda-graphs", "--accum-steps 2"]),
    ];
    for (i, (what, flags, needles)) in flag_cases.iter().enumerate() {
        let out = fresh(&s, &format!("flag-{i}"));
        let mut a = tiny(&good, &val, &out, flags);
        if flags[0] == "--val-split" {
            let at = a.iter().position(|x| x == "--val").unwrap();
            a.drain(at..at + 2);
        }
        s.case(what, &a, Error(2, needles), None);
    }

    // ---- config files
    let cfgdir = s.dir("config");
    let write = |name: &str, text: &str| {
        let p = cfgdir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let config_cases = [
        ("config file missing", cfgdir.join("absent.toml").to_string_lossy().into_owned(), &["cannot read --config", "absent.toml"][..]),
        ("config not TOML", write("broken.toml", "epochs = = 3\n"), &["invalid TOML", "broken.toml", "line 1"][..]),
        ("config with an unknown key", write("unknown.toml", "epochs = 1\nlearning_rate = 0.1\n"), &["unknown field", "learning_rate"][..]),
        ("config with a wrong type", write("type.toml", "epochs = \"three\"\n"), &["invalid type", "string \"three\"", "epochs"][..]),
    ];
    for (what, path, needles) in config_cases {
        let out = fresh(&s, &format!("config-{what}"));
        let mut a = tiny(&good, &val, &out, &[]);
        a.extend(["--config".into(), path]);
        s.case(what, &a, Error(2, needles), None);
    }

    // ---- checkpoints
    let out = fresh(&s, "resume-missing");
    s.case("--resume from a missing directory", &tiny(&good, &val, &out, &["--resume", "/no/such/checkpoint"]), Error(2, &["/no/such/checkpoint"]), None);
    let run = s.run_copy("resume-truncated");
    let model = run.join("last/model.safetensors");
    let b = std::fs::read(&model).unwrap();
    std::fs::write(&model, &b[..b.len() / 3]).unwrap();
    let best_before = checkpoints(&run.join("best"));
    s.case("--resume from a truncated checkpoint", &tiny(&good, &val, &run, &["--epochs", "2", "--resume", "auto"]), Error(2, &["model.safetensors"]), Some(&run));
    assert_eq!(checkpoints(&run.join("best")), best_before);
    let run = s.run_copy("resume-foreign");
    std::fs::write(run.join("last/state.json"), "{\"format\": \"something else\"}").unwrap();
    s.case("--resume from a foreign state.json", &tiny(&good, &val, &run, &["--epochs", "2", "--resume", "auto"]), Error(2, &["state.json"]), Some(&run));
    let run = s.run_copy("resume-other-model");
    s.case("--resume with another model", &tiny(&good, &val, &run, &["--epochs", "2", "--resume", "auto", "--model", "resnet18"]), Error(2, &["--model"]), Some(&run));
    let pickle = s.dir("pretrained").join("resnet18.pth");
    std::fs::write(&pickle, b"\x80\x02}q\x00(X\x06\x00\x00\x00conv1.q\x01").unwrap();
    let out = fresh(&s, "pretrained-pickle");
    let p = pickle.to_string_lossy().into_owned();
    s.case("--pretrained given a broken pickle", &tiny(&good, &val, &out, &["--pretrained", &p]), Error(2, &["--pretrained", "resnet18.pth"]), None);
    // What `pickle.dumps` writes for an object whose __reduce__ is (os.system, ("touch MARKER",)):
    // unpickling it would create MARKER.
    let marker = s.dir("pretrained").join("PWNED");
    let cmd = format!("touch {}", marker.display());
    let mut evil = b"\x80\x02cposix\nsystem\nX".to_vec();
    evil.extend((cmd.len() as u32).to_le_bytes());
    evil.extend(cmd.as_bytes());
    evil.extend(b"\x85R.");
    let evil_path = s.dir("pretrained").join("evil.pth");
    std::fs::write(&evil_path, evil).unwrap();
    let out = fresh(&s, "pretrained-evil");
    let p = evil_path.to_string_lossy().into_owned();
    s.case("--pretrained given a pickle that calls os.system", &tiny(&good, &val, &out, &["--pretrained", &p]), Error(2, &["--pretrained", "posix.system"]), None);
    assert!(!marker.exists(), "reading a hostile pickle ran its call");
    let out = fresh(&s, "pretrained-key-safetensors");
    let st = s.base_run.join("last/model.safetensors").to_string_lossy().into_owned();
    s.case("--pretrained-key with a safetensors file", &tiny(&good, &val, &out, &["--pretrained", &st, "--pretrained-key", "state_dict"]), Error(2, &["--pretrained-key", "safetensors"]), None);
    let out = fresh(&s, "pretrained-unknown-torchvision");
    s.case("--pretrained of an unknown torchvision name", &tiny(&good, &val, &out, &["--pretrained", "torchvision:resnet51"]), Error(2, &["torchvision:resnet51", "closest"]), None);
    let out = fresh(&s, "pretrained-offline");
    let args = tiny(&good, &val, &out, &["--model", "resnet18", "--pretrained", "torchvision:resnet18"]);
    let torch_home = s.dir("torch-home");
    s.case_with(
        "--pretrained torchvision:NAME with no network and no cached file",
        Error(2, &["cannot download", "place it at"]),
        None,
        || {
            Command::new(env!("CARGO_BIN_EXE_ringtrain"))
                .args(&args)
                .env("TORCH_HOME", &torch_home)
                .env("RINGTRAIN_TORCHVISION_URL", "http://127.0.0.1:9/models")
                .output()
                .unwrap()
        },
        Some(&out),
    );
    let out = fresh(&s, "pretrained-arch");
    let other = s.base_run.join("last/model.safetensors").to_string_lossy().into_owned();
    s.case("--pretrained of another architecture", &tiny(&good, &val, &out, &["--model", "resnet18", "--pretrained", &other]), Error(2, &["--pretrained", "different architecture"]), None);

    // ---- the run directory and the disk
    let blocker = s.dir("out-under-file").join("file");
    std::fs::write(&blocker, "x").unwrap();
    s.case("--out inside a regular file", &tiny(&good, &val, &blocker.join("run"), &["--epochs", "1"]), Error(2, &["--out", "file/run"]), None);
    let run = s.run_copy("existing-run");
    s.case("--out already holds a run", &tiny(&good, &val, &run, &["--epochs", "1"]), Error(2, &["already holds a run", "--resume", "--overwrite"]), Some(&run));
    // Disk full while the second epoch's checkpoint is written: a file-size limit fails the
    // write; the first epoch's checkpoint stays whole and a later resume uses it.
    let run = s.run_copy("disk-full");
    let args = tiny(&good, &val, &run, &["--epochs", "2", "--resume", "auto"]);
    let limited = {
        let args = args.clone();
        move || {
            let mut c = std::process::Command::new("bash");
            c.arg("-c").arg("ulimit -f 64 && exec \"$0\" \"$@\"").arg(env!("CARGO_BIN_EXE_ringtrain")).args(&args);
            c.output().unwrap()
        }
    };
    s.case_with("disk full while writing a checkpoint", Error(1, &["File too large"]), Some(&run), limited, None);
    let o = ringtrain(&args);
    s.results.push((
        "after the disk-full failure, --resume auto finishes the run".into(),
        judge(&o, &Warns(&[])).and_then(|_| {
            let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
            if csv.lines().count() == 3 { Ok(how(&o)) } else { Err(csv) }
        }),
    ));
    // The loss diverges in the second epoch (lr 1e30): the run stops naming the step, and the
    // first epoch's checkpoint is kept.
    let run = s.run_copy("nan-loss");
    s.case("loss becomes NaN (fp32)", &tiny(&good, &val, &run, &["--epochs", "2", "--resume", "auto", "--lr", "1e30"]), Error(2, &["the loss became NaN or infinite at step", "last good checkpoint"]), Some(&run));

    // ---- processes
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let out = fresh(&s, "port-in-use");
    s.case("master port already in use", &tiny(&good, &val, &out, &["--nproc-per-node", "2", "--master-port", &port, "--epochs", "1", "--dist-timeout", "20"]), Error(2, &[&port]), None);
    // The same under torchrun/srun/mpirun, whose rank 0 binds the store itself (no launcher check).
    let out = fresh(&s, "port-in-use-env");
    let args = tiny(&good, &val, &out, &["--epochs", "1", "--dist-timeout", "20"]);
    let env_rank0 = || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ringtrain"));
        c.args(&args).envs([("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str())]);
        c.output().unwrap()
    };
    s.case_with("master port in use, rank 0 started by torchrun's variables", Error(1, &["rendezvous with the master at 127.0.0.1:", &port, "already in use", "MASTER_PORT"]), None, env_rank0, Some(&out));
    drop(busy);

    // ---- eval and predict
    let out = fresh(&s, "eval-missing");
    s.case("eval of a missing checkpoint", &strs(&["eval", "--checkpoint", "/no/such/ckpt", "--data", good.to_str().unwrap(), "--out", out.to_str().unwrap()]), Error(2, &["/no/such/ckpt"]), None);
    let other = s.dir("eval-classes").join("data");
    make_folder(&other, &["circle", "square"], 2);
    let ckpt = s.base_run.join("best");
    s.case("eval on data of other classes", &strs(&["eval", "--checkpoint", ckpt.to_str().unwrap(), "--data", other.to_str().unwrap(), "--out", out.to_str().unwrap()]), Error(2, &["square"]), None);
    let csv = s.dir("predict").join("p.csv");
    s.case("predict a missing file", &strs(&["predict", "--checkpoint", ckpt.to_str().unwrap(), "--out", csv.to_str().unwrap(), "/no/such/photo.png"]), Error(2, &["/no/such/photo.png"]), None);

    // ---- the verdicts
    let failed: Vec<_> = s.results.iter().filter(|(_, r)| r.is_err()).collect();
    eprintln!("{} cases, {} passed", s.results.len(), s.results.len() - failed.len());
    for (name, r) in &s.results {
        match r {
            Ok(how) => eprintln!("ok   {name} | {how}"),
            Err(why) => eprintln!("FAIL {name}: {why}"),
        }
    }
    assert!(s.results.len() >= 30, "{} cases", s.results.len());
    assert!(failed.is_empty(), "{} of {} cases failed", failed.len(), s.results.len());
}

/// Checkpoints and weights are only ever read as safetensors: no code path can unpickle or run
/// TorchScript from a user's file. (A source scan: the loaders that could do it are named here.)
/// Two lines are let through, both `export`'s: the shim's tracer names libtorch's `torch::jit`
/// namespace to write a module, and the exported file, written under a temporary name a moment
/// before, is read back and run once before it is kept. `jit::load` stays refused in the shim.
#[test]
fn no_pickle_or_torchscript_loader_in_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed = [
        ("csrc/export.cpp", "namespace jit = torch::jit;"),
        ("src/export/torchscript.rs", "use tch::{CModule, Tensor};"),
        ("src/export/torchscript.rs", "let module = CModule::load(file).context(\"reading the traced module back\")?;"),
    ];
    let mut seen = vec![false; allowed.len()];
    let forbidden = [
        "torch::load",
        "torch::jit",
        "jit::load",
        "jit::import",
        "import_ir_module",
        "pickle_load",
        "unpickle",
        "CModule",
        "Tensor::load(",
        "load_multi",
        "VarStore::load",
        "vs.load(",
        ".load_partial(",
    ];
    let mut files = Vec::new();
    let mut stack = vec![root.join("src"), root.join("csrc")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 20, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().to_string();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap();
            if let Some(i) = allowed.iter().position(|&(p, l)| rel == p && code.trim() == l) {
                seen[i] = true;
                continue;
            }
            for pat in forbidden {
                assert!(!code.contains(pat), "{}:{}: {pat}", f.display(), n + 1);
            }
        }
    }
    // A line let through that is no longer there is taken off the list, not left to grow stale.
    for (i, (p, l)) in allowed.iter().enumerate() {
        assert!(seen[i], "{p}: the allowed line `{l}` is gone");
    }
    // The read-back is only ever of the file just written under its temporary name.
    let ts = std::fs::read_to_string(root.join("src/export/torchscript.rs")).unwrap();
    assert_eq!(ts.matches("check(graph, ").count(), 1);
    assert!(ts.contains("check(graph, tmp)"));
}

/// The rendezvous store listens on the master address it was given, not on every interface
/// (c10d on its own binds a wildcard address): seen from /proc/net/tcp while a 2-rank job runs.
#[test]
fn the_rendezvous_listens_only_on_the_master_address() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["circle", "ring"], 8);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let args = common::train_args(
        &data,
        &d.path().join("run"),
        &format!(
            "--model lenet5 --img-size 32 --epochs 2 --batch-size 4 --device cpu --nproc-per-node 2 \
             --master-addr 127.0.0.1 --master-port {port} --workers 1"
        ),
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Listening sockets (state 0A) on the port: "local_address:port" in hex, per /proc/net/tcp*.
    let mut seen = std::collections::BTreeSet::new();
    let port_hex = format!(":{port:04X}");
    loop {
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
                let cols: Vec<&str> = line.split_whitespace().collect();
                if cols.len() > 3 && cols[3] == "0A" && cols[1].ends_with(&port_hex) {
                    seen.insert(cols[1].to_string());
                }
            }
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!seen.is_empty(), "never saw the store listening on port {port}");
    for addr in &seen {
        assert_eq!(addr, &format!("0100007F{port_hex}"), "listening on {addr}: not 127.0.0.1 only ({seen:?})");
    }
}
