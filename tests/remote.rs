//! Data in object stores and on web servers: a real S3-compatible server (moto's server mode) and
//! a plain HTTP server with Range support, both on loopback behind a proxy that injects faults
//! (tests/py/object_server.py). Shards, parquet files and a pack, uploaded with boto3, list and
//! batch as the same local files; --cache-dir keeps what was fetched; a run through 503s and a
//! connection cut mid-object ends with the weights of a run on the local files; a missing object,
//! a denied bucket and an object changed under a run are one line each.
mod common;

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use common::{
    argv, eval_batches, expect_user_error, max_diff, ringtrain, run_python_code, sample_sha256, train_samples, weights,
};
use ringtrain::data::source::Dataset;

/// The servers, started once for this test binary (they end when its standard input, the
/// pipe this process holds, closes), and the local files they serve.
struct Remote {
    _server: Child,
    /// The S3 endpoint (the proxy in front of moto) and the HTTP server's base URL.
    s3: String,
    http: String,
    /// `train-00000{0..3}.tar` (the first 6 seedlings of 3 classes, 5 a shard), `s.pack` (an
    /// encoded pack of them), `parquet/train-0000{0,1}-of-00002.parquet` (the same images by
    /// datasets, row groups of 4), `tree/` (an ImageFolder of them). Uploaded under `set/`,
    /// `faults/` and `changed/` of the bucket `data`; the parquet files also under `mixed/`,
    /// with a copy named as a test split's.
    files: PathBuf,
}

