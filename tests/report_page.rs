//! The run report page (report.html) as a reader meets it: opened from disk by a real browser
//! (headless Chromium), and its highest-loss images checked against a label flipped on purpose
//! and against the losses `eval` computes. Also the TensorBoard images, read by TensorBoard's
//! own reader.
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Class names in Chinese, as the users' own guides write them: the page and the pictures must
/// show them. Red, green and blue images: learnt in a few steps, so the model is sure of them.
const CLASSES: [&str; 3] = ["红色", "绿色", "蓝色"];

/// `root/<class>/<i>.png`: 24 px images of class `c`'s colour with pixel noise, `per_class` of
/// them from `first` on.
fn colours(root: &Path, per_class: usize, first: u64) {
    let base = [[200u8, 40, 40], [40, 170, 50], [40, 60, 200]];
    for (c, name) in CLASSES.iter().enumerate() {
        std::fs::create_dir_all(root.join(name)).unwrap();
        for i in 0..per_class as u64 {
            let mut x = (first + i) * 7919 + c as u64 * 104_729 + 1;
            let img = image::RgbImage::from_fn(24, 24, |_, _| {
                image::Rgb(base[c].map(|v| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    (v as i64 + (x >> 58) as i64 * 5 - 40).clamp(0, 255) as u8
                }))
            });
            img.save(root.join(name).join(format!("{i}.png"))).unwrap();
        }
    }
}

/// predictions.csv: path → (true class, predicted class, its probability, loss as written).
fn predictions(path: &Path) -> HashMap<String, (String, String, f64, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("path,label,predicted,probability,loss"));
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 5, "{l}");
            (f[0].to_string(), (f[1].to_string(), f[2].to_string(), f[3].parse().unwrap(), f[4].to_string()))
        })
        .collect()
}

/// The figures of one section of the page, in order: (path, true class, loss as shown).
fn figures(html: &str, section: &str) -> Vec<(String, String, String)> {
    let start = html.find(&format!("<section id=\"{section}\">")).unwrap_or_else(|| panic!("no section {section}"));
    let body = &html[start..start + html[start..].find("</section>").unwrap()];
    body.split("<figure>")
        .skip(1)
        .map(|f| {
            let between = |a: &str, b: &str| {
                let i = f.find(a).unwrap_or_else(|| panic!("no {a} in {f}")) + a.len();
                f[i..i + f[i..].find(b).unwrap()].to_string()
            };
            (between("<span class=\"path\" title=\"", "\""), between("true <b>", "</b>"), between("loss ", "<br>"))
        })
        .collect()
}

