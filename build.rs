//! Compiles the C++ shim (csrc/) against the libtorch that torch-sys found, and makes the
//! binaries load libtorch's CUDA libraries when present and find libtorch without LD_LIBRARY_PATH.
use std::path::PathBuf;

fn main() {
    // torch-sys declares `links = "tch"` and exports the library directory it linked against.
    let lib = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB")
            .expect("torch-sys did not export DEP_TCH_LIBTORCH_LIB; run scripts/setup.sh"),
    );
    let include = lib.join("../include");
    for f in [
        "csrc/shim.cpp",
        "csrc/dist.cpp",
        "csrc/sync_bn.cpp",
        "csrc/optim.cpp",
        "csrc/shim.h",
        "csrc/pg.h",
        "csrc/error.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .file("csrc/shim.cpp")
        .file("csrc/dist.cpp")
        .file("csrc/sync_bn.cpp")
        .file("csrc/optim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        // Gloo's headers come from Debian's libgloo-dev (scripts/setup.sh); its code is the copy
        // built into libtorch_cpu.
        .define("USE_C10D_GLOO", None)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    // NCCL: the CUDA and NCCL headers of the same Python environment (the CUDA ones completed by
    // the cuda-toolkit[cccl,crt] wheel). Without them the shim builds with Gloo only.
    let nvidia = lib.join("../../nvidia");
    let (cuda_inc, nccl_inc) = (nvidia.join("cu13/include"), nvidia.join("nccl/include"));
    if cuda_inc.join("nv/target").exists()
        && cuda_inc.join("crt/host_config.h").exists()
        && nccl_inc.join("nccl.h").exists()
    {
        build
            .include(&cuda_inc)
            .include(&nccl_inc)
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None)
            .define("RT_WITH_NCCL", None)
            .define("RT_WITH_CUDA", None);
    } else {
        println!(
            "cargo:warning=CUDA/NCCL headers not found under {}: building without NCCL",
            nvidia.display()
        );
    }
    build.compile("ringtrain_shim");

    let lib = lib.display();
    // The final link otherwise keeps only torch_cpu and c10, and CUDA would be silently absent.
    // --no-as-needed keeps the CUDA libraries as dependencies; they load (and find no GPU) on
    // CPU-only machines too. RUNPATH (new dtags) lets LD_LIBRARY_PATH point at another libtorch.
    for arg in [
        format!("-L{lib}"),
        "-Wl,--no-as-needed".to_string(),
        "-ltorch_cuda".to_string(),
        "-lc10_cuda".to_string(),
        "-ltorch_cpu".to_string(),
        "-lc10".to_string(),
        "-ltorch".to_string(),
        "-Wl,--as-needed".to_string(),
        "-Wl,--enable-new-dtags".to_string(),
        format!("-Wl,-rpath,{lib}"),
    ] {
        // All linked targets: the binary, integration tests and the library's unit tests.
        println!("cargo:rustc-link-arg={arg}");
    }
}
