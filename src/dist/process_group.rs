//! A safe handle on a c10d process group (see csrc/dist.cpp): rendezvous through PyTorch's
//! TCPStore, then NCCL for a CUDA run, Gloo for a CPU run (or as `--dist-backend` says).
//!
//! Every collective runs on the group's `device`, the training device: NCCL refuses host
//! tensors ("Tensors must be CUDA and dense"), and Gloo on the CPU is held to the same rule so
//! that one code path serves both. Tensors given to a collective are checked, in every build;
//! values that live on the host (counts, sums, predictions) go through `all_reduce_values` and
//! `all_gather_values`, which put them on the device themselves, so no caller builds a
//! collective's tensor on the host.
use std::ffi::CString;
use std::os::raw::{c_char, c_int};
use std::time::Duration;

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};

use super::network;
use super::stderr;
use crate::error::user_error;
use crate::shim::ptr;

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
        local_addr: *const c_char,
        port: c_int,
        rank: c_int,
        world: c_int,
        timeout_ms: i64,
        cuda_device: c_int,
    ) -> *mut RtPg;
    fn rt_pg_free(pg: *mut RtPg);
    fn rt_pg_allreduce(pg: *mut RtPg, t: *mut torch_sys::C_tensor, op: c_int) -> *mut RtWork;
    fn rt_pg_broadcast(pg: *mut RtPg, t: *mut torch_sys::C_tensor, root: c_int) -> *mut RtWork;
    fn rt_pg_allgather(pg: *mut RtPg, out: *mut torch_sys::C_tensor, input: *mut torch_sys::C_tensor) -> *mut RtWork;
    fn rt_pg_barrier(pg: *mut RtPg) -> *mut RtWork;
    fn rt_work_wait(w: *mut RtWork) -> c_int;
}

crate::flag_enum! {
    /// `--dist-backend`: the c10d backend of the job's process group.
    #[derive(Default)]
    pub enum Backend("invalid --dist-backend") {
        /// NCCL for CUDA tensors when this build has it, Gloo otherwise.
        #[default]
        Auto = "auto",
        Nccl = "nccl",
        /// On the CPU, or with CUDA tensors (Gloo stages them through the host): several ranks
        /// can then share one GPU, which NCCL refuses.
        Gloo = "gloo",
    }
}

impl Backend {
    /// The backend of a group on `device`, never Auto; an error names a choice that cannot work.
    pub fn for_device(self, device: Device) -> Result<Backend> {
        Ok(match self {
            Backend::Auto => Backend::auto(device),
            Backend::Gloo => Backend::Gloo,
            Backend::Nccl if !device.is_cuda() => {
                return Err(user_error(
                    "--dist-backend nccl needs a CUDA device; on the CPU use gloo",
                ))
            }
            Backend::Nccl if !nccl_available() => {
                return Err(user_error("--dist-backend nccl: this build of ringtrain has no NCCL"))
            }
            Backend::Nccl => Backend::Nccl,
        })
    }

    /// The variable that names this backend's interface in PyTorch, with its value if set.
    pub(crate) fn interface_variable(self) -> Option<(&'static str, String)> {
        let name = match self {
            Backend::Nccl => network::NCCL_VAR,
            _ => network::GLOO_VAR,
        };
        std::env::var(name).ok().map(|v| (name, v))
    }

