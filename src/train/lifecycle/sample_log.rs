//! `--log-samples`: the samples each optimizer step trained on, per rank, in
//! `<out>/samples/rank<R>-of-<W>.csv` (`epoch,step,sample`, the sample by its name under the
//! data's root): which images a run saw, across stops and resumptions on any number of ranks.
//! A resumed run first drops the rows at or after the step it resumes from (the steps a killed
//! run took past its last checkpoint, taken again now), so every step trained is listed once.
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub struct SampleLog {
    file: BufWriter<File>,
    path: PathBuf,
    /// The names of the micro-batches of the step being taken.
    pending: Vec<String>,
}

impl SampleLog {
    /// This rank's log in `run`, the run resuming at `(epoch, step)` (0-based; steps done in
    /// that epoch). The main rank first drops every rank's rows from there on; the others start
    /// writing only after the first step's all-reduce, which the main rank joins after that.
    pub fn open(run: &Path, rank: usize, world: usize, resume_at: (usize, usize), is_main: bool) -> Result<SampleLog> {
        let dir = run.join("samples");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if is_main {
            drop_rows_from(&dir, resume_at)?;
        }
        let path = dir.join(format!("rank{rank}-of-{world}.csv"));
        let new = !path.exists();
        let file = OpenOptions::new().create(true).append(true).open(&path);
        let file = file.with_context(|| format!("opening {}", path.display()))?;
        let mut file = BufWriter::new(file);
        if new {
            writeln!(file, "epoch,step,sample")?;
        }
        Ok(SampleLog {
            file,
            path,
            pending: Vec::new(),
        })
    }

    /// A micro-batch's samples, by name.
    pub fn add<'a>(&mut self, names: impl Iterator<Item = &'a Path>) {
        self.pending.extend(names.map(|n| csv_field(&n.to_string_lossy())));
    }

    /// The step's samples, written out: step `step` (0-based) of `epoch` (0-based) is taken.
    pub fn step_done(&mut self, epoch: usize, step: usize) -> Result<()> {
        for name in self.pending.drain(..) {
            writeln!(self.file, "{epoch},{step},{name}")?;
        }
        self.file.flush().with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Rewrites each log in `dir` without its rows at or after `(epoch, step)`.
fn drop_rows_from(dir: &Path, (epoch, step): (usize, usize)) -> Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "csv") {
            continue;
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let kept: Vec<&str> = text
            .lines()
            .enumerate()
            .filter(|(i, line)| {
                let mut f = line.splitn(3, ',').map(|x| x.parse::<usize>());
                *i == 0 || matches!((f.next(), f.next()), (Some(Ok(e)), Some(Ok(s))) if (e, s) < (epoch, step))
            })
            .map(|(_, l)| l)
            .collect();
        if kept.len() < text.lines().count() {
            crate::atomic::write_file(&path, (kept.join("\n") + "\n").as_bytes())?;
        }
    }
    Ok(())
}

/// A name as one CSV field: quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    match s.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", s.replace('"', "\"\"")),
        false => s.to_owned(),
    }
}
