//! exec, signal and result through the async client.

#![cfg(feature = "client")]

mod common;

use std::time::{Duration, Instant};

use common::{eventually, Agent};
use guest_agent::client::PtyInput;
use guest_agent::protocol::WinSize;
use guest_agent::{
    AgentErrorCode, ClientError, ExecCall, ExecExit, ExecOutcome, ExecStdin, ExecUpdate,
};
use tokio::sync::mpsc;

async fn run(agent: &Agent, req: ExecCall) -> guest_agent::ExecOutput {
    agent
        .client()
        .await
        .exec_collect(req, ExecStdin::None)
        .await
        .unwrap()
}

async fn result(agent: &Agent, id: &str) -> Result<ExecOutcome, ClientError> {
    agent.client().await.result(id).await
}

#[tokio::test]
async fn argv_and_shell_run_and_report_exit_codes() {
    let agent = Agent::start();
    let out = run(&agent, ExecCall::argv(["echo", "hello", "world"])).await;
    assert_eq!(out.stdout, b"hello world\n");
    assert_eq!(out.exited.code, Some(0));
    assert!(out.exited.success());
    assert!(out.pid > 0);
    assert_eq!(out.exec_id, out.exited.exec_id);

    let out = run(&agent, ExecCall::shell("echo out; echo err >&2; exit 42")).await;
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!((out.exited.code, out.exited.signal), (Some(42), None));
    assert_eq!((out.exited.stdout_bytes, out.exited.stderr_bytes), (4, 4));
    assert!(!out.exited.timed_out);

    let out = run(&agent, ExecCall::shell("kill -TERM $$")).await;
    assert_eq!(
        (out.exited.code, out.exited.signal),
        (None, Some(libc::SIGTERM))
    );

    let err = agent
        .client()
        .await
        .exec_collect(ExecCall::argv(["/no/such/program"]), ExecStdin::None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::NotFound), "{err}");
    let err = agent
        .client()
        .await
        .exec_collect(ExecCall::default(), ExecStdin::None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput), "{err}");
}

#[tokio::test]
async fn env_and_cwd_apply_over_a_minimal_environment() {
    let agent = Agent::start();
    let dir = agent.files();
    let req = ExecCall::shell("echo $GREETING; pwd; echo $PATH; echo $HOME; env | wc -l")
        .env("GREETING", "hi there")
        .cwd(dir.to_str().unwrap());
    let out = run(&agent, req).await;
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "hi there");
    assert_eq!(lines[1], dir.to_str().unwrap());
    assert!(lines[2].contains("/usr/bin"), "{text}");
    assert_eq!(lines[3], "/root");
    // PATH, HOME, GREETING, and what sh adds itself (PWD, SHLVL, _...).
    assert!(lines[4].trim().parse::<u32>().unwrap() <= 6, "{text}");
}

#[tokio::test]
async fn uid_and_gid_apply() {
    // SAFETY: getuid/getgid take no arguments and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let agent = Agent::start();
    // Our own ids always work; another user only as root.
    let target = if uid == 0 { (65534, 65534) } else { (uid, gid) };
    let out = run(
        &agent,
        ExecCall::shell("id -u; id -g").user(target.0, target.1),
    )
    .await;
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}\n{}\n", target.0, target.1)
    );
}

#[tokio::test]
async fn named_users_resolve_in_the_agents_passwd() {
    // SAFETY: getuid takes no arguments and cannot fail.
    let uid = unsafe { libc::getuid() };
    let agent = Agent::start();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    // This process's own user (any user may "switch" to itself), by name.
    let Some(me) = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.get(2) == Some(&uid.to_string().as_str())).then(|| (f[0].to_owned(), f[5].to_owned()))
    }) else {
        eprintln!("skipped: uid {uid} is not in /etc/passwd");
        return;
    };
    let out = run(
        &agent,
        ExecCall::shell("id -u; echo $HOME").user_named(me.0.clone()),
    )
    .await;
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{uid}\n{}\n", me.1)
    );
    let err = agent
        .client()
        .await
        .exec_collect(
            ExecCall::shell("id -u").user_named("no-such-user-here"),
            ExecStdin::None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput), "{err}");
    assert!(err.to_string().contains("no-such-user-here"), "{err}");
}

