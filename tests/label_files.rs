//! A folder of images with a CSV label file (`--labels`, `--val-labels`): the layout of most
//! Kaggle competitions. Its images give the same batches as the same images in an ImageFolder;
//! rows find their images with or without the extension or the sub-folder; every malformed file
//! is one line naming the line of the file.
mod common;

use std::path::Path;

use common::{argv, eval_batches, expect_user_error, link_first, ringtrain, run_python_code, shared_data, train_samples};
use ringtrain::data::source::{DataSpec, Dataset};

const CLASSES: [&str; 3] = ["Black-grass", "Charlock", "Cleavers"];

fn labels(dir: &Path, csv: &Path) -> DataSpec {
    DataSpec {
        labels: Some(csv.to_path_buf()),
        ..DataSpec::from(dir)
    }
}

/// The same seedlings as an ImageFolder and as a flat folder of renamed files with a label file
/// listing them in the folder's order (ids without extension, extra columns, the columns chosen
/// by name): the same classes and exactly the same batches.
#[test]
fn a_label_file_gives_the_folders_batches() {
    let d = tempfile::tempdir().unwrap();
    let tree = d.path().join("tree");
    link_first(&shared_data("plant-seedlings/train"), &tree, &CLASSES, 7);
    let folder = Dataset::open(&tree, "--data").unwrap();
    let flat = d.path().join("kaggle/train_images");
    std::fs::create_dir_all(&flat).unwrap();
    // Python's csv module writes the file (its "\r\n" line ends included).
    let mut rows = Vec::new();
    for i in 0..folder.len() {
        let id = format!("{:08x}", (i as u64 + 1) * 0x9E37_79B9 % 0xFFFF_FFFF);
        std::os::unix::fs::symlink(folder.samples.path(i), flat.join(format!("{id}.png"))).unwrap();
        rows.push(format!("[{id:?}, 150, {:?}]", folder.classes[folder.samples.label(i)]));
    }
    let file = d.path().join("kaggle/train.csv");
    run_python_code(&format!(
        "import csv\nw = csv.writer(open({:?}, 'w', newline=''))\nw.writerow(['id', 'width', 'species'])\nw.writerows([{}])\n",
        file.to_str().unwrap(),
        rows.join(", ")
    ));
    let csv = std::fs::read_to_string(&file).unwrap();
    assert!(csv.contains("\r\n"));

    let mut spec = labels(&flat, &file);
    spec.columns.label = Some("species".into());
    let set = Dataset::open(spec.clone(), "--data").unwrap();
    assert_eq!(set.classes, CLASSES);
    assert_eq!(set.len(), 21);
    assert_eq!(eval_batches(spec.clone()), eval_batches(DataSpec::from(&tree)));
    // Training: the same shuffle and the same augmentation, sample for sample.
    assert_eq!(train_samples(spec), train_samples(&tree));

    // The rows may name the images under the folder above, by their path in it.
    let rows: String = csv.lines().skip(1).map(|l| format!("train_images/{l}\n")).collect();
    std::fs::write(&file, format!("id,width,species\n{rows}")).unwrap();
    let mut spec = labels(&d.path().join("kaggle"), &file);
    spec.columns.label = Some("species".into());
    assert_eq!(eval_batches(spec), eval_batches(DataSpec::from(&tree)));

    // A pack of them holds the same images; a label file changed since is refused.
    let pack = d.path().join("k.pack");
    let packed = ringtrain(&argv(
        "pack --data {} --labels {} --label-column species --out {} --store encoded",
        &[&d.path().join("kaggle"), &file, &pack],
    ));
    assert!(packed.status.success(), "{}", String::from_utf8_lossy(&packed.stderr));
    assert_eq!(eval_batches(&pack), eval_batches(&tree));
    let f = std::fs::File::options().append(true).open(&file).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5)).unwrap();
    let e = Dataset::open(&pack, "--data").err().unwrap().to_string();
    assert!(e.contains("older than its label file"), "{e}");
}

