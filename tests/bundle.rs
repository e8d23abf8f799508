//! The bundle for machines with PyTorch but no Rust (scripts/bundle.sh), and the GPU battery
//! (bench/gpu.sh), checked on this machine: the bundle's binary keeps no path of the build
//! machine and loads the libtorch its launcher finds; the battery runs its whole sequence dry on
//! the CPU, from a bundle, in a folder that is not the repository.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::text;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `scripts/bundle.sh args...` with the binary under test.
fn bundle(args: &[&Path]) -> Output {
    Command::new("bash")
        .arg(repo().join("scripts/bundle.sh"))
        .args(args)
        .env("RINGTRAIN_BIN", env!("CARGO_BIN_EXE_ringtrain"))
        .output()
        .unwrap()
}

fn bundled(dir: &Path) -> PathBuf {
    let b = dir.join("bundle");
    let o = bundle(&[&b]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    b
}

/// The bundle's launcher (or another program of it), run from `cwd` with nothing on the library
/// path: what it loads, it found itself.
fn launch(program: &Path, args: &[&str], cwd: &Path, envs: &[(&str, &str)]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env_remove("LD_LIBRARY_PATH")
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}


#[test]
fn the_bundle_finds_libtorch_through_its_launcher_only() {
    let d = tempfile::tempdir().unwrap();
    let b = bundled(d.path());
    for f in [
        "ringtrain",
        "bin/ringtrain",
        "BUILD",
        "recipes/demo.toml",
        "bench/gpu.sh",
        "bench/gpu_battery.py",
        "bench/jpeg_copy.py",
        "bench/torch_step.py",
        "bench/torch_loader.py",
        "bench/fused_tiles.py",
        "kernels/bn_act.py",
        "kernels/launch.py",
    ] {
        assert!(b.join(f).is_file(), "the bundle lacks {f}");
    }
    let build = std::fs::read_to_string(b.join("BUILD")).unwrap();
    assert!(build.contains("libtorch=2.11.0\n") && build.contains("torch=2.11.0"), "{build}");

    // The binary alone cannot start: the build's libtorch is not in its search path.
    let bare = launch(&b.join("bin/ringtrain"), &["--version"], d.path(), &[]);
    assert!(
        !bare.status.success() && text(&bare).contains("libtorch"),
        "the bundled binary still finds the build's libtorch by itself: {}",
        text(&bare)
    );
    // The launcher finds it: through $RINGTRAIN_PYTHON's torch, or $RINGTRAIN_LIBTORCH.
    let torch_lib = common::run_python_code("import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))");
    let torch_lib = torch_lib.trim();
    for envs in [vec![], vec![("RINGTRAIN_LIBTORCH", torch_lib)]] {
        let o = launch(&b.join("ringtrain"), &["--version"], d.path(), &envs);
        assert!(o.status.success() && text(&o).contains("libtorch 2.11.0"), "{envs:?}: {}", text(&o));
        // The fused kernels were compiled into the bundled binary.
        let fused = ringtrain::model::fused::describe();
        assert!(fused.contains("kernels for sm_80, sm_90, sm_100"), "{fused}");
        assert!(text(&o).contains(&format!("fused kernels (--fused-norm): {fused}")), "{}", text(&o));
    }
    // doctor says how the launcher found it.
    let o = launch(&b.join("ringtrain"), &["doctor"], d.path(), &[]);
    assert!(o.status.success() && text(&o).contains("found by the bundle's launcher: the torch of"), "{}", text(&o));
    // What it cannot find, it names, in one line, with exit code 2.
    let nowhere = d.path().join("nowhere");
    // A Python without torch: the set-up's, blind to its site-packages.
    let bare_python = d.path().join("bare-python");
    std::fs::write(&bare_python, format!("#!/bin/sh\nexec '{}' -S \"$@\"\n", common::python())).unwrap();
    let executable = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
    std::fs::set_permissions(&bare_python, executable).unwrap();
    for (envs, says) in [
        (vec![("RINGTRAIN_LIBTORCH", nowhere.to_str().unwrap())], "holds no libtorch_cpu.so"),
        (vec![("RINGTRAIN_PYTHON", nowhere.to_str().unwrap())], "cannot find libtorch: no "),
        (vec![("RINGTRAIN_PYTHON", bare_python.to_str().unwrap())], "has no torch"),
    ] {
        let o = launch(&b.join("ringtrain"), &["--version"], d.path(), &envs);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.code() == Some(2) && err.contains(says) && err.trim().lines().count() == 1,
            "{envs:?}: {err}"
        );
    }

    // A second bundle replaces the first; a folder holding anything else is refused, untouched.
    assert!(bundle(&[&b]).status.success());
    let other = d.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    let o = bundle(&[&other]);
    assert!(o.status.code() == Some(2) && text(&o).contains("is not a ringtrain bundle"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(other.join("notes.txt")).unwrap(), "mine");
}

/// Checks the dry battery of the test suite runs: one of each kind of command and reader (the
/// others build theirs with the same functions): 2 min 45 s on 2 idle cores, a part of the whole
/// sequence. The whole sequence runs dry before a GPU session: `bench/gpu.sh --dry-run`.
const DRY_CHECKS: &[&str] = &[
    "environment",
    "doctor",
    "demo",
    "one_epoch_bf16",
    "eval_predict_vs_cpu",
    "nccl_world_size_1",
    "two_ranks_one_gpu_gloo",
    "sigterm_then_resume",
    "train_cuda_graphs",
    "fused_norm_numerics",
    "fused_norm_training",
    "fused_norm_training_convnext",
    "step_resnet50_bf16",
    "step_resnet50_bf16_torch_compile",
    "step_resnet18-cifar_bf16_cuda_graphs",
    "end_to_end_resnet18-cifar_bf16_raw_pack",
    "profile_resnet50_bf16",
    "fused_tiles",
];

/// The GPU battery on the CPU at tiny sizes, from a bundle, so that a typo in a command line or a
/// reader cannot waste a GPU run: the sequence names every check, and those of DRY_CHECKS run and
/// pass (the others are recorded as left out).
#[test]
fn the_gpu_battery_runs_dry_on_the_cpu_from_a_bundle() {
    let d = tempfile::tempdir().unwrap();
    let b = bundled(d.path());
    let out = d.path().join("battery");
    // The default budget (570 s) is a GPU call's; dry, these checks take about 3 minutes on 2
    // idle cores, and more on busy ones.
    let only = DRY_CHECKS.join(",");
    let o = launch(
        Path::new("bash"),
        &[
            b.join("bench/gpu.sh").to_str().unwrap(),
            "--dry-run",
            "--budget",
            "3600",
            "--only",
            &only,
            "--out",
            out.to_str().unwrap(),
        ],
        d.path(),
        &[],
    );
    let report: serde_json::Value = match std::fs::read(out.join("battery.json")) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
        Err(e) => panic!("no battery.json ({e}): {}", text(&o)),
    };
    assert!(o.status.success(), "{}\n{report:#}", text(&o));
    assert_eq!(report["dry_run"], true);
    assert!(report["ringtrain"].as_str().unwrap().ends_with("bundle/ringtrain"), "{}", report["ringtrain"]);
    let checks = report["checks"].as_array().unwrap();
    let names: Vec<String> = checks.iter().map(|c| c["name"].as_str().unwrap().to_string()).collect();
    let mut want: Vec<String> = [
        "environment",
        "doctor",
        "demo",
        "one_epoch_fp16",
        "one_epoch_bf16",
        "eval_predict_vs_cpu",
        "nccl_world_size_1",
        "two_ranks_one_gpu_gloo",
        "two_ranks_one_gpu_sync_bn",
        "fp16_overflow_backs_off",
        "sigterm_then_resume",
        "train_cuda_graphs",
        "train_cuda_graphs_fused_norm",
        "fused_norm_numerics",
        "fused_norm_training",
        "fused_norm_training_convnext",
        "host_syncs_per_step",
    ]
    .map(String::from)
    .to_vec();
    for (model, compiled) in [("resnet50", &["bf16", "fp16"][..]), ("resnet18-cifar", &["bf16"][..])] {
        for step in ["bf16", "fp16", "ringtrain_defaults"] {
            want.push(format!("step_{model}_{step}"));
        }
        want.extend(compiled.iter().map(|amp| format!("step_{model}_{amp}_torch_compile")));
        if model == "resnet18-cifar" {
            // The CUDA graph step against eager and torch.compile's CUDA-graph mode (dry: the
            // refusal on the CPU).
            let graphed = ["bf16_cuda_graphs", "bf16_cuda_graphs_fused_norm", "bf16_torch_compile_reduce_overhead"];
            want.extend(graphed.map(|s| format!("step_{model}_{s}")));
        }
    }
    want.push("end_to_end_resnet50_bf16".into());
    // Decode once: from a raw pack, and with the set on the device.
    for model in ["resnet50", "resnet18-cifar"] {
        want.extend(["raw_pack", "on_device"].map(|how| format!("end_to_end_{model}_bf16_{how}")));
    }
    want.extend(["step_convnext_tiny_bf16", "step_vit_b_16_bf16"].map(String::from));
    // --fused-norm against eager PyTorch, then ringtrain, eager and torch.compile profiled.
    for model in ["resnet50", "convnext_tiny"] {
        want.extend(["bf16", "fp16"].map(|amp| format!("step_{model}_{amp}_fused_norm")));
    }
    want.extend(
        [
            "profile_resnet50_bf16",
            "profile_resnet50_bf16_fused_norm",
            "profile_convnext_tiny_bf16",
            "profile_convnext_tiny_bf16_fused_norm",
            "fused_tiles",
        ]
        .map(String::from),
    );
    assert_eq!(names, want);
    for c in checks {
        match DRY_CHECKS.contains(&c["name"].as_str().unwrap()) {
            true => assert_eq!(c["passed"], true, "{c:#}"),
            false => assert_eq!(c["skipped"], "not named by --only", "{c:#}"),
        }
    }
    assert!(DRY_CHECKS.iter().all(|n| names.iter().any(|m| m == n)), "a name of DRY_CHECKS is not a check");
    // The readers found the figures the commands printed.
    let details = |name: &str| &checks.iter().find(|c| c["name"] == name).unwrap()["details"];
    assert!(details("step_resnet50_bf16")["ratio"].as_f64().unwrap() > 0.0);
    // fp32: the CPU's bound; the low precision (bf16 here, fp16 on CUDA): within 3x of its own
    // noise, a different split of the same images.
    let ranks = details("two_ranks_one_gpu_gloo");
    assert!(ranks["fp32"]["dual_vs_single"].as_f64().unwrap() <= 5e-6, "{ranks:#}");
    let low = &ranks["fp16"];
    assert!(low["accum_vs_single"].as_f64().unwrap() > 1e-4, "bf16 changed nothing? {ranks:#}");
    assert!(low["dual_vs_single"].as_f64().unwrap() <= low["bound"].as_f64().unwrap(), "{ranks:#}");
    assert_eq!(details("sigterm_then_resume")["deterministic"]["bit_identical"], true);
    // On the CPU --fused-norm falls back, says so, and changes nothing.
    for check in ["fused_norm_training", "fused_norm_training_convnext"] {
        let fused = details(check);
        assert_eq!(fused["fused_vs_unfused"].as_f64(), Some(0.0), "{fused:#}");
        assert_eq!(fused["fell_back"].as_array().unwrap().len(), 1, "{fused:#}");
    }
    // The profile table has the three traces' columns and the classes' rows.
    let table: Vec<&str> =
        details("profile_resnet50_bf16")["table"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert!(table[0].contains("ringtrain (CPU)") && table[0].contains("eager (CPU)") && table[0].contains("compile (CPU)"));
    assert!(table.iter().any(|l| l.starts_with("convolution forward")), "{table:?}");
    let doctor = details("doctor")["lines"].as_array().unwrap();
    assert!(doctor.iter().any(|l| l.as_str().unwrap().contains("found by the bundle's launcher")), "{doctor:?}");
    assert!(out.join("battery.log").is_file());
}

/// The battery's reading of nvidia-smi's samples around a speed check (gpu_battery.clock_summary):
/// a GPU at its full clock passes; one slowed for heat (as an H100 of 2026-11-27 was, mid-battery)
/// or running far below its maximum clock is named, so its figures are not compared; a power cap
/// alone, and idle samples, are not.
#[test]
fn the_battery_names_a_gpu_slowed_mid_check() {
    let code = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
from gpu_battery import clock_summary as s
full = ["100, 1980, 1980, 70, 520.1, 0x0000000000000000", "98, 1965, 1980, 71, 510.0, 0x0000000000000004"]
idle = ["0, 345, 1980, 60, 97.2, 0x0000000000000001"]
heat = ["100, 1905, 1980, 86, 190.5, 0x0000000000000020"]
slow = ["100, 990, 1980, 72, 300.0, 0x0000000000000000", "99, 1005, 1980, 72, 300.0, 0x0000000000000004"]
print(json.dumps([s(full + idle), s(full + heat + idle), s(slow + ["[N/A]"]), s(idle)]))
"#;
    let o = Command::new(common::python())
        .args(["-c", code, repo().join("bench").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["slowed"], serde_json::Value::Null, "{v}");
    assert_eq!(v[0]["busy_samples"], 2, "idle samples left out: {v}");
    assert_eq!(v[1]["slowed"], "slowed by heat (software)", "{v}");
    assert_eq!(v[1]["temperature_max_c"], 86.0, "{v}");
    assert_eq!(v[2]["slowed"], "median SM clock 1005 of 1980 MHz", "{v}");
    assert_eq!(v[3]["busy_samples"], 0, "{v}");
}