#[tokio::test]
async fn stdin_streams_from_the_client() {
    let agent = Agent::start();
    let (tx, rx) = mpsc::channel(4);
    let feeder = tokio::spawn(async move {
        for i in 0..5 {
            tx.send(format!("line {i}\n").into_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Dropping tx sends EOF.
    });
    let out = agent
        .client()
        .await
        .exec_collect(ExecCall::argv(["cat"]), ExecStdin::Channel(rx))
        .await
        .unwrap();
    feeder.await.unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "line 0\nline 1\nline 2\nline 3\nline 4\n"
    );

    let big = common::random_bytes(7, 3 << 20);
    let out = agent
        .client()
        .await
        .exec_collect(
            ExecCall::shell("wc -c").output_cap(1 << 20),
            ExecStdin::Bytes(big),
        )
        .await
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "3145728");

    // stdin "none" is /dev/null.
    let out = run(&agent, ExecCall::argv(["cat"])).await;
    assert!(out.stdout.is_empty() && out.exited.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_execs_run_concurrently() {
    let agent = Agent::start();
    let start = Instant::now();
    let runs = (0..8).map(|i| {
        let endpoint = agent.endpoint();
        tokio::spawn(async move {
            let req = ExecCall::shell(format!("sleep 0.5; echo {i}"));
            let client = endpoint.connect().await.unwrap();
            (i, client.exec_collect(req, ExecStdin::None).await.unwrap())
        })
    });
    for run in runs.collect::<Vec<_>>() {
        let (i, out) = run.await.unwrap();
        assert_eq!(out.stdout, format!("{i}\n").into_bytes());
    }
    // Serially this would take 4 s.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn output_past_the_cap_is_counted_and_dropped() {
    let agent = Agent::start();
    let req =
        ExecCall::shell("head -c 3000000 /dev/zero; head -c 10 /dev/zero >&2").output_cap(1000);
    let out = run(&agent, req).await;
    assert_eq!(out.stdout.len(), 1000);
    assert_eq!(out.exited.stdout_bytes, 3_000_000);
    assert_eq!(out.exited.stdout_dropped, 2_999_000);
    assert_eq!((out.stderr.len(), out.exited.stderr_dropped), (10, 0));

    // The default cap is 1 MiB.
    let out = run(&agent, ExecCall::shell("head -c 1500000 /dev/zero")).await;
    assert_eq!(out.stdout.len(), 1 << 20);
    assert_eq!(out.exited.stdout_dropped, 1_500_000 - (1 << 20));

    let err = agent
        .client()
        .await
        .exec_collect(
            ExecCall::shell("true").output_cap(65 << 20),
            ExecStdin::None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::TooLarge));
}

fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // A zombie is gone too (its parent, the agent, reaps it soon).
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn timeout_kills_the_process_group() {
    let agent = Agent::start();
    let req = ExecCall::shell("sleep 30 & echo $!; wait").timeout(Duration::from_millis(500));
    let start = Instant::now();
    let out = run(&agent, req).await;
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(out.exited.timed_out);
    assert_eq!(out.exited.signal, Some(libc::SIGKILL));
    assert!(out.exited.wall_ms >= 500, "{}", out.exited.wall_ms);
    let background: u32 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eventually("the background sleep to die", || process_gone(background));

    let quick = run(
        &agent,
        ExecCall::shell("true").timeout(Duration::from_secs(5)),
    )
    .await;
    assert!(!quick.exited.timed_out && quick.exited.success());
    // A timeout too far away to represent is no timeout.
    let mut forever = ExecCall::shell("true");
    forever.timeout_ms = Some(u64::MAX);
    assert!(run(&agent, forever).await.exited.success());
}

/// Starts an exec on its own connection; returns once it has started.
async fn start_exec(
    agent: &Agent,
    req: ExecCall,
) -> (
    String,
    tokio::task::JoinHandle<Result<ExecExit, ClientError>>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let client = agent.client().await;
    let task = tokio::spawn(async move {
        client
            .exec(req, ExecStdin::None, move |event| {
                if let ExecUpdate::Started { exec_id, .. } = event {
                    let _ = tx.send(exec_id);
                }
            })
            .await
    });
    let id = rx.recv().await.expect("the exec did not start");
    (id, task)
}

#[tokio::test]
async fn signal_from_a_second_connection() {
    let agent = Agent::start();
    let (id, task) = start_exec(&agent, ExecCall::argv(["sleep", "30"]).id("sleeper")).await;
    assert_eq!(id, "sleeper");
    agent
        .client()
        .await
        .signal("sleeper", "TERM")
        .await
        .unwrap();
    let exited = task.await.unwrap().unwrap();
    assert_eq!(exited.signal, Some(libc::SIGTERM));
    assert!(!exited.timed_out);

    let (id, task) = start_exec(&agent, ExecCall::argv(["sleep", "30"])).await;
    agent.client().await.signal(&id, 9).await.unwrap();
    assert_eq!(task.await.unwrap().unwrap().signal, Some(9));

    let err = agent.client().await.signal(&id, "KILL").await.unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::NotFound));
    let err = agent
        .client()
        .await
        .signal("nope", "KILL")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::NotFound));
    let err = agent.client().await.signal(&id, "BOGUS").await.unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput));
}

