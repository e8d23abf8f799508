//! `ringtrain compare`: training runs side by side, read from their run directories (config.toml
//! and metrics.csv, finished or still running): each run's best validation top-1, and the
//! configuration keys whose values differ between them.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Result;

use crate::bail_user;
use crate::report::duration;
use crate::report::metrics_csv::{self, EpochRow};

/// Keys of config.toml left out of the comparison: they say nothing about how a run trained.
/// `out` is the run directory itself, `overwrite` only whether an earlier run was there
/// (`resume`, the other such flag, is never saved).
pub const IGNORED_KEYS: [&str; 2] = ["out", "overwrite"];

/// One run directory as read back.
pub struct Run {
    /// The directory as the command line gave it.
    pub name: String,
    /// config.toml with nested tables flattened to dotted keys.
    pub config: BTreeMap<String, toml::Value>,
    /// metrics.csv's rows: none before the first epoch ends.
    pub rows: Vec<EpochRow>,
}

impl Run {
    /// Reads `dir`; a directory that is not a run's, or a malformed file, is a user error that
    /// names the path.
    pub fn read(dir: &Path) -> Result<Run> {
        if !dir.is_dir() {
            let why = if dir.exists() { "not a directory" } else { "no such directory" };
            bail_user!("{} is not a run directory ({why})", dir.display());
        }
        let config_path = dir.join("config.toml");
        if !config_path.is_file() {
            bail_user!(
                "{} is not a run directory (no config.toml; ringtrain train --out writes one)",
                dir.display()
            );
        }
        let text = match std::fs::read_to_string(&config_path) {
            Ok(t) => t,
            Err(e) => bail_user!("cannot read {}: {e}", config_path.display()),
        };
        let table = match text.parse::<toml::Table>() {
            Ok(t) => t,
            Err(e) => bail_user!("{} is malformed: {}", config_path.display(), one_line(e.message())),
        };
        if !table.contains_key("model") {
            bail_user!("{} is not a run's configuration (no model key)", config_path.display());
        }
        let mut config = BTreeMap::new();
        flatten("", &table, &mut config);
        // A run whose first epoch has not ended yet has no metrics.csv: shown without figures.
        let csv = dir.join("metrics.csv");
        let rows = match csv.exists() {
            true => metrics_csv::read(&csv)?,
            false => Vec::new(),
        };
        Ok(Run {
            name: dir.display().to_string(),
            config,
            rows,
        })
    }

    pub fn model(&self) -> String {
        self.config.get("model").map(shown).unwrap_or_else(|| "?".into())
    }

    /// The epoch of the highest validation top-1 (the earliest of equals); none before the
    /// first validation.
    pub fn best(&self) -> Option<&EpochRow> {
        self.rows
            .iter()
            .filter(|r| r.val_top1.is_finite())
            .fold(None, |best: Option<&EpochRow>, r| match best {
                Some(b) if b.val_top1 >= r.val_top1 => Some(b),
                _ => Some(r),
            })
    }

    /// Training time: the sum of the epochs' seconds.
    pub fn seconds(&self) -> f64 {
        self.rows.iter().map(|r| r.seconds).filter(|s| s.is_finite()).sum()
    }

