//! `ringtrain doctor`: the rank and world size it reads from torchrun's, Slurm's and Open MPI's
//! variables are the ones a run would take; a missing or small /dev/shm, a full or read-only
//! `--out` disk and an interface variable naming no interface are warnings with a fix.
//! The file-system cases run in a mount namespace of their own (unshare), so the host's /dev
//! and disks are untouched.
use std::process::{Command, Output};

/// The variables of every launcher, and of the interfaces: removed, so only a test's own are seen.
fn without_launcher_vars(cmd: &mut Command) -> &mut Command {
    for v in ringtrain::doctor::LAUNCHER_VARS.iter().chain(&["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]) {
        cmd.env_remove(v);
    }
    cmd
}

fn doctor(envs: &[(&str, &str)], args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringtrain"));
    cmd.arg("doctor").args(args);
    finished(without_launcher_vars(&mut cmd).envs(envs.iter().copied()).output().unwrap())
}

fn finished(o: Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    stdout
}

/// The line that mentions `needle`, checked to carry `tag` (ok or warning); with its fix line.
fn line<'a>(out: &'a str, needle: &str, tag: &str) -> &'a str {
    let lines: Vec<&str> = out.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"));
    assert!(lines[i].starts_with(&format!("{tag} ")), "{:?} is not `{tag}`:\n{out}", lines[i]);
    if tag == "warning" {
        assert!(lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("fix: ")), "a warning without its fix:\n{out}");
    }
    lines[i]
}

#[test]
fn doctor_names_the_rank_and_world_size_each_launcher_gives() {
    let plain = doctor(&[], &[]);
    for needle in ["built against libtorch 2.11.0", "found by", "CPU: ", "memory: ", "network interfaces: "] {
        line(&plain, needle, "ok");
    }
    line(&plain, "no launcher's variables: one process", "ok");

    let torchrun = doctor(
        &[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29411"),
        ],
        &[],
    );
    line(&torchrun, "would run as rank 3 of 8 (local rank 1 of 2), master 127.0.0.1:29411", "ok");
    line(&torchrun, "launcher variables: RANK=3 WORLD_SIZE=8", "ok");
    line(&torchrun, "this rank would talk over lo (127.0.0.1)", "ok");

    // srun's variables: the master is the first host of the node list (it does not resolve
    // here, which is itself a warning).
    let slurm = doctor(
        &[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_NODELIST", "gpu-node[07-08]"),
        ],
        &[],
    );
    line(&slurm, "would run as rank 5 of 8 (local rank 1 of 4), master gpu-node07:29500, from Slurm", "ok");
    line(&slurm, "cannot resolve the master address gpu-node07", "warning");

    let mpi = doctor(
        &[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ],
        &[],
    );
    line(&mpi, "would run as rank 2 of 4 (local rank 2 of 4), master 127.0.0.1:29500, from Open MPI", "ok");

    // Variables that describe no job, and an interface that does not exist.
    let bad = doctor(&[("RANK", "4"), ("WORLD_SIZE", "2")], &[]);
    line(&bad, "rank 4 is out of range for world size 2", "warning");
    let iface = doctor(&[("GLOO_SOCKET_IFNAME", "ib-nonexistent0")], &[]);
    line(&iface, "GLOO_SOCKET_IFNAME=ib-nonexistent0 names no interface of this host", "warning");
    let iface = doctor(&[("NCCL_SOCKET_IFNAME", "lo")], &[]);
    line(&iface, "NCCL_SOCKET_IFNAME=lo: the ranks' interface as set", "ok");
}

/// `ringtrain doctor ARGS` after `setup` (a shell script) in a private mount namespace.
fn doctor_in_namespace(setup: &str, args: &str) -> String {
    let script = format!("set -e\n{setup}\nexec \"$RINGTRAIN\" doctor {args}");
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("RINGTRAIN", env!("CARGO_BIN_EXE_ringtrain"));
    finished(without_launcher_vars(&mut cmd).output().unwrap())
}

#[test]
fn doctor_warns_of_a_missing_or_small_dev_shm_and_a_full_or_read_only_out_disk() {
    let d = tempfile::tempdir().unwrap();
    let t = d.path().to_str().unwrap();

    // A roomy /dev/shm and disk first: both ok (tmpfs sizes are limits, nothing is allocated).
    let roomy = doctor_in_namespace(
        &format!("mount -t tmpfs -o size=8g tmpfs /dev/shm\nmkdir {t}/roomy\nmount -t tmpfs -o size=8g tmpfs {t}/roomy"),
        &format!("--out {t}/roomy/run"),
    );
    line(&roomy, "/dev/shm: 8.0 GiB (tmpfs)", "ok");
    line(&roomy, &format!("--out {t}/roomy/run (on {t}/roomy, which exists): 8.0 GiB free of 8.0 GiB"), "ok");

    // /dev/shm at a container's default size, and an --out disk filled to the last block.
    let small = doctor_in_namespace(
        &format!(
            "mount -t tmpfs -o size=64m tmpfs /dev/shm\nmkdir {t}/full\nmount -t tmpfs -o size=1m tmpfs {t}/full\n\
             dd if=/dev/zero of={t}/full/filler bs=64k 2>/dev/null || true"
        ),
        &format!("--out {t}/full/run"),
    );
    line(&small, "/dev/shm: 64 MiB (tmpfs), small", "warning");
    line(&small, &format!("--out {t}/full/run (on {t}/full, which exists): only 0 MiB free of 1 MiB"), "warning");

    // No /dev/shm at all: a fresh /dev holding only the devices a process needs; and an --out
    // on a read-only file system.
    let missing = doctor_in_namespace(
        &format!(
            "mkdir {t}/olddev {t}/ro\nmount --rbind /dev {t}/olddev\nmount -t tmpfs tmpfs /dev\n\
             for n in null zero random urandom; do touch /dev/$n; mount --bind {t}/olddev/$n /dev/$n; done\n\
             mount -t tmpfs -o ro tmpfs {t}/ro"
        ),
        &format!("--out {t}/ro"),
    );
    line(&missing, "/dev/shm is missing", "warning");
    line(&missing, &format!("--out {t}/ro: not writable"), "warning");
}
