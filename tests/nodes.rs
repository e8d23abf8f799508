//! Two nodes on one machine: two network namespaces joined by a veth pair, each with its own
//! address, made by the test and torn down after it (skipped, saying why, where the kernel or
//! the user may not make them). Inside each, as on many real nodes, the host's name resolves to
//! a loopback address, and no interface variable (GLOO_SOCKET_IFNAME) is set: ringtrain must
//! find the interface on the route to the master by itself.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{rel_diff, text, weights};

const BIN: &str = env!("CARGO_BIN_EXE_ringtrain");

/// Two namespaces `a` (node 0, the master) and `b` (node 1) on 10.77.K.0/24, with host names
/// NAME-1 and NAME-2 for them in their own hosts file (/etc/netns/NS/hosts, which `ip netns exec`
/// mounts over /etc/hosts).
struct Nodes {
    ns: [String; 2],
    addr: [String; 2],
    /// Host names of the two nodes, as a Slurm node list names them.
    host: [String; 2],
    /// The veth end inside each namespace.
    link: [String; 2],
}

fn sh(args: &[&str]) -> Result<(), String> {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    match o.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
    }
}

impl Nodes {
    /// None (and the reason on stderr) where namespaces cannot be made here.
    fn new() -> Option<Nodes> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let k = NEXT.fetch_add(1, Ordering::SeqCst);
        let id = format!("rt{}n{k}", std::process::id());
        let subnet = 100 + (std::process::id() % 50) * 3 + k % 3; // 10.77.<subnet>.0/24, per test
        let n = Nodes {
            ns: [format!("{id}a"), format!("{id}b")],
            addr: [format!("10.77.{subnet}.1"), format!("10.77.{subnet}.2")],
            host: [format!("{id}-1"), format!("{id}-2")],
            link: [format!("{id}va"), format!("{id}vb")],
        };
        match n.make() {
            Ok(()) => Some(n),
            Err(why) => {
                eprintln!("SKIPPED: cannot make network namespaces on this machine ({why})");
                None
            }
        }
    }

    fn make(&self) -> Result<(), String> {
        let hostname = ringtrain::train::lifecycle::run_lock::hostname();
        for i in 0..2 {
            sh(&["ip", "netns", "add", &self.ns[i]])?;
            // The host's name on loopback (Debian's 127.0.1.1 line), the nodes by name.
            let dir = PathBuf::from("/etc/netns").join(&self.ns[i]);
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let hosts = format!(
                "127.0.0.1 localhost\n127.0.1.1 {hostname}\n{} {}\n{} {}\n",
                self.addr[0], self.host[0], self.addr[1], self.host[1]
            );
            std::fs::write(dir.join("hosts"), hosts).map_err(|e| e.to_string())?;
        }
        sh(&[
            "ip",
            "link",
            "add",
            &self.link[0],
            "type",
            "veth",
            "peer",
            "name",
            &self.link[1],
        ])?;
        for i in 0..2 {
            sh(&["ip", "link", "set", &self.link[i], "netns", &self.ns[i]])?;
            sh(&[
                "ip",
                "-n",
                &self.ns[i],
                "addr",
                "add",
                &format!("{}/24", self.addr[i]),
                "dev",
                &self.link[i],
            ])?;
            sh(&["ip", "-n", &self.ns[i], "link", "set", &self.link[i], "up"])?;
            sh(&["ip", "-n", &self.ns[i], "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// ringtrain on node `i` with `args` and `envs` (no interface variable unless `envs` sets one).
    fn start(&self, i: usize, args: &[String], envs: &[(&str, String)]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.ns[i], BIN])
            .args(args)
            .env_remove("GLOO_SOCKET_IFNAME")
            .env_remove("NCCL_SOCKET_IFNAME")
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting ringtrain in a namespace")
    }

    /// Cuts (or restores) node `i`'s link.
    fn link(&self, i: usize, up: bool) {
        sh(&[
            "ip",
            "-n",
            &self.ns[i],
            "link",
            "set",
            &self.link[i],
            if up { "up" } else { "down" },
        ])
        .unwrap();
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = sh(&["ip", "netns", "del", ns]); // takes its veth end, and so the pair, along
            let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(ns));
        }
    }
}

