//! Background processes through the async client, against the agent as a
//! host process: the table, the rings and cursors, stdin, signals, waits,
//! and what survives the connection that started a process.

#![cfg(feature = "client")]

mod common;

use std::time::{Duration, Instant};

use common::Agent;
use guest_agent::protocol::{
    ProcessEntry, ProcessRunState, StdinMode, MAX_FINISHED_PROCESSES, MAX_PROCESS_RING,
};
use guest_agent::{AgentErrorCode, ExecCall, ProcessRead};

async fn start(agent: &Agent, req: ExecCall) -> ProcessEntry {
    agent.client().await.process_start(req).await.unwrap()
}

async fn output(agent: &Agent, id: &str, cursors: [u64; 2], wait_ms: u64) -> ProcessRead {
    agent
        .client()
        .await
        .process_output(id, cursors, None, Duration::from_millis(wait_ms))
        .await
        .unwrap()
}

async fn wait(agent: &Agent, id: &str, secs: u64) -> ProcessEntry {
    agent
        .client()
        .await
        .process_wait(id, Duration::from_secs(secs))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_process_runs_on_after_its_client_and_its_output_reads_from_cursors() {
    let agent = Agent::start();
    let started = Instant::now();
    let info = start(
        &agent,
        ExecCall::shell("echo one; sleep 1; echo two; echo err >&2; exit 3"),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "process_start returns before the process ends"
    );
    assert_eq!(info.state, ProcessRunState::Running);
    assert!(info.pid > 1);
    assert!(info.id.starts_with("proc-"), "{info:?}");
    assert_eq!(
        info.command,
        "echo one; sleep 1; echo two; echo err >&2; exit 3"
    );

    // A long poll returns as soon as the first line is there.
    let first = output(&agent, &info.id, [0, 0], 5_000).await;
    assert_eq!(first.stdout, b"one\n");
    assert_eq!(first.output.stdout.next_cursor, 4);
    assert!(!first.output.eof);

    let done = wait(&agent, &info.id, 20).await;
    assert_eq!(done.state, ProcessRunState::Exited);
    assert_eq!((done.exit_code, done.signal), (Some(3), None));
    assert_eq!((done.stdout_bytes, done.stderr_bytes), (8, 4));
    assert!(done.ended_unix_ms.unwrap() >= done.started_unix_ms);

    // From the cursor: only what came after; from 0 again: everything.
    let rest = output(&agent, &info.id, [4, 0], 1_000).await;
    assert_eq!(rest.stdout, b"two\n");
    assert_eq!(rest.stderr, b"err\n");
    assert_eq!(rest.output.stdout.cursor, 4);
    assert!(rest.output.eof);
    let all = output(&agent, &info.id, [0, 0], 0).await;
    assert_eq!(all.stdout, b"one\ntwo\n");
    // Nothing new after the end: the answer comes at once, empty.
    let t = Instant::now();
    let none = output(&agent, &info.id, [8, 4], 5_000).await;
    assert!(none.stdout.is_empty() && none.stderr.is_empty());
    assert!(t.elapsed() < Duration::from_secs(4), "no wait after eof");

    let listed = agent.client().await.process_list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].exit_code, Some(3));
    agent.client().await.process_remove(&info.id).await.unwrap();
    let err = agent
        .client()
        .await
        .process_wait(&info.id, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::NotFound), "{err}");
}

#[tokio::test]
async fn a_small_ring_keeps_the_newest_output_and_says_what_was_dropped() {
    let agent = Agent::start();
    let info = start(
        &agent,
        ExecCall::shell("i=0; while [ $i -lt 100 ]; do echo line$i; i=$((i+1)); done")
            .output_cap(64)
            .id("ring"),
    )
    .await;
    assert_eq!(info.id, "ring");
    assert_eq!(info.ring_bytes, 64);
    let done = wait(&agent, "ring", 20).await;
    assert_eq!(done.exit_code, Some(0));
    let read = output(&agent, "ring", [0, 0], 0).await;
    assert_eq!(read.stdout.len(), 64);
    assert!(read.stdout.ends_with(b"line99\n"));
    let total = done.stdout_bytes;
    assert_eq!(read.output.stdout.dropped, total - 64);
    assert_eq!(read.output.stdout.cursor, total - 64);
    assert_eq!(read.output.stdout.next_cursor, total);

    let err = agent
        .client()
        .await
        .process_start(ExecCall::shell("true").output_cap(MAX_PROCESS_RING + 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::TooLarge), "{err}");
    let err = agent
        .client()
        .await
        .process_start(ExecCall::shell("true").id("ring"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::Exists), "{err}");
}

