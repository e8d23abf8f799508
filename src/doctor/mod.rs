//! `ringtrain doctor`: the machine as a run would find it, one screen to paste into a bug report
//! (PyTorch's `python -m torch.utils.collect_env`, plus what goes wrong in distributed runs). Each
//! line is `ok` or `warning`, and a warning says how to fix it. Nothing here creates a CUDA
//! context, joins a job or writes a file.
mod cuda;
pub mod system;

use std::net::{IpAddr, ToSocketAddrs};
use std::path::Path;

use anyhow::Result;

use crate::dist::{env as dist_env, network};
use crate::outln;
use crate::shim;
use system::gib;

/// One line of the screen.
pub struct Check {
    pub ok: bool,
    pub text: String,
    /// For a warning: what to do about it.
    pub fix: Option<String>,
}

fn ok(text: impl Into<String>) -> Check {
    Check {
        ok: true,
        text: text.into(),
        fix: None,
    }
}

fn warning(text: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        ok: false,
        text: text.into(),
        fix: Some(fix.into()),
    }
}

/// Below these, a warning: NCCL's shared-memory transport and PyTorch's DataLoader workers (in
/// the references) fill /dev/shm, whose container default is 64 MB; checkpoints of the largest
/// models here are about 350 MB each (best, last and a temporary copy on disk at once).
const SHM_WANTED: u64 = 1 << 30;
const OUT_WANTED: u64 = 2 << 30;

/// Every check, in the order of the screen.
pub fn checks(out: Option<&Path>) -> Vec<Check> {
    let get = |k: &str| std::env::var(k).ok();
    let mut c = Vec::new();
    c.extend(build());
    c.extend(gpus());
    c.extend(machine());
    c.extend(distributed(&get));
    if let Some(out) = out {
        c.push(out_space(out));
    }
    c
}

pub fn run(out: Option<&Path>, data: Option<&Path>) -> Result<()> {
    let mut checks = checks(out);
    if let Some(data) = data {
        checks.push(data_check(data));
    }
    outln!("ringtrain doctor: this machine as a run finds it (paste the whole screen into a bug report)\n");
    for c in &checks {
        outln!("{:<8} {}", if c.ok { "ok" } else { "warning" }, c.text);
        if let Some(fix) = &c.fix {
            outln!("{:<8} fix: {fix}", "");
        }
    }
    let warnings = checks.iter().filter(|c| !c.ok).count();
    outln!(
        "\n{}",
        match warnings {
            0 => "no warnings".to_string(),
            1 => "1 warning".to_string(),
            n => format!("{n} warnings"),
        }
    );
    Ok(())
}

/// Whether `data` can be read: a remote location listed and the start of its first object
/// fetched (into memory: nothing written), a local one opened as training opens it.
fn data_check(data: &Path) -> Check {
    use crate::data::source::{files, is_remote, Dataset};
    let shown = data.display();
    if !is_remote(data) {
        return match Dataset::open(data, "--data") {
            Ok(set) => ok(format!("data {shown}: {} images of {} classes", set.len(), set.classes.len())),
            Err(e) => warning(format!("data {shown}: {e}"), "check the path (ringtrain train --help lists the forms --data takes)"),
        };
    }
    let start = std::time::Instant::now();
    let checked = files::open_location(&data.to_string_lossy(), "--data").and_then(|kind| {
        let objects = kind.objects();
        let first = &objects[0];
        let head = first.read_start(64 << 10)?;
        Ok(format!(
            "data {shown}: {} object(s), {:.1} MB in all, listed and read (the first {} KB of {} in {:.0} ms); credentials: {}",
            objects.len(),
            objects.iter().map(|o| o.size).sum::<u64>() as f64 / 1e6,
            head.len() >> 10,
            first.url,
            start.elapsed().as_secs_f64() * 1e3,
            first.credentials()
        ))
    });
    match checked {
        Ok(text) => ok(text),
        Err(e) => warning(
            format!("data {shown}: {e}"),
            "check the location and the credentials the provider's SDK would use (for an S3-compatible store, AWS_ENDPOINT_URL too)",
        ),
    }
}

