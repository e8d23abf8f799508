//! WebDataset tar shards: listed as the webdataset package reads them (its ShardWriter writes
//! them, its reader is the reference), brace patterns expanded as its braceexpand does, the same
//! batches as the same images in an ImageFolder, shards cut short, and training split by shard
//! across ranks.
mod common;

use std::path::Path;

use common::{
    argv, eval_batches, expect_user_error, ringtrain, run_python_code, sample_sha256, sorted_epochs,
    train_samples,
};
use ringtrain::data::source::common::expand;
use ringtrain::data::source::{DataSpec, Dataset};

/// Writes `dir/train-00000{0..3}.tar` with webdataset's ShardWriter (5 samples each: the first
/// 6 seedlings of 3 classes in ImageFolder order, keys under a folder with a dot in its name)
/// and `dir/train-000004.tar` with tarfile: a sample with an upper-case extension, one without
/// a label, WebDataset's `__meta__` and a directory entry. Links the same 18 images into
/// `dir/tree`, an ImageFolder. Returns webdataset's own listing: shard, key, the image's
/// SHA-256, class, one line per sample it yields with both a png and a cls.
fn write_shards(dir: &Path) -> String {
    run_python_code(&format!(
        r#"
import hashlib, io, os, tarfile, webdataset as wds
{seedlings}
with wds.ShardWriter(f"{{out}}/train-%06d.tar", maxcount=5, verbose=0) as w:
    for i, (p, c) in enumerate(items):
        w.write({{"__key__": f"set.v1/s{{i:04d}}", "png": open(p, "rb").read(), "cls": c}})
with tarfile.open(f"{{out}}/train-000004.tar", "w") as t:
    def add(name, data):
        info = tarfile.TarInfo(name); info.size = len(data); t.addfile(info, io.BytesIO(data))
    png = open(items[0][0], "rb").read()
    add("__meta__", b"{{}}")
    d = tarfile.TarInfo("folder"); d.type = tarfile.DIRTYPE; t.addfile(d)
    add("e0.PNG", png); add("e0.cls", b" 2\n")
    add("e1.png", png)
    add("e2.png", png); add("e2.cls", b"1")
ds = wds.WebDataset(f"{{out}}/train-{{{{000000..000004}}}}.tar", shardshuffle=False, empty_check=False)
for s in ds:
    if "png" in s and "cls" in s:
        print(os.path.basename(s["__url__"]), s["__key__"], hashlib.sha256(s["png"]).hexdigest(), int(s["cls"]))
"#,
        seedlings = common::first_seedlings_py(dir),
    ))
}

#[test]
fn shards_list_what_webdataset_reads_and_batch_as_their_folder() {
    let d = tempfile::tempdir().unwrap();
    let want = write_shards(d.path());
    let pattern = d.path().join("train-{000000..000004}.tar");
    let set = Dataset::open(&pattern, "--data").unwrap();
    assert_eq!(set.classes, ["0", "1", "2"]);
    let mut got = String::new();
    for i in 0..set.len() {
        let name = set.samples.name(i).to_str().unwrap();
        let (shard, member) = name.split_once('/').unwrap();
        let key = &member[..member.rfind('.').unwrap()];
        let sha = sample_sha256(&set.samples, i);
        got += &format!("{shard} {key} {sha} {}\n", set.samples.label(i));
    }
    assert_eq!(got, want);
    assert_eq!(set.len(), 20, "18 written by ShardWriter, 2 by tarfile");

    // The ShardWriter's shards hold the folder's images in its order: the same batches.
    let four = d.path().join("train-{000000..000003}.tar");
    let tree = eval_batches(d.path().join("tree"));
    assert_eq!(eval_batches(&four), tree);
    // Training reads them in WebDataset's order: each epoch the same multiset of samples, each
    // augmented as the folder's same image is (its randomness is keyed by the sample's index).
    let (shards, folder) = (train_samples(&four), train_samples(d.path().join("tree")));
    for (s, f) in shards.iter().zip(&folder) {
        assert_ne!(s, f, "not the folder's global shuffle");
    }
    assert_eq!(sorted_epochs(shards), sorted_epochs(folder));

    // A pack of the shards holds the same images; a shard changed since is refused.
    let pack = d.path().join("s.pack");
    let packed = ringtrain(&argv("pack --data {} --out {} --store encoded", &[&four, &pack]));
    assert!(packed.status.success(), "{}", String::from_utf8_lossy(&packed.stderr));
    assert_eq!(eval_batches(&pack), tree);
    let shard = d.path().join("train-000002.tar");
    let f = std::fs::File::options().append(true).open(&shard).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5)).unwrap();
    let e = Dataset::open(&pack, "--data").err().unwrap().to_string();
    assert!(e.contains("older than its shards") && e.contains("train-000002.tar changed"), "{e}");
}