#[tokio::test]
async fn stdin_is_written_then_closed_and_signals_end_a_process() {
    let agent = Agent::start();
    let mut req = ExecCall::argv(["cat"]);
    req.stdin = StdinMode::Stream;
    let cat = start(&agent, req).await;
    assert!(cat.stdin_open);
    let n = agent
        .client()
        .await
        .process_stdin(&cat.id, b"hello ", false)
        .await
        .unwrap();
    assert_eq!(n, 6);
    let first = output(&agent, &cat.id, [0, 0], 5_000).await;
    assert_eq!(first.stdout, b"hello ");
    agent
        .client()
        .await
        .process_stdin(&cat.id, b"world\n", true)
        .await
        .unwrap();
    let done = wait(&agent, &cat.id, 20).await;
    assert_eq!(done.exit_code, Some(0), "closing stdin ends cat");
    assert!(!done.stdin_open);
    assert_eq!(
        output(&agent, &cat.id, [0, 0], 0).await.stdout,
        b"hello world\n"
    );
    let err = agent
        .client()
        .await
        .process_stdin(&cat.id, b"late", false)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput), "{err}");

    // No stdin asked for: none to write to.
    let sleeper = start(&agent, ExecCall::argv(["sleep", "600"])).await;
    let err = agent
        .client()
        .await
        .process_stdin(&sleeper.id, b"x", false)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput), "{err}");
    // A bounded wait on a running process returns it still running.
    let t = Instant::now();
    let still = wait(&agent, &sleeper.id, 1).await;
    assert_eq!(still.state, ProcessRunState::Running);
    assert!(t.elapsed() >= Duration::from_millis(900));
    let err = agent
        .client()
        .await
        .process_remove(&sleeper.id)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput), "{err}");
    agent
        .client()
        .await
        .process_signal(&sleeper.id, "TERM")
        .await
        .unwrap();
    let done = wait(&agent, &sleeper.id, 20).await;
    assert_eq!((done.exit_code, done.signal), (None, Some(libc::SIGTERM)));

    // A timeout kills it and says so.
    let timed = start(
        &agent,
        ExecCall::argv(["sleep", "600"]).timeout(Duration::from_millis(300)),
    )
    .await;
    let done = wait(&agent, &timed.id, 20).await;
    assert!(done.timed_out);
    assert_eq!(done.signal, Some(libc::SIGKILL));
}

#[tokio::test]
async fn finished_processes_are_pushed_out_by_newer_ones_and_bad_requests_change_nothing() {
    let agent = Agent::start();
    let mut ids = Vec::new();
    for i in 0..MAX_FINISHED_PROCESSES + 3 {
        let info = start(&agent, ExecCall::argv(["true"]).id(format!("t{i}"))).await;
        wait(&agent, &info.id, 20).await;
        ids.push(info.id);
    }
    let listed = agent.client().await.process_list().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(listed.len(), MAX_FINISHED_PROCESSES, "{names:?}");
    assert!(
        !names.contains(&"t0") && names.contains(&"t34"),
        "{names:?}"
    );

    for (req, code) in [
        (
            ExecCall::shell("true").id("bad id"),
            AgentErrorCode::InvalidInput,
        ),
        (
            ExecCall::argv(["/no/such/program"]),
            AgentErrorCode::NotFound,
        ),
        (
            ExecCall::shell("true").timeout(Duration::ZERO),
            AgentErrorCode::InvalidInput,
        ),
    ] {
        let err = agent.client().await.process_start(req).await.unwrap_err();
        assert_eq!(err.code(), Some(code), "{err}");
    }
    let err = agent
        .client()
        .await
        .process_output("nope", [0, 0], None, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::NotFound), "{err}");
    let err = agent
        .client()
        .await
        .process_wait("t34", Duration::from_secs(601))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput), "{err}");
    let err = agent
        .client()
        .await
        .process_signal("t34", "NOPE")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::InvalidInput), "{err}");
    assert_eq!(
        agent.client().await.process_list().await.unwrap().len(),
        MAX_FINISHED_PROCESSES
    );
    common::ping(&agent);
}
