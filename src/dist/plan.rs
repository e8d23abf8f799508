//! How a `train` process takes part in its job: it starts this node's workers (the built-in
//! launcher), it is one rank of a job whose environment names it (our launcher, torchrun, srun,
//! mpirun), or it trains alone. Every launch option is checked here, before any worker starts.
use std::time::Duration;

use anyhow::Result;

use super::ddp::WirePrecision;
use super::env as dist_env;
use super::launcher::{self, LaunchSpec};
use super::process_group::Backend;
use super::DistSetup;
use crate::device::DeviceSpec;
use crate::error::user_error;

/// How many processes, and how they meet. Not part of the saved config: a run's result does not
/// depend on how it was launched, only on the global batch.
#[derive(Debug, Clone)]
pub struct DistOptions {
    /// Workers on this node; None: the visible GPUs when training on CUDA, else 1.
    pub nproc_per_node: Option<usize>,
    pub nnodes: usize,
    pub node_rank: usize,
    /// Address of the node of rank 0; None: 127.0.0.1 on one node (required across nodes).
    pub master_addr: Option<String>,
    /// Rendezvous port; None: a free port on one node, 29500 across nodes.
    pub master_port: Option<u16>,
    /// CUDA devices of the local ranks (indices among the visible ones).
    pub devices: Option<Vec<usize>>,
    /// For a collective or the rendezvous (at least a second).
    pub timeout: Duration,
    pub bucket_mb: f64,
    pub grad_compress: WirePrecision,
    /// Gradient all-reduce launched during backward (off: `--no-grad-overlap`).
    pub overlap: bool,
    pub backend: Backend,
    /// Restarts of this node's workers after a failure (`--max-restarts`).
    pub max_restarts: usize,
}

pub enum Plan {
    /// Start the workers of this node and wait for them.
    Launch(LaunchSpec),
    /// One rank of a job (launched by us, torchrun, srun or mpirun).
    Worker(DistSetup),
    Single,
}

/// Whether a command that runs in this process alone (lr-find, show-batch) was started as one
/// process: `o` as given, but one process per node unless --nproc-per-node says otherwise (not
/// one per visible GPU); false under a launcher or with launch flags.
pub fn is_one_process(o: &DistOptions, device: DeviceSpec, sync_bn: bool) -> Result<bool> {
    let o = DistOptions {
        nproc_per_node: Some(o.nproc_per_node.unwrap_or(1)),
        ..o.clone()
    };
    Ok(matches!(plan(&o, device, sync_bn)?, Plan::Single))
}

