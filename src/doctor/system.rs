//! The machine under the run: CPU, memory (and a container's limit), file systems' free space.
use std::path::{Path, PathBuf};

/// The CPU's model name, from /proc/cpuinfo.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Logical CPUs online on the machine (this process may be allowed fewer).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

/// (total, available) bytes of memory, from /proc/meminfo.
pub fn memory() -> Option<(u64, u64)> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// The memory limit of this process's cgroup (a container's or a Slurm job's), when it has one.
pub fn cgroup_memory_limit() -> Option<u64> {
    // cgroup v2: the process's own group, else the root of the namespace's view.
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("0::").map(str::to_string)));
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(g) = own {
        candidates.push(Path::new("/sys/fs/cgroup").join(g.trim_start_matches('/')).join("memory.max"));
    }
    candidates.push("/sys/fs/cgroup/memory.max".into());
    candidates.push("/sys/fs/cgroup/memory/memory.limit_in_bytes".into()); // cgroup v1
    candidates
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .find(|&v| v < (1u64 << 60)) // v1 writes a huge number for "no limit", v2 "max"
}

/// Size and free bytes of the file system holding `path`.
pub struct Space {
    pub total: u64,
    pub free: u64,
    pub fs_type: Option<String>,
}

pub fn space(path: &Path) -> Option<Space> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct for a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some(Space {
        total: s.f_blocks * s.f_frsize,
        free: s.f_bavail * s.f_frsize,
        fs_type: mount_type(path),
    })
}

/// The type of the file system mounted exactly at `path` ("tmpfs"), from /proc/self/mounts.
fn mount_type(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let want = path.to_str()?;
    mounts.lines().rev().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
        (at == want).then(|| kind.to_string())
    })
}

/// The nearest folder of `path` that exists (the run directory may not yet).
pub fn existing_ancestor(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    abs.ancestors()
        .find(|p| p.is_dir())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// Whether this process may create files in `dir`.
pub fn writable(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: access with a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// 1536 MiB → "1.5 GiB".
pub fn gib(bytes: u64) -> String {
    let g = bytes as f64 / (1u64 << 30) as f64;
    if g >= 1.0 {
        format!("{g:.1} GiB")
    } else {
        format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}
