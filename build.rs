//! Compiles the C++ shim (csrc/) against the libtorch that torch-sys found, and makes the
//! binaries load libtorch's CUDA libraries when present and find libtorch without LD_LIBRARY_PATH.
use std::path::PathBuf;

#[path = "build_support/cuda.rs"]
mod cuda;

/// Compiles the Triton kernels (kernels/*.py) into OUT_DIR/kernels with the set-up's Python and
/// writes the table the binary embeds (build_support/compile_kernels.py). Without Triton the
/// table is empty: ringtrain builds and runs, and `--fused-norm` says the build has no kernels.
/// A kernel that fails to compile fails the build.
fn compile_kernels() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("kernels");
    let python = std::env::var("RINGTRAIN_PYTHON").unwrap_or_else(|_| "python3".into());
    let status = std::process::Command::new(&python)
        .arg("build_support/compile_kernels.py")
        .arg(&out)
        .status();
    let why = match status {
        Ok(s) if s.success() => return,
        Ok(s) if s.code() == Some(3) => format!("Triton is not importable by {python}"),
        Ok(s) => {
            eprintln!("error: compiling the fused kernels failed ({s}); see the output above");
            std::process::exit(1);
        }
        Err(e) => format!("cannot run {python} ({e})"),
    };
    println!("cargo:warning={why}: building without fused kernels");
    std::fs::create_dir_all(&out).unwrap();
    let empty = "pub const TRITON_VERSION: &str = \"\";\n\
                 pub const LN_PLAN: LayerNormPlan = LayerNormPlan { tile: 0, programs_per_sm: 0, min_width: 0, \
                 max_width: 0 };\npub static KERNELS: &[KernelImage] = &[];\n";
    std::fs::write(out.join("fused_kernels.rs"), empty).unwrap();
}

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
        "csrc/reducer.cpp",
        "csrc/cuda_graph.cpp",
        "csrc/fused_norm.cpp",
        "csrc/profile.cpp",
        "csrc/export.cpp",
        "csrc/shim.h",
        "csrc/pg.h",
        "csrc/error.h",
        "build_support/cuda.rs",
        "build_support/compile_kernels.py",
        "kernels",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    // Headers installed (or removed) later must rebuild the shim with (or without) NCCL.
    for h in cuda::nccl_headers(&lib) {
        println!("cargo:rerun-if-changed={}", h.display());
    }
    println!("cargo:rerun-if-changed={}", lib.join("libtorch_cuda.so").display());
    println!("cargo:rerun-if-env-changed={}", cuda::NO_NCCL_VAR);
    // Set by scripts/env.sh: a build of another checkout in the shared target directory must not
    // pass for this one's (see there).
    println!("cargo:rerun-if-env-changed=RINGTRAIN_CHECKOUT");
    println!("cargo:rerun-if-env-changed=RINGTRAIN_PYTHON");
    compile_kernels();
    let no_nccl = std::env::var(cuda::NO_NCCL_VAR).is_ok_and(|v| !v.is_empty() && v != "0");
    let plan = match cuda::decide(&lib, no_nccl) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("error: {msg}");
            std::process::exit(1);
        }
    };
    // What --version reports (NCCL it learns from the shim itself).
    println!("cargo:rustc-env=RINGTRAIN_BUILT_CUDA={}", plan.cuda as u8);

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .file("csrc/shim.cpp")
        .file("csrc/dist.cpp")
        .file("csrc/sync_bn.cpp")
        .file("csrc/optim.cpp")
        .file("csrc/reducer.cpp")
        .file("csrc/cuda_graph.cpp")
        .file("csrc/fused_norm.cpp")
        .file("csrc/profile.cpp")
        .file("csrc/export.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        // Gloo's headers come from Debian's libgloo-dev (scripts/setup.sh); its code is the copy
        // built into libtorch_cpu.
        .define("USE_C10D_GLOO", None)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    // NCCL: the CUDA and NCCL headers of the same Python environment (see build_support/cuda.rs).
    if let Some([cuda_inc, nccl_inc]) = &plan.nccl_includes {
        build
            .include(cuda_inc)
            .include(nccl_inc)
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None)
            .define("RT_WITH_NCCL", None)
            .define("RT_WITH_CUDA", None);
    } else if plan.cuda {
        println!("cargo:warning={}=1: building without NCCL", cuda::NO_NCCL_VAR);
    }
    build.compile("ringtrain_shim");

    let lib = lib.display();
    // The final link otherwise keeps only torch_cpu and c10, and CUDA would be silently absent.
    // --no-as-needed keeps the CUDA libraries as dependencies; they load (and find no GPU) on
    // CPU-only machines too. RUNPATH (new dtags) lets LD_LIBRARY_PATH point at another libtorch.
    let mut args = vec![format!("-L{lib}"), "-Wl,--no-as-needed".to_string()];
    if plan.cuda {
        // A CPU-only libtorch has no CUDA libraries to link.
        args.extend(["-ltorch_cuda", "-lc10_cuda"].map(String::from));
    }
    args.extend(
        [
            "-ltorch_cpu",
            "-lc10",
            "-ltorch",
            "-Wl,--as-needed",
            "-Wl,--enable-new-dtags",
        ]
        .map(String::from),
    );
    args.push(format!("-Wl,-rpath,{lib}"));
    for arg in args {
        // All linked targets: the binary, integration tests and the library's unit tests.
        println!("cargo:rustc-link-arg={arg}");
    }
}
