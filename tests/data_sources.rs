//! Data as it comes: every file torchvision's ImageFolder takes, listed in its order and decoded
//! as PIL decodes it (torchvision and PIL themselves are the references).
mod common;

use common::run_python_code;
use ringtrain::data::decode::decode_rgb;
use ringtrain::data::source::folder::ImageFolder;

/// A tree with every extension torchvision accepts, in several letter cases, nested folders
/// whose names sort differently as paths and as strings, a hidden file, a symlinked image, and
/// files torchvision leaves out. PIL writes the images; torchvision lists them; ringtrain must
/// list the same files in the same order with the same classes, and decode each to PIL's pixels.
#[test]
fn imagefolder_lists_and_decodes_what_torchvision_does() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("tree");
    let listing = run_python_code(&format!(
        r#"
import os, numpy as np, torchvision
from PIL import Image
root = {root:?}
rng = np.random.default_rng(0)
def img(path, mode, size=(7, 5)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    a = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    im = Image.fromarray(a).convert(mode)
    fmt = {{'.jpg': 'JPEG', '.jpeg': 'JPEG', '.png': 'PNG', '.ppm': 'PPM', '.pgm': 'PPM', '.bmp': 'BMP',
           '.tif': 'TIFF', '.tiff': 'TIFF', '.webp': 'WEBP'}}['.' + path.rsplit('.', 1)[1].lower()]
    im.save(path, fmt, **({{'lossless': True}} if fmt == 'WEBP' else {{}}))
for i, ext in enumerate(['jpg', 'JPG', 'jpeg', 'Jpeg', 'png', 'PNG', 'ppm', 'PPM', 'bmp', 'BMP',
                         'tif', 'TIF', 'tiff', 'TiFf', 'webp', 'WEBP']):
    img(f'{{root}}/cat/{{i:02d}}.{{ext}}', 'RGB')
img(f'{{root}}/cat/gray.pgm', 'L')
img(f'{{root}}/cat/gray_upper.PGM', 'L')
img(f'{{root}}/cat/rgba.tiff', 'RGBA')
img(f'{{root}}/cat/.ppm', 'RGB')
img(f'{{root}}/dog/sub/a.png', 'RGB')
img(f'{{root}}/dog/sub b/b.tif', 'RGB')
img(f'{{root}}/dog/sub/x/c.ppm', 'RGB')
img(f'{{root}}/dog/z.jpeg', 'RGB')
img(f'{{root}}/dog/Z.TIFF', 'RGB')
for skip in ['cat/notes.txt', 'cat/ppm', 'cat/a.gif.bak', 'dog/sub/readme.md']:
    open(f'{{root}}/{{skip}}', 'w').write('x')
os.symlink(f'{{root}}/cat/00.jpg', f'{{root}}/dog/linked.JPG')
ds = torchvision.datasets.ImageFolder(root)
print('\n'.join(ds.classes))
print('--')
for p, c in ds.samples:
    print(f'{{c}}\t{{os.path.relpath(p, root)}}')
"#,
        root = root.to_str().unwrap()
    ));
    let (classes, samples) = listing.split_once("--\n").unwrap();
    let want: Vec<(usize, String)> = samples
        .lines()
        .map(|l| {
            let (c, p) = l.split_once('\t').unwrap();
            (c.parse().unwrap(), p.to_string())
        })
        .collect();
    let f = ImageFolder::scan(&root, "--data").unwrap();
    assert_eq!(f.classes, classes.lines().collect::<Vec<_>>());
    let got: Vec<(usize, String)> = (0..f.len())
        .map(|i| (f.catalog.label(i), f.catalog.name(i).to_str().unwrap().to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), 26, "every extension in every case, the hidden file and the link");

    // Each decodes to PIL's convert("RGB") pixels (the JPEGs within JPEG's decoder differences).
    let pil = run_python_code(&format!(
        r#"
import sys, hashlib, numpy as np
from PIL import Image
for rel in {names:?}:
    a = np.asarray(Image.open({root:?} + '/' + rel).convert('RGB'))
    print(a.shape[1], a.shape[0], a.tobytes().hex())
"#,
        names = want.iter().map(|w| w.1.as_str()).collect::<Vec<_>>(),
        root = root.to_str().unwrap()
    ));
    for ((_, rel), line) in want.iter().zip(pil.lines()) {
        let mut parts = line.split(' ');
        let (w, h): (u32, u32) = (parts.next().unwrap().parse().unwrap(), parts.next().unwrap().parse().unwrap());
        let px = hex(parts.next().unwrap());
        let ours = decode_rgb(&root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e:#}"));
        assert_eq!(ours.dimensions(), (w, h), "{rel}");
        let worst = ours.as_raw().iter().zip(&px).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        let jpeg = [".jpg", ".jpeg"].iter().any(|x| rel.to_lowercase().ends_with(x));
        // Lossless formats: the same pixels. JPEG: libjpeg's and zune-jpeg's IDCT and upsampling
        // differ by a few levels.
        assert!(worst <= if jpeg { 24 } else { 0 }, "{rel}: differs from PIL by {worst}");
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A pack killed with SIGKILL in the middle of writing leaves its temporary beside the
/// destination; the next pack to the same destination removes it, says so in one line, and
/// leaves only the pack.
#[test]
fn a_pack_killed_mid_write_leaves_nothing_once_packed_again() {
    let d = tempfile::tempdir().unwrap();
    let data = common::shared_data("plant-seedlings/train");
    let out = d.path().join("seedlings.pack");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ringtrain"))
        .args(["pack", "--store", "raw", "--workers", "1", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let tmp = d.path().join(format!(".seedlings.pack.tmp-{}", child.id()));
    let started = std::time::Instant::now();
    while std::fs::metadata(&tmp).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(started.elapsed().as_secs() < 60, "the pack never started writing");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(tmp.is_file() && !out.exists(), "killed mid-write: a temporary and no pack");

    let again = common::ringtrain(&[
        "pack".as_ref(),
        "--store".as_ref(),
        "encoded".as_ref(),
        "--data".as_ref(),
        data.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("was killed")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("warning: removed ") && lines[0].contains(".seedlings.pack.tmp-"), "{err}");
    let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("seedlings.pack")]);
}

/// `--val` naming the images of `--data` (the same folder, or a pack of it) trains, with one
/// warning that the validation figures then measure the training set.
#[test]
fn validating_on_the_training_images_is_warned_about() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    common::make_folder(&data, &["a", "b"], 6);
    let pack = d.path().join("data.pack");
    let packed = common::ringtrain(&common::argv("pack --data {} --out {}", &[&data, &pack]));
    assert!(packed.status.success());
    for val in [&data, &pack] {
        let out = common::ringtrain(&common::argv(
            "train --data {} --val {} --out {} --model resnet10-tiny --img-size 32 --epochs 1 --batch-size 4 --device cpu --workers 1",
            &[&data, val, &d.path().join("run")],
        ));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let warned: Vec<&str> = err.lines().filter(|l| l.contains("holds the same images as --data")).collect();
        assert_eq!(warned.len(), 1, "{err}");
        std::fs::remove_dir_all(d.path().join("run")).unwrap();
    }
}
