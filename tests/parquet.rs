//! Hugging Face datasets as parquet files: written by the `datasets` library itself (its Image and
//! ClassLabel features, several files and row groups, an unlabelled test split), listed with
//! the labels and image bytes the library reads back, giving the same batches as the same
//! images in an ImageFolder; bad files are one line each.
mod common;

use std::path::Path;

use common::{
    argv, eval_batches, expect_user_error, ringtrain, run_python_code, sample_sha256, sorted_epochs,
    train_samples,
};
use ringtrain::data::source::{DataSpec, Dataset};

/// `dir/data/train-0000{0,1}-of-00002.parquet` (the first 6 seedlings of 3 classes in
/// ImageFolder order, row groups of 4) and `dir/data/test-00000-of-00001.parquet` (3 images,
/// label -1), written by `datasets`; the training files again in `dir/CODEC/` for each codec
/// pyarrow writes; `dir/tree`, the same training images as an ImageFolder.
/// Returns the class names, then one line per training row as `datasets` reads it back:
/// label and the image bytes' SHA-256.
fn write_parquet(dir: &Path) -> String {
    run_python_code(&format!(
        r#"
import hashlib, os
from datasets import ClassLabel, Dataset, Features, Image
{seedlings}
features = Features({{"image": Image(), "label": ClassLabel(names=classes)}})
# The bytes embedded, as the hub's files hold them (push_to_hub embeds what paths point to).
embed = lambda p: {{"bytes": open(p, "rb").read(), "path": os.path.basename(p)}}
ds = Dataset.from_dict({{"image": [embed(p) for p, _ in items], "label": [c for _, c in items]}}, features=features)
for i in range(2):
    ds.shard(2, i, contiguous=True).to_parquet(f"{{out}}/data/train-{{i:05d}}-of-00002.parquet", batch_size=4)
test = Dataset.from_dict({{"image": [embed(p) for p, _ in items[:3]], "label": [-1] * 3}}, features=features)
test.to_parquet(f"{{out}}/data/test-00000-of-00001.parquet")
# The same files in every codec pyarrow writes.
import pyarrow.parquet as pq
for codec in ["snappy", "gzip", "zstd", "lz4"]:
    os.makedirs(f"{{out}}/{{codec}}")
    for i in range(2):
        name = f"train-{{i:05d}}-of-00002.parquet"
        pq.write_table(pq.read_table(f"{{out}}/data/{{name}}"), f"{{out}}/{{codec}}/{{name}}", compression=codec, row_group_size=4)
back = Dataset.from_parquet(sorted(f"{{out}}/data/" + f for f in os.listdir(f"{{out}}/data") if f.startswith("train")))
back = back.cast_column("image", Image(decode=False))
print(",".join(back.features["label"].names))
for row in back:
    print(row["label"], hashlib.sha256(row["image"]["bytes"]).hexdigest())
"#,
        seedlings = common::first_seedlings_py(dir),
    ))
}

/// A set as `write_parquet`'s script prints what `datasets` reads back: the class names, then
/// each row's label and image bytes' SHA-256.
fn listing(set: &Dataset) -> String {
    let mut out = set.classes.join(",") + "\n";
    for i in 0..set.len() {
        out += &format!("{} {}\n", set.samples.label(i), sample_sha256(&set.samples, i));
    }
    out
}

#[test]
fn parquet_reads_what_datasets_writes_and_batches_as_its_folder() {
    let d = tempfile::tempdir().unwrap();
    let want = write_parquet(d.path());
    let train = d.path().join("data/train-*.parquet");
    let set = Dataset::open(&train, "--data").unwrap();
    assert_eq!(listing(&set), want);
    assert_eq!(set.len(), 18);
    // 9 rows a file in row groups of 4: 3 groups each, read as 6 "shards".
    let groups: std::collections::BTreeSet<usize> = (0..set.len()).map(|i| set.samples.shard_of(i).unwrap()).collect();
    assert_eq!(groups.len(), 6);

    let tree = eval_batches(d.path().join("tree"));
    assert_eq!(eval_batches(&train), tree);
    // Training reads row groups as shards: each epoch the folder's multiset of samples.
    assert_eq!(sorted_epochs(train_samples(&train)), sorted_epochs(train_samples(d.path().join("tree"))));
    for codec in ["snappy", "gzip", "zstd", "lz4"] {
        assert_eq!(eval_batches(d.path().join(codec)), tree, "{codec}");
    }
    let pack = d.path().join("p.pack");
    let packed = ringtrain(&argv("pack --data {} --out {} --store encoded", &[&train, &pack]));
    assert!(packed.status.success(), "{}", String::from_utf8_lossy(&packed.stderr));
    assert_eq!(eval_batches(&pack), tree);

    // Training from the files, validating on a split of them; the unlabelled test split is
    // left out with a warning when named, refused under --strict.
    let run = d.path().join("run");
    let out = ringtrain(&argv(
        "train --data {} --out {} --model resnet10-tiny --img-size 32 --epochs 1 --batch-size 4 --device cpu --workers 2",
        &[&train, &run],
    ));
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("3 classes") && said.contains("parquet"), "{said}");
    let both = d.path().join("data/{train,test}-*.parquet");
    let mut spec = DataSpec::from(&both);
    assert_eq!(Dataset::open(spec.clone(), "--data").unwrap().len(), 18);
    spec.strict = true;
    let e = Dataset::open(spec, "--data").err().unwrap().to_string();
    assert!(e.contains("3 rows have no label"), "{e}");
}