    fn auto(device: Device) -> Backend {
        if device.is_cuda() && nccl_available() {
            Backend::Nccl
        } else {
            Backend::Gloo
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

/// Why ranks that met at the store may still fail to connect.
const UNREACHABLE: &str = "each node's `network:` line names the address it gave its peers, and a loopback one (127.x) \
     cannot be reached from another node (leave GLOO_SOCKET_IFNAME unset, or name the interface of the nodes' network)";

/// Ends the process with `message` unless dropped within `after`: for a call into c10d that
/// has no deadline of its own.
struct Deadline(Option<std::sync::mpsc::Sender<()>>);

impl Deadline {
    fn start(after: Duration, message: String) -> Deadline {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(after) {
                stderr::say_now(&format!("error: {message}"));
                // The main thread is inside libtorch: end without running its destructors.
                unsafe { libc::_exit(1) };
            }
        });
        Deadline(Some(tx))
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        let _ = self.0.take().map(|tx| tx.send(()));
    }
}

/// A collective in flight; `wait` blocks until it is done (or failed).
#[must_use = "a collective must be waited for"]
pub struct Work(*mut RtWork);

impl Work {
    pub fn wait(self) -> Result<()> {
        if self.0.is_null() {
            return Ok(()); // a process alone: nothing was sent
        }
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
        if !self.0.is_null() {
            unsafe { rt_work_wait(self.0) };
        }
    }
}

/// The ranks of a job. A process training alone has one too, of world size 1, whose collectives
/// return at once (as llm.c's): callers never branch on whether they are distributed.
pub struct ProcessGroup {
    /// Null for a process alone.
    pg: *mut RtPg,
    pub rank: usize,
    pub world_size: usize,
    pub backend: Backend,
    /// Where every collective's tensors must live: the training device.
    pub device: Device,
}

// The handle is used from the training thread only; c10d's objects are thread-safe anyway.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Rendezvous at master_addr:port (rank 0 hosts the store) and create the group of `backend`
    /// (`Auto`: NCCL on CUDA), whose collectives run on `device` (for NCCL a CUDA device, which
    /// must be the current one: `dist::worker_device` makes it so). Fails with c10d's message
    /// when the port is taken or the master does not answer within `timeout`.
    pub fn new(
        backend: Backend,
        master_addr: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
        device: Device,
    ) -> Result<Self> {
        let backend = backend.for_device(device)?;
        let cuda_index = match (backend, device) {
            (Backend::Nccl, Device::Cuda(i)) => i as c_int,
            _ => -1,
        };
        let route = network::route_to_master(master_addr, port, backend.interface_variable())?;
        if backend == Backend::Nccl && std::env::var_os(network::NCCL_VAR).is_none() {
            // NCCL's bootstrap reads it when the communicator is made ("=": this name exactly).
            std::env::set_var(network::NCCL_VAR, format!("={}", route.iface));
        }
        let local = route.addr.map(|a| a.to_string()).unwrap_or_default();
        let (b, m, l) = (
            CString::new(backend.name())?,
            CString::new(master_addr)?,
            CString::new(local)?,
        );
        // Gloo waits for peers that registered but cannot be reached for a minute of its own,
        // whatever the timeout: the rendezvous is held to `--dist-timeout` here.
        let what = format!("rendezvous with the master at {master_addr}:{port} ({} backend, rank {rank} of {world_size})", backend.name());
        let deadline = Deadline::start(timeout + Duration::from_secs(5), format!(
            "{what} did not complete within --dist-timeout ({} s): the master did not answer, or the ranks could not \
             reach each other ({UNREACHABLE})",
            timeout.as_secs()
        ));
        let (pg, gloo_said) = stderr::captured(|| unsafe {
            rt_pg_new(
                b.as_ptr(),
                m.as_ptr(),
                l.as_ptr(),
                port as c_int,
                rank as c_int,
                world_size as c_int,
                timeout.as_millis() as i64,
                cuda_index,
            )
        })?;
        drop(deadline);
        stderr::pass_on(&gloo_said);
        if pg.is_null() {
            let why = crate::shim::last_error_message();
            let why = why.lines().next().unwrap_or("");
            let hint = match why.contains("connectFullMesh") {
                true => format!(": the ranks reached the master's store but not each other ({UNREACHABLE})"),
                false => String::new(),
            };
            bail!("{what} failed: {why}{hint}");
        }
        Ok(ProcessGroup {
            pg,
            rank,
            world_size,
            backend,
            device,
        })
    }

    /// A process alone: rank 0 of 1, no rendezvous, no c10d.
    pub fn single(device: Device) -> Self {
        ProcessGroup {
            pg: std::ptr::null_mut(),
            rank: 0,
            world_size: 1,
            backend: Backend::auto(device),
            device,
        }
    }

