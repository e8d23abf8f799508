//! `report.html`: one self-contained page for a run or an evaluation. Every picture is embedded
//! as a data URI; no script, no network, no other file: it can be mailed or archived alone.
//! Sections: summary, command and configuration, curves, per-class table, confusion matrix, the
//! most confused pairs with examples, the 50 highest-loss images, the 5 highest per class.
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::atomic;
use crate::data::source::Samples;
use crate::report::classification::ClassificationReport;
use crate::report::metrics_csv::EpochRow;
use crate::report::plots;
use crate::report::thumbnails::{data_uri, jpeg_data_uri, thumbnails};
use crate::report::worst::{Counts, Entry, Worst};
use crate::train::step::eval::EvalResult;

/// Side of the thumbnails, in pixels.
const THUMB: u32 = 128;

/// What the page shows besides the evaluation itself.
pub struct PageContext<'a> {
    /// Where the page goes.
    pub path: &'a Path,
    /// The command line that made it.
    pub command: String,
    /// The run's resolved configuration (TOML).
    pub config_toml: String,
    /// The run's epochs, for the curves (none: no curves section).
    pub history: &'a [EpochRow],
    /// The evaluated images, in the evaluation's sample order (None: no pictures).
    pub samples: Option<&'a Samples>,
    /// The run's first training batch as a PNG (`train::first_batch`), when it has one.
    pub first_batch: Option<Vec<u8>>,
}

