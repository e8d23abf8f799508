//! What the build decides about CUDA and NCCL (build_support/cuda.rs, run by build.rs), on
//! made-up libtorch trees, and what `--version` then says of the real build.
mod common;

#[path = "../build_support/cuda.rs"]
mod cuda;

use std::path::Path;

/// A libtorch tree as the torch wheel lays it out: site-packages/torch/lib beside
/// site-packages/nvidia/{cu13,nccl}/include.
fn tree(root: &Path, cuda: bool, headers: bool) -> std::path::PathBuf {
    let lib = root.join("site-packages/torch/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libtorch_cpu.so"), b"").unwrap();
    if cuda {
        std::fs::write(lib.join("libtorch_cuda.so"), b"").unwrap();
    }
    if headers {
        for h in cuda::nccl_headers(&lib) {
            std::fs::create_dir_all(h.parent().unwrap()).unwrap();
            if h.ends_with("target") {
                std::fs::create_dir_all(&h).unwrap();
            } else {
                std::fs::write(&h, b"").unwrap();
            }
        }
    }
    lib
}

#[test]
fn a_cuda_libtorch_without_the_nccl_headers_fails_the_build_naming_the_fix() {
    let d = tempfile::tempdir().unwrap();
    let lib = tree(&d.path().join("a"), true, false);
    let err = cuda::decide(&lib, false).unwrap_err();
    assert!(
        err.contains("has CUDA, but the headers the NCCL backend compiles against are missing"),
        "{err}"
    );
    assert!(err.contains("nccl/include/nccl.h"), "names what is missing: {err}");
    assert!(
        err.contains("pip install \"cuda-toolkit[cccl,crt]==13.0.2\""),
        "names the fix: {err}"
    );
    assert!(err.contains("RINGTRAIN_NO_NCCL=1"), "names the way out: {err}");
    // Asked for explicitly, a build without NCCL still links CUDA.
    assert_eq!(
        cuda::decide(&lib, true).unwrap(),
        cuda::CudaBuild {
            cuda: true,
            nccl_includes: None
        }
    );

    let lib = tree(&d.path().join("b"), true, true);
    let b = cuda::decide(&lib, false).unwrap();
    assert!(b.cuda && b.nccl_includes.is_some(), "{b:?}");

    // A CPU-only libtorch: no CUDA libraries to link, nothing to fail on.
    let lib = tree(&d.path().join("c"), false, false);
    assert_eq!(
        cuda::decide(&lib, false).unwrap(),
        cuda::CudaBuild {
            cuda: false,
            nccl_includes: None
        }
    );
}

#[test]
fn version_says_whether_cuda_and_nccl_are_compiled_in() {
    let torch = common::run_python_code("import torch, os; print(os.path.dirname(torch.__file__))");
    let lib = Path::new(torch.trim()).join("lib");
    let want = cuda::decide(
        &lib,
        std::env::var(cuda::NO_NCCL_VAR).is_ok_and(|v| !v.is_empty() && v != "0"),
    )
    .expect("this build succeeded, so the decision did");
    let o = common::ringtrain(&["--version"]);
    let s = String::from_utf8_lossy(&o.stdout);
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let line = format!(
        "built with: CUDA {}, NCCL {}",
        yes_no(want.cuda),
        yes_no(want.nccl_includes.is_some())
    );
    assert!(s.contains(&line), "expected {line:?} in:\n{s}");
}
