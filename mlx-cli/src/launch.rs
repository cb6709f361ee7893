//! `mlx launch`: run `mlx SUBCOMMAND ARGS...` as the ranks of one MLX distributed group (as
//! Python's `mlx.launch` does for a script).
//!
//! The transport is MLX's own. For the `ring` backend the launcher writes the hostfile MLX
//! reads (`MLX_HOSTFILE`: JSON, per rank a list of `"ip:port"`; `-n N` gives N loopback
//! ranks on consecutive ports from `--starting-port`) and starts each rank with `MLX_RANK`;
//! `--hostfile F` uses such a file as it is, and `--ranks` picks the ranks started on this
//! machine (the others are started by `mlx launch` on their own machines). For `mpi` it runs
//! `mpirun -np N` on this binary. Each rank forms the group before its subcommand runs
//! ([`init_from_env`]), and gives up with an error naming the missing peers after
//! `--timeout` seconds. Only rank 0's standard output is shown; the standard error of
//! every other rank is shown when that rank fails. When a rank fails, the launcher stops
//! every other rank and exits with that rank's message.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use mlx_core::distributed::{self, Backend};

/// The environment variable the launcher sets in each rank: the backend to initialise.
pub const ENV_BACKEND: &str = "MLX_LAUNCH_BACKEND";
/// The environment variable holding the group-formation timeout, in seconds.
pub const ENV_TIMEOUT: &str = "MLX_LAUNCH_TIMEOUT";
/// The environment variable set (to `1`) by `mlx launch --pipeline`.
pub const ENV_PIPELINE: &str = "MLX_LAUNCH_PIPELINE";
/// The launcher's process id, set in the ranks it starts itself (ring, nccl): a rank whose
/// launcher is gone (killed, even by SIGKILL) stops instead of living on as an orphan.
pub const ENV_PARENT: &str = "MLX_LAUNCH_PARENT";
/// How often a rank checks that its launcher is still there.
const PARENT_POLL: Duration = Duration::from_millis(200);

#[derive(Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Number of local processes (ranks) to start.
    #[arg(short = 'n', long = "num-processes", value_name = "N")]
    pub n: Option<usize>,
    /// An MLX ring hostfile (JSON: one list of "ip:port" per rank) to use instead of -n.
    #[arg(long, value_name = "FILE")]
    pub hostfile: Option<PathBuf>,
    /// With --hostfile: the ranks to start on this machine (default: all of them).
    #[arg(long, value_delimiter = ',', value_name = "R,R,...")]
    pub ranks: Vec<usize>,
    /// MLX's distributed backend (`nccl`: CUDA builds, with -n, one GPU per rank).
    #[arg(long, default_value = "ring", value_parser = ["ring", "mpi", "nccl"])]
    pub backend: String,
    /// With -n: the first port of the loopback ring (one port per rank; 0 picks free ones).
    #[arg(long, default_value_t = 0)]
    pub starting_port: u16,
    /// Seconds a rank waits for its peers to connect before failing.
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    pub timeout: f64,
    /// Split the model into pipeline stages (mlx-lm's `--pipeline`: each rank runs a run of
    /// layers) instead of tensor parallelism.
    #[arg(long)]
    pub pipeline: bool,
    /// Instead of a subcommand, check that the group forms and communicates: each rank
    /// all-sums its rank and rank 0 prints the result.
    #[arg(long)]
    pub check: bool,
    /// (Internal) one rank of --check.
    #[arg(long, hide = true)]
    pub check_rank: bool,
    /// (Testing) with --check, make this rank fail after the group has formed.
    #[arg(long, hide = true, value_name = "R")]
    pub check_fail_rank: Option<i32>,
    /// The `mlx` subcommand and its arguments, after `--`.
    #[arg(last = true, value_name = "SUBCOMMAND ARGS")]
    pub command: Vec<String>,
}