/// Opens `page` in headless Chromium with a check appended that counts the images that did not
/// load; returns (the console lines, the check's line). Also saves a screenshot.
fn open_in_chromium(page: &Path, work: &Path) -> (Vec<String>, String) {
    let html = std::fs::read_to_string(page).unwrap();
    assert!(!html.contains("<script"), "the page needs no script");
    let checked = work.join("checked.html");
    let check = "<script>window.addEventListener('load', () => { const imgs = [...document.images]; \
        const broken = imgs.filter(i => !i.complete || i.naturalWidth === 0).length; \
        console.log('ringtrain-check images ' + imgs.length + ' broken ' + broken + ' sections ' + \
        [...document.querySelectorAll('section')].map(s => s.id).join(',')); });</script>";
    std::fs::write(&checked, html.replace("</body>", &format!("{check}</body>"))).unwrap();
    let shot = work.join("report.png");
    let o = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1400,2400")
        .arg(format!("file://{}", checked.display()))
        .output()
        .expect("chromium (installed by the set-up) runs");
    assert!(o.status.success(), "{}", common::text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let console: Vec<String> = stderr.lines().filter(|l| l.contains(":CONSOLE")).map(String::from).collect();
    let line = console.iter().find(|l| l.contains("ringtrain-check")).cloned().unwrap_or_else(|| panic!("no check line: {stderr}"));
    let img = image::open(&shot).unwrap().into_rgb8();
    assert_eq!(img.dimensions(), (1400, 2400));
    let dark = img.pixels().filter(|p| p.0.iter().all(|&c| c < 100)).count();
    assert!(dark > 5000, "the screenshot is almost blank ({dark} dark pixels)");
    (console, line)
}

#[test]
fn the_page_opens_in_a_browser_and_its_worst_images_show_a_flipped_label_with_evals_losses() {
    let d = tempfile::tempdir().unwrap();
    let (train, val, run) = (d.path().join("train"), d.path().join("val"), d.path().join("run"));
    colours(&train, 40, 0);
    colours(&val, 15, 1000);
    // A green image filed under red: its label is wrong on purpose.
    let flipped: PathBuf = val.join(CLASSES[0]).join("flipped.png");
    std::fs::rename(val.join(CLASSES[1]).join("3.png"), &flipped).unwrap();
    let args = common::train_val_args(
        &train,
        &val,
        &run,
        "--model resnet10-tiny --img-size 24 --epochs 4 --batch-size 16 --device cpu --seed 1",
    );
    let o = common::ringtrain(&args);
    assert!(o.status.success(), "{}", common::text(&o));
    assert!(!common::text(&o).contains("no font"), "a font with the Chinese names is installed: {}", common::text(&o));

    // The run's page: the flipped image has the highest loss of all 45.
    let ours = predictions(&run.join("predictions.csv"));
    assert_eq!(ours.len(), 45);
    let key = flipped.display().to_string();
    let (t, p, conf, loss) = &ours[&key];
    assert_eq!((t.as_str(), p.as_str()), (CLASSES[0], CLASSES[1]), "the model sees green");
    assert!(*conf > 0.5, "{conf}");
    let max = ours.values().map(|v| v.3.parse::<f64>().unwrap()).fold(0.0, f64::max);
    assert_eq!(loss.parse::<f64>().unwrap(), max, "the flipped label has the highest loss");
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    let top = figures(&html, "top-losses");
    assert_eq!(top.len(), 45, "all 45 images, fewer than 50");
    assert_eq!(top[0].0, key, "first of the highest losses");
    let losses: Vec<f64> = top.iter().map(|f| f.2.parse().unwrap()).collect();
    assert!(losses.windows(2).all(|w| w[0] >= w[1]), "highest first: {losses:?}");
    let per_class = figures(&html, "class-losses");
    assert_eq!(per_class.len(), 15, "5 per class");
    assert!(per_class.iter().any(|f| f.0 == key && f.1 == CLASSES[0]));
    let pairs = figures(&html, "confused-pairs");
    assert_eq!(pairs[0].0, key, "the flipped image is an example of the most confused pair");
    for name in CLASSES {
        assert!(html.contains(&format!("<td class=\"name\">{name}</td>")), "{name} in the per-class table");
    }
    assert!(html.contains("--model resnet10-tiny"), "the command");
    assert!(html.contains("model = &quot;resnet10-tiny&quot;"), "the resolved configuration");

    // eval --report: the same page for the best checkpoint; the losses it shows are eval's own.
    let (eval_out, page_dir) = (d.path().join("eval"), d.path().join("page"));
    let o = common::ringtrain(&common::argv(
        "eval --checkpoint {} --data {} --out {} --report {} --device cpu --batch-size 7",
        &[&run.join("best"), &val, &eval_out, &page_dir],
    ));
    assert!(o.status.success(), "{}", common::text(&o));
    assert!(!eval_out.join("report.html").exists(), "the page goes to --report");
    let theirs = predictions(&eval_out.join("predictions.csv"));
    let eval_html = std::fs::read_to_string(page_dir.join("report.html")).unwrap();
    let shown = figures(&eval_html, "top-losses");
    assert_eq!(shown[0].0, key);
    for (path, class, loss) in &shown {
        let row = &theirs[path];
        assert_eq!(class, &row.0);
        assert_eq!(loss, &format!("{:.3}", row.3.parse::<f32>().unwrap()), "{path}: the page shows eval's loss");
    }
    // eval's per-image losses average to its loss; the run's (batches of 16) agree with them.
    let metrics: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(eval_out.join("metrics.json")).unwrap()).unwrap();
    let mean = theirs.values().map(|v| v.3.parse::<f64>().unwrap()).sum::<f64>() / theirs.len() as f64;
    let loss = metrics["loss"].as_f64().unwrap();
    assert!((mean - loss).abs() <= 1e-5 * loss.abs().max(1e-3), "mean {mean} vs metrics.json {loss}");
    for (path, row) in &theirs {
        let (a, b) = (row.3.parse::<f64>().unwrap(), ours[path].3.parse::<f64>().unwrap());
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1e-2), "{path}: eval {a}, the run {b}");
        assert_eq!(row.1, ours[path].1, "{path}: the same prediction");
    }

    // The same images from a raw pack (decoded pixels, not files): the page shows them too.
    let pack = d.path().join("val.pack");
    let o = common::ringtrain(&common::argv("pack --store raw --data {} --out {}", &[&val, &pack]));
    assert!(o.status.success(), "{}", common::text(&o));
    let packed_page = d.path().join("packed");
    let o = common::ringtrain(&common::argv(
        "eval --checkpoint {} --data {} --report {} --out {} --device cpu",
        &[&run.join("best"), &pack, &packed_page, &d.path().join("eval-packed")],
    ));
    assert!(o.status.success(), "{}", common::text(&o));
    let packed = std::fs::read_to_string(packed_page.join("report.html")).unwrap();
    let first = &figures(&packed, "top-losses")[0];
    assert_eq!(first.0, pack.join(CLASSES[0]).join("flipped.png").display().to_string());
    assert_eq!(packed.matches("<img alt=").count(), top.len() + per_class.len() + pairs.len(), "every thumbnail, from the pack");

    // A real browser: no console message but the check's, every image loaded, every section.
    let (console, line) = open_in_chromium(&run.join("report.html"), d.path());
    assert_eq!(console.len(), 1, "console messages: {console:#?}");
    // curves, first batch, confusion matrix, figures
    let images = 3 + top.len() + per_class.len() + pairs.len();
    assert!(
        line.contains(&format!("images {images} broken 0 sections summary,command,curves,first-batch,classes,confusion,confused-pairs,top-losses,class-losses")),
        "{line}"
    );

    // TensorBoard's reader: per epoch, the confusion matrix and the highest-loss grid.
    let code = format!(
        "import io, json\nfrom PIL import Image\nfrom tensorboard.backend.event_processing import event_accumulator as ea\n\
         acc = ea.EventAccumulator({:?}, size_guidance={{ea.IMAGES: 0}})\nacc.Reload()\n\
         out = {{t: [[e.step, e.width, e.height, list(Image.open(io.BytesIO(e.encoded_image_string)).size)] for e in acc.Images(t)] for t in acc.Tags()['images']}}\n\
         print(json.dumps(out))",
        run.display().to_string()
    );
    let tb: serde_json::Value = serde_json::from_str(&common::run_python_code(&code)).unwrap();
    for tag in ["val/confusion_matrix", "val/highest_loss_images"] {
        let events = tb[tag].as_array().unwrap_or_else(|| panic!("no {tag} in {tb}"));
        assert_eq!(events.iter().map(|e| e[0].as_i64().unwrap()).collect::<Vec<_>>(), [1, 2, 3, 4], "{tag}");
        for e in events {
            assert_eq!(e[3], serde_json::json!([e[1], e[2]]), "{tag}: the PNG's size is the one recorded");
        }
    }
    // 16 images in 4 columns of 160 px, each a 128 px picture over two caption lines.
    assert_eq!(tb["val/highest_loss_images"][0][1], 4 * 160);
    assert_eq!(tb["val/highest_loss_images"][0][2], 4 * (128 + 34));
}
