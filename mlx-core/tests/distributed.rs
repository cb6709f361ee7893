//! MLX's distributed layer over the ring backend: two processes on this machine over
//! loopback. The test binary spawns itself twice (the `worker` test, which does nothing
//! unless `MLX_DIST_TEST_WORKER` is set) with the environment MLX's ring backend reads:
//! `MLX_RANK` and `MLX_HOSTFILE` (JSON: per rank, a list of `"ip:port"`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mlx_core::distributed::{self, Backend};
use mlx_core::{Array, Dtype};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn hostfile(dir: &str, n: usize) -> PathBuf {
    let hosts: Vec<String> = (0..n)
        .map(|_| format!("[\"127.0.0.1:{}\"]", free_port()))
        .collect();
    let path = std::env::temp_dir().join(format!(
        "mlx-dist-{dir}-{}-{}.json",
        std::process::id(),
        free_port()
    ));
    std::fs::write(&path, format!("[{}]", hosts.join(","))).unwrap();
    path
}

/// Spawns `ranks` of a world of `world` processes running the worker in `mode`, and waits
/// for all (killing them after `limit`). Returns (exit success, stdout+stderr) per rank.
fn run_world(mode: &str, world: usize, ranks: &[usize], limit: Duration) -> Vec<(bool, String)> {
    let hf = hostfile(mode, world);
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = ranks
        .iter()
        .map(|r| {
            Command::new(&exe)
                .args(["worker", "--exact", "--nocapture", "--test-threads", "1"])
                .env("MLX_DIST_TEST_WORKER", mode)
                .env("MLX_RANK", r.to_string())
                .env("MLX_HOSTFILE", &hf)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    loop {
        let done = children.iter_mut().all(|c| c.try_wait().unwrap().is_some());
        if done || start.elapsed() > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = children
        .into_iter()
        .map(|mut c| {
            let _ = c.kill();
            let o = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            (o.status.success(), text)
        })
        .collect();
    let _ = std::fs::remove_file(hf);
    out
}

#[test]
fn worker() {
    let Ok(mode) = std::env::var("MLX_DIST_TEST_WORKER") else {
        return;
    };
    let g = distributed::init(true, Backend::Ring).expect("ring init");
    let (rank, size) = (g.rank(), g.size());
    assert_eq!(size, 2);
    match mode.as_str() {
        "collectives" => {
            let r = rank as f32;
            let x = Array::from_slice(&[1.0f32 + r, 10.0 * r, -r], &[3]).unwrap();
            let s = distributed::all_sum(&x, Some(&g), None).unwrap();
            assert_eq!(s.to_vec::<f32>().unwrap(), vec![3.0, 10.0, -1.0]);
            let mx = distributed::all_max(&x, None, None).unwrap();
            assert_eq!(mx.to_vec::<f32>().unwrap(), vec![2.0, 10.0, 0.0]);
            let mn = distributed::all_min(&x, Some(&g), None).unwrap();
            assert_eq!(mn.to_vec::<f32>().unwrap(), vec![1.0, 0.0, -1.0]);
            let y = Array::from_slice(&[rank, rank + 100], &[1, 2]).unwrap();
            let ga = distributed::all_gather(&y, Some(&g), None).unwrap();
            assert_eq!(ga.shape(), vec![2, 2]);
            assert_eq!(ga.to_vec::<i32>().unwrap(), vec![0, 100, 1, 101]);
            // Point to point: 0 -> 1, then 1 -> 0 with recv_like.
            if rank == 0 {
                let m = Array::from_slice(&[7i32, 8, 9, 10], &[2, 2]).unwrap();
                distributed::send(&m, 1, Some(&g), None)
                    .unwrap()
                    .eval()
                    .unwrap();
                let back = distributed::recv_like(&m, 1, Some(&g), None).unwrap();
                assert_eq!(back.to_vec::<i32>().unwrap(), vec![14, 16, 18, 20]);
            } else {
                let m = distributed::recv(&[2, 2], Dtype::Int32, 0, Some(&g), None).unwrap();
                assert_eq!(m.to_vec::<i32>().unwrap(), vec![7, 8, 9, 10]);
                let twice = (&m + &m).unwrap();
                distributed::send(&twice, 0, Some(&g), None)
                    .unwrap()
                    .eval()
                    .unwrap();
            }
            println!("rank {rank} ok");
        }
        "errors" => {
            // MLX's own messages come back as errors, not aborts.
            let x = Array::from_slice(&[1.0f32], &[1]).unwrap();
            let e = distributed::send(&x, 5, Some(&g), None).unwrap_err();
            assert!(e.to_string().contains("send"), "{e}");
            let e = distributed::recv(&[1], Dtype::Float32, -1, Some(&g), None).unwrap_err();
            assert!(e.to_string().contains("recv"), "{e}");
            println!("rank {rank} ok: {e}");
        }
        other => panic!("unknown worker mode {other}"),
    }
}

#[test]
fn two_ranks_over_the_ring_backend() {
    if std::env::var("MLX_DIST_TEST_WORKER").is_ok() {
        return;
    }
    assert!(distributed::is_available(Backend::Ring).unwrap());
    for mode in ["collectives", "errors"] {
        let out = run_world(mode, 2, &[0, 1], Duration::from_secs(120));
        for (rank, (ok, text)) in out.iter().enumerate() {
            assert!(ok, "{mode}: rank {rank} failed:\n{text}");
            assert!(text.contains(&format!("rank {rank} ok")), "{mode}: {text}");
        }
    }
}

#[test]
fn without_environment_init_is_the_singleton_group_or_an_error() {
    if std::env::var("MLX_DIST_TEST_WORKER").is_ok() {
        return;
    }
    // This process has no MLX_RANK / MLX_HOSTFILE (the test harness does not set them).
    if std::env::var("MLX_HOSTFILE").is_ok() {
        return;
    }
    let g = distributed::init(false, Backend::Ring).unwrap();
    assert_eq!((g.rank(), g.size()), (0, 1));
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let s = distributed::all_sum(&x, Some(&g), None).unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    let e = distributed::init(true, Backend::Ring).unwrap_err();
    assert!(e.to_string().contains("distributed::init"), "{e}");
    assert!(Backend::parse("tcp").is_err());
    assert_eq!(Backend::parse("mpi").unwrap(), Backend::Mpi);
}
