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
    println!("cargo:rerun-if-changed=csrc/shim.cpp");
    println!("cargo:rerun-if-changed=csrc/shim.h");

    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("csrc/shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
        .compile("ringtrain_shim");

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
