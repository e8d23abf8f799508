//! The shim's gradient reducer (csrc/reducer.cpp): each bucket's all-reduce launched from
//! autograd hooks as soon as backward has produced all its gradients, and an event log of the
//! last backward that shows when.
use std::os::raw::c_int;

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use super::process_group::ProcessGroup;

#[repr(C)]
struct RtReducer {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RtEvent {
    kind: c_int,
    index: c_int,
    t_ns: i64,
}

extern "C" {
    fn rt_reducer_new(
        pg: *mut std::ffi::c_void,
        params: *const *mut torch_sys::C_tensor,
        bucket_of: *const c_int,
        n: c_int,
        flats: *const *mut torch_sys::C_tensor,
        nbuckets: c_int,
        wire_dtype: c_int,
        hooks: c_int,
    ) -> *mut RtReducer;
    fn rt_reducer_prepare(r: *mut RtReducer, sync: c_int) -> c_int;
    fn rt_reducer_finish(r: *mut RtReducer) -> c_int;
    fn rt_reducer_events(r: *mut RtReducer, out: *mut RtEvent, cap: i64) -> i64;
    fn rt_reducer_free(r: *mut RtReducer);
}

/// What happened during the last backward, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Backward has accumulated this parameter's gradient (its index in the DDP order).
    GradReady(usize),
    /// This bucket's all-reduce was launched.
    Launch(usize),
    /// Backward had returned and the host asked for the averaged gradients.
    BackwardDone,
    /// Every bucket was reduced and averaged.
    AllDone,
}

/// An event and when it happened (steady clock, ns).
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub event: Event,
    pub t_ns: i64,
}

pub struct Reducer(*mut RtReducer);

impl Reducer {
    /// Parameter `i`'s gradient must already be a view into `flats[bucket_of[i]]`. `wire`: the
    /// all-reduce's dtype (None: fp32). Without `hooks` every bucket is launched by `finish`.
    pub fn new(
        pg: &ProcessGroup,
        params: &[Tensor],
        bucket_of: &[usize],
        flats: &[Tensor],
        wire: Option<Kind>,
        hooks: bool,
    ) -> Result<Self> {
        assert_eq!(params.len(), bucket_of.len());
        let (p, f) = (crate::shim::ptrs(params), crate::shim::ptrs(flats));
        let b: Vec<c_int> = bucket_of.iter().map(|&b| b as c_int).collect();
        let wire = wire.map(crate::shim::scalar_type).transpose()?.unwrap_or(-1);
        let r = unsafe {
            rt_reducer_new(
                pg.raw(),
                p.as_ptr(),
                b.as_ptr(),
                p.len() as c_int,
                f.as_ptr(),
                f.len() as c_int,
                wire,
                hooks as c_int,
            )
        };
        if r.is_null() {
            bail!("gradient reducer: {}", crate::shim::last_error_message());
        }
        Ok(Reducer(r))
    }

    /// Before a backward; `sync`: it ends an optimizer step (otherwise nothing is launched and
    /// the gradients keep accumulating locally).
    pub fn prepare(&self, sync: bool) -> Result<()> {
        check(unsafe { rt_reducer_prepare(self.0, sync as c_int) }, "prepare")
    }

    /// After the step's last backward: launches the buckets not launched yet, waits for all and
    /// averages them in place.
    pub fn finish(&self) -> Result<()> {
        check(unsafe { rt_reducer_finish(self.0) }, "all-reduce")
    }

    /// The last backward's events, in order.
    pub fn events(&self) -> Vec<Timed> {
        let n = unsafe { rt_reducer_events(self.0, std::ptr::null_mut(), 0) };
        let mut raw = vec![RtEvent::default(); n as usize];
        let n = unsafe { rt_reducer_events(self.0, raw.as_mut_ptr(), n) }.min(raw.len() as i64);
        raw.truncate(n as usize);
        raw.into_iter()
            .map(|e| Timed {
                event: match e.kind {
                    0 => Event::GradReady(e.index as usize),
                    1 => Event::Launch(e.index as usize),
                    2 => Event::BackwardDone,
                    _ => Event::AllDone,
                },
                t_ns: e.t_ns,
            })
            .collect()
    }
}

fn check(rc: c_int, what: &str) -> Result<()> {
    if rc != 0 {
        bail!("gradient {what} failed: {}", crate::shim::last_error_message());
    }
    Ok(())
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // Waits for anything in flight and removes the hooks from the parameters.
        unsafe { rt_reducer_free(self.0) }
    }
}