/// Brace patterns expand as webdataset's braceexpand expands them.
#[test]
fn brace_patterns_expand_as_braceexpand_does() {
    let patterns = ["/s/train-{000000..000012}.tar", "a-{8..11}.tar", "{x,y}-{0..2}.tar", "b-{09..11}-{a,bc}.tar", "plain.tar"];
    let want = run_python_code(&format!(
        "from braceexpand import braceexpand\nfor p in {patterns:?}:\n    print(' '.join(braceexpand(p)))\n"
    ));
    for (p, line) in patterns.iter().zip(want.lines()) {
        let got: Vec<String> = expand(p, "--data").unwrap().iter().map(|p| p.display().to_string()).collect();
        assert_eq!(got.join(" "), line, "{p}");
    }
}

/// A shard cut short keeps the samples before the cut, with one warning (an error under
/// --strict); a missing shard, a backwards range and a label file over shards are one-line
/// errors; training on two ranks splits the shards between them, and refuses fewer shards than
/// ranks.
#[test]
fn cut_shards_bad_patterns_and_two_ranks() {
    let d = tempfile::tempdir().unwrap();
    write_shards(d.path());
    let cut = d.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    let whole = std::fs::read(d.path().join("train-000001.tar")).unwrap();
    std::fs::write(cut.join("a.tar"), &whole[..whole.len() / 2]).unwrap();
    // A folder of .tar files and no sub-folders is a set of shards.
    let mut spec = DataSpec::from(&cut);
    let set = Dataset::open(spec.clone(), "--data").unwrap();
    assert!(set.len() >= 1 && set.len() < 5, "{} samples before the cut", set.len());
    spec.strict = true;
    let e = Dataset::open(spec, "--data").err().unwrap().to_string();
    assert!(e.contains("is cut short after"), "{e}");

    let out = d.path().join("run");
    let train = |data: &Path, flags: &str| {
        let mut a = argv("train --data {} --out {} --device cpu --model resnet10-tiny --img-size 32 --batch-size 4 --epochs 1 --workers 1", &[data, &out]);
        a.extend(flags.split_whitespace().map(Into::into));
        a
    };
    expect_user_error(&train(&d.path().join("train-{000000..000009}.tar"), ""), "train-000005.tar: No such file");
    expect_user_error(&train(&d.path().join("train-{000003..000001}.tar"), ""), "runs backwards");
    let labels = d.path().join("l.csv");
    std::fs::write(&labels, "a,b\n").unwrap();
    expect_user_error(
        &train(&d.path().join("train-000000.tar"), &format!("--labels {}", labels.display())),
        "carry their own labels",
    );
    // Shards are read in WebDataset's order: no sampler order over them.
    for (flags, needle) in [
        ("--ra-sampler", "--ra-sampler: --data"),
        ("--torch-sampler-seed 0", "--torch-sampler-seed: --data"),
    ] {
        let flags = format!("{flags} --val-split 0.2");
        expect_user_error(&train(&d.path().join("train-{000000..000003}.tar"), &flags), needle);
    }
    assert!(!out.exists());

    let four = d.path().join("train-{000000..000003}.tar");
    let two = ringtrain(&train(&four, "--nproc-per-node 2 --val-split 0.2"));
    let said = String::from_utf8_lossy(&two.stdout) + String::from_utf8_lossy(&two.stderr);
    assert!(two.status.success(), "{said}");
    assert!(said.contains("images from 4 tar shard(s)"), "{said}");
    // Shard 2 holds two classes (samples 10 to 14).
    let one = ringtrain(&train(&d.path().join("train-000002.tar"), "--nproc-per-node 2 --overwrite"));
    let said = String::from_utf8_lossy(&one.stdout) + String::from_utf8_lossy(&one.stderr);
    assert_eq!(one.status.code(), Some(2), "{said}");
    assert!(said.contains("1 shard(s) for 2 ranks"), "{said}");
}

/// What names no local path, refused before anything starts by every command that reads data:
/// WebDataset's `pipe:` URLs and schemes ringtrain does not read: one line saying what to give
/// instead (tests/remote.rs reads s3://, gs:// and http(s):// ones).
#[test]
fn pipe_and_remote_locations_are_one_line_each() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("run");
    for (data, needle) in [
        ("pipe:curl -s https://example.com/train-{000000..000009}.tar", "ringtrain runs no command to read data (WebDataset's pipe: URLs)"),
        ("ftp://example.com/train-{000000..000009}.tar", "not ftp://"),
        ("hdfs://namenode/data/train-*.parquet", "not hdfs://"),
    ] {
        let (out, here) = (out.to_str().unwrap(), d.path().to_str().unwrap());
        let pack = d.path().join("p.pack");
        for args in [
            vec!["train", "--data", data, "--out", out, "--device", "cpu"],
            vec!["train", "--data", here, "--val", data, "--out", out, "--device", "cpu"],
            vec!["stats", "--data", data],
            vec!["pack", "--data", data, "--out", pack.to_str().unwrap()],
            vec!["bench-data", "--data", data],
        ] {
            expect_user_error(&args, needle);
        }
    }
    assert!(!out.exists());
}