/// Writes the page atomically. `confusion_png`: the heat-map as written beside it.
pub fn write(
    ctx: &PageContext,
    title: &str,
    classes: &[String],
    ev: &EvalResult,
    report: &ClassificationReport,
    confusion_png: &[u8],
) -> Result<()> {
    let worst = Worst::of(ev, &report.confusion, Counts::PAGE);
    let mut h = String::with_capacity(1 << 20);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        esc(title),
        esc(title)
    );
    h += "<nav><a href=\"#summary\">summary</a> · <a href=\"#command\">command</a>";
    if !ctx.history.is_empty() {
        h += " · <a href=\"#curves\">curves</a>";
    }
    if ctx.first_batch.is_some() {
        h += " · <a href=\"#first-batch\">first batch</a>";
    }
    h += " · <a href=\"#classes\">per class</a> · <a href=\"#confusion\">confusion matrix</a> · \
          <a href=\"#confused-pairs\">most confused</a> · <a href=\"#top-losses\">highest losses</a> · \
          <a href=\"#class-losses\">highest losses per class</a></nav>\n";
    summary(&mut h, ev, report, classes.len());
    let _ = write!(
        h,
        "<section id=\"command\"><h2>Command</h2><pre>{}</pre>\
         <details><summary>Resolved configuration</summary><pre>{}</pre></details></section>\n",
        esc(&ctx.command),
        esc(&ctx.config_toml)
    );
    if !ctx.history.is_empty() {
        let png = plots::training_curves_png(ctx.history)?;
        let _ = write!(
            h,
            "<section id=\"curves\"><h2>Training curves</h2><img class=\"wide\" alt=\"loss, accuracy and learning rate per epoch\" src=\"{}\"></section>\n",
            data_uri("image/png", &png)
        );
    }
    if let Some(png) = &ctx.first_batch {
        let _ = write!(
            h,
            "<section id=\"first-batch\"><h2>First training batch</h2><p class=\"note\">As the step received it: \
             crop, flip, augmentation policy, erasing and Mixup/CutMix, each image with its label or its classes' \
             weights in the mixed targets.</p><img class=\"wide\" alt=\"the first training batch\" src=\"{}\"></section>\n",
            data_uri("image/png", png)
        );
    }
    class_table(&mut h, classes, report);
    let how = match classes.len() > plots::NAMED_CLASSES {
        true => format!(
            "{} classes: one cell per class pair, too small for names or counts, so the axes give the class index \
             (the per-class table lists them); the colour is the square root of the row's share, so a scattered 1 % \
             error stays visible; the most confused pairs are listed beside it and below, by name. Every count is in \
             confusion.csv.",
            classes.len()
        ),
        false => "Rows are true classes, columns predictions; the colour is the share of the row (recall on the \
                  diagonal), each cell shows its count."
            .to_string(),
    };
    let _ = write!(
        h,
        "<section id=\"confusion\"><h2>Confusion matrix</h2><p class=\"note\">{}</p>\
         <img class=\"wide pixels\" alt=\"confusion matrix\" src=\"{}\"></section>\n",
        esc(&how),
        data_uri("image/png", confusion_png)
    );
    pictures(&mut h, ctx.samples, &worst, classes, report)?;
    h += "</body></html>\n";
    atomic::write_file(ctx.path, h.as_bytes())
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1600px}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ccc}\
nav{margin-bottom:1em}pre{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre-wrap}\
table{border-collapse:collapse;font-size:.9em}td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}\
td.name,th.name{text-align:left}.bar{background:linear-gradient(90deg,#9cc3e6 var(--v),transparent var(--v))}\
img.wide{max-width:100%;height:auto}img.pixels{image-rendering:pixelated}.note{color:#555;max-width:70em}\
.grid{display:flex;flex-wrap:wrap;gap:10px}figure{margin:0;width:170px;font-size:.75em;line-height:1.25}\
figure img{display:block;margin:0 auto 2px}.wrong{color:#b00}.right{color:#070}\
.path{color:#777;word-break:break-all}.kv td{text-align:left}";

fn summary(h: &mut String, ev: &EvalResult, report: &ClassificationReport, classes: usize) {
    let _ = write!(
        h,
        "<section id=\"summary\"><h2>Summary</h2><table class=\"kv\">\
         <tr><th class=\"name\">images</th><td>{}</td></tr><tr><th class=\"name\">classes</th><td>{classes}</td></tr>\
         <tr><th class=\"name\">loss</th><td>{:.4}</td></tr><tr><th class=\"name\">top-1</th><td>{:.2} %</td></tr>\
         <tr><th class=\"name\">top-5</th><td>{:.2} %</td></tr><tr><th class=\"name\">macro F1</th><td>{:.4}</td></tr>",
        ev.targets.len(),
        ev.loss,
        100.0 * ev.top1,
        100.0 * ev.top5,
        report.macro_avg.f1
    );
    if !ev.unreadable.is_empty() {
        let _ = write!(h, "<tr><th class=\"name\">unreadable (not counted)</th><td>{}</td></tr>", ev.unreadable.len());
    }
    h.push_str("</table></section>\n");
}

fn class_table(h: &mut String, classes: &[String], report: &ClassificationReport) {
    h.push_str(
        "<section id=\"classes\"><h2>Per-class results</h2><table><tr><th>#</th><th class=\"name\">class</th>\
         <th>precision</th><th>recall</th><th>F1</th><th>support</th><th class=\"name\">most often mistaken for</th></tr>\n",
    );
    for (i, r) in report.rows.iter().enumerate() {
        let row = &report.confusion[i];
        // The largest count off the diagonal (ties: the lower class index).
        let mistaken = (row.iter().enumerate())
            .filter(|&(p, &c)| p != i && c > 0)
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
            .map(|(p, c)| format!("{} ({c})", esc(&classes[p])))
            .unwrap_or_default();
        let _ = writeln!(
            h,
            "<tr><td>{i}</td><td class=\"name\">{}</td><td>{:.4}</td><td>{:.4}</td>\
             <td class=\"bar\" style=\"--v:{:.1}%\">{:.4}</td><td>{}</td><td class=\"name\">{mistaken}</td></tr>",
            esc(&r.name),
            r.precision,
            r.recall,
            100.0 * r.f1,
            r.f1,
            r.support
        );
    }
    for r in [&report.macro_avg, &report.weighted_avg] {
        let _ = writeln!(
            h,
            "<tr><td></td><th class=\"name\">{}</th><td>{:.4}</td><td>{:.4}</td><td>{:.4}</td><td>{}</td><td></td></tr>",
            r.name, r.precision, r.recall, r.f1, r.support
        );
    }
    h.push_str("</table></section>\n");
}

/// The sections with images: most confused pairs, highest losses, highest per class.
fn pictures(
    h: &mut String,
    samples: Option<&Samples>,
    worst: &Worst,
    classes: &[String],
    report: &ClassificationReport,
) -> Result<()> {
    let Some(samples) = samples.filter(|_| !worst.is_empty()) else {
        for (id, name) in [("confused-pairs", "Most confused pairs"), ("top-losses", "Highest-loss images"), ("class-losses", "Highest-loss images per class")] {
            let _ = write!(h, "<section id=\"{id}\"><h2>{name}</h2><p class=\"note\">No per-image losses were kept for this evaluation (a checkpoint from an earlier version): run ringtrain eval --report on it.</p></section>\n");
        }
        return Ok(());
    };
    // Each image decoded once, whichever sections show it.
    let mut picks: Vec<usize> = (worst.overall.iter())
        .chain(worst.per_class.iter().flatten())
        .chain(worst.pairs.iter().flat_map(|p| &p.examples))
        .map(|e| e.sample)
        .collect();
    picks.sort_unstable();
    picks.dedup();
    let uris: std::collections::HashMap<usize, String> = picks
        .iter()
        .zip(thumbnails(samples, &picks, THUMB))
        .filter_map(|(&i, t)| Some((i, jpeg_data_uri(&t?).ok()?)))
        .collect();
    let figure = |e: &Entry| {
        let img = match uris.get(&e.sample) {
            Some(uri) => format!("<img alt=\"{}\" src=\"{uri}\">", esc(&classes[e.target])),
            None => "<p class=\"wrong\">(image no longer readable)</p>".to_string(),
        };
        let verdict = if e.pred == e.target { "right" } else { "wrong" };
        format!(
            "<figure>{img}<figcaption>true <b>{}</b><br><span class=\"{verdict}\">pred <b>{}</b> {:.1} %</span><br>\
             loss {:.3}<br><span class=\"path\" title=\"{}\">{}</span></figcaption></figure>",
            esc(&classes[e.target]),
            esc(&classes[e.pred]),
            100.0 * e.confidence,
            e.loss,
            esc(&samples.path(e.sample).display().to_string()),
            esc(&samples.name(e.sample).display().to_string())
        )
    };
    h.push_str("<section id=\"confused-pairs\"><h2>Most confused pairs</h2>");
    if worst.pairs.is_empty() {
        h.push_str("<p class=\"note\">No image was misclassified.</p>");
    }
    for p in &worst.pairs {
        let support = report.rows[p.target].support.max(1);
        let _ = write!(
            h,
            "<h3>{} → {}: {} of {} ({:.1} %)</h3><div class=\"grid\">",
            esc(&classes[p.target]),
            esc(&classes[p.pred]),
            p.count,
            support,
            100.0 * p.count as f64 / support as f64
        );
        p.examples.iter().for_each(|e| h.push_str(&figure(e)));
        h.push_str("</div>");
    }
    let _ = write!(
        h,
        "</section>\n<section id=\"top-losses\"><h2>Highest-loss images</h2><p class=\"note\">The {} images with the \
         highest cross-entropy, highest first: confident mistakes come first, and a wrong label usually shows here.</p>\
         <div class=\"grid\">",
        worst.overall.len()
    );
    worst.overall.iter().for_each(|e| h.push_str(&figure(e)));
    h.push_str("</div></section>\n<section id=\"class-losses\"><h2>Highest-loss images per class</h2>");
    for (c, entries) in worst.per_class.iter().enumerate().filter(|(_, e)| !e.is_empty()) {
        let _ = write!(h, "<h3>{}</h3><div class=\"grid\">", esc(&classes[c]));
        entries.iter().for_each(|e| h.push_str(&figure(e)));
        h.push_str("</div>");
    }
    h.push_str("</section>\n");
    Ok(())
}

/// This process's command line, as a shell would take it back.
pub fn command_line() -> String {
    std::iter::once("ringtrain".to_string())
        .chain(std::env::args().skip(1).map(|a| shell_word(&a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `w` quoted for a POSIX shell where it needs it.
pub fn shell_word(w: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c);
    match !w.is_empty() && w.chars().all(plain) {
        true => w.to_string(),
        false => format!("'{}'", w.replace('\'', r"'\''")),
    }
}

/// Text made safe inside HTML elements and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
    }

    /// 120 classes: the compact heat-map with its reading, a table row per class, the most
    /// confused pair named; without per-image losses the image sections say why they are empty.
    #[test]
    fn a_page_of_many_classes() {
        let k = 120;
        let classes: Vec<String> = (0..k).map(|i| format!("class <{i}>")).collect();
        let targets: Vec<i64> = (0..k as i64).flat_map(|c| [c, c, c]).collect();
        let mut preds = targets.clone();
        preds[3 * 7 + 1] = 8; // class 7 taken once for 8, twice for 9
        preds[3 * 7 + 2] = 9;
        preds[3 * 7] = 9;
        let ev = EvalResult { targets: targets.clone(), preds: preds.clone(), ..Default::default() };
        let report = ClassificationReport::new(&classes, &targets, &preds);
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("report.html");
        let ctx = PageContext { path: &path, command: "ringtrain eval".into(), config_toml: String::new(), history: &[], samples: None, first_batch: None };
        let png = plots::confusion_heatmap_png(&classes, &report.confusion, "t").unwrap();
        write(&ctx, "a <title>", &classes, &ev, &report, &png).unwrap();
        let html = std::fs::read_to_string(&path).unwrap();
        assert!(html.contains("<title>a &lt;title&gt;</title>"));
        assert!(html.contains("120 classes: one cell per class pair"), "the compact map's reading");
        for i in 0..k {
            assert!(html.contains(&format!("<tr><td>{i}</td><td class=\"name\">class &lt;{i}&gt;</td>")), "row {i}");
        }
        assert!(html.contains("<td class=\"name\">class &lt;7&gt;</td><td>0.0000</td><td>0.0000</td>"), "class 7: never right");
        assert!(html.contains("class &lt;9&gt; (2)</td>"), "class 7 is most often mistaken for 9");
        assert!(!html.contains("<section id=\"curves\">"), "no history, no curves");
        assert_eq!(html.matches("No per-image losses were kept").count(), 3);
    }
}
