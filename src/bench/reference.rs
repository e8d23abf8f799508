//! What `bench` and `bench-data` need around the measurement itself: their settings checked, the
//! PyTorch reference (script and Python) found for `--vs-pytorch`, and rates printed so that the
//! printed figures give the printed ratio.
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::bail_user;

/// `bench`'s settings: at least one image and one timed step.
pub fn check_step_settings(batch_size: usize, steps: usize) -> Result<()> {
    if batch_size == 0 || steps == 0 {
        bail_user!("--batch-size and --steps must be at least 1");
    }
    Ok(())
}

/// The timed steps in whole windows of at most 10 steps: (steps, window), steps >= 1.
pub fn timed_windows(steps: usize) -> (usize, usize) {
    let window = steps.clamp(1, 10);
    (steps - steps % window, window)
}

/// `bench-data`'s settings (`workers` as given; None is the available cores).
pub fn check_data_settings(batch_size: usize, epochs: usize, img_size: u32, workers: Option<usize>) -> Result<()> {
    if batch_size == 0 || epochs == 0 || img_size == 0 || workers == Some(0) {
        bail_user!("--batch-size, --epochs, --img-size and --workers must be at least 1");
    }
    Ok(())
}

/// A PyTorch reference script of bench/: in the working directory's bench/ (a copy of the
/// repository on another machine), else beside the binary's folder (a bundle: bin/ringtrain and
/// bench/, see scripts/bundle.sh), else in the source tree the binary was built from.
pub fn script(name: &str) -> Result<PathBuf> {
    let beside_binary = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("bench")));
    let candidates = [
        Some(Path::new("bench").join(name)),
        beside_binary.map(|b| b.join(name)),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench").join(name)),
    ];
    match candidates.iter().flatten().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => bail_user!("--vs-pytorch: cannot find bench/{name}; run from the repository's root"),
    }
}

/// The Python that runs the reference: `--python`, else $RINGTRAIN_PYTHON, else python3.
pub fn python(flag: Option<&str>) -> String {
    flag.map(str::to_string)
        .or_else(|| std::env::var("RINGTRAIN_PYTHON").ok())
        .unwrap_or_else(|| "python3".into())
}

/// Four significant figures or more, so printed figures give the printed ratio.
pub fn rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_steps_fill_whole_windows() {
        assert_eq!(timed_windows(50), (50, 10));
        assert_eq!(timed_windows(25), (20, 10));
        assert_eq!(timed_windows(7), (7, 7));
        assert!(check_step_settings(64, 0).is_err());
        assert_eq!(
            (rate(1234.56), rate(12.345678)),
            ("1234.6".to_string(), "12.3457".to_string())
        );
    }
}
