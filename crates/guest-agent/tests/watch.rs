//! File watches through the async client, against the agent as a host
//! process: what a watch reports of files made, written, moved and
//! removed, in directories made after it began too, how a long poll
//! returns, the limits, and the watch's end when its path goes.

#![cfg(feature = "client")]

mod common;

use std::time::{Duration, Instant};

use common::Agent;
use guest_agent::protocol::{WatchEvent, WatchEventKind, MAX_WATCHES};
use guest_agent::AgentErrorCode;

/// Reads watch `id` from `since` until `want` events came, or 10 s.
async fn events(agent: &Agent, id: &str, mut since: u64, want: usize) -> Vec<WatchEvent> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < want && Instant::now() < deadline {
        let batch = agent
            .client()
            .await
            .watch_events(id, since, Duration::from_secs(2))
            .await
            .unwrap();
        since = batch.next;
        got.extend(batch.events);
    }
    got
}

fn kinds(
    events: &[WatchEvent],
    root: &std::path::Path,
) -> Vec<(WatchEventKind, String, Option<String>)> {
    let rel = |p: &str| {
        p.strip_prefix(&*root.to_string_lossy())
            .unwrap_or(p)
            .to_owned()
    };
    events
        .iter()
        .map(|e| (e.kind, rel(&e.path), e.to.as_deref().map(rel)))
        .collect()
}

#[tokio::test]
async fn a_recursive_watch_sees_files_made_written_moved_and_removed() {
    use WatchEventKind::{Created, Deleted, Modified, Moved};
    let agent = Agent::start();
    let root = agent.dir.join("files");
    let watch = agent
        .client()
        .await
        .watch_start(&root.to_string_lossy(), true)
        .await
        .unwrap();
    assert_eq!((watch.next_seq, watch.dirs, watch.ended), (0, 1, false));

    // A long poll returns when the first change comes, not at its end.
    let began = Instant::now();
    let poll = {
        let (agent_socket, id) = (agent.socket.clone(), watch.id.clone());
        tokio::spawn(async move {
            let stream = guest_agent::client::connect_unix(&agent_socket)
                .await
                .unwrap();
            guest_agent::GuestAgentClient::new(stream)
                .watch_events(&id, 0, Duration::from_secs(30))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(root.join("a"), b"1").unwrap();
    let first = poll.await.unwrap();
    assert!(began.elapsed() < Duration::from_secs(10));
    assert_eq!(first.events[0].kind, Created);

    // Written in pieces: one `modified` until read.
    for piece in 0..5 {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(root.join("a"))
            .unwrap();
        write!(f, "{piece}").unwrap();
    }
    std::fs::rename(root.join("a"), root.join("b")).unwrap();
    // A directory made after the watch began is followed, and a file put
    // in it before its own watch existed is reported.
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::write(root.join("sub/deeper/c"), b"x").unwrap();
    std::fs::remove_file(root.join("b")).unwrap();
    let got = events(&agent, &watch.id, first.next, 6).await;
    let seen = kinds(&got, &root);
    let has = |k: WatchEventKind, p: &str, to: Option<&str>| {
        seen.iter()
            .any(|(kk, pp, tt)| *kk == k && pp == p && tt.as_deref() == to)
    };
    assert!(has(Modified, "/a", None), "{seen:?}");
    assert_eq!(
        seen.iter()
            .filter(|(k, p, _)| *k == Modified && p == "/a")
            .count(),
        1,
        "{seen:?}"
    );
    assert!(has(Moved, "/a", Some("/b")), "{seen:?}");
    assert!(has(Created, "/sub", None), "{seen:?}");
    assert!(has(Created, "/sub/deeper/c", None), "{seen:?}");
    assert!(has(Deleted, "/b", None), "{seen:?}");
    // Numbered without gaps.
    for pair in got.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1, "{got:?}");
    }

    // Moving a followed directory: what happens in it is reported at
    // its new place.
    std::fs::rename(root.join("sub"), root.join("moved")).unwrap();
    std::fs::write(root.join("moved/deeper/d"), b"y").unwrap();
    let since = got.last().unwrap().seq + 1;
    let seen = kinds(&events(&agent, &watch.id, since, 2).await, &root);
    assert!(
        seen.contains(&(Moved, "/sub".into(), Some("/moved".into()))),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(Created, "/moved/deeper/d".into(), None)),
        "{seen:?}"
    );

    let listed = agent.client().await.watch_list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].dirs >= 3, "{listed:?}");
    agent.client().await.watch_stop(&watch.id).await.unwrap();
    assert!(agent.client().await.watch_list().await.unwrap().is_empty());
    let err = agent
        .client()
        .await
        .watch_events(&watch.id, 0, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(AgentErrorCode::NotFound), "{err}");
}

#[tokio::test]
async fn a_watch_ends_when_its_path_goes_and_bad_requests_change_nothing() {
    let agent = Agent::start();
    let root = agent.dir.join("files");
    let file = root.join("one");
    std::fs::write(&file, b"1").unwrap();
    let watch = agent
        .client()
        .await
        .watch_start(&file.to_string_lossy(), false)
        .await
        .unwrap();
    std::fs::write(&file, b"2").unwrap();
    std::fs::remove_file(&file).unwrap();
    let got = events(&agent, &watch.id, 0, 2).await;
    assert_eq!(got[0].kind, WatchEventKind::Modified, "{got:?}");
    assert_eq!(got.last().unwrap().kind, WatchEventKind::Deleted, "{got:?}");
    let batch = agent
        .client()
        .await
        .watch_events(&watch.id, 99, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(batch.watch.ended && batch.events.is_empty(), "{batch:?}");

    fn code<T: std::fmt::Debug>(r: Result<T, guest_agent::ClientError>) -> Option<AgentErrorCode> {
        r.unwrap_err().code()
    }
    let missing = root.join("nothing-here");
    assert_eq!(
        code(
            agent
                .client()
                .await
                .watch_start(&missing.to_string_lossy(), false)
                .await
        ),
        Some(AgentErrorCode::NotFound)
    );
    assert_eq!(
        code(
            agent
                .client()
                .await
                .watch_start("relative/path", false)
                .await
        ),
        Some(AgentErrorCode::InvalidInput)
    );
    assert_eq!(
        code(
            agent
                .client()
                .await
                .watch_events(&watch.id, 0, Duration::from_secs(601))
                .await
        ),
        Some(AgentErrorCode::InvalidInput)
    );
    // At most MAX_WATCHES (the ended one counts until stopped).
    for _ in 1..MAX_WATCHES {
        agent
            .client()
            .await
            .watch_start(&root.to_string_lossy(), false)
            .await
            .unwrap();
    }
    assert_eq!(
        code(
            agent
                .client()
                .await
                .watch_start(&root.to_string_lossy(), false)
                .await
        ),
        Some(AgentErrorCode::TooLarge)
    );
    agent.client().await.watch_stop(&watch.id).await.unwrap();
    agent
        .client()
        .await
        .watch_start(&root.to_string_lossy(), false)
        .await
        .unwrap();
}