/// Kaggle's layout trained end to end: a folder of images, train.csv and val.csv over it
/// (`--val-labels` without `--val`), validation lacking a class; then `eval` of the model on
/// val.csv alone.
#[test]
fn training_and_eval_from_label_files() {
    let d = tempfile::tempdir().unwrap();
    let tree = d.path().join("tree");
    link_first(&shared_data("plant-seedlings/train"), &tree, &CLASSES, 10);
    let images = d.path().join("images");
    std::fs::create_dir(&images).unwrap();
    let (mut train, mut val) = (String::from("image,label\n"), String::from("image,label\n"));
    for (c, class) in CLASSES.iter().enumerate() {
        for (i, f) in std::fs::read_dir(tree.join(class)).unwrap().enumerate() {
            let name = format!("{c}_{i}.png");
            std::os::unix::fs::symlink(f.unwrap().path(), images.join(&name)).unwrap();
            // Validation holds no Cleavers: its classes are among the training classes.
            match i < 3 && c < 2 {
                true => val += &format!("{name},{class}\n"),
                false => train += &format!("{name},{class}\n"),
            }
        }
    }
    std::fs::write(d.path().join("train.csv"), train).unwrap();
    std::fs::write(d.path().join("val.csv"), val).unwrap();
    let run = d.path().join("run");
    let out = ringtrain(&argv(
        "train --data {} --labels {} --val-labels {} --out {} --model resnet10-tiny --img-size 32 --epochs 1 --batch-size 8 --device cpu --workers 2",
        &[&images, &d.path().join("train.csv"), &d.path().join("val.csv"), &run],
    ));
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("3 classes, 24 train / 6 val images"), "{said}");
    assert!(said.contains("labelled by"), "{said}");
    let eval = ringtrain(&argv(
        "eval --checkpoint {} --data {} --labels {} --device cpu",
        &[&run.join("best"), &images, &d.path().join("val.csv")],
    ));
    assert!(eval.status.success(), "{}{}", String::from_utf8_lossy(&eval.stdout), String::from_utf8_lossy(&eval.stderr));
    let report = std::fs::read_to_string(run.join("eval-best/report.txt")).unwrap();
    // Every training class is in the report; Cleavers has no validation image.
    let support = |class: &str| {
        let line = report.lines().find(|l| l.trim_start().starts_with(class)).unwrap();
        line.split_whitespace().last().unwrap().parse::<usize>().unwrap()
    };
    assert_eq!([support("Black-grass"), support("Charlock"), support("Cleavers")], [3, 3, 0], "{report}");
}

/// Each malformed label file is refused in one line naming the file and the line; rows naming
/// no image are left out with a warning, or refused with --strict.
#[test]
fn malformed_label_files_are_one_line_each() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("images");
    common::make_folder(&dir, &["a", "b"], 3);
    // The same stem in two folders: only its path tells them apart; one name found anywhere.
    std::fs::copy(dir.join("a/0.png"), dir.join("b/x.png")).unwrap();
    std::fs::copy(dir.join("a/0.png"), dir.join("b/only.png")).unwrap();
    std::fs::copy(dir.join("a/0.png"), dir.join("a/x.png")).unwrap();
    let out = d.path().join("run");
    let good = "file,label\na/0.png,cat\na/1,cat\nonly.png,dog\nb/0,dog\nb/1.png,dog\n";
    let cases: &[(&str, &str, &str)] = &[
        ("file\na/0.png\n", "", "it needs an image column and a label column"),
        (good, "--label-column class", "has no column 'class' (--label-column); its columns: file, label"),
        ("file,label\na/0.png,cat\na/1.png,\n", "", "line 3: image 'a/1.png' has an empty label"),
        ("file,label\na/0.png,cat\n,dog\n", "", "line 3: the image column 'file' is empty"),
        ("file,label\na/0.png,cat\nb/1.png,dog\na/0,dog\n", "", "line 4: image 'a/0' is labelled again (first on line 2)"),
        ("file,label\na/0.png,cat\nx,dog\n", "", "line 3: 'x' names more than one image"),
        ("file,label\n", "", "has no rows"),
        ("file,label\nnope.png,cat\n", "", "1 row(s) name no image under"),
        (&format!("{good}gone.png,cat\n"), "--strict", "1 row(s) name no image under"),
        ("file,label\n\"a/0.png,cat\n", "", "line"),
        ("file,label\na/0.png,cat\na/1.png,cat\n", "", "has one class ('cat')"),
    ];
    for (i, (text, flags, needle)) in cases.iter().enumerate() {
        let csv = d.path().join(format!("{i}.csv"));
        std::fs::write(&csv, text).unwrap();
        let mut args = argv("train --data {} --labels {} --out {} --device cpu", &[&dir, &csv, &out]);
        args.extend(flags.split_whitespace().map(Into::into));
        expect_user_error(&args, needle);
    }
    assert!(!out.exists(), "a rejected run must not create its run directory");
    expect_user_error(
        &argv("train --data {} --labels {} --out {} --device cpu", &[&dir, &d.path().join("no.csv"), &out]),
        "--labels file does not exist",
    );

    // A row naming no image, without --strict: one warning, and the run trains on the rest.
    let csv = d.path().join("gone.csv");
    std::fs::write(&csv, format!("{good}gone.png,cat\n")).unwrap();
    let run = ringtrain(&argv(
        "train --data {} --labels {} --out {} --model resnet10-tiny --img-size 32 --epochs 1 --batch-size 2 --val-split 0.4 --device cpu",
        &[&dir, &csv, &out],
    ));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    let warned: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(warned.len(), 2, "{err}");
    assert!(warned[0].contains("line 7, 'gone.png'") && warned[0].contains("left out"), "{err}");
    // a/x.png, b/2.png, b/x.png and a/2.png have no row.
    assert!(warned[1].contains("4 of the 9 images under") && warned[1].contains("have no row in"), "{err}");

    // A validation label the training labels do not have.
    let (train, val) = (d.path().join("train.csv"), d.path().join("val.csv"));
    std::fs::write(&train, good).unwrap();
    std::fs::write(&val, "file,label\na/2.png,cat\nb/2.png,emu\n").unwrap();
    expect_user_error(
        &argv("train --data {} --labels {} --val-labels {} --out {} --device cpu --overwrite", &[&dir, &train, &val, &out]),
        "has classes the model does not know: [\"emu\"]",
    );
}

