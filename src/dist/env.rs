//! Who am I in the job? Rank, world size, local rank and the master's address, read from (in this
//! order) ringtrain's own launcher or torchrun (`RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
//! MASTER_ADDR MASTER_PORT`), Slurm's `srun` (`SLURM_PROCID ...`, master from the first host of
//! `SLURM_JOB_NODELIST` unless `MASTER_ADDR` is set) and Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
//! Flags given to `train` (`--master-addr`, `--master-port`) override the master found here.
use anyhow::Result;

use crate::bail_user;

pub const DEFAULT_MASTER_PORT: u16 = 29500;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// Where the values came from, for the start-up line.
    pub source: &'static str,
}

fn parse<T: std::str::FromStr>(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<T>> {
    match get(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse() {
            Ok(x) => Ok(Some(x)),
            Err(_) => bail_user!("environment variable {name}={v:?} is not a valid number"),
        },
    }
}

/// The first host of a Slurm node list: `node[03-05,07],gpu1` → `node03`.
pub fn first_slurm_host(nodelist: &str) -> String {
    let first = match nodelist.find(['[', ',']) {
        Some(i) if nodelist.as_bytes()[i] == b'[' => {
            let prefix = &nodelist[..i];
            let inner = &nodelist[i + 1..];
            let first_range = inner.split([',', ']']).next().unwrap_or("");
            format!("{prefix}{}", first_range.split('-').next().unwrap_or(""))
        }
        Some(i) => nodelist[..i].to_string(),
        None => nodelist.to_string(),
    };
    first.trim().to_string()
}

/// `SLURM_STEP_TASKS_PER_NODE` like `4(x2),3` → tasks on the first node (4).
fn slurm_tasks_per_node(v: &str) -> Option<usize> {
    v.split([',', '(']).next()?.trim().parse().ok()
}

/// The distributed environment, or None for a single-process run.
pub fn detect(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<DistEnv>> {
    let master_port = parse::<u16>(get, "MASTER_PORT")?.unwrap_or(DEFAULT_MASTER_PORT);
    if let (Some(rank), Some(world)) = (parse::<usize>(get, "RANK")?, parse::<usize>(get, "WORLD_SIZE")?) {
        let local_rank = parse(get, "LOCAL_RANK")?.unwrap_or(rank);
        let env = DistEnv {
            rank,
            world_size: world,
            local_rank,
            local_world_size: parse(get, "LOCAL_WORLD_SIZE")?.unwrap_or(world),
            master_addr: get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port,
            source: "torchrun-style environment (RANK, WORLD_SIZE)",
        };
        return check(env).map(Some);
    }
    // srun sets SLURM_STEP_NUM_TASKS for the tasks of a step; a batch script alone is not a job step.
    if let (Some(rank), Some(world)) = (
        parse::<usize>(get, "SLURM_PROCID")?,
        parse::<usize>(get, "SLURM_STEP_NUM_TASKS")?,
    ) {
        if world > 1 {
            let master = get("MASTER_ADDR").or_else(|| {
                get("SLURM_STEP_NODELIST")
                    .or_else(|| get("SLURM_JOB_NODELIST"))
                    .or_else(|| get("SLURM_NODELIST"))
                    .map(|l| first_slurm_host(&l))
            });
            let Some(master_addr) = master else {
                bail_user!("Slurm job without SLURM_JOB_NODELIST or MASTER_ADDR: cannot find the master")
            };
            let env = DistEnv {
                rank,
                world_size: world,
                local_rank: parse(get, "SLURM_LOCALID")?.unwrap_or(0),
                local_world_size: get("SLURM_STEP_TASKS_PER_NODE")
                    .as_deref()
                    .and_then(slurm_tasks_per_node)
                    .unwrap_or(1),
                master_addr,
                master_port,
                source: "Slurm (SLURM_PROCID, SLURM_STEP_NUM_TASKS)",
            };
            return check(env).map(Some);
        }
    }
    if let (Some(rank), Some(world)) = (
        parse::<usize>(get, "OMPI_COMM_WORLD_RANK")?,
        parse::<usize>(get, "OMPI_COMM_WORLD_SIZE")?,
    ) {
        if world > 1 {
            let local_world_size = parse(get, "OMPI_COMM_WORLD_LOCAL_SIZE")?.unwrap_or(world);
            let master_addr = match get("MASTER_ADDR") {
                Some(a) => a,
                None if local_world_size == world => "127.0.0.1".into(),
                None => bail_user!(
                    "mpirun across nodes needs MASTER_ADDR (the host of rank 0), e.g. mpirun -x MASTER_ADDR=..."
                ),
            };
            let env = DistEnv {
                rank,
                world_size: world,
                local_rank: parse(get, "OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0),
                local_world_size,
                master_addr,
                master_port,
                source: "Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)",
            };
            return check(env).map(Some);
        }
    }
    Ok(None)
}

fn check(env: DistEnv) -> Result<DistEnv> {
    if env.world_size == 0 || env.rank >= env.world_size {
        bail_user!(
            "rank {} is out of range for world size {} ({})",
            env.rank,
            env.world_size,
            env.source
        );
    }
    if env.local_world_size == 0 || env.local_rank >= env.local_world_size {
        bail_user!(
            "local rank {} is out of range for local world size {} ({})",
            env.local_rank,
            env.local_world_size,
            env.source
        );
    }
    Ok(env)
}

pub fn from_process_env() -> Result<Option<DistEnv>> {
    detect(&|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<DistEnv>> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        detect(&move |k| m.get(k).cloned())
    }

    #[test]
    fn torchrun_variables() {
        let e = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank, e.local_world_size), (3, 8, 1, 2));
        assert_eq!((e.master_addr.as_str(), e.master_port), ("10.1.2.3", 1234));
    }

    #[test]
    fn slurm_srun_step_with_nodelist() {
        let e = env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank, e.local_world_size), (5, 8, 1, 4));
        assert_eq!((e.master_addr.as_str(), e.master_port), ("gpu07", DEFAULT_MASTER_PORT));
    }

    #[test]
    fn slurm_batch_script_alone_is_single_process() {
        assert_eq!(env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "8")]).unwrap(), None);
    }

    #[test]
    fn open_mpi_single_node_defaults_to_loopback() {
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.local_rank, e.master_addr.as_str()), (1, 1, "127.0.0.1"));
        let multi = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]);
        assert!(multi.unwrap_err().to_string().contains("MASTER_ADDR"));
    }

    #[test]
    fn node_lists_and_bad_values() {
        assert_eq!(first_slurm_host("node[03-05,07],gpu1"), "node03");
        assert_eq!(first_slurm_host("a1,b2"), "a1");
        assert_eq!(first_slurm_host("single"), "single");
        assert!(env(&[("RANK", "x"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string()
            .contains("RANK"));
        assert!(env(&[("RANK", "2"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string()
            .contains("out of range"));
        assert_eq!(env(&[]).unwrap(), None);
    }
}