/// Checks a launch command line that needs no network or model.
pub fn check_args(a: &LaunchArgs) -> Result<(), String> {
    if a.check_rank {
        return Ok(());
    }
    if a.command.is_empty() && !a.check {
        return Err("mlx launch: give the subcommand to run after --, e.g. \
                    `mlx launch -n 2 -- generate --model DIR`, or --check"
            .into());
    }
    if !a.command.is_empty() && a.check {
        return Err("mlx launch: --check runs no subcommand; drop one of them".into());
    }
    if a.command.first().is_some_and(|c| c == "launch") {
        return Err("mlx launch: the subcommand cannot be launch itself".into());
    }
    match (a.n, &a.hostfile) {
        (None, None) => return Err("mlx launch: give -n N or --hostfile FILE".into()),
        (Some(_), Some(_)) => return Err("mlx launch: give -n or --hostfile, not both".into()),
        (Some(0), _) => return Err("mlx launch: -n must be at least 1".into()),
        _ => {}
    }
    if !a.ranks.is_empty() && a.hostfile.is_none() {
        return Err("mlx launch: --ranks needs --hostfile".into());
    }
    if a.backend == "nccl" && a.n.is_none() {
        return Err("mlx launch: --backend nccl runs -n N ranks on this machine".into());
    }
    if a.backend == "mpi" && a.hostfile.is_some() {
        return Err("mlx launch: --hostfile is for the ring backend (mpirun has its own)".into());
    }
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        return Err(format!(
            "mlx launch: --timeout {} must be a positive number",
            a.timeout
        ));
    }
    Ok(())
}

/// Runs `mlx launch`.
pub fn run(a: &LaunchArgs) -> Result<(), String> {
    if a.check_rank {
        return check_rank(a.check_fail_rank);
    }
    let exe = std::env::current_exe().map_err(|e| format!("mlx launch: this binary: {e}"))?;
    let inner: Vec<String> = if a.check {
        let mut v = vec!["launch".to_string(), "--check-rank".to_string()];
        if let Some(r) = a.check_fail_rank {
            v.extend(["--check-fail-rank".to_string(), r.to_string()]);
        }
        v
    } else {
        a.command.clone()
    };
    if a.backend == "mpi" {
        return run_mpi(&exe, a, &inner);
    }
    if a.backend == "nccl" {
        let n = a.n.unwrap_or(1);
        let port = match a.starting_port {
            0 => free_port()?,
            p => p,
        };
        let ranks: Vec<usize> = (0..n).collect();
        let env = move |r: usize| nccl_env(r, n, port);
        return supervise(&exe, &inner, &env, &ranks, a.timeout, a.pipeline);
    }
    let (hostfile, world, temp) = match &a.hostfile {
        Some(f) => (f.clone(), ring_world_size(f)?, false),
        None => {
            let n = a.n.unwrap_or(1);
            (write_loopback_hostfile(n, a.starting_port)?, n, true)
        }
    };
    let ranks: Vec<usize> = if a.ranks.is_empty() {
        (0..world).collect()
    } else {
        a.ranks.clone()
    };
    if let Some(r) = ranks.iter().find(|&&r| r >= world) {
        return Err(format!(
            "mlx launch: --ranks {r}: the hostfile {} has {world} ranks",
            hostfile.display()
        ));
    }
    let hf = hostfile.clone();
    let env = move |_r: usize| {
        vec![
            ("MLX_HOSTFILE".to_string(), hf.display().to_string()),
            (ENV_BACKEND.to_string(), "ring".to_string()),
        ]
    };
    let result = supervise(&exe, &inner, &env, &ranks, a.timeout, a.pipeline);
    if temp {
        let _ = std::fs::remove_file(&hostfile);
    }
    result
}