/// ringtrain, the libtorch it loaded and how it found it, and CUDA's libraries.
fn build() -> Vec<Check> {
    let mut c = vec![ok(format!(
        "ringtrain {} for {}, built against libtorch {} with CUDA {}, NCCL {}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        shim::torch_version(),
        yes_no(shim::built_with_cuda()),
        yes_no(crate::dist::process_group::nccl_available()),
    ))];
    c.push(libtorch());
    c.push(ok(format!("fused kernels (--fused-norm): {}", crate::model::fused::describe())));
    c.push(onnx_runtime());
    if !shim::built_with_cuda() {
        return c;
    }
    let runtime = cuda::runtime_version();
    let cudnn = shim::cudnn_version();
    c.push(ok(format!(
        "CUDA runtime {}, cuDNN {}, NCCL {} (loaded with libtorch)",
        runtime.map(cuda::dotted).unwrap_or_else(|| "not loaded".into()),
        cudnn.unwrap_or_else(|| "not loaded".into()),
        cuda::nccl_version().unwrap_or_else(|| "not loaded".into()),
    )));
    c
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The libtorch_cpu.so mapped into this process, its torch version and who chose it.
fn libtorch() -> Check {
    let Some(lib) = loaded_library("libtorch_cpu.so") else {
        return warning("cannot tell which libtorch_cpu.so is loaded", "mount /proc (its maps name the libraries loaded)");
    };
    let folder = lib.parent().unwrap_or(Path::new("/")).to_path_buf();
    // An installed torch keeps its version beside lib/, a libtorch archive in build-version.
    let torch = std::fs::read_to_string(folder.join("../version.py"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("__version__ = ").map(|v| v.trim_matches(['\'', '"']).to_string()))
        })
        .or_else(|| std::fs::read_to_string(folder.join("../build-version")).ok().map(|s| s.trim().to_string()));
    let how = match std::env::var("RINGTRAIN_LIBTORCH_FOUND") {
        Ok(how) => how,
        Err(_) => {
            let on_path = std::env::var("LD_LIBRARY_PATH")
                .unwrap_or_default()
                .split(':')
                .any(|d| !d.is_empty() && same_dir(Path::new(d), &folder));
            if on_path {
                "LD_LIBRARY_PATH".to_string()
            } else {
                "the library path recorded by the build".to_string()
            }
        }
    };
    let built = shim::torch_version();
    let text = format!(
        "libtorch {} in {}, found by {how}",
        torch.as_deref().unwrap_or("(version unknown)"),
        folder.display()
    );
    match torch {
        Some(v) if !v.starts_with(&built) => warning(
            text,
            format!("install torch=={built} for this Python (ringtrain was built against libtorch {built})"),
        ),
        _ => ok(text),
    }
}

/// ONNX Runtime's library, which `predict` runs .onnx files with and `export` checks them in.
fn onnx_runtime() -> Check {
    match crate::infer::onnx::runtime_library() {
        Ok(lib) => ok(format!("ONNX Runtime {} (predict and export run .onnx files in it)", lib.display())),
        Err(e) => warning(
            format!("{e:#}"),
            "needed only for .onnx files: pip install onnxruntime beside torch, or set ORT_DYLIB_PATH",
        ),
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The path of a shared library mapped into this process, from /proc/self/maps.
pub(crate) fn loaded_library(name: &str) -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| Path::new(p).file_name().is_some_and(|f| f == name))
        .map(std::path::PathBuf::from)
}