/// The plan for a run on `device` (`sync_bn` as the run's config says).
pub fn plan(o: &DistOptions, device: DeviceSpec, sync_bn: bool) -> Result<Plan> {
    let timeout = o.timeout.max(Duration::from_secs(1));
    if !(o.bucket_mb > 0.0) {
        return Err(user_error(format!("--bucket-mb must be positive, got {}", o.bucket_mb)));
    }
    if let Some(mut env) = dist_env::from_process_env()? {
        if let Some(addr) = &o.master_addr {
            env.master_addr = addr.clone();
        }
        if let Some(port) = o.master_port {
            env.master_port = port;
        }
        return Ok(Plan::Worker(DistSetup {
            env,
            timeout,
            bucket_mb: o.bucket_mb,
            grad_compress: o.grad_compress,
            overlap: o.overlap,
            sync_bn,
            backend: o.backend,
            restarts: launcher::restart_count()?,
        }));
    }
    if std::env::var_os(launcher::LAUNCHED_VAR).is_some() {
        return Err(user_error("launched as a worker but RANK/WORLD_SIZE are missing"));
    }
    let resolved = device.resolve()?;
    let cuda = resolved.is_cuda();
    let nccl = o.backend.for_device(resolved)? == Backend::Nccl;
    let gpus = tch::Cuda::device_count() as usize;
    let nproc = match o.nproc_per_node {
        Some(0) => return Err(user_error("--nproc-per-node must be at least 1")),
        Some(n) => n,
        None if cuda => gpus.max(1),
        None => 1,
    };
    if cuda && o.devices.is_none() && nproc > gpus {
        return Err(user_error(format!(
            "--nproc-per-node {nproc} is more than the {gpus} visible GPUs (NCCL needs one GPU per rank)"
        )));
    }
    if let Some(d) = &o.devices {
        if d.len() != nproc {
            return Err(user_error(format!(
                "--devices lists {} devices for {nproc} local ranks",
                d.len()
            )));
        }
        if let Some(bad) = d.iter().find(|&&i| cuda && i >= gpus) {
            return Err(user_error(format!("--devices: no CUDA device {bad} ({gpus} visible)")));
        }
        let twice = d.iter().enumerate().find_map(|(k, i)| d[..k].contains(i).then_some(i));
        if let Some(twice) = twice.filter(|_| cuda && nccl) {
            return Err(user_error(format!(
                "--devices lists GPU {twice} twice: NCCL needs a GPU per rank (--dist-backend gloo lets ranks share one)"
            )));
        }
    }
    if o.nnodes == 0 || o.node_rank >= o.nnodes {
        return Err(user_error(format!(
            "--node-rank {} must be less than --nnodes {}",
            o.node_rank, o.nnodes
        )));
    }
    if nproc == 1 && o.nnodes == 1 && o.max_restarts == 0 {
        return Ok(Plan::Single);
    }
    if o.nnodes > 1 && o.master_addr.is_none() {
        return Err(user_error("--nnodes > 1 needs --master-addr (the address of node 0)"));
    }
    let master_port = match o.master_port {
        Some(p) => p,
        None if o.nnodes == 1 => launcher::free_port()?,
        None => dist_env::DEFAULT_MASTER_PORT,
    };
    Ok(Plan::Launch(LaunchSpec {
        nproc_per_node: nproc,
        nnodes: o.nnodes,
        node_rank: o.node_rank,
        master_addr: o.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
        master_port,
        devices: o.devices.clone(),
        max_restarts: o.max_restarts,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_process() -> DistOptions {
        DistOptions {
            nproc_per_node: None,
            nnodes: 1,
            node_rank: 0,
            master_addr: None,
            master_port: None,
            devices: None,
            timeout: crate::dist::DEFAULT_TIMEOUT,
            bucket_mb: super::super::ddp::DEFAULT_BUCKET_MB,
            grad_compress: WirePrecision::Off,
            overlap: true,
            backend: Backend::Auto,
            max_restarts: 0,
        }
    }

    fn error(o: DistOptions) -> String {
        match plan(&o, DeviceSpec::Cpu, false) {
            Ok(_) => panic!("no error"),
            Err(e) => {
                assert!(crate::error::is_user_error(&e), "{e}");
                e.to_string()
            }
        }
    }

    #[test]
    fn launch_options_are_planned_or_rejected_naming_the_flag() {
        if dist_env::from_process_env().ok().flatten().is_some() {
            return; // run as a rank of a job: the plan is Worker whatever the options
        }
        assert!(matches!(plan(&one_process(), DeviceSpec::Cpu, false), Ok(Plan::Single)));
        let two = plan(
            &DistOptions {
                nproc_per_node: Some(2),
                master_port: Some(29999),
                ..one_process()
            },
            DeviceSpec::Cpu,
            false,
        );
        match two {
            Ok(Plan::Launch(s)) => assert_eq!(
                (s.nproc_per_node, s.master_addr.as_str(), s.master_port),
                (2, "127.0.0.1", 29999)
            ),
            _ => panic!("two CPU workers are launched"),
        }
        // Each a change to the options of one process, and what the error names.
        let bad: [(fn(&mut DistOptions), &str); 6] = [
            (|o| o.bucket_mb = 0.0, "--bucket-mb must be positive"),
            (|o| o.nproc_per_node = Some(0), "--nproc-per-node must be at least 1"),
            (
                |o| (o.node_rank, o.nnodes) = (2, 2),
                "--node-rank 2 must be less than --nnodes 2",
            ),
            (|o| o.nnodes = 2, "--nnodes > 1 needs --master-addr"),
            (
                |o| (o.nproc_per_node, o.devices) = (Some(2), Some(vec![0])),
                "--devices lists 1 devices for 2 local ranks",
            ),
            (|o| o.backend = Backend::Nccl, "--dist-backend nccl needs a CUDA device"),
        ];
        for (change, needle) in bad {
            let mut options = one_process();
            change(&mut options);
            let e = error(options);
            assert!(e.contains(needle), "{e}");
        }
    }
}