/// The number of ranks in an MLX ring hostfile, with the file and problem named on error.
fn ring_world_size(path: &Path) -> Result<usize, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("mlx launch: --hostfile {}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("mlx launch: --hostfile {}: not JSON: {e}", path.display()))?;
    let ranks = v.as_array().ok_or_else(|| {
        format!(
            "mlx launch: --hostfile {}: expected a JSON list with one list of \"ip:port\" per rank",
            path.display()
        )
    })?;
    for (i, r) in ranks.iter().enumerate() {
        let ok = r.as_array().is_some_and(|l| {
            !l.is_empty()
                && l.iter()
                    .all(|s| s.as_str().is_some_and(|s| s.contains(':')))
        });
        if !ok {
            return Err(format!(
                "mlx launch: --hostfile {}: rank {i}: expected a non-empty list of \"ip:port\"",
                path.display()
            ));
        }
    }
    if ranks.is_empty() {
        return Err(format!(
            "mlx launch: --hostfile {}: no ranks",
            path.display()
        ));
    }
    Ok(ranks.len())
}

fn write_loopback_hostfile(n: usize, start: u16) -> Result<PathBuf, String> {
    let mut ports = Vec::with_capacity(n);
    // Keep the probe listeners open until every port is chosen so that none repeats.
    let mut held = Vec::new();
    for i in 0..n {
        if start == 0 {
            let l = TcpListener::bind("127.0.0.1:0")
                .map_err(|e| format!("mlx launch: finding a free loopback port: {e}"))?;
            ports.push(l.local_addr().map_err(|e| e.to_string())?.port());
            held.push(l);
        } else {
            let p = u16::try_from(usize::from(start) + i).map_err(|_| {
                format!("mlx launch: --starting-port {start} + {n} ranks passes 65535")
            })?;
            ports.push(p);
        }
    }
    drop(held);
    let hosts: Vec<Vec<String>> = ports
        .iter()
        .map(|p| vec![format!("127.0.0.1:{p}")])
        .collect();
    let path = std::env::temp_dir().join(format!(
        "mlx-launch-{}-{}.json",
        std::process::id(),
        ports.first().copied().unwrap_or(0)
    ));
    let text = serde_json::to_string(&hosts).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("mlx launch: {}: {e}", path.display()))?;
    Ok(path)
}

/// Starts the ranks and waits for them; the first failure stops every other rank.
/// What MLX's NCCL backend reads in rank `rank` of `n` on this machine, as `mlx.launch
/// --backend nccl` sets it: the rank, the world size, rank 0's address and port for NCCL's
/// bootstrap, and one GPU per rank.
pub fn nccl_env(rank: usize, n: usize, port: u16) -> Vec<(String, String)> {
    vec![
        (ENV_BACKEND.to_string(), "nccl".to_string()),
        ("MLX_WORLD_SIZE".to_string(), n.to_string()),
        ("NCCL_HOST_IP".to_string(), "127.0.0.1".to_string()),
        ("NCCL_PORT".to_string(), port.to_string()),
        ("CUDA_VISIBLE_DEVICES".to_string(), rank.to_string()),
    ]
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("mlx launch: picking a free port: {e}"))
}

