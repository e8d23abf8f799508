//! `bench --profile DIR`: after the timed steps, a few more steps under libtorch's Kineto
//! profiler, each in a `ProfilerStep#N` scope as torch.profiler marks its steps; the trace is
//! written to DIR/trace.json (Chrome trace), and the steps' time measured by a clock around them
//! (the device synchronised before and after) for the table to be checked against.
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Deserialize;
use tch::Device;

use crate::shim;

#[derive(Debug, Clone)]
pub struct ProfileOptions {
    pub dir: PathBuf,
    pub steps: usize,
}

/// A profiled run of steps: its trace, and the milliseconds per step the clock measured.
#[derive(Debug, Clone, Deserialize)]
pub struct ProfiledSteps {
    pub trace: PathBuf,
    pub measured_ms: f64,
}

/// `o.steps` calls of `step` on `device`, profiled.
pub fn run(mut step: impl FnMut() -> Result<()>, device: Device, o: &ProfileOptions) -> Result<ProfiledSteps> {
    std::fs::create_dir_all(&o.dir).with_context(|| format!("creating --profile {}", o.dir.display()))?;
    let trace = o.dir.join("trace.json");
    let measured_ms = crate::atomic::write_file_by_path(&trace, |tmp| {
        crate::device::synchronize(device);
        shim::profiler_start(device.is_cuda())?;
        let t0 = Instant::now();
        for i in 0..o.steps {
            let _scope = shim::RecordScope::begin(&format!("ProfilerStep#{}", i + 1))?;
            step()?;
        }
        crate::device::synchronize(device);
        let ms = t0.elapsed().as_secs_f64() * 1000.0 / o.steps as f64;
        shim::profiler_stop(tmp)?;
        Ok(ms)
    })?;
    Ok(ProfiledSteps { trace, measured_ms })
}

/// DIR/profile.txt (the printed tables) and DIR/profile.csv (`write_csv`), written atomically.
pub fn write_tables(dir: &Path, text: &str, csv_rows: &[[String; 4]]) -> Result<()> {
    crate::atomic::write_file(&dir.join("profile.txt"), text.as_bytes())?;
    write_csv(&dir.join("profile.csv"), csv_rows)
}

/// The profiles' figures as CSV (`source,kind,name,ms_per_step`; trace_table::csv_rows), written
/// atomically.
pub fn write_csv(path: &Path, rows: &[[String; 4]]) -> Result<()> {
    crate::atomic::write_file_with(path, |f| {
        let mut w = csv::Writer::from_writer(f);
        w.write_record(["source", "kind", "name", "ms_per_step"])?;
        for r in rows {
            w.write_record(r)?;
        }
        w.flush()?;
        Ok(())
    })
}
