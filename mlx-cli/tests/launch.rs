//! `mlx launch` over MLX's ring backend on this machine (loopback): the group forms, only
//! rank 0 prints, a failing rank stops the others with its message, a peer that never
//! connects is an error within the timeout.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The tests of this file run one group at a time: `-n N` picks free loopback ports, and two
/// groups forming at once could pick the same ones.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The longest any `mlx launch` of this file may run: past it the launcher is killed (its
/// ranks follow it, see `a_killed_launcher_leaves_no_rank_behind`) and the test fails, so a
/// hang costs CI minutes, not its whole budget.
const DEADLINE: Duration = Duration::from_secs(240);

fn mlx(args: &[&str]) -> (Output, Duration) {
    let _one_group = serial();
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running mlx");
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out_t = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let err_t = drain(child.stderr.take().map(|s| Box::new(s) as _));
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for mlx") {
            break s;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mlx {args:?} did not finish within {DEADLINE:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = Output {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    };
    (out, start.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn two_ranks_form_a_group_and_only_rank_0_prints() {
    let (out, _) = mlx(&["launch", "-n", "2", "--backend", "ring", "--check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "world 2: rank 0 all_sum of ranks = 1\n");
    let (out, _) = mlx(&["launch", "-n", "3", "--check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "world 3: rank 0 all_sum of ranks = 3\n");
}

#[test]
fn a_failing_rank_stops_every_rank_with_its_message() {
    let (out, took) = mlx(&["launch", "-n", "3", "--check", "--check-fail-rank", "1"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("rank 1 exited with status 1"), "{err}");
    assert!(err.contains("failing on purpose"), "{err}");
    assert!(took < Duration::from_secs(60), "{took:?}");
}

/// A hostfile of two loopback ranks on ports free a moment ago, under the temporary directory
/// as `NAME-PID.json`.
fn two_rank_hostfile(name: &str) -> std::path::PathBuf {
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
    let hf = std::env::temp_dir().join(format!("{name}-{}.json", std::process::id()));
    let hosts = format!(
        "[[\"127.0.0.1:{}\"],[\"127.0.0.1:{}\"]]",
        ports[0], ports[1]
    );
    std::fs::write(&hf, hosts).unwrap();
    hf
}

#[test]
fn a_peer_that_never_connects_is_an_error_within_the_timeout() {
    let hf = two_rank_hostfile("mlx-launch-test");
    let hfs = hf.to_str().unwrap();
    let (out, took) = mlx(&[
        "launch",
        "--hostfile",
        hfs,
        "--ranks",
        "0",
        "--timeout",
        "2",
        "--check",
    ]);
    let _ = std::fs::remove_file(&hf);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("did not form within 2 s"), "{err}");
    // The stated 2 s, plus starting the launcher and the rank on a loaded 2-core machine.
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(took < Duration::from_secs(12), "{took:?}");
}

/// A launcher killed outright (SIGKILL: it cannot stop its ranks) leaves no rank behind: each
/// rank sees that its launcher is gone and exits within a fraction of a second. Here rank 0
/// of a 2-rank hostfile waits for a peer that never comes (timeout 120 s); once the launcher
/// is killed, the launcher's standard output (which rank 0 shares) reaches its end when rank
/// 0 exits.
#[test]
fn a_killed_launcher_leaves_no_rank_behind() {
    use std::io::Read;
    let _one_group = serial();
    let hf = two_rank_hostfile("mlx-launch-orphan");
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["launch", "--hostfile", hf.to_str().unwrap(), "--ranks", "0"])
        .args(["--timeout", "120", "--check"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = launcher.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    // Let the rank start and block forming the group.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        launcher.try_wait().unwrap().is_none(),
        "the launcher ended early"
    );
    launcher.kill().unwrap();
    let _ = launcher.wait();
    let killed = Instant::now();
    let ended = rx.recv_timeout(Duration::from_secs(20));
    let _ = std::fs::remove_file(&hf);
    assert!(
        ended.is_ok(),
        "rank 0 still runs 20 s after its launcher was killed"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );
}

#[test]
fn bad_input_in_the_subcommand_stops_the_ranks_with_its_message() {
    let (out, _) = mlx(&[
        "launch",
        "-n",
        "2",
        "--",
        "generate",
        "--model",
        "/nonexistent/model",
        "--prompt",
        "hi",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("/nonexistent/model"), "{err}");
    assert!(err.contains("mlx launch: rank"), "{err}");
}

#[test]
fn launch_command_lines_are_checked() {
    for (args, want) in [
        (vec!["launch", "-n", "2"], "give the subcommand"),
        (vec!["launch", "--check"], "give -n N or --hostfile"),
        (vec!["launch", "-n", "0", "--check"], "at least 1"),
        (
            vec!["launch", "-n", "2", "--ranks", "0", "--check"],
            "--ranks needs --hostfile",
        ),
        (
            vec!["launch", "-n", "2", "--", "launch", "-n", "2"],
            "cannot be launch",
        ),
        (
            vec!["launch", "--hostfile", "/nonexistent.json", "--check"],
            "/nonexistent.json",
        ),
    ] {
        let (out, _) = mlx(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `mlx launch -n 2 [launch_flags] -- generate` on the fixture `model` gives the greedy ids
/// of mlx-lm's own sharded run in `golden` (xtask/oracle/goldens_dist.py), and only rank 0
/// prints.
fn launched_generate_equals(golden: &str, model: &str, launch_flags: &[&str]) {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let (gold, _) = mlx_core::io::load_safetensors(
        root.join(format!("mlx-models/tests/goldens/{golden}.safetensors")),
        None,
    )
    .unwrap();
    let prompt: Vec<String> = gold["prompt"]
        .to_vec::<i32>()
        .unwrap()
        .iter()
        .map(i32::to_string)
        .collect();
    let greedy = gold["greedy"].to_vec::<i32>().unwrap();
    let model = with_tokenizer(&root.join("mlx-cli/tests/models").join(model), golden);
    let mut args = vec!["launch", "-n", "2", "--backend", "ring", "--timeout", "60"];
    args.extend_from_slice(launch_flags);
    let (prompt, n) = (prompt.join(","), greedy.len().to_string());
    args.extend_from_slice(&[
        "--",
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
        "--max-tokens",
        &n,
        "--json",
    ]);
    let (out, took) = mlx(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    assert_eq!(stdout.lines().count(), 1, "only rank 0 prints: {stdout}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let tokens: Vec<i32> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap() as i32)
        .collect();
    assert_eq!(tokens, greedy, "{golden}");
    assert!(took < Duration::from_secs(120), "{took:?}");
}

/// `model` itself when it has a tokenizer; else a copy of its config and weights with
/// dense_f32's tokenizer (the one goldens_dist.py stages beside such fixtures) under the test
/// temporary directory.
fn with_tokenizer(model: &std::path::Path, name: &str) -> std::path::PathBuf {
    if model.join("tokenizer.json").exists() {
        return model.to_path_buf();
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("launch_{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let tok = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/models/dense_f32");
    for (from, file) in [
        (model, "config.json"),
        (model, "model.safetensors"),
        (tok.as_path(), "tokenizer.json"),
        (tok.as_path(), "tokenizer_config.json"),
    ] {
        std::fs::copy(from.join(file), dir.join(file)).unwrap();
    }
    dir
}

/// The rows added last to the coverage table, end to end: step3p5 tensor parallel,
/// minimax_m3_vl pipelined, bailing_hybrid pipelined by its layer groups (and refused
/// without `--pipeline`: mlx-lm's class has no `shard()`).
#[test]
fn launched_generate_equals_mlx_lm_for_step3p5_minimax_m3_vl_and_bailing_hybrid() {
    let models = "../../../mlx-models/tests/models";
    let step = format!("{models}/dist/step3p5");
    launched_generate_equals("dist_step3p5_tp2", &step, &[]);
    let minimax = format!("{models}/dense2/minimax_m3_vl");
    launched_generate_equals("dist_minimax_m3_vl_pp2", &minimax, &["--pipeline"]);
    let bailing = format!("{models}/dist/bailing_hybrid");
    launched_generate_equals("dist_bailing_hybrid_pp2", &bailing, &["--pipeline"]);
    let bailing = with_tokenizer(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/models")
            .join(&bailing),
        "dist_bailing_hybrid_pp2",
    );
    launched_generate_is_refused(bailing.to_str().unwrap(), &[], "--pipeline");
}

/// kimi_k3 tensor parallel (KDA layers by heads) and deepseek_v41 pipelined (its stage
/// message of streams and shared compressed state), end to end through `mlx launch`.
#[test]
fn launched_generate_equals_mlx_lm_for_kimi_k3_and_deepseek_v41() {
    let models = "../../../mlx-models/tests/models/dense2";
    launched_generate_equals("dist_kimi_k3_tp2", &format!("{models}/kimi_k3"), &[]);
    let v41 = format!("{models}/deepseek_v41");
    launched_generate_equals("dist_deepseek_v41_pp2", &v41, &["--pipeline"]);
}

#[test]
fn launched_generate_is_tensor_parallel_and_equals_mlx_lm_sharded_run() {
    launched_generate_equals("dist_llama_tp2", "dense_f32", &[]);
    launched_generate_equals("dist_llama_q4_tp2", "q4_g32", &[]);
}

#[test]
fn launched_generate_with_pipeline_equals_mlx_lm_pipeline_run() {
    launched_generate_equals("dist_qwen2_pp2", "qwen2_f32", &["--pipeline"]);
    // llama's mlx-lm class has no `pipeline`: every rank refuses with the reason.
    launched_generate_is_refused("dense_f32", &["--pipeline"], "pipeline parallelism");
}

#[test]
fn a_model_without_tensor_parallelism_is_refused_by_every_rank() {
    // phi3: its mlx-lm class has no `shard()`.
    launched_generate_is_refused("phi3", &[], "tensor parallelism");
}

/// `mlx launch -n 2 [launch_flags] -- generate` on the fixture `model` fails with `want` in
/// its message.
fn launched_generate_is_refused(model: &str, launch_flags: &[&str], want: &str) {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = root.join("mlx-cli/tests/models").join(model);
    let mut args = vec!["launch", "-n", "2"];
    args.extend_from_slice(launch_flags);
    args.extend_from_slice(&["--", "generate", "--model", model.to_str().unwrap()]);
    args.extend_from_slice(&["--prompt-ids", "1,2,3", "--max-tokens", "2"]);
    let (out, _) = mlx(&args);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(want), "{err}");
}

#[test]
fn launched_train_is_data_parallel_and_equals_mlx_lm_lora_distributed_run() {
    // mlx_lm.lora's own run under `mlx.launch -n 2 --backend ring`
    // (xtask/oracle/goldens_train_dp.py): the same flags and config file.
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let (gold, _) = mlx_core::io::load_safetensors(
        root.join("mlx-train/tests/goldens/train_dp2_text_adam.safetensors"),
        None,
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("mlx_launch_train_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("c.yaml");
    std::fs::write(
        &cfg,
        "lora_parameters:\n  rank: 4\n  dropout: 0.0\n  scale: 10.0\nlearning_rate: 1e-2\n",
    )
    .unwrap();
    let adapters = dir.join("adapters");
    let model = root.join("mlx-train/tests/models/dense");
    let data = root.join("mlx-train/tests/data/text");
    let train = |n: &str, extra: &[&str]| {
        let mut args = vec![
            "launch",
            "-n",
            n,
            "--backend",
            "ring",
            "--timeout",
            "60",
            "--",
        ];
        args.extend_from_slice(&[
            "train",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "-c",
            cfg.to_str().unwrap(),
            "--adapter-path",
            adapters.to_str().unwrap(),
            "--train",
            "--num-layers",
            "1",
            "--iters",
            "4",
            "--steps-per-eval",
            "2",
            "--val-batches",
            "2",
            "--steps-per-report",
            "1",
            "--save-every",
            "4",
            "--overwrite",
        ]);
        args.extend_from_slice(extra);
        mlx(&args)
    };
    let (out, _) = train("2", &["--batch-size", "2"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let (ours, _) =
        mlx_core::io::load_safetensors(adapters.join("adapters.safetensors"), None).unwrap();
    let mut compared = 0;
    for (k, v) in &ours {
        if let Err(e) = mlx_core::testing::assert_bit_equal(v, &gold[k.as_str()]) {
            panic!("{k}: {e}");
        }
        // The group changes the run: one process gives other adapters.
        assert!(
            mlx_core::testing::assert_bit_equal(v, &gold[format!("single.{k}").as_str()]).is_err(),
            "{k}: the data-parallel run equals the one-process run"
        );
        compared += 1;
    }
    assert_eq!(
        compared,
        gold.keys().filter(|k| k.starts_with("single.")).count()
    );
    // The reported losses (summed over the group) in rank 0's log, one line each.
    let log = std::fs::read_to_string(adapters.join("train_log.jsonl")).unwrap();
    let losses = |event: &str, key: &str| -> Vec<f32> {
        log.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["event"] == event)
            .map(|v| v[key].as_f64().unwrap() as f32)
            .collect()
    };
    assert_eq!(
        losses("train", "train_loss"),
        gold["train_loss"].to_vec::<f32>().unwrap()
    );
    assert_eq!(
        losses("val", "val_loss"),
        gold["val_loss"].to_vec::<f32>().unwrap()
    );

    // A batch size the group cannot split: every rank stops with mlx-lm's message.
    let (out, _) = train("2", &["--batch-size", "3"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("divisible by the number of workers"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn launched_chat_reads_on_rank_0_and_every_rank_runs_the_turn() {
    use std::io::Write;
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = root.join("mlx-cli/tests/models/dense_f32");
    let run = |launched: bool| {
        let mut args: Vec<&str> = Vec::new();
        if launched {
            args.extend_from_slice(&["launch", "-n", "2", "--timeout", "60", "--"]);
        }
        args.extend_from_slice(&[
            "chat",
            "--model",
            model.to_str().unwrap(),
            "--max-tokens",
            "6",
            "--json",
        ]);
        let _one_group = serial();
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlx"))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Two turns (one with a non-ASCII character), then the end of input.
        child
            .stdin
            .take()
            .unwrap()
            .write_all("hello there\nwie geht’s\n".as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "launched {launched}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let launched = run(true);
    assert_eq!(
        launched.lines().count(),
        2,
        "two turns, rank 0 only: {launched}"
    );
    // Tensor parallelism reorders sums (logits differ in the last bits), but these short
    // greedy replies are the same tokens as one process gives.
    let tokens = |s: &str| -> Vec<serde_json::Value> {
        s.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["tokens"].clone())
            .collect()
    };
    assert_eq!(tokens(&launched), tokens(&run(false)));
}

/// `mlx launch -n 2 -- serve` (mlx_lm.server under mlx.launch): rank 0 serves HTTP, both
/// ranks step together through the tensor-parallel model, and a greedy completion equals what
/// `mlx launch -n 2 -- generate` makes of the same prompt (whose ids the test above holds to
/// mlx-lm's own sharded run). Stopping the group (a signal to its process group) stops both.
#[test]
fn launched_serve_answers_from_rank_0_with_both_ranks_stepping() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::process::CommandExt;
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = root.join("mlx-cli/tests/models/dense_f32");
    let model = model.to_str().unwrap();
    let prompt = "the cat and the dog";
    let (out, _) = mlx(&[
        "launch",
        "-n",
        "2",
        "--timeout",
        "60",
        "--",
        "generate",
        "--model",
        model,
        "--prompt",
        prompt,
        "--ignore-chat-template",
        "--max-tokens",
        "8",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    let want = v["text"].as_str().unwrap().to_string();

    let _one_group = serial();
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_mlx"))
        .args(["launch", "-n", "2", "--timeout", "60", "--", "serve"])
        .args(["--model", model, "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = launcher.id();
    let stop = |sig: &str| {
        let _ = Command::new("kill")
            .args([sig, "--", &format!("-{group}")])
            .status();
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let err = launcher.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    let addr = loop {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if let Some(a) = line.split("listening on http://").nth(1) {
                    break a.trim().to_string();
                }
            }
            Err(_) => {
                stop("-KILL");
                panic!("no listening line:\n{seen}");
            }
        }
    };
    let body = serde_json::json!({
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0.0,
    })
    .to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    let read = conn.read_to_string(&mut reply);
    stop("-TERM");
    let t0 = Instant::now();
    while launcher.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let exited = launcher.try_wait().unwrap().is_some();
    if !exited {
        stop("-KILL");
        let _ = launcher.wait();
    }
    read.unwrap();
    assert!(exited, "the group did not stop on SIGTERM");
    let json = reply.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {reply}"));
    assert_eq!(
        v["choices"][0]["text"].as_str(),
        Some(want.as_str()),
        "{reply}"
    );
}

/// Faults across machines (`--hostfile` + `--ranks`, one launcher per rank, as on two
/// hosts): a peer that dies while the group serves makes the surviving rank stop with an
/// error naming a lost peer, within seconds; it does not hang.
#[test]
fn a_peer_that_dies_stops_the_other_rank_with_a_clear_error() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    let _one_group = serial();
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = root.join("mlx-cli/tests/models/dense_f32");
    let hf = two_rank_hostfile("mlx-launch-dies");
    let start = |rank: &str| {
        Command::new(env!("CARGO_BIN_EXE_mlx"))
            .args([
                "launch",
                "--hostfile",
                hf.to_str().unwrap(),
                "--ranks",
                rank,
            ])
            .args(["--timeout", "60", "--", "serve", "--port", "0", "--model"])
            .arg(&model)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let mut r0 = start("0");
    let mut r1 = start("1");
    let kill = |pid: u32| {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status();
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let err = r0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    while !seen.contains("listening on") {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(l) => seen.push_str(&(l + "\n")),
            Err(_) => {
                kill(r0.id());
                kill(r1.id());
                panic!("rank 0 never listened:\n{seen}");
            }
        }
    }
    // Rank 1 (its launcher and its process) dies at once.
    kill(r1.id());
    let _ = r1.wait();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = r0.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.is_none() {
        kill(r0.id());
    }
    let _ = r0.wait();
    let _ = std::fs::remove_file(&hf);
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
        seen.push_str(&(l + "\n"));
    }
    let status = status.unwrap_or_else(|| panic!("rank 0 hung after its peer died:\n{seen}"));
    assert!(!status.success(), "{seen}");
    assert!(
        seen.contains("a peer of this launched group died"),
        "{seen}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}