fn remote() -> &'static Remote {
    static REMOTE: OnceLock<Remote> = OnceLock::new();
    REMOTE.get_or_init(|| {
        let files = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("remote-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&files);
        std::fs::create_dir_all(files.join("parquet")).unwrap();
        write_files(&files);
        let mut server = Command::new(common::python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/object_server.py"))
            .arg(&files)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the object server");
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let urls: HashMap<String, String> = serde_json::from_str(&line).expect("the server's addresses");
        // Credentials the way the provider's SDK finds them: the environment, here and in every
        // ringtrain this process starts.
        for (k, v) in [
            ("AWS_ENDPOINT_URL", urls["s3"].as_str()),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", "us-east-1"),
        ] {
            std::env::set_var(k, v);
        }
        // In this process, a cache that holds one object: every other read fetches again.
        ringtrain::data::remote::cache::configure(ringtrain::data::remote::CacheOptions {
            dir: Some(files.join("in-process-cache")),
            max_bytes: Some(1),
        });
        run_python_code(&format!(
            r#"
import boto3, os
s3 = boto3.client("s3", endpoint_url={s3:?})
s3.create_bucket(Bucket="data")
files = {files:?}
for prefix in ["set", "faults", "changed"]:
    for name in sorted(os.listdir(files)):
        if name.endswith((".tar", ".pack")):
            s3.upload_file(f"{{files}}/{{name}}", "data", f"{{prefix}}/{{name}}")
for name in sorted(os.listdir(f"{{files}}/parquet")):
    s3.upload_file(f"{{files}}/parquet/{{name}}", "data", f"set/parquet/{{name}}")
    s3.upload_file(f"{{files}}/parquet/{{name}}", "data", f"mixed/{{name}}")
s3.upload_file(f"{{files}}/parquet/{{name}}", "data", "mixed/test-00000-of-00001.parquet")
"#,
            s3 = urls["s3"],
            files = files.to_str().unwrap()
        ));
        Remote {
            _server: server,
            s3: urls["s3"].clone(),
            http: urls["http"].clone(),
            files,
        }
    })
}

/// The shards and parquet files by webdataset and datasets, and an encoded pack by ringtrain.
fn write_files(files: &Path) {
    run_python_code(&format!(
        r#"
import os, webdataset as wds
from datasets import ClassLabel, Dataset, Features, Image
{seedlings}
with wds.ShardWriter(f"{{out}}/train-%06d.tar", maxcount=5, verbose=0) as w:
    for i, (p, c) in enumerate(items):
        w.write({{"__key__": f"s{{i:04d}}", "png": open(p, "rb").read(), "cls": c}})
features = Features({{"image": Image(), "label": ClassLabel(names=classes)}})
embed = lambda p: {{"bytes": open(p, "rb").read(), "path": os.path.basename(p)}}
ds = Dataset.from_dict({{"image": [embed(p) for p, _ in items], "label": [c for _, c in items]}}, features=features)
for i in range(2):
    ds.shard(2, i, contiguous=True).to_parquet(f"{{out}}/parquet/train-{{i:05d}}-of-00002.parquet", batch_size=4)
"#,
        seedlings = common::first_seedlings_py(files),
    ));
    let (shards, pack) = (files.join("train-{000000..000003}.tar"), files.join("s.pack"));
    let packed = ringtrain(&argv("pack --data {} --out {} --store encoded", &[&shards, &pack]));
    assert!(packed.status.success(), "{}", common::text(&packed));
}

/// A set's classes, then per sample its name under the set's root, label and bytes' SHA-256.
fn listing(set: &Dataset) -> String {
    let mut out = set.classes.join(",") + "\n";
    for i in 0..set.len() {
        let name = set.samples.name(i).display();
        out += &format!("{name} {} {}\n", set.samples.label(i), sample_sha256(&set.samples, i));
    }
    out
}

/// The proxy's log: [method, path, range] of every request so far.
fn requests(r: &Remote) -> Vec<(String, String, Option<String>)> {
    let url = format!("{}/__log__", r.s3);
    let out = run_python_code(&format!("import urllib.request as u; print(u.urlopen({url:?}).read().decode())"));
    serde_json::from_str(out.trim()).unwrap()
}

/// The next GETs of paths holding each key fail: `503` answers SlowDown, `cut` sends half the
/// body and drops the connection; `deny`, a bucket every request of which answers 403.
fn set_faults(r: &Remote, faults: &str) {
    run_python_code(&format!(
        "import urllib.request; urllib.request.urlopen(urllib.request.Request({:?}, data={faults:?}.encode()))",
        format!("{}/__faults__", r.s3)
    ));
}

/// GETs of the objects whose paths hold `part`: (whole, ranged).
fn gets(log: &[(String, String, Option<String>)], part: &str) -> (usize, usize) {
    let of = log.iter().filter(|(m, p, _)| m == "GET" && p.contains(part) && !p.contains("list-type"));
    let (ranged, whole): (Vec<_>, Vec<_>) = of.partition(|(_, _, range)| range.is_some());
    (whole.len(), ranged.len())
}

/// Every remote form names the samples, labels and bytes of the same local files, and gives
/// their batches, in evaluation order and in training's order.
#[test]
fn remote_locations_list_and_batch_as_their_local_files() {
    let r = remote();
    let local_shards = r.files.join("train-{000000..000003}.tar");
    let want = listing(&Dataset::open(&local_shards, "--data").unwrap());
    assert_eq!(want.lines().count(), 19, "3 classes and 18 samples:\n{want}");
    let http = &r.http;
    for location in [
        "s3://data/set/train-{000000..000003}.tar".to_owned(),
        "s3://data/set/train-*.tar".to_owned(),
        "s3://data/set/train-00000{0,1}.tar::s3://data/set/train-00000{2..3}.tar".to_owned(),
        format!("{http}/train-{{000000..000003}}.tar"),
    ] {
        let set = Dataset::open(Path::new(&location), "--data").unwrap();
        assert_eq!(listing(&set), want, "{location}");
    }
    let remote_shards = Path::new("s3://data/set/train-{000000..000003}.tar");
    assert_eq!(eval_batches(remote_shards), eval_batches(&local_shards));
    let same_order = "the same order: the streams', of the same names";
    assert_eq!(train_samples(remote_shards), train_samples(&local_shards), "{same_order}");

    let local_parquet = r.files.join("parquet/train-*.parquet");
    let want = listing(&Dataset::open(&local_parquet, "--data").unwrap());
    for location in [
        "s3://data/set/parquet/train-*.parquet".to_owned(),
        "s3://data/set/parquet/".to_owned(),
        format!("{http}/parquet/train-{{00000,00001}}-of-00002.parquet"),
    ] {
        assert_eq!(listing(&Dataset::open(Path::new(&location), "--data").unwrap()), want, "{location}");
    }
    assert_eq!(eval_batches(Path::new("s3://data/set/parquet/")), eval_batches(&local_parquet));

    let local_pack = r.files.join("s.pack");
    assert_eq!(eval_batches(Path::new("s3://data/set/s.pack")), eval_batches(&local_pack));
    assert_eq!(eval_batches(Path::new(&format!("{http}/s.pack"))), eval_batches(r.files.join("tree")));
}

/// A training run through two 503s and a connection cut mid-object ends with the weights of
/// the same run on the local files, each object fetched once (the 503s retried, the cut one
/// finished by a Range request); a second run with the same --cache-dir fetches nothing.
#[test]
fn cache_dir_keeps_what_was_fetched_and_faults_are_retried() {
    let r = remote();
    let d = tempfile::tempdir().unwrap();
    let flags = "--device cpu --model resnet18 --img-size 32 --batch-size 4 --epochs 2 --seed 3 --workers 2";
    let (train, val) = (r.files.join("train-{000000..000002}.tar"), r.files.join("train-000003.tar"));
    let local = ringtrain(&common::train_val_args(&train, &val, &d.path().join("local"), flags));
    assert!(local.status.success(), "{}", common::text(&local));

    set_faults(r, r#"{"503": {"faults/train-000001": 2}, "cut": {"faults/train-000002": 1}}"#);
    let cache = d.path().join("cache");
    let run = |out: &str| {
        let mut args = common::train_val_args(
            Path::new("s3://data/faults/train-{000000..000002}.tar"),
            Path::new("s3://data/faults/train-000003.tar"),
            &d.path().join(out),
            flags,
        );
        args.extend(["--cache-dir".into(), cache.to_string_lossy().into_owned()]);
        let o = ringtrain(&args);
        assert!(o.status.success(), "{}", common::text(&o));
        common::text(&o)
    };
    let before = requests(r).len();
    let text = run("remote");
    let log = requests(r)[before..].to_vec();
    let into = format!("into the cache {}", cache.display());
    assert!(text.contains("fetched 4 object(s)") && text.contains(&into), "{text}");
    assert_eq!(gets(&log, "faults/train-000000"), (1, 0));
    assert_eq!(gets(&log, "faults/train-000001"), (3, 0), "two 503s, then the object");
    assert_eq!(gets(&log, "faults/train-000002"), (1, 1), "cut half-way, then the rest by a Range request");
    assert_eq!(gets(&log, "faults/train-000003"), (1, 0));
    let diff = max_diff(&weights(&d.path().join("local")), &weights(&d.path().join("remote")));
    assert_eq!(diff, 0.0, "the same samples in the same order give the same weights");

    let before = requests(r).len();
    let text = run("again");
    let log = requests(r)[before..].to_vec();
    assert_eq!(gets(&log, "faults/"), (0, 0), "every object read from --cache-dir: {log:?}");
    assert!(text.contains("fetched 0 object(s)"), "{text}");
    assert_eq!(max_diff(&weights(&d.path().join("local")), &weights(&d.path().join("again"))), 0.0);
}

/// A missing object, a denied bucket, a web server asked to list, a folder of two splits'
/// parquet files, WebDataset's pipe: and an unknown scheme are one line each (exit 2); an object
/// replaced while a run reads it is detected when it is fetched again, and stops the loader.
#[test]
fn missing_denied_and_changed_objects_are_one_line_each() {
    let r = remote();
    let http = &r.http;
    let data = |location: &str| ["stats".to_owned(), "--data".to_owned(), location.to_owned()];
    let missing = "s3://data/set/train-000004.tar: no such object";
    expect_user_error(&data("s3://data/set/train-{000000..000009}.tar"), missing);
    expect_user_error(&data("s3://nobucket/train-000000.tar"), "no such object");
    expect_user_error(&data(&format!("{http}/nothing.tar")), "nothing.tar: no such object");
    expect_user_error(&data(&format!("{http}/train-*.tar")), "a web server's files cannot be listed");
    expect_user_error(&data("s3://data/set/nothing-*.tar"), "matches no object");
    set_faults(r, r#"{"deny": "secret"}"#);
    let denied = "access denied (credentials: AWS_ACCESS_KEY_ID from the environment)";
    expect_user_error(&data("s3://secret/train-000000.tar"), denied);
    expect_user_error(&data("pipe:curl -s https://example.com/train-{000000..000009}.tar"), "WebDataset's pipe: URLs");
    expect_user_error(&data("ftp://example.com/train.tar"), "not ftp://");
    let splits = "holds the parquet files of several splits (test, train): name one, e.g. 's3://data/mixed/test-*.parquet'";
    expect_user_error(&data("s3://data/mixed/"), splits);
    expect_user_error(&["stats", "--data", "s3://data/set/s.pack", "--cache-max", "lots"], "not a size");
    let d = tempfile::tempdir().unwrap();
    let csv = d.path().join("labels.csv");
    std::fs::write(&csv, "image,label\na.png,0\n").unwrap();
    let labelled = ["stats", "--data", "s3://data/set/", "--labels", csv.to_str().unwrap()];
    expect_user_error(&labelled, "a label file labels the images of a local folder");

    // This process's cache holds one object, so reading shard 0 after the others fetches it
    // again, asking for the version listed when the set was opened.
    let set = Dataset::open(Path::new("s3://data/changed/train-{000000..000003}.tar"), "--data").unwrap();
    let first_of = |shard: &str| (0..set.len()).find(|&i| set.samples.name(i).starts_with(shard)).unwrap();
    for shard in ["train-000001.tar", "train-000002.tar", "train-000003.tar"] {
        set.samples.read(first_of(shard)).unwrap();
    }
    run_python_code(&format!(
        "import boto3; boto3.client('s3', endpoint_url={:?}).put_object(Bucket='data', Key='changed/train-000000.tar', Body=b'x' * 10240)",
        r.s3
    ));
    let e = set.samples.read(first_of("train-000000.tar")).err().expect("a changed object is an error");
    assert!(ringtrain::error::is_user_error(&e), "{e:#}");
    assert!(e.to_string().contains("s3://data/changed/train-000000.tar changed while this run read it"), "{e:#}");
    // The loader stops there, where an unreadable image would be passed over with a warning.
    use ringtrain::data::load::loader::{Loader, LoaderOptions};
    let t = ringtrain::data::augment::transform::Transform::eval(48, 56, Default::default());
    let loader = Loader::new(set.samples.clone(), t, LoaderOptions::in_order(4, 2)).unwrap();
    let stopped = loader.epoch(0).find_map(Result::err).expect("the loader stops at data it cannot fetch");
    assert!(stopped.to_string().contains("changed while this run read it"), "{stopped:#}");
}

/// `doctor --data` lists a location and reads the start of its first object, or says why not.
#[test]
fn doctor_checks_a_remote_location() {
    let r = remote();
    let out = ringtrain(&["doctor", "--data", "s3://data/set/train-*.tar"]);
    let text = common::text(&out);
    assert!(out.status.success(), "{text}");
    let size: u64 = (0..4).map(|i| std::fs::metadata(r.files.join(format!("train-00000{i}.tar"))).unwrap().len()).sum();
    let want = format!(
        "ok       data s3://data/set/train-*.tar: 4 object(s), {:.1} MB in all, listed and read (the first 64 KB of s3://data/set/train-000000.tar",
        size as f64 / 1e6
    );
    assert!(text.contains(&want), "{want}\n{text}");
    let out = ringtrain(&["doctor", "--data", "s3://data/set/none-*.tar"]);
    let text = common::text(&out);
    let want = "warning  data s3://data/set/none-*.tar: --data 's3://data/set/none-*.tar' matches no object";
    assert!(text.contains(want), "{text}");
}

/// Starts a run and sends SIGTERM once a progress line contains `when`; returns the exit code
/// and what it printed.
fn interrupt(args: &[String], when: &str) -> (Option<i32>, String) {
    let mut child = common::spawn_ringtrain(args);
    let mut seen = String::new();
    let mut sent = false;
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if !sent && line.contains(when) {
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            sent = true;
        }
        seen += &line;
        seen.push('\n');
    }
    let o = child.wait_with_output().unwrap();
    assert!(sent, "never saw {when:?}: {seen}{}", String::from_utf8_lossy(&o.stderr));
    (o.status.code(), seen)
}

/// The run's own record (--log-samples): per (epoch, step), the samples every rank took, sorted.
fn steps_taken(run: &Path) -> std::collections::BTreeMap<(usize, usize), Vec<String>> {
    let mut steps: std::collections::BTreeMap<(usize, usize), Vec<String>> = Default::default();
    for e in std::fs::read_dir(run.join("samples")).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.splitn(3, ',').collect();
            steps.entry((f[0].parse().unwrap(), f[1].parse().unwrap())).or_default().push(f[2].to_owned());
        }
    }
    for names in steps.values_mut() {
        names.sort();
    }
    steps
}