/// A label file as spreadsheets export it in many locales, written by Python's csv module: `;`,
/// a tab or `|` between the columns, a byte-order mark, CRLF line ends, a third column whose
/// values hold the other delimiters (decimal commas; quoted where they hold the file's own), and
/// labels that are class numbers 0…11. Python's csv.Sniffer finds the delimiter each file was
/// written with and its csv module reads the rows back; ringtrain reads every form as the ImageFolder of the same images: the same
/// classes and exactly its batches, so label k is output k (sorted as text, "10" would come
/// before "2").
#[test]
fn spreadsheet_exports_and_class_numbers_read_as_the_folder() {
    let d = tempfile::tempdir().unwrap();
    let tree = d.path().join("tree");
    let all = shared_data("plant-seedlings/train");
    let mut names: Vec<String> = std::fs::read_dir(&all).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 12);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    link_first(&all, &tree, &names, 2);
    let folder = Dataset::open(&tree, "--data").unwrap();
    let flat = d.path().join("images");
    std::fs::create_dir(&flat).unwrap();
    let mut rows = Vec::new();
    for i in 0..folder.len() {
        std::os::unix::fs::symlink(folder.samples.path(i), flat.join(format!("{i}.png"))).unwrap();
        rows.push(format!("['{i}.png', {}, '{},5']", folder.samples.label(i), folder.samples.label(i)));
    }
    let forms = [(",", "utf-8"), (";", "utf-8-sig"), ("\t", "utf-8"), ("|", "utf-8-sig")];
    let found = run_python_code(&format!(
        "import csv, os\nrows = [{}]\nfor i, (delim, enc) in enumerate({forms:?}):\n    \
         path = os.path.join({:?}, f'{{i}}.csv')\n    \
         with open(path, 'w', newline='', encoding=enc) as f:\n        \
         w = csv.writer(f, delimiter=delim)\n        w.writerow(['image', 'label', 'score'])\n        w.writerows(rows)\n    \
         dialect = csv.Sniffer().sniff(open(path, encoding='utf-8-sig').read(), delimiters=',;\\t|')\n    \
         back = list(csv.reader(open(path, encoding='utf-8-sig', newline=''), dialect))\n    \
         assert back[1:] == [[str(v) for v in r] for r in rows], back\n    \
         print(repr(dialect.delimiter))\n",
        rows.join(", "),
        d.path().to_str().unwrap()
    ));
    assert_eq!(found.split_whitespace().collect::<Vec<_>>(), ["','", "';'", "'\\t'", "'|'"], "{found}");
    let want = eval_batches(&tree);
    let numbers: Vec<String> = (0..12).map(|k| k.to_string()).collect();
    for (i, (delim, encoding)) in forms.iter().enumerate() {
        let csv = d.path().join(format!("{i}.csv"));
        let text = std::fs::read(&csv).unwrap();
        assert_eq!(text.starts_with(b"\xEF\xBB\xBF"), *encoding == "utf-8-sig");
        assert!(text.ends_with(b"\r\n"));
        let set = Dataset::open(labels(&flat, &csv), "--data").unwrap_or_else(|e| panic!("{delim}: {e}"));
        assert_eq!(set.classes, numbers, "{delim}");
        assert_eq!(eval_batches(labels(&flat, &csv)), want, "{delim}");
    }
}