    /// Training throughput: the mean of the epochs' images/s.
    pub fn images_per_s(&self) -> Option<f64> {
        let v: Vec<f64> = self.rows.iter().map(|r| r.images_per_s).filter(|x| x.is_finite()).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// `table`'s `a.b = v` as `"a.b" → v`.
fn flatten(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, toml::Value>) {
    for (k, v) in table {
        let key = format!("{prefix}{k}");
        match v {
            toml::Value::Table(t) => flatten(&format!("{key}."), t, out),
            v => {
                out.insert(key, v.clone());
            }
        }
    }
}

/// A configuration value as a person reads it: strings without quotes.
fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The summary table: one line per run, after a line saying what "best" means.
pub fn table(runs: &[Run]) -> String {
    let mut lines = vec![[
        "run", "model", "best val top-1", "epoch", "macro-F1", "epochs", "time", "images/s",
    ]
    .map(String::from)
    .to_vec()];
    for r in runs {
        let best = r.best();
        let planned = r.config.get("epochs").and_then(toml::Value::as_integer);
        lines.push(vec![
            r.name.clone(),
            r.model(),
            best.map_or("-".into(), |b| format!("{:.2}%", 100.0 * b.val_top1)),
            best.map_or("-".into(), |b| b.epoch.to_string()),
            best.map_or("-".into(), |b| format!("{:.4}", b.val_macro_f1)),
            match planned {
                Some(p) => format!("{}/{p}", r.rows.len()),
                None => r.rows.len().to_string(),
            },
            match r.rows.is_empty() {
                true => "-".into(),
                false => duration(r.seconds()),
            },
            r.images_per_s().map_or("-".into(), |x| format!("{x:.1}")),
        ]);
    }
    let numeric = [false, false, true, true, true, true, true, true];
    format!(
        "best = the epoch of the highest validation top-1; epochs: run/planned; time: the epochs' seconds summed; images/s: their mean\n{}",
        aligned(&lines, &numeric)
    )
}

/// Each configuration key whose value is not the same in every run, with each run's value
/// (`None` where a run's config.toml lacks the key), in key order; `IGNORED_KEYS` left out.
pub fn differing_keys(runs: &[Run]) -> Vec<(String, Vec<Option<&toml::Value>>)> {
    let keys: BTreeSet<&String> = runs.iter().flat_map(|r| r.config.keys()).collect();
    keys.into_iter()
        .filter(|k| !IGNORED_KEYS.contains(&k.as_str()))
        .map(|k| (k.clone(), runs.iter().map(|r| r.config.get(k)).collect::<Vec<_>>()))
        .filter(|(_, values)| values.iter().any(|v| *v != values[0]))
        .collect()
}

/// "configuration keys that differ:" and a table of them, one line per key, a column per run.
pub fn differences(runs: &[Run]) -> String {
    let left_out = IGNORED_KEYS.join(" and ");
    if runs.len() < 2 {
        return "configuration keys that differ: none (one run)".into();
    }
    let keys = differing_keys(runs);
    if keys.is_empty() {
        return format!("configuration keys that differ: none ({left_out} left out)");
    }
    let mut lines = vec![std::iter::once("key".to_string()).chain(runs.iter().map(|r| r.name.clone())).collect()];
    for (k, values) in &keys {
        let shown = values.iter().map(|v| v.map_or("(unset)".into(), shown));
        lines.push(std::iter::once(k.clone()).chain(shown).collect());
    }
    format!(
        "configuration keys that differ ({left_out} left out):\n{}",
        aligned(&lines, &vec![false; runs.len() + 1])
    )
}

/// Cells in columns two spaces apart, each as wide as its widest cell; `right[i]` aligns column
/// `i` to the right (numbers).
fn aligned(lines: &[Vec<String>], right: &[bool]) -> String {
    let width = |i: usize| lines.iter().map(|l| l[i].chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..right.len()).map(width).collect();
    lines
        .iter()
        .map(|l| {
            let cells = l.iter().zip(&widths).zip(right).map(|((c, &w), &r)| match r {
                true => format!("{c:>w$}"),
                false => format!("{c:<w$}"),
            });
            cells.collect::<Vec<_>>().join("  ").trim_end().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_tables_flatten_to_dotted_keys_and_unset_keys_differ() {
        let run = |text: &str| {
            let mut config = BTreeMap::new();
            flatten("", &text.parse::<toml::Table>().unwrap(), &mut config);
            Run {
                name: "r".into(),
                config,
                rows: Vec::new(),
            }
        };
        let a = run("out = 'a'\nlr = 0.1\n[sched]\nkind = 'cosine'\nt = 3");
        let b = run("out = 'b'\nlr = 0.1\nema = 0.99\n[sched]\nkind = 'step'\nt = 3");
        let keys: Vec<String> = differing_keys(&[a, b]).into_iter().map(|k| k.0).collect();
        assert_eq!(keys, ["ema", "sched.kind"]);
    }
}