#[tokio::test]
async fn results_are_kept_by_id() {
    let agent = Agent::start();
    let (id, task) = start_exec(
        &agent,
        ExecCall::shell("sleep 0.5; echo hello; echo oops >&2; exit 3").id("job-1"),
    )
    .await;
    assert!(matches!(
        result(&agent, &id).await.unwrap(),
        ExecOutcome::Running { pid } if pid > 0
    ));
    // The id is taken while it runs.
    let err = agent
        .client()
        .await
        .exec_collect(ExecCall::shell("true").id("job-1"), ExecStdin::None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::Exists));
    let exited = task.await.unwrap().unwrap();
    assert_eq!(exited.code, Some(3));
    assert!(exited.stdout_head.is_none());

    for _ in 0..2 {
        let ExecOutcome::Exited(kept) = result(&agent, "job-1").await.unwrap() else {
            panic!("still running")
        };
        assert_eq!(kept.code, Some(3));
        assert_eq!(kept.stdout_head_bytes().unwrap(), b"hello\n");
        assert_eq!(kept.stderr_head_bytes().unwrap(), b"oops\n");
        assert_eq!(kept.stdout_bytes, exited.stdout_bytes);
    }
    let err = result(&agent, "never-ran").await.unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::NotFound));
}

#[tokio::test]
async fn an_exec_outlives_its_client_and_its_result_stays() {
    let agent = Agent::start();
    let req = ExecCall::shell("sleep 0.5; echo done").id("orphan");
    let client = agent.client().await;
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        client.exec_collect(req, ExecStdin::None),
    )
    .await;
    assert!(cut.is_err(), "the exec should still have been running");
    let mut last = None;
    for _ in 0..100 {
        match result(&agent, "orphan").await.unwrap() {
            ExecOutcome::Running { .. } => tokio::time::sleep(Duration::from_millis(50)).await,
            ExecOutcome::Exited(e) => {
                last = Some(e);
                break;
            }
        }
    }
    let exited = last.expect("the exec never finished");
    assert_eq!(exited.code, Some(0));
    assert_eq!(exited.stdout_bytes, 5);
    assert_eq!(exited.stdout_head_bytes().unwrap(), b"done\n");
}

