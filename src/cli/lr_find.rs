//! `ringtrain lr-find`: train's configuration, checked for one process and a fresh --out, the
//! range test (`train::lr_find`), its two files, and the suggestion as a train command built
//! from the user's own arguments.
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::args::LrFindArgs;
use crate::dist::plan::{self, DistOptions};
use crate::error::user_error;
use crate::report::page::shell_word;
use crate::train::lr_find::{self, Stop, DIVERGED};
use crate::train::step::schedule::ExpRamp;
use crate::{bail_user, say};

/// Where lr_find.csv and lr_find.png go without --out.
pub const DEFAULT_OUT: &str = "lr-find";

/// lr-find's own flags (each takes a value): left out of the suggested train command.
const OWN_FLAGS: [&str; 5] = ["--out", "--start-lr", "--end-lr", "--steps", "--lr"];

pub fn run(args: &LrFindArgs) -> Result<()> {
    let ramp = ramp(args)?;
    if args.train.resume.is_some() {
        bail_user!("lr-find starts from fresh weights (or --pretrained): --resume does not apply");
    }
    let out = args.train.out.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    refuse_run_dir(&out)?;
    let mut cfg = super::train_config(&args.train)?;
    cfg.out = out.clone(); // not the config file's run directory: preflight looks there
    one_process(args, &cfg)?;
    let result = lr_find::run(&cfg, ramp)?;

    std::fs::create_dir_all(&out)
        .map_err(|e| user_error(format!("cannot create --out {}: {e}", out.display())))?;
    crate::atomic::write_file(&out.join("lr_find.csv"), lr_find::csv(&result.points).as_bytes())?;
    crate::report::lr_find_plot::lr_find_plot(&out.join("lr_find.png"), &result.points, result.suggestion)?;

    let last = result.points.last().expect("at least one step ran");
    say!(
        "{} steps on {} images ({} classes): {}",
        result.points.len(),
        result.train_images,
        result.classes,
        match result.stop {
            Stop::End => format!("reached --end-lr {:e}", ramp.end),
            Stop::Diverged => format!(
                "stopped at lr {:.2e}, where the smoothed loss exceeded {DIVERGED} times its minimum",
                last.lr
            ),
            Stop::NonFinite => format!("stopped at lr {:.2e}, where the loss became infinite or NaN", last.lr),
        }
    );
    say!("lr_find.csv and lr_find.png in {}", out.display());
    match result.suggestion {
        Some(i) => {
            let lr = format!("{:.1e}", result.points[i].lr);
            say!("suggested --lr {lr} (steepest fall of the smoothed loss); train with:");
            say!("{}", train_command(&std::env::args().collect::<Vec<_>>(), &lr));
        }
        None => say!(
            "no suggestion: the smoothed loss did not fall between the first tenth of the steps and the last {}; try a lower --start-lr or more --steps",
            lr_find::SKIP_END
        ),
    }
    Ok(())
}

fn ramp(args: &LrFindArgs) -> Result<ExpRamp> {
    let (start, end) = (args.start_lr, args.end_lr);
    if !(start > 0.0 && start.is_finite()) {
        bail_user!("--start-lr must be a positive number, got {start}");
    }
    if !(end > start && end.is_finite()) {
        bail_user!("--end-lr ({end}) must be larger than --start-lr ({start})");
    }
    if args.steps < 10 {
        bail_user!("--steps must be at least 10 (the suggestion leaves out the first tenth and the last 5), got {}", args.steps);
    }
    Ok(ExpRamp {
        start,
        end,
        steps: args.steps,
    })
}

/// A training run's directory is never written into (nor anything else of it read as ours).
fn refuse_run_dir(out: &Path) -> Result<()> {
    let run_files = ["config.toml", "metrics.csv", "last", "best"];
    if let Some(f) = run_files.iter().find(|f| out.join(f).exists()) {
        bail_user!(
            "--out {} is a training run's directory (it holds {f}); lr-find writes lr_find.csv and lr_find.png only into a folder of its own: choose another --out",
            out.display()
        );
    }
    if out.exists() && !out.is_dir() {
        bail_user!("--out {} exists and is not a directory", out.display());
    }
    Ok(())
}

/// The test runs in this process alone: several ranks would each need the others' losses, and
/// the suggestion is for the global batch, which one process takes whole.
fn one_process(args: &LrFindArgs, cfg: &crate::config::TrainConfig) -> Result<()> {
    match plan::is_one_process(&DistOptions::from(&args.train.dist), cfg.device, cfg.sync_bn)? {
        true => Ok(()),
        false => Err(user_error(
            "lr-find runs in one process, at the global --batch-size: leave out --nproc-per-node, --nnodes and --max-restarts, and start it without a launcher (torchrun, srun, mpirun)",
        )),
    }
}

/// The user's command line as `ringtrain train ...`: lr-find's own flags left out, `--lr`
/// set to `lr`, each word quoted for a POSIX shell where it needs it.
fn train_command(argv: &[String], lr: &str) -> String {
    let mut words = vec!["ringtrain".to_string()];
    let mut rest = argv.iter().skip(1);
    let mut replaced = false;
    while let Some(w) = rest.next() {
        if !replaced && w == "lr-find" {
            words.push("train".into());
            replaced = true;
        } else if OWN_FLAGS.contains(&w.as_str()) {
            rest.next(); // its value
        } else if !OWN_FLAGS.iter().any(|f| w.starts_with(&format!("{f}="))) {
            words.push(w.clone());
        }
    }
    words.extend(["--lr".into(), lr.into()]);
    words.iter().map(|w| shell_word(w)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_train_command_is_the_users_without_lr_finds_flags() {
        let argv: Vec<String> = [
            "/x/ringtrain", "-q", "lr-find", "--data", "my data", "--out=o", "--steps", "50", "--lr", "0.1",
            "--model", "resnet18", "--end-lr=1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            train_command(&argv, "3.2e-3"),
            "ringtrain -q train --data 'my data' --model resnet18 --lr 3.2e-3"
        );
    }
}
