//! Who this process is in the job, and what that decides before any data is read: its device,
//! its process group (a group of one when alone), its share of the node's cores, its batch.
use std::rc::Rc;

use anyhow::Result;

use super::step::trainer::DdpOptions;
use crate::config::TrainConfig;
use crate::dist::process_group::ProcessGroup;
use crate::dist::watchdog::Watchdog;
use crate::dist::DistSetup;
use crate::error::user_error;
use crate::model::batchnorm::{sync_batch_norm, SyncBatchNormGuard};

pub struct RankContext {
    pub pg: Rc<ProcessGroup>,
    /// Ranks on this node: they share its cores.
    pub local_world: usize,
    /// This rank's part of the global `--batch-size`.
    pub rank_batch: usize,
    /// How the job was launched, for the banner (None when alone).
    pub dist: Option<DistSetup>,
    pub cores: usize,
    /// Names a peer that stops answering (None when alone).
    _watchdog: Option<Watchdog>,
}

impl RankContext {
    /// Joins the job (when distributed) on the configured device.
    pub fn new(cfg: &TrainConfig, dist: Option<&DistSetup>) -> Result<Self> {
        if cfg.deterministic && std::env::var_os("CUBLAS_WORKSPACE_CONFIG").is_none() {
            // cuBLAS reads it when its first handle is made: before any CUDA work of the run.
            std::env::set_var("CUBLAS_WORKSPACE_CONFIG", ":4096:8");
        }
        let device = cfg.device.resolve()?;
        let pg = match dist {
            Some(d) => crate::dist::join(&d.env, device, d.backend, d.timeout)?,
            None => ProcessGroup::single(device),
        };
        if !pg.is_main() {
            crate::report::progress::set_quiet(true); // only rank 0 reports; errors still go to stderr
        }
        let _watchdog = match dist {
            Some(d) => Watchdog::start(&pg, d.timeout)?,
            None => None,
        };
        let world = pg.world_size;
        if cfg.batch_size % world != 0 {
            return Err(user_error(format!(
                "--batch-size {} (the global batch) must be divisible by the world size {world}",
                cfg.batch_size
            )));
        }
        // The node's cores are shared among its ranks, for data workers and (as torchrun does)
        // for libtorch's intra-op threads.
        let cores = crate::device::available_cores();
        let local_world = dist.map_or(1, |d| d.env.local_world_size);
        if local_world > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
            tch::set_num_threads((cores / local_world).max(1) as i32);
        }
        if device.is_cuda() {
            crate::shim::set_cudnn_deterministic(cfg.deterministic);
        }
        Ok(RankContext {
            pg: Rc::new(pg),
            local_world,
            rank_batch: cfg.batch_size / world,
            dist: dist.cloned(),
            cores,
            _watchdog,
        })
    }

    pub fn is_main(&self) -> bool {
        self.pg.is_main()
    }

    pub fn world(&self) -> usize {
        self.pg.world_size
    }

    /// How often a launcher restarted this job's workers before this start.
    pub fn restarts(&self) -> usize {
        self.dist.as_ref().map_or(0, |d| d.restarts)
    }

    /// Data threads: `--workers`, else this rank's share of the node's cores.
    pub fn workers(&self, cfg: &TrainConfig) -> usize {
        cfg.workers.unwrap_or((self.cores / self.local_world).max(1))
    }

    pub fn ddp_options(&self) -> DdpOptions {
        match &self.dist {
            Some(d) => DdpOptions {
                bucket_mb: d.bucket_mb,
                wire: d.grad_compress,
                overlap: d.overlap,
            },
            None => DdpOptions::default(),
        }
    }

    /// `--sync-bn` across ranks, while the guard lives.
    pub fn sync_batch_norm(&self, cfg: &TrainConfig) -> Option<SyncBatchNormGuard<'_>> {
        (cfg.sync_bn && self.pg.is_distributed()).then(|| sync_batch_norm(&self.pg))
    }
}