#[tokio::test]
async fn a_command_starts_with_every_signal_at_its_default() {
    // Started as a shell's background job under nohup starts it: what the
    // agent ignores is not its commands' to ignore (a shell's trap of
    // SIGINT would do nothing, and Ctrl-C on a terminal would not reach
    // it).
    let ignored = &[libc::SIGINT, libc::SIGQUIT, libc::SIGHUP];
    let agent = Agent::start_ignoring(&[], ignored);
    let line = "grep -E '^Sig(Ign|Blk)' /proc/self/status";
    let out = run(&agent, ExecCall::shell(line)).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let mask = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or_else(|| panic!("{key} in {text}"))
    };
    assert_eq!(mask("SigBlk:"), 0, "{text}");
    // The standard signals (1-31); 32 and 33 are glibc's own, which it
    // sets up in every program and lets no program change.
    assert_eq!(mask("SigIgn:") & 0x7fff_ffff, 0, "{text}");
}

#[tokio::test]
async fn a_pty_exec_has_a_terminal_that_follows_resizes_and_turns_ctrl_c_into_sigint() {
    let agent = Agent::start();
    let (tx, rx) = mpsc::channel(8);
    let line = "stty size; read line; stty size; echo got-$line; \
                trap 'echo interrupted; exit 9' INT; echo ready; \
                while :; do sleep 0.1; done";
    let req = ExecCall::shell(line).pty(WinSize { rows: 20, cols: 70 });
    // Input goes as the shell shows it is there: typed before the
    // shell runs, a terminal may drop it (a ^C flushes what is queued
    // and signals no one yet), and the test would wait for ever.
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let (mut typed, mut interrupted) = (false, false);
    let on_update = |update: ExecUpdate| match update {
        ExecUpdate::Stdout(bytes) => {
            stdout.extend_from_slice(&bytes);
            let text = String::from_utf8_lossy(&stdout);
            if !typed && text.contains("20 70") {
                let size = WinSize { rows: 30, cols: 90 };
                tx.try_send(PtyInput::Resize(size)).unwrap();
                tx.try_send(PtyInput::Data(b"hello\n".to_vec())).unwrap();
                typed = true;
            }
            if !interrupted && text.contains("ready") {
                tx.try_send(PtyInput::Data(vec![0x03])).unwrap();
                interrupted = true;
            }
        }
        ExecUpdate::Stderr(bytes) => stderr.extend_from_slice(&bytes),
        _ => {}
    };
    let client = agent.client().await;
    let running = client.exec(req, ExecStdin::Terminal(rx), on_update);
    let exited = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the terminal's command did not end within 60 s")
        .unwrap();
    let text = String::from_utf8_lossy(&stdout);
    assert!(stderr.is_empty(), "a terminal merges the streams");
    assert!(text.contains("20 70"), "{text:?}");
    assert!(text.contains("30 90"), "{text:?}");
    assert!(text.contains("got-hello"), "{text:?}");
    assert!(text.contains("interrupted"), "{text:?}");
    assert_eq!(exited.code, Some(9), "{text:?}");

    // Background processes have no terminal.
    let err = agent
        .client()
        .await
        .process_start(ExecCall::argv(["true"]).pty(WinSize::default()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput));
}

/// The `request exec` lines an agent's verbose log has.
fn exec_requests(agent: &Agent) -> usize {
    agent
        .log()
        .lines()
        .filter(|l| l.ends_with("request exec"))
        .count()
}

#[tokio::test]
async fn warm_up_runs_one_command_through_the_exec_path_before_serving() {
    let plain = Agent::start();
    let warmed = Agent::start_with(&["--warm-up"]);
    for agent in [&plain, &warmed] {
        let out = run(agent, ExecCall::argv(["echo", "served"])).await;
        assert_eq!(out.stdout, b"served\n");
    }
    // Without the flag (and not PID 1) only the caller's command ran.
    assert_eq!(exec_requests(&plain), 1, "{}", plain.log());
    assert_eq!(exec_requests(&warmed), 2, "{}", warmed.log());
    assert!(
        !warmed.log().contains("warming the exec path"),
        "{}",
        warmed.log()
    );
}