fn supervise(
    exe: &Path,
    inner: &[String],
    env: &dyn Fn(usize) -> Vec<(String, String)>,
    ranks: &[usize],
    timeout: f64,
    pipeline: bool,
) -> Result<(), String> {
    let mut children: Vec<Rank> = Vec::new();
    for &r in ranks {
        let mut cmd = Command::new(exe);
        if pipeline {
            cmd.env(ENV_PIPELINE, "1");
        }
        cmd.args(inner)
            .env("MLX_RANK", r.to_string())
            .envs(env(r))
            .env(ENV_TIMEOUT, timeout.to_string())
            .env(ENV_PARENT, std::process::id().to_string())
            .stdin(if r == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        if r == 0 {
            cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
        } else {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut children);
                return Err(format!("mlx launch: starting rank {r}: {e}"));
            }
        };
        // Drain the rank's standard error on a thread so that it never blocks on a full pipe.
        let err = child.stderr.take().map(|mut s| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut buf = String::new();
                let _ = s.read_to_string(&mut buf);
                let _ = tx.send(buf);
            });
            rx
        });
        children.push((r, child, err));
    }
    let mut done = vec![false; children.len()];
    // Once one rank has finished, the others get `timeout` seconds to finish too.
    let mut first_done: Option<Instant> = None;
    loop {
        for i in 0..children.len() {
            if done[i] {
                continue;
            }
            let (r, status) = {
                let (r, child, _) = &mut children[i];
                (*r, child.try_wait())
            };
            match status {
                Ok(Some(status)) if status.success() => done[i] = true,
                Ok(Some(status))
                    if status.code().is_none() && r != 0 && rank0_succeeds(&mut children) =>
                {
                    // Rank 0 passed the final barrier, so this rank had finished its
                    // subcommand: a signal now comes from MLX's ring tearing down after a
                    // peer closed its sockets, not from the work.
                    eprintln!(
                        "mlx launch: rank {r} was killed by a signal after the group finished                          (ignored)"
                    );
                    done[i] = true;
                }
                Ok(Some(_)) => {
                    // Let ranks that fail because of this one finish dying, then report
                    // every failed rank (this one first) and stop the rest.
                    std::thread::sleep(Duration::from_millis(200));
                    return Err(report_failures(i, &mut children));
                }
                Ok(None) => {}
                Err(e) => {
                    stop_all(&mut children);
                    return Err(format!("mlx launch: waiting for rank {r}: {e}"));
                }
            }
        }
        if done.iter().all(|&d| d) {
            return Ok(());
        }
        if first_done.is_none() && done.iter().any(|&d| d) {
            first_done = Some(Instant::now());
        }
        if first_done.is_some_and(|t| t.elapsed() > Duration::from_secs_f64(timeout)) {
            let late: Vec<String> = children
                .iter()
                .zip(&done)
                .filter(|(_, d)| !**d)
                .map(|((r, _, _), _)| r.to_string())
                .collect();
            stop_all(&mut children);
            return Err(format!(
                "mlx launch: rank(s) {} did not finish within {timeout} s of the others \
                 (a peer lost mid-collective?); stopped them",
                late.join(", ")
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

type Rank = (usize, Child, Option<mpsc::Receiver<String>>);

/// Whether rank 0 runs here and exits successfully (waiting up to 10 s for it). Rank 0 exits
/// 0 only after the final barrier (`barrier`) succeeded, that is after every rank finished
/// its subcommand.
fn rank0_succeeds(children: &mut [Rank]) -> bool {
    let Some((_, child, _)) = children.iter_mut().find(|(r, _, _)| *r == 0) else {
        return false;
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        match child.try_wait() {
            Ok(Some(s)) => return s.success(),
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => return false,
        }
    }
    false
}

/// Kills the running ranks and describes every failed one, `first` (the one seen first)
/// leading.
fn report_failures(first: usize, children: &mut [Rank]) -> String {
    let mut order: Vec<usize> = vec![first];
    order.extend((0..children.len()).filter(|&j| j != first));
    let mut failed = Vec::new();
    for j in order {
        let (r, child, err) = &mut children[j];
        let status = match child.try_wait() {
            Ok(Some(s)) if !s.success() => s,
            _ => continue,
        };
        let stderr = err
            .take()
            .and_then(|rx| rx.recv_timeout(Duration::from_secs(2)).ok())
            .unwrap_or_default();
        let how = match status.code() {
            Some(c) => format!("exited with status {c}"),
            None => "was killed by a signal".into(),
        };
        let tail = stderr.trim();
        failed.push(if tail.is_empty() {
            format!("rank {r} {how}")
        } else {
            format!("rank {r} {how}:\n{tail}")
        });
    }
    stop_all(children);
    format!(
        "mlx launch: {}\n(stopped the other ranks)",
        failed.join("\n")
    )
}

fn stop_all(children: &mut [Rank]) {
    for (_, c, _) in children.iter_mut() {
        let _ = c.kill();
    }
    for (_, c, _) in children.iter_mut() {
        let _ = c.wait();
    }
}

fn run_mpi(exe: &Path, a: &LaunchArgs, inner: &[String]) -> Result<(), String> {
    let n = a.n.unwrap_or(1);
    let status = Command::new("mpirun")
        .args(["-np", &n.to_string(), "-x", ENV_BACKEND, "-x", ENV_TIMEOUT])
        .args(if a.pipeline {
            vec!["-x", ENV_PIPELINE]
        } else {
            vec![]
        })
        .arg(exe)
        .args(inner)
        .env(ENV_PIPELINE, if a.pipeline { "1" } else { "0" })
        .env(ENV_BACKEND, "mpi")
        .env(ENV_TIMEOUT, a.timeout.to_string())
        .status()
        .map_err(|e| format!("mlx launch --backend mpi: running mpirun: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("mlx launch --backend mpi: mpirun {status}"))
    }
}

/// In a process started by `mlx launch` (its environment names a backend), forms the group
/// before the subcommand runs; elsewhere does nothing. A group that does not form within the
/// timeout is an error naming the rank and the hostfile, never a hang.
pub fn init_from_env() -> Result<Option<distributed::Group>, String> {
    let Ok(name) = std::env::var(ENV_BACKEND) else {
        return Ok(None);
    };
    let backend = Backend::parse(&name).map_err(|e| e.to_string())?;
    let timeout = std::env::var(ENV_TIMEOUT)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|t| t.is_finite() && *t > 0.0)
        .unwrap_or(60.0);
    let rank = std::env::var("MLX_RANK").unwrap_or_else(|_| "?".into());
    watch_launcher(&rank);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let g = distributed::init(true, backend).map(|g| (g.rank(), g.size()));
        let _ = tx.send(g);
    });
    match rx.recv_timeout(Duration::from_secs_f64(timeout)) {
        Ok(Ok(_)) => {
            // The group is MLX's global one now; this handle refers to it from this thread.
            let g = distributed::init(false, backend).map_err(|e| e.to_string())?;
            Ok(Some(g))
        }
        Ok(Err(e)) => Err(format!("rank {rank}: forming the {name} group: {e}")),
        Err(_) => Err(format!(
            "rank {rank}: the {name} group did not form within {timeout} s: a peer never \
             connected (hostfile {})",
            std::env::var("MLX_HOSTFILE").unwrap_or_default()
        )),
    }
}

/// In a rank `mlx launch` started itself ([`ENV_PARENT`]), a thread that ends the process
/// once the launcher is gone (this process was re-parented): a killed launcher leaves no
/// rank behind, blocked in a collective or still forming the group.
fn watch_launcher(rank: &str) {
    #[cfg(unix)]
    {
        let Some(parent) = std::env::var(ENV_PARENT)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            return;
        };
        if std::os::unix::process::parent_id() != parent {
            eprintln!("error: rank {rank}: the launcher (pid {parent}) is gone; stopping");
            std::process::exit(1);
        }
        let rank = rank.to_string();
        std::thread::spawn(move || loop {
            std::thread::sleep(PARENT_POLL);
            if std::os::unix::process::parent_id() != parent {
                eprintln!("error: rank {rank}: the launcher (pid {parent}) is gone; stopping");
                std::process::exit(1);
            }
        });
    }
    #[cfg(not(unix))]
    let _ = rank;
}

fn check_rank(fail_rank: Option<i32>) -> Result<(), String> {
    use mlx_core::Array;
    let g = init_from_env()?.ok_or("mlx launch --check-rank: not started by mlx launch")?;
    let (rank, size) = (g.rank(), g.size());
    if fail_rank == Some(rank) {
        return Err(format!(
            "rank {rank}: failing on purpose (--check-fail-rank)"
        ));
    }
    let x = Array::from_slice(&[rank], &[1]).map_err(|e| e.to_string())?;
    let s = distributed::all_sum(&x, Some(&g), None)
        .and_then(|s| s.to_vec::<i32>())
        .map_err(|e| format!("rank {rank}: all_sum: {e}"))?;
    println!("world {size}: rank {rank} all_sum of ranks = {}", s[0]);
    Ok(())
}

/// The group `mlx launch` formed for this process, when it has more than one rank (`None`
/// outside a launch or in a group of one).
fn launched_group() -> Result<Option<distributed::Group>, String> {
    let Ok(name) = std::env::var(ENV_BACKEND) else {
        return Ok(None);
    };
    let backend = Backend::parse(&name).map_err(|e| e.to_string())?;
    let g = distributed::init(false, backend).map_err(|e| e.to_string())?;
    Ok((g.size() > 1).then_some(g))
}

/// In a rank started by `mlx launch` with more than one rank, shards the model over the
/// group as mlx-lm's `sharded_load` does: tensor parallelism, or pipeline stages with
/// `mlx launch --pipeline`; elsewhere does nothing.
pub fn shard_if_launched(model: &mut dyn mlx_models::models::LanguageModel) -> Result<(), String> {
    let Some(g) = launched_group()? else {
        return Ok(());
    };
    if std::env::var(ENV_PIPELINE).is_ok_and(|v| v == "1") {
        return model
            .shard_pipeline(g.size(), g.rank())
            .map_err(|e| format!("rank {}: splitting the model into stages: {e}", g.rank()));
    }
    model
        .shard_tensor_parallel(g.size(), g.rank())
        .map_err(|e| format!("rank {}: sharding the model: {e}", g.rank()))
}

/// This process's place in the group `mlx launch` formed (rank 0 of 1 elsewhere): what a
/// data-parallel `train` splits its batches by.
pub fn world() -> Result<mlx_train::data::World, String> {
    let Some(g) = launched_group()? else {
        return Ok(mlx_train::data::World::single());
    };
    let (rank, size) = (g.rank(), g.size());
    match (usize::try_from(rank), usize::try_from(size)) {
        (Ok(rank), Ok(size)) if rank < size => Ok(mlx_train::data::World { rank, size }),
        _ => Err(format!("MLX's group reports rank {rank} of {size}")),
    }
}

/// A line of input every rank sees: in a launched group of several ranks, rank 0 runs `read`
/// (only it has the terminal) and the others receive its result ([`share_bytes`]);
/// elsewhere just `read`.
pub fn shared_line(
    read: impl FnOnce() -> Result<Option<String>, String>,
) -> Result<Option<String>, String> {
    let Some(g) = launched_group()? else {
        return read();
    };
    let rank = g.rank();
    let mine = if rank == 0 { read()? } else { None };
    match share_bytes(&g, mine.map(String::into_bytes), "the input line")? {
        None => Ok(None),
        Some(b) => String::from_utf8(b)
            .map(Some)
            .map_err(|_| format!("rank {rank}: the shared input line is not UTF-8")),
    }
}

/// Rank 0's `mine` on every rank (the others pass `None`) through two `all_sum`s: the length
/// (`-1` for `None`), then the bytes, each as an int32 (so past 16 MiB it is refused rather
/// than allocated). On the generation stream, after the collectives of steps still queued
/// there (a collective on another stream could interleave with them on the ring).
pub fn share_bytes(
    g: &distributed::Group,
    mine: Option<Vec<u8>>,
    what: &str,
) -> Result<Option<Vec<u8>>, String> {
    let rank = g.rank();
    let sum = |v: &[i32]| -> Result<Vec<i32>, String> {
        mlx_engine::generate::on_generation_stream(|| {
            let x = mlx_core::Array::from_slice(v, &[v.len() as i32])?;
            Ok(distributed::all_sum(&x, Some(g), None)?.to_vec::<i32>()?)
        })
        .map_err(|e| format!("rank {rank}: sharing {what}: {e}"))
    };
    let len = match (&mine, rank) {
        (Some(b), 0) => i32::try_from(b.len()).map_err(|_| format!("{what} over 2 GiB"))?,
        (None, 0) => -1,
        _ => 0,
    };
    let len = sum(&[len])?[0];
    if len < 0 {
        return Ok(None);
    }
    if len > 1 << 24 {
        return Err(format!(
            "rank {rank}: {what} of {len} bytes (at most 16 MiB)"
        ));
    }
    let bytes: Vec<i32> = match &mine {
        Some(b) if rank == 0 => b.iter().map(|&x| i32::from(x)).collect(),
        _ => vec![0; len as usize],
    };
    if bytes.is_empty() {
        return Ok(Some(Vec::new()));
    }
    Ok(Some(sum(&bytes)?.into_iter().map(|b| b as u8).collect()))
}

/// The ranks of `mlx launch -- serve` stepping together ([`mlx_engine::batch::lockstep`]):
/// rank 0's engine messages reach the others through [`share_bytes`].
struct GroupLockstep {
    rank: i32,
    group: std::sync::Mutex<distributed::Group>,
}

impl mlx_engine::batch::lockstep::Lockstep for GroupLockstep {
    fn is_leader(&self) -> bool {
        self.rank == 0
    }
    fn share(
        &self,
        msg: Option<&mlx_engine::batch::lockstep::Message>,
    ) -> Result<Option<mlx_engine::batch::lockstep::Message>, String> {
        let g = self
            .group
            .lock()
            .map_err(|_| "the group's lock was poisoned".to_string())?;
        let got = share_bytes(&g, msg.map(|m| m.to_bytes()), "an engine message")?;
        got.map(|b| mlx_engine::batch::lockstep::Message::from_bytes(&b))
            .transpose()
            .map_err(|e| e.to_string())
    }
    fn lost(&self, error: &str) {
        // The HTTP side of rank 0 (and the wait of the others) would outlive an engine
        // that can no longer step with its peers: end the rank with the reason.
        eprintln!("error: {}", peer_hint(error));
        std::process::exit(1);
    }
}

/// `error` with what a ring failure means for a launched rank: MLX reports a dead peer as a
/// lost or closed connection.
pub fn peer_hint(error: &str) -> String {
    let lost = ["[ring]", "connection to a peer", "closed by the peer"]
        .iter()
        .any(|k| error.contains(k));
    if lost && std::env::var(ENV_BACKEND).is_ok() {
        format!(
            "{error} (a peer of this launched group died or its connection dropped; every \
             rank stops)"
        )
    } else {
        error.to_string()
    }
}

/// In a launched group of several ranks, makes the engine step with the other ranks and
/// returns this rank (`None` elsewhere): `serve` then runs the HTTP server on rank 0 only.
pub fn lockstep_engine() -> Result<Option<i32>, String> {
    let Some(g) = launched_group()? else {
        return Ok(None);
    };
    let rank = g.rank();
    mlx_engine::batch::lockstep::set(std::sync::Arc::new(GroupLockstep {
        rank,
        group: std::sync::Mutex::new(g),
    }));
    Ok(Some(rank))
}

/// In a launched rank, after the subcommand: one all_sum over the group, so that no rank
/// leaves while a peer still waits on it in a collective. An error when it fails (a peer was
/// lost): a launched rank then exits non-zero, so rank 0's success means every rank finished.
pub fn barrier() -> Result<(), String> {
    let Some(g) = launched_group()? else {
        return Ok(());
    };
    let x = mlx_core::Array::from_slice(&[1i32], &[1]).map_err(|e| e.to_string())?;
    // On the generation stream, after any step still queued there (see `shared_line`).
    let s = mlx_engine::generate::on_generation_stream(|| {
        Ok(distributed::all_sum(&x, Some(&g), None)?.to_vec::<i32>()?)
    })
    .map_err(|e| format!("rank {}: the final barrier: {e}", g.rank()))?;
    if s.first() != Some(&g.size()) {
        return Err(format!("rank {}: the final barrier summed {s:?}", g.rank()));
    }
    Ok(())
}

/// Exit code helper for the binary: distributed setup before a launched subcommand.
pub fn prepare() -> Option<ExitCode> {
    match init_from_env() {
        Ok(_) => None,
        Err(e) => {
            eprintln!("error: {e}");
            Some(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nccl_ranks_get_the_environment_mlx_launch_sets() {
        let env: std::collections::HashMap<_, _> =
            super::nccl_env(1, 2, 4321).into_iter().collect();
        assert_eq!(env["MLX_WORLD_SIZE"], "2");
        assert_eq!(env["NCCL_HOST_IP"], "127.0.0.1");
        assert_eq!(env["NCCL_PORT"], "4321");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "1");
        assert_eq!(env[super::ENV_BACKEND], "nccl");
    }
}
