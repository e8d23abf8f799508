//! A safe handle on a c10d process group (see csrc/dist.cpp): rendezvous through PyTorch's
//! TCPStore, then Gloo (CPU tensors, or CUDA tensors staged through the host) or NCCL (CUDA).
use std::ffi::CString;
use std::os::raw::{c_char, c_int};
use std::time::Duration;

use anyhow::{bail, Result};
use tch::Tensor;

#[repr(C)]
struct RtPg {
    _private: [u8; 0],
}
#[repr(C)]
struct RtWork {
    _private: [u8; 0],
}

extern "C" {
    fn rt_nccl_available() -> c_int;
    fn rt_pg_new(
        backend: *const c_char,
        master: *const c_char,
        port: c_int,
        rank: c_int,
        world: c_int,
        timeout_ms: i64,
    ) -> *mut RtPg;
    fn rt_pg_free(pg: *mut RtPg);
    fn rt_pg_allreduce(pg: *mut RtPg, t: *mut torch_sys::C_tensor, op: c_int) -> *mut RtWork;
    fn rt_pg_broadcast(pg: *mut RtPg, t: *mut torch_sys::C_tensor, root: c_int) -> *mut RtWork;
    fn rt_pg_allgather(pg: *mut RtPg, out: *mut torch_sys::C_tensor, input: *mut torch_sys::C_tensor) -> *mut RtWork;
    fn rt_pg_barrier(pg: *mut RtPg) -> *mut RtWork;
    fn rt_work_wait(w: *mut RtWork) -> c_int;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Gloo,
    Nccl,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

pub fn nccl_available() -> bool {
    unsafe { rt_nccl_available() == 1 }
}

fn ptr(t: &Tensor) -> *mut torch_sys::C_tensor {
    t.as_ptr() as *mut _
}

/// A collective in flight; `wait` blocks until it is done (or failed).
#[must_use = "a collective must be waited for"]
pub struct Work(*mut RtWork);

impl Work {
    pub fn wait(self) -> Result<()> {
        let rc = unsafe { rt_work_wait(self.0) };
        std::mem::forget(self);
        if rc != 0 {
            bail!("collective failed: {}", crate::shim::last_error_message());
        }
        Ok(())
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        // Dropped without wait (an error path): still wait, so the work is freed.
        unsafe { rt_work_wait(self.0) };
    }
}

pub struct ProcessGroup {
    pg: *mut RtPg,
    pub rank: usize,
    pub world_size: usize,
    pub backend: Backend,
}

// The handle is used from the training thread only; c10d's objects are thread-safe anyway.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Rendezvous at master_addr:port (rank 0 hosts the store) and create the group. Fails with
    /// c10d's message when the port is taken or the master does not answer within `timeout`.
    pub fn new(
        backend: Backend,
        master_addr: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let (b, m) = (CString::new(backend.name())?, CString::new(master_addr)?);
        let pg = unsafe {
            rt_pg_new(
                b.as_ptr(),
                m.as_ptr(),
                port as c_int,
                rank as c_int,
                world_size as c_int,
                timeout.as_millis() as i64,
            )
        };
        if pg.is_null() {
            bail!(
                "rendezvous with the master at {master_addr}:{port} failed ({} backend, rank {rank} of {world_size}): {}",
                backend.name(),
                crate::shim::last_error_message().lines().next().unwrap_or("")
            );
        }
        Ok(ProcessGroup {
            pg,
            rank,
            world_size,
            backend,
        })
    }

    /// The shim's handle, for the shim's other users (SyncBatchNorm).
    pub(crate) fn raw(&self) -> *mut std::ffi::c_void {
        self.pg as *mut std::ffi::c_void
    }

    fn started(&self, w: *mut RtWork, what: &str) -> Result<Work> {
        if w.is_null() {
            bail!("{what} failed: {}", crate::shim::last_error_message());
        }
        Ok(Work(w))
    }

    pub fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        let op = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        };
        self.started(unsafe { rt_pg_allreduce(self.pg, ptr(t), op) }, "all-reduce")
    }

    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_async(t, op)?.wait()
    }

    pub fn broadcast_async(&self, t: &Tensor, root: usize) -> Result<Work> {
        self.started(unsafe { rt_pg_broadcast(self.pg, ptr(t), root as c_int) }, "broadcast")
    }

    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        self.broadcast_async(t, root)?.wait()
    }

    /// `out[r]` receives rank r's `input`; `out` has shape [world_size, *input.shape].
    pub fn all_gather(&self, out: &Tensor, input: &Tensor) -> Result<()> {
        self.started(unsafe { rt_pg_allgather(self.pg, ptr(out), ptr(input)) }, "all-gather")?
            .wait()
    }

    pub fn barrier(&self) -> Result<()> {
        self.started(unsafe { rt_pg_barrier(self.pg) }, "barrier")?.wait()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        unsafe { rt_pg_free(self.pg) };
    }
}