    /// Whether this is a job's group, through c10d (even of world size 1 under a launcher), rather
    /// than a process alone, whose collectives return at once.
    pub fn is_distributed(&self) -> bool {
        !self.pg.is_null()
    }

    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// A collective's tensor must be on the group's device: a host tensor under NCCL would fail
    /// only on a GPU, and a copy made here would leave an in-place result behind.
    fn check(&self, t: &Tensor, what: &str) -> Result<()> {
        if t.device() != self.device {
            bail!(
                "{what}: a tensor on {:?} given to a {} group whose collectives run on {:?} (a bug: build it on the training device)",
                t.device(),
                self.backend.name(),
                self.device
            );
        }
        Ok(())
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
        self.check(t, "all-reduce")?;
        if !self.is_distributed() {
            return Ok(Work(std::ptr::null_mut()));
        }
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
        self.check(t, "broadcast")?;
        if !self.is_distributed() {
            return Ok(Work(std::ptr::null_mut()));
        }
        self.started(unsafe { rt_pg_broadcast(self.pg, ptr(t), root as c_int) }, "broadcast")
    }

    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        self.broadcast_async(t, root)?.wait()
    }

    /// `out[r]` receives rank r's `input`; `out` has shape [world_size, *input.shape].
    pub fn all_gather(&self, out: &Tensor, input: &Tensor) -> Result<()> {
        self.check(out, "all-gather")?;
        self.check(input, "all-gather")?;
        if !self.is_distributed() {
            let _ = out.get(0).copy_(input);
            return Ok(());
        }
        self.started(unsafe { rt_pg_allgather(self.pg, ptr(out), ptr(input)) }, "all-gather")?
            .wait()
    }

    /// Host values reduced element-wise over ranks (on the group's device, then read back).
    pub fn all_reduce_values(&self, values: &[f64], op: ReduceOp) -> Result<Vec<f64>> {
        if !self.is_distributed() {
            return Ok(values.to_vec());
        }
        let t = Tensor::from_slice(values).f_to_device(self.device)?;
        self.all_reduce(&t, op)?;
        Ok(Vec::<f64>::try_from(&t.to_device(Device::Cpu))?)
    }

    /// Every rank's `values` (of any length, each ≥ 0), in rank order.
    pub fn all_gather_values(&self, values: &[i64]) -> Result<Vec<Vec<i64>>> {
        if values.iter().any(|&v| v < 0) {
            bail!("all_gather_values: negative values are reserved for padding");
        }
        if !self.is_distributed() {
            return Ok(vec![values.to_vec()]);
        }
        let lens = self.all_reduce_values(&[values.len() as f64], ReduceOp::Max)?;
        let max = lens[0] as i64;
        if max == 0 {
            return Ok(vec![Vec::new(); self.world_size]);
        }
        let mut padded = values.to_vec();
        padded.resize(max as usize, -1);
        let input = Tensor::from_slice(&padded).f_to_device(self.device)?;
        let out = Tensor::zeros([self.world_size as i64, max], (Kind::Int64, self.device));
        self.all_gather(&out, &input)?;
        let out = Vec::<i64>::try_from(out.to_device(Device::Cpu).flatten(0, -1))?;
        Ok(out
            .chunks(max as usize)
            .map(|rank| rank.iter().copied().filter(|&v| v >= 0).collect())
            .collect())
    }

    pub fn barrier(&self) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        self.started(unsafe { rt_pg_barrier(self.pg) }, "barrier")?.wait()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.is_distributed() {
            unsafe { rt_pg_free(self.pg) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(backend: Backend, device: Device) -> Result<ProcessGroup> {
        let port = crate::dist::launcher::free_port()?;
        ProcessGroup::new(backend, "127.0.0.1", port, 0, 1, Duration::from_secs(30), device)
    }

    #[test]
    fn a_process_alone_has_collectives_that_return_their_input() {
        let pg = ProcessGroup::single(Device::Cpu);
        assert!(!pg.is_distributed() && pg.is_main() && pg.world_size == 1);
        assert_eq!(
            pg.all_reduce_values(&[1.5, -2.0], ReduceOp::Max).unwrap(),
            vec![1.5, -2.0]
        );
        assert_eq!(pg.all_gather_values(&[3, 7]).unwrap(), vec![vec![3, 7]]);
        let t = Tensor::from_slice(&[2.0f32, 3.0]);
        pg.all_reduce(&t, ReduceOp::Sum).unwrap();
        pg.broadcast(&t, 0).unwrap();
        let out = Tensor::zeros([1, 2], (Kind::Float, Device::Cpu));
        pg.all_gather(&out, &t).unwrap();
        assert_eq!(Vec::<f32>::try_from(out.flatten(0, -1)).unwrap(), vec![2.0, 3.0]);
        pg.barrier().unwrap();
        // The device rule holds alone too: a CUDA run's group refuses a host tensor.
        assert!(ProcessGroup::single(Device::Cuda(0))
            .all_reduce(&t, ReduceOp::Sum)
            .is_err());
    }

    #[test]
    fn host_values_travel_through_the_group_device() {
        let pg = group(Backend::Gloo, Device::Cpu).unwrap();
        assert_eq!(
            pg.all_reduce_values(&[1.5, -2.0], ReduceOp::Sum).unwrap(),
            vec![1.5, -2.0]
        );
        assert_eq!(pg.all_gather_values(&[3, 0, 7]).unwrap(), vec![vec![3, 0, 7]]);
        assert_eq!(pg.all_gather_values(&[]).unwrap(), vec![Vec::<i64>::new()]);
        assert!(pg.all_gather_values(&[-1]).is_err());
    }

    /// What a CUDA run's group does with a host tensor, shown with Gloo on this machine: the
    /// group of a CUDA run refuses it, in every build, before c10d sees it (NCCL would refuse it
    /// only on a GPU, with "Tensors must be CUDA and dense"); host values are put on the
    /// device, never sent from the host.
    #[test]
    fn a_group_refuses_tensors_that_are_not_on_its_device() {
        let pg = group(Backend::Gloo, Device::Cuda(0)).unwrap();
        let host = Tensor::from_slice(&[1.0f64]);
        let err = pg.all_reduce(&host, ReduceOp::Sum).unwrap_err().to_string();
        assert!(
            err.contains("all-reduce: a tensor on Cpu given to a gloo group whose collectives run on Cuda(0)"),
            "{err}"
        );
        assert!(pg
            .broadcast(&host, 0)
            .unwrap_err()
            .to_string()
            .contains("broadcast: a tensor on Cpu"));
        let out = Tensor::zeros([1, 1], (Kind::Double, Device::Cpu));
        assert!(pg
            .all_gather(&out, &host)
            .unwrap_err()
            .to_string()
            .contains("all-gather: a tensor on Cpu"));
        if !tch::Cuda::is_available() {
            // Placing the values on a missing GPU fails; they are not reduced from the host.
            assert!(pg.all_reduce_values(&[1.0], ReduceOp::Sum).is_err());
        }
        let err = group(Backend::Nccl, Device::Cpu).err().unwrap().to_string();
        assert!(err.contains("--dist-backend nccl needs a CUDA device"), "{err}");
    }
}