/// Waits for both nodes, at most `limit`; kills what is left after it.
fn wait_both(children: [Child; 2], limit: Duration) -> [(Output, Duration); 2] {
    let start = Instant::now();
    let mut out = Vec::new();
    for mut c in children {
        loop {
            if c.try_wait().unwrap().is_some() || start.elapsed() > limit {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = c.kill();
        out.push((c.wait_with_output().unwrap(), start.elapsed()));
    }
    out.try_into().unwrap()
}


struct Data {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

fn data() -> Data {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::Shapes {
        size: 36,
        seed: 4,
        first: 0,
    }
    .write(&root.join("train"), &["circle", "cross", "ring"], 8);
    common::Shapes {
        size: 36,
        seed: 4,
        first: 10_000,
    }
    .write(&root.join("val"), &["circle", "cross", "ring"], 4);
    Data { _dir: dir, root }
}

/// LeNet-5 (no BatchNorm), 24 images, 2 epochs of 3 steps of the global batch 8 (`lr` and
/// `epochs` as given for the initial weights).
fn train_args_with(d: &Data, out: &Path, lr: &str, epochs: usize, extra: &str) -> Vec<String> {
    let mut a = common::train_val_args(
        &d.root.join("train"),
        &d.root.join("val"),
        out,
        &format!(
            "--model lenet5 --img-size 32 --epochs {epochs} --batch-size 8 --lr {lr} --sched constant --device cpu \
             --seed 1 --workers 1 --log-every 0"
        ),
    );
    a.extend(extra.split_whitespace().map(String::from));
    a
}

fn train_args(d: &Data, out: &Path, extra: &str) -> Vec<String> {
    train_args_with(d, out, "0.05", 2, extra)
}

// 2 nodes of 1 rank against 1 process with the same global batch: only the split of the batch,
// and so the order of the sums, differs. The dist test's LeNet-5 bound (tests/dist.rs).
const SAME: f64 = 5e-6;

#[test]
fn two_nodes_train_as_one_process_under_three_launchers_with_no_interface_variable() {
    let Some(nodes) = Nodes::new() else { return };
    let d = data();
    let single = d.root.join("single");
    let o = Command::new(BIN).args(train_args(&d, &single, "")).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // The initial weights: one step too small to change a float.
    let init = d.root.join("init");
    let o = Command::new(BIN)
        .args(train_args_with(&d, &init, "1e-30", 1, ""))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let (init, single) = (weights(&init), weights(&single));

    let master = &nodes.addr[0];
    type Setup<'a> = Box<dyn Fn(usize, u16) -> (String, Vec<(&'static str, String)>) + 'a>;
    let launchers: [(&str, Setup); 3] = [
        (
            "the built-in launcher",
            Box::new(|i, port| {
                (
                    format!(
                        "--nnodes 2 --node-rank {i} --nproc-per-node 1 --master-addr {master} --master-port {port}"
                    ),
                    vec![],
                )
            }),
        ),
        (
            "torchrun's variables",
            Box::new(|i, port| {
                let v = [
                    ("RANK", i.to_string()),
                    ("WORLD_SIZE", "2".into()),
                    ("LOCAL_RANK", "0".into()),
                    ("LOCAL_WORLD_SIZE", "1".into()),
                    ("MASTER_ADDR", master.clone()),
                    ("MASTER_PORT", port.to_string()),
                ];
                (String::new(), v.to_vec())
            }),
        ),
        (
            "Slurm's variables",
            Box::new(|i, port| {
                // The node list as Slurm writes it: a hostlist expression, whose first host is
                // the master (resolved through the nodes' hosts file).
                let prefix = nodes.host[0].trim_end_matches("-1");
                let v = [
                    ("SLURM_PROCID", i.to_string()),
                    ("SLURM_STEP_NUM_TASKS", "2".into()),
                    ("SLURM_LOCALID", "0".into()),
                    ("SLURM_STEP_TASKS_PER_NODE", "1(x2)".into()),
                    ("SLURM_NODELIST", format!("{prefix}-[1-2]")),
                    ("MASTER_PORT", port.to_string()),
                ];
                (String::new(), v.to_vec())
            }),
        ),
    ];
    for (k, (how, setup)) in launchers.iter().enumerate() {
        let port = 29400 + (std::process::id() % 500) as u16 + k as u16;
        let outs = [d.root.join(format!("node0-{k}")), d.root.join(format!("node1-{k}"))];
        let children = [0, 1].map(|i| {
            let (flags, envs) = setup(i, port);
            nodes.start(
                i,
                &train_args(&d, &outs[i], &format!("{flags} --dist-timeout 60")),
                &envs,
            )
        });
        let [(o0, _), (o1, took)] = wait_both(children, Duration::from_secs(120));
        let (t0, t1) = (text(&o0), text(&o1));
        assert!(
            o0.status.success() && o1.status.success(),
            "{how}:\nnode 0:\n{t0}\nnode 1:\n{t1}"
        );
        // Each node names the interface it talks on: its veth end, found by the route to the master.
        for (i, t) in [&t0, &t1].iter().enumerate() {
            let want = format!("over {} ({})", nodes.link[i], nodes.addr[i]);
            assert!(
                t.contains(&want) && t.contains("on the route to the master"),
                "{how}, node {i}: {t}"
            );
            assert!(
                !t.contains("gloo/"),
                "{how}, node {i}: Gloo's own lines reached the terminal: {t}"
            );
        }
        let dual = weights(&outs[0]);
        let r = rel_diff(&dual, &single, &single, &init);
        eprintln!("2 nodes ({how}) vs 1 process: {r:.1e} of the update, in {took:.1?}");
        assert!(
            r <= SAME,
            "{how}: 2 nodes differ from one process by {r:.1e} of the update (bound {SAME})"
        );
        assert!(!outs[1].join("last").exists(), "{how}: only rank 0 writes");
    }
}

/// The link cut mid-epoch (`ip link set ... down` on node 1): neither node hears from the other
/// again. Each names the peer that stopped answering (node 0 the rank, node 1 the master, which
/// serves the store), and both exit non-zero within the timeout plus the watchdog's beat, with
/// node 0's last/ intact.
#[test]
fn a_cut_link_ends_both_nodes_naming_the_silent_peer() {
    const TIMEOUT: u64 = 16;
    let Some(nodes) = Nodes::new() else { return };
    let d = data();
    let port = 29300 + (std::process::id() % 500) as u16;
    let outs = [d.root.join("cut0"), d.root.join("cut1")];
    let children = [0, 1].map(|i| {
        let flags = format!(
            "--nnodes 2 --node-rank {i} --nproc-per-node 1 --master-addr {} --master-port {port} --dist-timeout {TIMEOUT} \
             --epochs 400 --save-every-steps 3",
            nodes.addr[0]
        );
        let mut a = train_args(&d, &outs[i], &flags);
        let e = a.iter().position(|x| x == "--epochs").unwrap();
        a.drain(e..e + 2); // the first --epochs (2) gives way to the one above
        nodes.start(i, &a, &[])
    });
    let t0 = Instant::now();
    while !outs[0].join("last/state.json").exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "the job did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes.link(1, false);
    let cut = Instant::now();
    let [(o0, _), (o1, _)] = wait_both(children, Duration::from_secs(TIMEOUT + 60));
    let took = cut.elapsed();
    let (t0, t1) = (text(&o0), text(&o1));
    eprintln!("node 0:\n{t0}\nnode 1:\n{t1}\nboth ended {took:.1?} after the cut");
    assert!(!o0.status.success() && !o1.status.success(), "node 0:\n{t0}\nnode 1:\n{t1}");
    assert!(t0.contains("error: rank 1 stopped answering"), "node 0 names rank 1:\n{t0}");
    assert!(t1.contains("error: rank 0 (the master, which serves the job's store) stopped answering"), "node 1 names the master:\n{t1}");
    assert!(took < Duration::from_secs(TIMEOUT + 10), "took {took:?}");
    weights(&outs[0]); // last/ whole
}

/// The mistake PyTorch users make by default, forced: both nodes told to talk over loopback
/// (GLOO_SOCKET_IFNAME=lo), so neither can reach the other. Both end within the timeout (Gloo
/// alone would wait a minute of its own), in ringtrain's words: no raw Gloo log line, the
/// address given to the peers named, and what to change.
#[test]
fn nodes_that_cannot_reach_each_other_end_in_one_clear_line_each() {
    const TIMEOUT: u64 = 10;
    let Some(nodes) = Nodes::new() else { return };
    let d = data();
    let port = 29200 + (std::process::id() % 500) as u16;
    let children = [0, 1].map(|i| {
        let flags = format!(
            "--nnodes 2 --node-rank {i} --nproc-per-node 1 --master-addr {} --master-port {port} --dist-timeout {TIMEOUT}",
            nodes.addr[0]
        );
        nodes.start(i, &train_args(&d, &d.root.join(format!("lo{i}")), &flags), &[("GLOO_SOCKET_IFNAME", "lo".into())])
    });
    let [(o0, t0), (o1, t1)] = wait_both(children, Duration::from_secs(TIMEOUT + 60));
    for (i, (o, took)) in [(o0, t0), (o1, t1)].iter().enumerate() {
        let all = text(o);
        eprintln!("node {i}, {took:.1?}:\n{all}");
        assert!(!o.status.success(), "node {i}:\n{all}");
        assert!(!all.contains("gloo/transport"), "node {i}: Gloo's raw lines reached the terminal:\n{all}");
        assert!(all.contains("network: rank") && all.contains("over lo, GLOO_SOCKET_IFNAME=lo"), "node {i}:\n{all}");
        let error = all.lines().find(|l| l.contains("error: rendezvous with the master")).unwrap_or_else(|| panic!("node {i}:\n{all}"));
        assert!(error.contains("a loopback one (127.x) cannot be reached from another node"), "node {i}: {error}");
        assert!(*took < Duration::from_secs(TIMEOUT + 10), "node {i} took {took:?}");
        assert!(!d.root.join(format!("lo{i}")).exists(), "node {i} wrote a run directory");
    }
}
