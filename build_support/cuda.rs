//! What build.rs decides about CUDA and NCCL from the libtorch it links (kept apart so a test
//! can run the same decision on a made-up directory tree).
use std::path::{Path, PathBuf};

/// Set to build without NCCL on purpose (multi-GPU runs then use Gloo).
pub const NO_NCCL_VAR: &str = "RINGTRAIN_NO_NCCL";

#[derive(Debug, PartialEq)]
pub struct CudaBuild {
    /// libtorch has its CUDA libraries: link them, so CUDA loads when a GPU is present.
    pub cuda: bool,
    /// The CUDA and NCCL include directories the shim compiles its NCCL backend against.
    pub nccl_includes: Option<[PathBuf; 2]>,
}

/// The CUDA and NCCL include directories of the Python environment whose torch/lib is `lib`.
fn include_dirs(lib: &Path) -> [PathBuf; 2] {
    let nvidia = lib.join("../../nvidia");
    [nvidia.join("cu13/include"), nvidia.join("nccl/include")]
}

/// The headers that must exist for the NCCL part of the shim (the CUDA ones completed by the
/// cuda-toolkit[cccl,crt] wheel).
pub fn nccl_headers(lib: &Path) -> Vec<PathBuf> {
    let [cuda, nccl] = include_dirs(lib);
    vec![
        cuda.join("nv/target"),
        cuda.join("crt/host_config.h"),
        nccl.join("nccl.h"),
    ]
}

/// CUDA when libtorch has it; NCCL with it unless `no_nccl`. A CUDA libtorch without the headers
/// is an error that says how to get them: a build that silently drops NCCL would make every
/// multi-GPU run fall back to Gloo.
pub fn decide(lib: &Path, no_nccl: bool) -> Result<CudaBuild, String> {
    let cuda = lib.join("libtorch_cuda.so").exists();
    if !cuda || no_nccl {
        return Ok(CudaBuild {
            cuda,
            nccl_includes: None,
        });
    }
    let missing: Vec<String> = nccl_headers(lib)
        .into_iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "libtorch in {} has CUDA, but the headers the NCCL backend compiles against are missing: {}. \
             Install them into the same Python environment with \
             `python -m pip install \"cuda-toolkit[cccl,crt]==13.0.2\" nvidia-nccl-cu13` (scripts/setup.sh does this), \
             or set {NO_NCCL_VAR}=1 to build without NCCL (multi-GPU runs then use Gloo)",
            lib.display(),
            missing.join(", ")
        ));
    }
    Ok(CudaBuild {
        cuda,
        nccl_includes: Some(include_dirs(lib)),
    })
}
