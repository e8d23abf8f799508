//! `--device auto | cpu | cuda | cuda:N`: parsed once at the edge, resolved against the visible
//! GPUs where a run starts.
use anyhow::Result;
use tch::Device;

use crate::error::UserError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde_with::SerializeDisplay, serde_with::DeserializeFromStr)]
pub enum DeviceSpec {
    /// The first GPU when one is visible, else the CPU.
    Auto,
    Cpu,
    Cuda(usize),
}

impl DeviceSpec {
    /// The device on this machine; a CUDA device must be visible.
    pub fn resolve(self) -> Result<Device> {
        let visible = tch::Cuda::device_count().max(0) as usize;
        match self {
            DeviceSpec::Auto if visible > 0 => Ok(Device::Cuda(0)),
            DeviceSpec::Auto | DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(i) if i < visible => Ok(Device::Cuda(i)),
            DeviceSpec::Cuda(_) => crate::bail_user!("--device {self}: no such CUDA device ({visible} visible)"),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(0) => f.write_str("cuda"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = UserError;

    fn from_str(s: &str) -> std::result::Result<Self, UserError> {
        let invalid = || UserError(format!("invalid --device '{s}' (expected auto, cpu, cuda or cuda:N)"));
        match s {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Ok(DeviceSpec::Cuda(i)),
                _ => Err(invalid()),
            },
        }
    }
}

/// `--channels-last` as given, else on for CUDA (cuDNN's NHWC kernels) and off on the CPU.
pub fn channels_last(flag: Option<bool>, device: Device) -> bool {
    flag.unwrap_or(device.is_cuda())
}

/// The cores this process may use (2 when the system cannot say).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
}

/// Waits for the device's queued work (a no-op on the CPU): before reading a clock.
pub fn synchronize(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// `RINGTRAIN_CUDA_SYNC_DEBUG=warn`: on a CUDA `device`, while the guard lives and `active`,
/// libtorch warns on stderr ("called a synchronizing CUDA operation") of each host
/// synchronisation, as torch.cuda.set_sync_debug_mode("warn") does. Training holds it over each
/// batch's work from the second epoch on (cuDNN's autotuning in the first synchronises), `bench`
/// over its timed steps: how the GPU battery counts the synchronisations inside a step.
pub fn sync_warnings(device: Device, active: bool) -> Option<crate::shim::SyncWarnings> {
    match sync_debug_requested() && active && device.is_cuda() {
        true => crate::shim::SyncWarnings::start().ok(),
        false => None,
    }
}

/// Whether `RINGTRAIN_CUDA_SYNC_DEBUG=warn` is set (read once): libtorch's warnings must then
/// stay on (cli's start-up), as they carry the synchronisations.
pub fn sync_debug_requested() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RINGTRAIN_CUDA_SYNC_DEBUG").is_ok_and(|v| v == "warn"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_round_trip() {
        for s in ["auto", "cpu", "cuda", "cuda:3"] {
            assert_eq!(s.parse::<DeviceSpec>().unwrap().to_string(), s);
        }
        assert_eq!("gpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        for bad in ["tpu", "cuda:", "cuda:x", "CPU"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(e.0.contains(&format!("invalid --device '{bad}'")), "{e}");
        }
    }
}