/// The NVIDIA driver and every GPU it shows, with peer access between them.
fn gpus() -> Vec<Check> {
    if !shim::built_with_cuda() {
        return vec![ok("no CUDA in this build: training runs on the CPU")];
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let visible_note = visible
        .as_deref()
        .map(|v| format!(" (CUDA_VISIBLE_DEVICES={v})"))
        .unwrap_or_default();
    let driver = match cuda::driver() {
        Ok(d) => d,
        Err(why) => {
            return vec![warning(
                format!("no CUDA GPU: {why}{visible_note}; training runs on the CPU"),
                "nothing, for CPU training; for GPUs install the NVIDIA driver (in a container: docker run --gpus all, with the NVIDIA Container Toolkit)",
            )]
        }
    };
    let mut c = Vec::new();
    let release = driver.release.as_deref().map(|r| format!("{r}, ")).unwrap_or_default();
    let driver_text = format!("NVIDIA driver {release}for CUDA {}", cuda::dotted(driver.cuda_version));
    match cuda::runtime_version() {
        Some(rt) if driver.cuda_version / 1000 < rt / 1000 => c.push(warning(
            format!("{driver_text}: older than libtorch's CUDA {} runtime", cuda::dotted(rt)),
            format!("update the NVIDIA driver to one for CUDA {}.x, or install a torch build for CUDA {}.x", rt / 1000, driver.cuda_version / 1000),
        )),
        _ => c.push(ok(driver_text)),
    }
    if driver.gpus.is_empty() {
        c.push(warning(
            format!("the driver shows no GPU{visible_note}"),
            "check CUDA_VISIBLE_DEVICES and nvidia-smi",
        ));
    }
    for (i, g) in driver.gpus.iter().enumerate() {
        let (major, minor) = g.capability;
        let text = format!(
            "GPU {i}: {}, {}, compute capability {major}.{minor}{}",
            g.name,
            gib(g.memory_bytes),
            if i == 0 { visible_note.as_str() } else { "" }
        );
        // CUDA 13 (libtorch 2.11's default build) has no kernels before Turing (7.5).
        if (major, minor) < (7, 5) {
            c.push(warning(text, "libtorch 2.11's CUDA 13 build needs compute capability 7.5 or newer; use a newer GPU"));
        } else {
            c.push(ok(text));
        }
    }
    let n = driver.gpus.len();
    if n > 1 {
        let missing: Vec<String> = (0..n)
            .flat_map(|a| (0..n).filter(move |&b| a < b).map(move |b| (a, b)))
            .filter(|&(a, b)| !(driver.peer[a][b] && driver.peer[b][a]))
            .map(|(a, b)| format!("{a}-{b}"))
            .collect();
        if missing.is_empty() {
            c.push(ok(format!("peer access between all {n} GPUs (NCCL copies GPU to GPU)")));
        } else {
            c.push(warning(
                format!("no peer access between GPUs {}: NCCL goes through host memory there (slower all-reduce)", missing.join(", ")),
                "see nvidia-smi topo -m; in a VM or with the IOMMU on, peer access may be disabled (NCCL_P2P_LEVEL, ACS settings)",
            ));
        }
    }
    c
}

/// CPU, memory and /dev/shm.
fn machine() -> Vec<Check> {
    let mut c = Vec::new();
    let cores = crate::device::available_cores();
    let online = system::online_cpus();
    c.push(ok(format!(
        "CPU: {}, {cores} of {online} logical cores available to this process",
        system::cpu_model().unwrap_or_else(|| "model unknown".into())
    )));
    match system::memory() {
        Some((total, available)) => {
            let limit = system::cgroup_memory_limit()
                .filter(|&l| l < total)
                .map(|l| format!(", limited to {} for this process's group", gib(l)))
                .unwrap_or_default();
            let text = format!("memory: {} total, {} available{limit}", gib(total), gib(available));
            if available < (2 << 30) {
                c.push(warning(text, "free memory: the RAM cache (--cache auto) and the data workers need some; --cache off and fewer --workers use less"));
            } else {
                c.push(ok(text));
            }
        }
        None => c.push(warning("memory: /proc/meminfo is unreadable", "mount /proc")),
    }
    c.push(shm());
    c
}

fn shm() -> Check {
    let shm = Path::new("/dev/shm");
    let uses = "NCCL's shared-memory transport between the GPUs of a node and the PyTorch references' DataLoader workers use it";
    if !shm.is_dir() {
        return warning(
            format!("/dev/shm is missing: {uses}"),
            "mount a tmpfs there (mount -t tmpfs -o size=8g tmpfs /dev/shm; docker run --shm-size=8g or --ipc=host)",
        );
    }
    match system::space(shm) {
        Some(s) if s.total < SHM_WANTED => warning(
            format!("/dev/shm: {} ({}), small: {uses}", gib(s.total), s.fs_type.as_deref().unwrap_or("?")),
            "docker run --shm-size=8g (or --ipc=host); Kubernetes: an emptyDir with medium Memory at /dev/shm",
        ),
        Some(s) => ok(format!(
            "/dev/shm: {} ({}), {} free",
            gib(s.total),
            s.fs_type.as_deref().unwrap_or("?"),
            gib(s.free)
        )),
        None => warning("/dev/shm cannot be read (statvfs failed)", "check its mount: mount | grep /dev/shm"),
    }
}

/// The variables torchrun, Slurm's srun and Open MPI's mpirun set, that a run reads.
pub const LAUNCHER_VARS: [&str; 17] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
];

/// The variables a launcher sets, what ringtrain makes of them, and the network the ranks use.
fn distributed(get: &dyn Fn(&str) -> Option<String>) -> Vec<Check> {
    let mut c = Vec::new();
    let set: Vec<String> = LAUNCHER_VARS.iter().filter_map(|&v| get(v).map(|x| format!("{v}={x}"))).collect();
    if !set.is_empty() {
        c.push(ok(format!("launcher variables: {}", set.join(" "))));
    }
    let env = match dist_env::detect(get) {
        Ok(Some(e)) => e,
        Ok(None) => {
            c.push(ok(
                "no launcher's variables: one process (--nproc-per-node N starts N; torchrun, srun and mpirun are read too)",
            ));
            c.extend(network_checks(get, None));
            return c;
        }
        Err(e) => {
            c.push(warning(
                format!("the launcher's variables do not describe a job: {e}"),
                "unset the stale variables, or start ringtrain through the launcher that sets them",
            ));
            return c;
        }
    };
    c.push(ok(format!(
        "would run as rank {} of {} (local rank {} of {}), master {}:{}, from {}",
        env.rank, env.world_size, env.local_rank, env.local_world_size, env.master_addr, env.master_port, env.source
    )));
    c.extend(network_checks(get, Some(&env)));
    c
}