/// Elastic resumption: a 2-rank run on remote shards stopped mid-epoch and resumed on 1
/// process, and a 1-process run on local shards resumed on 2, take at every step the samples a
/// run that never stopped takes (the order does not depend on the number of ranks), so each
/// epoch sees every sample once, and end with its weights within the bound 2 ranks hold against
/// 1 process (tests/dist.rs: 5e-6 of the update). The ranks of a node share --cache-dir: each
/// object is fetched once.
#[test]
fn runs_resumed_on_another_number_of_ranks_see_every_sample_once() {
    let r = remote();
    let d = tempfile::tempdir().unwrap();
    common::make_folder(&d.path().join("tree"), &["a", "b", "c"], 80);
    let shards = d.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    run_python_code(&format!(
        r#"
import boto3, os, webdataset as wds
tree, out = {tree:?}, {out:?}
items = [(f"{{tree}}/{{c}}/{{f}}", i) for i, c in enumerate(sorted(os.listdir(tree))) for f in sorted(os.listdir(f"{{tree}}/{{c}}"))]
with wds.ShardWriter(f"{{out}}/el-%06d.tar", maxcount=20, verbose=0) as w:
    for k, (p, c) in enumerate(items):
        w.write({{"__key__": f"e{{k:04d}}", "png": open(p, "rb").read(), "cls": c}})
s3 = boto3.client("s3", endpoint_url={s3:?})
for name in sorted(os.listdir(out)):
    s3.upload_file(f"{{out}}/{{name}}", "data", f"elastic/{{name}}")
"#,
        tree = d.path().join("tree").to_str().unwrap(),
        out = shards.to_str().unwrap(),
        s3 = r.s3
    ));
    let local = shards.join("el-{000000..000011}.tar");
    let remote_set = Path::new("s3://data/elastic/el-{000000..000011}.tar");
    let val = shards.join("el-000000.tar");
    // 240 samples, global batch 8: 30 steps an epoch, no padding on 1 or 2 ranks.
    let flags = "--model lenet5 --img-size 32 --batch-size 8 --device cpu --seed 4 --workers 2 --log-every 1 \
                 --log-samples";
    let args = |data: &Path, out: &str, extra: &[&str]| {
        let run = match out {
            // The initial weights: a step too small to change a float.
            "init" => "--epochs 1 --lr 1e-30 --momentum 0",
            _ => "--epochs 2 --lr 0.01",
        };
        let mut a = common::train_val_args(data, &val, &d.path().join(out), &format!("{flags} {run}"));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let ok = |a: Vec<String>| {
        let o = ringtrain(&a);
        assert!(o.status.success(), "{}", common::text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    ok(args(&local, "never-stopped", &[]));
    ok(args(&local, "init", &[]));
    let (init, reference) = (weights(&d.path().join("init")), weights(&d.path().join("never-stopped")));
    let want = steps_taken(&d.path().join("never-stopped"));
    assert_eq!(want.len(), 60);
    for epoch in 0..2 {
        let mut seen: Vec<&String> = want.range((epoch, 0)..(epoch + 1, 0)).flat_map(|(_, v)| v).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 240, "every sample once in epoch {epoch}");
    }

    let cache = d.path().join("cache");
    let cache_flag = ["--cache-dir", cache.to_str().unwrap()];
    let ranks = |n: &'static str| if n == "1" { vec![] } else { vec!["--nproc-per-node", n] };
    for (name, data, first, then) in [("two-then-one", remote_set, "2", "1"), ("one-then-two", &local, "1", "2")] {
        let before = requests(r).len();
        let stopped = args(data, name, &[&ranks(first)[..], &cache_flag[..]].concat());
        let (code, seen) = interrupt(&stopped, "epoch 1/2 step 3/30");
        assert_eq!(code, Some(143), "{seen}");
        let st = std::fs::read(d.path().join(name).join("last/state.json")).unwrap();
        let st: serde_json::Value = serde_json::from_slice(&st).unwrap();
        assert_eq!((st["world_size"].as_u64(), st["epoch"].as_u64()), (Some(first.parse().unwrap()), Some(0)), "{st}");
        let stopped_at = st["mid_epoch"]["steps"].as_u64().expect("a mid-epoch checkpoint");
        assert!((1..30).contains(&stopped_at), "{st}");
        let out = ok(args(data, name, &[&ranks(then)[..], &["--resume", "auto"], &cache_flag[..]].concat()));
        assert!(out.contains(&format!("the run had {first} ranks, now {then}")), "{out}");
        assert_eq!(steps_taken(&d.path().join(name)), want, "{name}: the steps of a run that never stopped, each once");
        let diff = common::rel_diff(&weights(&d.path().join(name)), &reference, &reference, &init);
        eprintln!("{name}: stopped after step {stopped_at}, weights {diff:.1e} of the update from a run never stopped");
        assert!(diff <= 5e-6, "{name}: {diff:.1e} of the update (bound 5e-6)");
        if data == remote_set {
            let log = requests(r)[before..].to_vec();
            let once = "each shard fetched once, by one of the ranks sharing the cache";
            assert_eq!(gets(&log, "elastic/"), (12, 0), "{once}");
        }
    }
}
