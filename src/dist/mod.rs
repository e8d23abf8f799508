//! Distribution on PyTorch's c10d: who am I (`env`), the process group (`process_group`), the
//! data-parallel gradient exchange (`ddp`), the built-in launcher (`launcher`) and the choice
//! between launching, joining and running alone (`plan`).
pub mod ddp;
pub mod env;
pub mod launcher;
pub mod network;
pub mod plan;
pub mod process_group;
pub mod reducer;
mod stderr;
pub mod watchdog;

use std::time::Duration;

use anyhow::Result;
use tch::Device;

use crate::error::user_error;

/// How long a collective or the rendezvous may take before it is an error (`--dist-timeout`):
/// 10 minutes, PyTorch's default for NCCL (its Gloo default is 30). The longest wait a healthy
/// run has between two collectives is rank 0 writing an epoch's checkpoints and report while the
/// others wait at the barrier; a hung peer is named by the watchdog within 30 s anyway, so a
/// longer timeout only keeps a broken job's nodes busy for longer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// How a worker joins its job (`plan`).
#[derive(Debug, Clone)]
pub struct DistSetup {
    pub env: env::DistEnv,
    pub timeout: Duration,
    pub bucket_mb: f64,
    /// Gradient all-reduce precision (`--grad-compress`).
    pub grad_compress: ddp::WirePrecision,
    /// Gradient all-reduce launched during backward (`--no-grad-overlap` turns it off).
    pub overlap: bool,
    /// BatchNorm over the global batch (`--sync-bn`).
    pub sync_bn: bool,
    /// `--dist-backend`.
    pub backend: process_group::Backend,
    /// How often the launcher restarted this job's workers before this start (counted in
    /// metrics.json).
    pub restarts: usize,
}

/// Joins the job as the rank `env` describes: its CUDA device made current (see
/// `worker_device`), then the rendezvous; `backend` (Auto: NCCL on CUDA, Gloo on the CPU). The
/// group's device is the one the rank trains or evaluates on.
pub fn join(
    env: &env::DistEnv,
    device: Device,
    backend: process_group::Backend,
    timeout: Duration,
) -> Result<process_group::ProcessGroup> {
    let device = worker_device(device, env)?;
    // Once per node, before the rendezvous (so a failing one shows it too): the interface its
    // ranks talk on (each node's can differ).
    if env.local_rank == 0 {
        let var = backend.for_device(device)?.interface_variable();
        let r = network::route_to_master(&env.master_addr, env.master_port, var)?;
        let addr = r.addr.map(|a| format!(" ({a})")).unwrap_or_default();
        crate::outln!("network: rank {} talks to its peers over {}{addr}, {}", env.rank, r.iface, r.why);
    }
    let pg = process_group::ProcessGroup::new(
        backend,
        &env.master_addr,
        env.master_port,
        env.rank,
        env.world_size,
        timeout,
        device,
    )?;
    Ok(pg)
}

/// The CUDA device of a worker on `device`'s kind, made the current device before its process
/// group exists (torch.cuda.set_device(local_rank) in a PyTorch script): the one `--devices`
/// gave it; else the only visible one, when a scheduler gives each task a GPU of its own (Slurm's
/// per-task CUDA_VISIBLE_DEVICES, where SLURM_LOCALID may be 1 with one device visible); else
/// its local rank. A CPU device is returned as it is.
fn worker_device(device: Device, env: &env::DistEnv) -> Result<Device> {
    if !device.is_cuda() {
        return Ok(device);
    }
    let visible = tch::Cuda::device_count().max(0) as usize;
    let given = std::env::var(launcher::DEVICE_VAR)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let index = pick_cuda_index(given, env.local_rank, visible)
        .map_err(|why| user_error(format!("rank {} (local rank {}): {why}", env.rank, env.local_rank)))?;
    crate::shim::set_cuda_device(index)?;
    Ok(Device::Cuda(index))
}

fn pick_cuda_index(given: Option<usize>, local_rank: usize, visible: usize) -> std::result::Result<usize, String> {
    let index = match given {
        Some(i) => i,
        None if visible == 1 => 0,
        None => local_rank,
    };
    if index >= visible {
        return Err(format!(
            "needs CUDA device {index}, but {visible} are visible (CUDA_VISIBLE_DEVICES={}); give each rank a device with --devices, or run fewer ranks per node",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        ));
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_finds_its_cuda_device() {
        // 4 GPUs, one rank each.
        assert_eq!(pick_cuda_index(None, 3, 4), Ok(3));
        // --devices 2,3: local rank 0 gets device 2.
        assert_eq!(pick_cuda_index(Some(2), 0, 4), Ok(2));
        // Slurm, one GPU per task: local rank 1 sees its own GPU as device 0.
        assert_eq!(pick_cuda_index(None, 1, 1), Ok(0));
        // More ranks than GPUs.
        let e = pick_cuda_index(None, 2, 2).unwrap_err();
        assert!(e.contains("needs CUDA device 2, but 2 are visible"), "{e}");
        assert!(pick_cuda_index(Some(5), 0, 4).is_err());
    }
}