#[test]
fn bad_parquet_input_is_one_line_each() {
    let d = tempfile::tempdir().unwrap();
    write_parquet(d.path());
    let out = d.path().join("run");
    let train = |data: &Path, flags: &str| {
        let mut a = argv("train --data {} --out {} --device cpu", &[data, &out]);
        a.extend(flags.split_whitespace().map(Into::into));
        a
    };
    let data = d.path().join("data");
    expect_user_error(&train(&data, ""), "holds the parquet files of several splits (test, train)");
    let files = data.join("train-*.parquet");
    expect_user_error(&train(&files, "--label-column species"), "has no label column 'species' (--label-column); its columns: image, label");
    expect_user_error(&train(&files, "--image-column img"), "has no image column 'img'");
    expect_user_error(&train(&data.join("test-*.parquet"), ""), "3 rows have no label");
    expect_user_error(&train(&data.join("nope-*.parquet"), ""), "matches no file");
    let junk = d.path().join("junk.parquet");
    std::fs::write(&junk, b"not parquet at all").unwrap();
    expect_user_error(&train(&junk, ""), "is not a readable parquet file");
    assert!(!out.exists());

    // Image bytes that do not decode: skipped with one warning naming the row, as a folder's
    // unreadable file is; --strict stops.
    let bad = d.path().join("bad/train-00000-of-00001.parquet");
    std::fs::create_dir(d.path().join("bad")).unwrap();
    run_python_code(&format!(
        r#"
import pyarrow.parquet as pq, pyarrow as pa
t = pq.read_table({good:?})
images = t.column("image").to_pylist()
images[3] = {{"bytes": b"these are not image bytes", "path": "x.png"}}
t = t.set_column(0, "image", pa.array(images, type=t.schema.field("image").type))
pq.write_table(t, {bad:?}, row_group_size=4)
"#,
        good = data.join("train-00000-of-00002.parquet").to_str().unwrap(),
        bad = bad.to_str().unwrap()
    ));
    let flags = "--model resnet10-tiny --img-size 32 --epochs 1 --batch-size 4 --workers 1";
    let o = ringtrain(&train(&bad, flags));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let warned: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: skipped unreadable image")).collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(warned[0].contains("train-00000-of-00001.parquet/3"), "{err}");
    let o = ringtrain(&train(&bad, &format!("{flags} --strict --overwrite")));
    assert_ne!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `Dataset.to_parquet` of a set made from image paths, as `datasets` writes it: the Image
/// struct with null bytes and the path, absolute or (here, for half the rows) relative to where
/// the set was made, beside the parquet file. ringtrain reads each row's file, as `datasets`
/// does: the labels and image bytes the library reads back, and the folder's batches, from any
/// current directory. A path that names no file stops a `--strict` run in one line naming it
/// (without `--strict` the row is skipped with a warning, as an unreadable image is).
#[test]
fn rows_without_bytes_read_the_files_their_paths_name() {
    let d = tempfile::tempdir().unwrap();
    let want = run_python_code(&format!(
        r#"
import hashlib, os
from datasets import ClassLabel, Dataset, Features, Image
{seedlings}
os.makedirs(f"{{out}}/set/images")
os.chdir(f"{{out}}/set")
paths = []
for i, (p, _) in enumerate(items):
    os.symlink(p, f"images/{{i}}.png")
    paths.append(p if i % 2 else f"images/{{i}}.png")
features = Features({{"image": Image(), "label": ClassLabel(names=classes)}})
ds = Dataset.from_dict({{"image": paths, "label": [c for _, c in items]}}, features=features)
ds.to_parquet("train.parquet", batch_size=4)
import pyarrow.parquet as pq
stored = pq.read_table("train.parquet").column("image").combine_chunks()
assert stored.field("bytes").null_count == len(items), "datasets embedded the bytes"
back = Dataset.from_parquet("train.parquet")
print(",".join(back.features["label"].names))
for row, path in zip(back.cast_column("image", Image(decode=False)), paths):
    assert row["image"]["bytes"] is None and row["image"]["path"] == path
    print(row["label"], hashlib.sha256(open(path, "rb").read()).hexdigest())
assert [r["image"].size for r in back] == [(150, 150)] * len(items)
"#,
        seedlings = common::first_seedlings_py(d.path()),
    ));
    let file = d.path().join("set/train.parquet");
    let set = Dataset::open(&file, "--data").unwrap();
    assert_eq!(listing(&set), want);
    assert_eq!(eval_batches(&file), eval_batches(d.path().join("tree")));

    std::fs::remove_file(d.path().join("set/images/4.png")).unwrap();
    expect_user_error(
        &argv("train --data {} --out {} --device cpu --model resnet10-tiny --img-size 32 --epochs 1 --batch-size 4 --workers 1 --strict", &[&file, &d.path().join("run")]),
        "a row without image bytes names images/4.png, which cannot be read",
    );
}
