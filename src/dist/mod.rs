//! Distribution on PyTorch's c10d: who am I (`env`), the process group (`process_group`), the
//! data-parallel gradient exchange (`ddp`) and the built-in launcher (`launcher`).
pub mod ddp;
pub mod env;
pub mod launcher;
pub mod process_group;

use std::time::Duration;

/// How a worker joins its job, resolved by the CLI.
#[derive(Debug, Clone)]
pub struct DistSetup {
    pub env: env::DistEnv,
    pub timeout: Duration,
    pub bucket_mb: f64,
    /// Gradient all-reduce precision (`--grad-compress bf16|fp16`), None for fp32.
    pub grad_compress: Option<tch::Kind>,
    /// BatchNorm over the global batch (`--sync-bn`).
    pub sync_bn: bool,
}
