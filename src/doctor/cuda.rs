//! CUDA as this process sees it, read from the libraries themselves: the runtime, cuDNN and NCCL
//! are loaded with libtorch's CUDA part (it links them), so their version functions are found by
//! name; the driver (libcuda.so.1, installed with the NVIDIA driver, never with torch) is opened
//! here, and its device API lists the GPUs without creating a CUDA context.
use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// What the driver reports about one GPU.
pub struct Gpu {
    pub name: String,
    pub memory_bytes: u64,
    pub capability: (i32, i32),
}

/// The driver's view, or why there is none.
pub struct Driver {
    /// The CUDA version the driver supports, as 13000 for 13.0.
    pub cuda_version: i32,
    /// The kernel module's version ("580.65.06"), when /proc says.
    pub release: Option<String>,
    pub gpus: Vec<Gpu>,
    /// peer[i][j]: GPU i can read GPU j's memory directly.
    pub peer: Vec<Vec<bool>>,
}

fn symbol(handle: *mut c_void, name: &str) -> Option<*mut c_void> {
    let name = CString::new(name).ok()?;
    // SAFETY: dlsym with a valid handle (or RTLD_DEFAULT) and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// An `int f(int*)` version function already loaded into the process, by name.
fn loaded_version(name: &str) -> Option<i32> {
    let f = symbol(libc::RTLD_DEFAULT, name)?;
    // SAFETY: cudaRuntimeGetVersion and ncclGetVersion both have this signature.
    let f: extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
    let mut v: c_int = 0;
    (f(&mut v) == 0 && v > 0).then_some(v)
}

/// The CUDA runtime's version (13000 for 13.0), when libtorch loaded one.
pub fn runtime_version() -> Option<i32> {
    loaded_version("cudaRuntimeGetVersion")
}

/// NCCL's version as "2.27.7", when libtorch loaded it.
pub fn nccl_version() -> Option<String> {
    let v = loaded_version("ncclGetVersion")?;
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    Some(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

/// The driver and its GPUs, or a sentence saying why there is none.
pub fn driver() -> Result<Driver, String> {
    let lib = CString::new("libcuda.so.1").expect("no NUL");
    // SAFETY: dlopen of a library by name; the handle is kept for the process's life.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        return Err("no NVIDIA driver (libcuda.so.1 cannot be loaded)".into());
    }
    type IntFn = extern "C" fn(*mut c_int) -> c_int;
    let get = |name: &str| symbol(h, name).ok_or_else(|| format!("libcuda.so.1 lacks {name}"));
    // SAFETY (every transmute below): the driver API's documented signatures.
    let init: extern "C" fn(u32) -> c_int = unsafe { std::mem::transmute(get("cuInit")?) };
    let version: IntFn = unsafe { std::mem::transmute(get("cuDriverGetVersion")?) };
    let count: IntFn = unsafe { std::mem::transmute(get("cuDeviceGetCount")?) };
    let device: extern "C" fn(*mut c_int, c_int) -> c_int = unsafe { std::mem::transmute(get("cuDeviceGet")?) };
    let name: extern "C" fn(*mut c_char, c_int, c_int) -> c_int =
        unsafe { std::mem::transmute(get("cuDeviceGetName")?) };
    let memory: extern "C" fn(*mut usize, c_int) -> c_int =
        unsafe { std::mem::transmute(get("cuDeviceTotalMem_v2")?) };
    let attribute: extern "C" fn(*mut c_int, c_int, c_int) -> c_int =
        unsafe { std::mem::transmute(get("cuDeviceGetAttribute")?) };
    let peer: extern "C" fn(*mut c_int, c_int, c_int) -> c_int =
        unsafe { std::mem::transmute(get("cuDeviceCanAccessPeer")?) };

    let mut cuda_version = 0;
    version(&mut cuda_version);
    let release = std::fs::read_to_string("/proc/driver/nvidia/version").ok().and_then(|s| driver_release(&s));
    let rc = init(0);
    if rc != 0 {
        return Err(format!(
            "the NVIDIA driver (CUDA {}) does not start: cuInit error {rc}{}",
            dotted(cuda_version),
            match rc {
                100 => " (no CUDA-capable device is detected; CUDA_VISIBLE_DEVICES may hide them all)",
                999 => " (unknown error: often a driver and kernel module of different versions)",
                _ => "",
            }
        ));
    }
    let mut n = 0;
    count(&mut n);
    let mut handles = Vec::new();
    let mut gpus = Vec::new();
    for i in 0..n {
        let mut d = 0;
        if device(&mut d, i) != 0 {
            continue;
        }
        let mut buf = [0 as c_char; 256];
        name(buf.as_mut_ptr(), buf.len() as c_int, d);
        // SAFETY: the driver wrote a NUL-terminated name into buf (zeroed, so terminated anyway).
        let gpu_name = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        let mut bytes = 0usize;
        memory(&mut bytes, d);
        let (mut major, mut minor) = (0, 0);
        attribute(&mut major, 75, d); // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        attribute(&mut minor, 76, d); // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
        handles.push(d);
        gpus.push(Gpu {
            name: gpu_name,
            memory_bytes: bytes as u64,
            capability: (major, minor),
        });
    }
    let peer = handles
        .iter()
        .map(|&a| {
            handles
                .iter()
                .map(|&b| {
                    let mut can = 0;
                    a != b && peer(&mut can, a, b) == 0 && can == 1
                })
                .collect()
        })
        .collect();
    Ok(Driver {
        cuda_version,
        release,
        gpus,
        peer,
    })
}

/// The driver's release ("580.65.06") from /proc/driver/nvidia/version's first line, whose
/// words differ between the proprietary and the open kernel modules:
/// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..." and
/// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...".
fn driver_release(proc_version: &str) -> Option<String> {
    let after = proc_version.lines().next()?.split("Kernel Module").nth(1)?;
    let is_release = |w: &&str| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.');
    after.split_whitespace().find(is_release).map(String::from)
}

/// 13000 → "13.0".
pub fn dotted(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both kernel modules' first lines give the release; the open module's "for x86_64" (which
    /// the first GPU run's doctor printed as the release) is skipped.
    #[test]
    fn the_driver_release_is_read_from_either_kernel_module() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025\nGCC version: gcc 12\n";
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Thu Oct 30 2025\n";
        assert_eq!(driver_release(proprietary).as_deref(), Some("580.65.06"));
        assert_eq!(driver_release(open).as_deref(), Some("580.159.04"));
        assert_eq!(driver_release("something else\n"), None);
        assert_eq!(driver_release(""), None);
    }
}