/// The interfaces, the variables that choose one, and with a job the route its ranks would take.
fn network_checks(get: &dyn Fn(&str) -> Option<String>, env: Option<&dist_env::DistEnv>) -> Vec<Check> {
    let mut c = Vec::new();
    let all = network::interfaces();
    let shown: Vec<String> = all
        .iter()
        .filter(|(_, a)| !is_link_local(a))
        .map(|(n, a)| format!("{n} {a}"))
        .collect();
    c.push(ok(format!("network interfaces: {}", shown.join(", "))));
    for var in [network::GLOO_VAR, network::NCCL_VAR] {
        let Some(v) = get(var).filter(|v| !v.is_empty()) else { continue };
        // NCCL takes a list of prefixes, "^" to exclude and "=" for exact names.
        let names: Vec<&str> = v.trim_start_matches(['^', '=']).split(',').map(str::trim).collect();
        let exact = v.starts_with('=') || var == network::GLOO_VAR;
        let found = names.iter().any(|want| {
            all.iter()
                .any(|(n, _)| if exact { n == want } else { n.starts_with(want) })
        });
        if found || v.starts_with('^') {
            c.push(ok(format!("{var}={v}: the ranks' interface as set")));
        } else {
            c.push(warning(
                format!("{var}={v} names no interface of this host"),
                format!("unset {var} (ringtrain then takes the interface on the route to the master) or name one listed above"),
            ));
        }
    }
    match env {
        Some(env) => {
            let var = [network::GLOO_VAR, network::NCCL_VAR]
                .into_iter()
                .find_map(|n| get(n).map(|v| (n, v)));
            match network::route_to_master(&env.master_addr, env.master_port, var) {
                Ok(r) => c.push(ok(format!(
                    "Gloo and NCCL: this rank would talk over {}{}, {}",
                    r.iface,
                    r.addr.map(|a| format!(" ({a})")).unwrap_or_default(),
                    r.why
                ))),
                Err(e) => c.push(warning(
                    format!("Gloo and NCCL: {e}"),
                    "check MASTER_ADDR (or the first host of SLURM_JOB_NODELIST) resolves and routes from this host",
                )),
            }
        }
        None => {
            // What Gloo alone would bind: the address this host's name resolves to.
            let host = hostname();
            let resolved = (host.as_str(), 0).to_socket_addrs().ok().and_then(|mut a| a.next());
            let text = match resolved {
                Some(a) if a.ip().is_loopback() => format!(
                    "Gloo and NCCL: this host's name {host} resolves to {} (loopback), which PyTorch's Gloo alone would bind; \
                     ringtrain gives both the interface on the route to the master (--master-addr) instead",
                    a.ip()
                ),
                Some(a) => format!(
                    "Gloo and NCCL: ringtrain gives both the interface on the route to the master (--master-addr); this host's name {host} resolves to {}",
                    a.ip()
                ),
                None => format!(
                    "Gloo and NCCL: ringtrain gives both the interface on the route to the master (--master-addr); this host's name {host} does not resolve"
                ),
            };
            c.push(ok(text));
        }
    }
    c
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(v4) => v4.is_link_local(),
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return "?".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Free space where `--out` would be written.
fn out_space(out: &Path) -> Check {
    let dir = system::existing_ancestor(out);
    let at = if dir == std::path::absolute(out).unwrap_or_default() {
        format!("--out {}", out.display())
    } else {
        format!("--out {} (on {}, which exists)", out.display(), dir.display())
    };
    if !system::writable(&dir) {
        return warning(
            format!("{at}: not writable by this user"),
            "choose a folder you may write to, or change its permissions",
        );
    }
    match system::space(&dir) {
        Some(s) if s.free < OUT_WANTED => warning(
            format!("{at}: only {} free of {}", gib(s.free), gib(s.total)),
            format!(
                "free some space or choose another disk: a run keeps best/ and last/ and writes each checkpoint beside the old one before replacing it (wanted: {})",
                gib(OUT_WANTED)
            ),
        ),
        Some(s) => ok(format!("{at}: {} free of {}", gib(s.free), gib(s.total))),
        None => warning(format!("{at}: cannot read its file system's free space"), "check the path"),
    }
}
