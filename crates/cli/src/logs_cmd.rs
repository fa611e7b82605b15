//! `microagent logs` (the serial console) and `microagent events`.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use workspace::Event;
use workspace::{Error, Workspaces};

use crate::output;

pub async fn logs(
    ws: &Workspaces,
    name: &str,
    lines: Option<usize>,
    follow: bool,
    json: bool,
) -> Result<ExitCode, Error> {
    let tail = ws.workspace(name)?.logs(lines)?;
    if json && !follow {
        output::json(&serde_json::json!({ "workspace": name, "lines": tail }));
        return Ok(ExitCode::SUCCESS);
    }
    for line in &tail {
        if json {
            output::json(&serde_json::json!({ "line": line }));
        } else {
            println!("{}", output::guest_text(line));
        }
    }
    if !follow {
        return Ok(ExitCode::SUCCESS);
    }
    let mut offset = ws.workspace(name)?.logs_from(0)?.next_offset;
    let mut partial = Vec::new();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let workspace::guest::ConsoleChunk {
            data: bytes,
            next_offset: next,
            ..
        } = ws.workspace(name)?.logs_from(offset)?;
        offset = next;
        if json {
            partial.extend_from_slice(&bytes);
            while let Some(pos) = partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = partial.drain(..=pos).collect();
                let text = String::from_utf8_lossy(&line).trim_end().replace('\r', "");
                output::json(&serde_json::json!({ "line": text }));
            }
        } else if !bytes.is_empty() {
            let mut out = std::io::stdout().lock();
            let written = if std::io::stdout().is_terminal() {
                out.write_all(output::inert(&String::from_utf8_lossy(&bytes)).as_bytes())
            } else {
                out.write_all(&bytes)
            };
            let _ = written.and_then(|()| out.flush());
        }
    }
}

fn print_event(e: &Event, json: bool) {
    if json {
        output::json(e);
        return;
    }
    let mut v = serde_json::to_value(e).unwrap_or_default();
    let kind = v["kind"].as_str().unwrap_or("?").to_owned();
    if let Some(obj) = v.as_object_mut() {
        for k in ["seq", "at_ms", "kind"] {
            obj.remove(k);
        }
    }
    let details: Vec<String> = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        })
        .unwrap_or_default();
    // JSON leaves C1 controls as they are; an event's details carry
    // guest text (exit reasons, refused names).
    println!(
        "{:>4}  {}  {:<14} {}",
        e.seq,
        e.at_ms,
        output::field(&kind),
        output::field(&details.join(" "))
    );
}

pub async fn events(
    ws: &Workspaces,
    name: &str,
    after: u64,
    follow: bool,
    wait: Option<u64>,
    json: bool,
) -> Result<ExitCode, Error> {
    let mut cursor = after;
    let first_wait = Duration::from_secs(wait.unwrap_or(0));
    let events = ws.workspace(name)?.events(cursor, first_wait).await?;
    for e in &events {
        print_event(e, json);
        cursor = e.seq;
    }
    if !follow {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            got = ws.workspace(name)?.events(cursor, Duration::from_secs(30)) => {
                for e in &got? {
                    print_event(e, json);
                    cursor = e.seq;
                }
                let _ = std::io::stdout().flush();
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
