//! The code-session kernel client against a real Jupyter kernel (Debian's
//! python3-ipykernel) run on the host, on loopback: state kept between
//! runs, results, printed streams, rich displays, errors, an interrupted
//! endless loop, a wrong key; and the library's JavaScript kernel on the
//! host's node the same way.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::net::TcpStream;
use workspace::code_sessions::{CodeRunLimits, JupyterClient, JupyterError};

const KEY: &str = "a-key-of-this-test";
/// The JavaScript kernel and runner a session's start writes into a guest.
const JS_KERNEL: &str = include_str!("../src/code_sessions/kernels/javascript_kernel.py");
const JS_RUNNER: &str = include_str!("../src/code_sessions/kernels/javascript_runner.js");

/// A kernel on loopback, ended with the test: forked by the library's
/// kernel server into a launcher's process group, as in a guest.
struct Kernel {
    server: Child,
    launcher: Child,
    dir: PathBuf,
    ports: Value,
}

impl Kernel {
    /// Starts Python's as a session's start does (a kernel server, a
    /// launcher, a fork) with ports 0 (it picks and writes them back)
    /// and waits for the connection file to name them.
    fn start(python: &Path, name: &str) -> Kernel {
        Self::start_with(python, name, "python", |_, file| {
            (
                vec![
                    "-f".into(),
                    file.display().to_string(),
                    workspace::code_sessions::KERNEL_IP_ARG.into(),
                ],
                json!({}),
            )
        })
    }

    /// Starts the library's JavaScript kernel as a session's start does:
    /// its kernel and runner written out, forked by the server.
    fn start_javascript(python: &Path, name: &str) -> Kernel {
        Self::start_with(python, name, "javascript", |dir, file| {
            let kernel_py = dir.join("kernel.py");
            let runner = dir.join("runner.js");
            std::fs::write(&kernel_py, JS_KERNEL).unwrap();
            std::fs::write(&runner, JS_RUNNER).unwrap();
            (
                vec![
                    kernel_py.display().to_string(),
                    "-f".into(),
                    file.display().to_string(),
                    workspace::code_sessions::KERNEL_IP_ARG.into(),
                ],
                json!({"MICROAGENT_JS_RUNNER": runner.display().to_string()}),
            )
        })
    }

    fn start_with(
        python: &Path,
        name: &str,
        language: &str,
        request: impl FnOnce(&Path, &Path) -> (Vec<String>, Value),
    ) -> Kernel {
        let dir = std::env::temp_dir().join(format!("code-kernel-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("kernel.json");
        let zero = json!({
            "ip": "127.0.0.1", "transport": "tcp", "signature_scheme": "hmac-sha256", "key": KEY,
            "shell_port": 0, "iopub_port": 0, "stdin_port": 0, "control_port": 0, "hb_port": 0,
        });
        std::fs::write(&file, zero.to_string()).unwrap();
        let port_file = dir.join("server.json");
        let log = || {
            std::fs::File::options()
                .create(true)
                .append(true)
                .open(dir.join("kernel.log"))
                .unwrap()
        };
        let mut server = Command::new(python);
        server
            .args(["-c", workspace::code_sessions::SERVER])
            .arg(&port_file)
            .env("HOME", &dir)
            .env("MPLBACKEND", "agg")
            .current_dir(&dir);
        let server = background(server, log().into());
        let address = read_json_when(&port_file, |v| v["port"].as_u64().is_some(), "server");
        let launcher = launcher(log().into());
        let (argv, env) = request(&dir, &file);
        let reply = ask(
            &address,
            json!({
                "key": address["key"], "launcher": launcher.id(), "language": language,
                "argv": argv, "env": env,
            }),
        );
        assert!(reply["pid"].is_u64(), "{reply}");
        let ports = read_json_when(
            &file,
            |v| v["shell_port"].as_u64().unwrap_or(0) != 0,
            "kernel",
        );
        Kernel {
            server,
            launcher,
            dir,
            ports,
        }
    }

    async fn connect(&self, key: &str) -> Result<JupyterClient<TcpStream>, JupyterError> {
        connect_to(&self.ports, key).await
    }
}

/// A client of the kernel whose connection file says `ports`.
async fn connect_to(ports: &Value, key: &str) -> Result<JupyterClient<TcpStream>, JupyterError> {
    let port = |name: &str| {
        let port = ports[name].as_u64().unwrap();
        TcpStream::connect(("127.0.0.1", port as u16))
    };
    let (shell, iopub, control) = (
        port("shell_port").await.unwrap(),
        port("iopub_port").await.unwrap(),
        port("control_port").await.unwrap(),
    );
    JupyterClient::connect(
        shell,
        iopub,
        control,
        key.as_bytes(),
        Duration::from_secs(60),
    )
    .await
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // The launcher's group: it and the kernel (and node).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.launcher.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.launcher.wait();
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `command` started as the guest agent starts a background process:
/// leading its own process group, stdin and stdout null.
fn background(mut command: Command, stderr: Stdio) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .unwrap()
}

/// A kernel's launcher, as a session's start runs it.
fn launcher(stderr: Stdio) -> Child {
    let mut command = Command::new("sh");
    command.args(["-c", workspace::code_sessions::LAUNCHER]);
    background(command, stderr)
}

/// The JSON in `file` once `whole` says it is (at most a minute).
fn read_json_when(file: &Path, whole: impl Fn(&Value) -> bool, what: &str) -> Value {
    let mut json = Value::Null;
    let named = testkit::wait_until(Duration::from_secs(60), || {
        json = std::fs::read(file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        whole(&json)
    });
    assert!(named, "the {what} wrote no ports: {json}");
    json
}

/// One request to the kernel server at `address`, and its answer.
fn ask(address: &Value, request: Value) -> Value {
    ask_raw(address, &request.to_string())
}

/// One line to the kernel server at `address`, and its answer.
fn ask_raw(address: &Value, line: &str) -> Value {
    use std::io::{BufRead, Write};
    let port = address["port"].as_u64().unwrap() as u16;
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut line = String::new();
    std::io::BufReader::new(conn).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

async fn run(
    client: &mut JupyterClient<TcpStream>,
    code: &str,
) -> workspace::code_sessions::CodeRun {
    let never = std::future::pending::<()>();
    client
        .execute(
            code,
            Duration::from_secs(60),
            CodeRunLimits::default(),
            never,
            |_, _| {},
        )
        .await
        .unwrap()
}

/// Runs `code` with a 2 s timeout, which it is to outlast.
async fn past_two_seconds(
    client: &mut JupyterClient<TcpStream>,
    code: &str,
) -> workspace::code_sessions::CodeRun {
    let timed = client
        .execute(
            code,
            Duration::from_secs(2),
            CodeRunLimits::default(),
            std::future::pending::<()>(),
            |_, _| {},
        )
        .await
        .unwrap();
    assert_eq!(
        timed.stopped.as_deref(),
        Some("timed out after 2s"),
        "{timed:?}"
    );
    timed
}

/// Runs `endless` past a 2 s timeout, then `waiting` until its caller
/// cancels it after 1 s: both are stopped, the first with the error
/// `interrupted` (the session goes on: the caller checks it).
async fn interrupted_twice(
    client: &mut JupyterClient<TcpStream>,
    endless: &str,
    waiting: &str,
    interrupted: &str,
) {
    let timed = past_two_seconds(client, endless).await;
    assert_eq!(timed.error.expect("interrupted").name, interrupted);
    let cancelled = client
        .execute(
            waiting,
            Duration::from_secs(600),
            CodeRunLimits::default(),
            tokio::time::sleep(Duration::from_secs(1)),
            |_, _| {},
        )
        .await
        .unwrap();
    assert_eq!(
        cancelled.stopped.as_deref(),
        Some("cancelled"),
        "{cancelled:?}"
    );
}

#[tokio::test]
async fn a_kernel_keeps_state_and_returns_results_streams_and_errors() {
    let test = "jupyter_kernel::a_kernel_keeps_state_and_returns_results_streams_and_errors";
    let Some(python) = testkit::require(test, testkit::ipykernel_python()) else {
        return;
    };
    let kernel = Kernel::start(&python, "state");
    let mut client = kernel.connect(KEY).await.unwrap();
    let set = run(&mut client, "x = 41").await;
    assert_eq!(set.result, None, "{set:?}");
    assert!(set.error.is_none(), "{set:?}");
    let got = run(&mut client, "x + 1").await;
    assert_eq!(got.result.as_deref(), Some("42"), "{got:?}");
    assert_eq!(got.execution_count, Some(2));
    // Started without the debugger and jedi (minutes of imports in an
    // emulated guest), which the session's own code still imports.
    let started = run(
        &mut client,
        "import sys\nskipped = ('debugpy' in sys.modules, 'jedi' in sys.modules)\n\
         import debugpy, jedi\nskipped, 'jedi' in sys.modules",
    )
    .await;
    assert_eq!(
        started.result.as_deref(),
        Some("((False, False), True)"),
        "{started:?}"
    );
    // Printed output comes as it is printed; the caller hears it too.
    let mut heard = String::new();
    let never = std::future::pending::<()>();
    let printed = client
        .execute(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)",
            Duration::from_secs(60),
            CodeRunLimits::default(),
            never,
            |name, text| heard.push_str(&format!("{name}:{text}")),
        )
        .await
        .unwrap();
    assert_eq!(
        (printed.stdout.as_str(), printed.stderr.as_str()),
        ("out\n", "err\n")
    );
    assert!(
        heard.contains("stdout:out") && heard.contains("stderr:err"),
        "{heard}"
    );
    // A raised error: its name, value and an uncolored traceback.
    let failed = run(&mut client, "1 / 0").await;
    let error = failed.error.expect("an error");
    assert_eq!(error.name, "ZeroDivisionError");
    assert!(error.value.contains("division by zero"), "{}", error.value);
    assert!(
        !error.traceback.concat().contains('\u{1b}'),
        "{:?}",
        error.traceback
    );
    // Rich displays: HTML beside the plain text, an image in base64.
    let html = run(
        &mut client,
        "from IPython.display import HTML, Image, display\n\
         display(HTML('<b>bold</b>'))\n\
         import base64\n\
         png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')\n\
         display(Image(data=png))",
    )
    .await;
    let mimes: Vec<_> = html.outputs.iter().map(|o| o.mime.as_str()).collect();
    assert_eq!(mimes, ["text/html", "image/png"], "{html:?}");
    assert_eq!(html.outputs[0].data, "<b>bold</b>");
    assert!(html.outputs[1].data.starts_with("iVBORw0KGgo"), "{html:?}");
    // Output past the limits is cut and said to be.
    let never = std::future::pending::<()>();
    let limits = CodeRunLimits {
        stream_bytes: 10,
        ..CodeRunLimits::default()
    };
    let long = client
        .execute(
            "print('y' * 100)",
            Duration::from_secs(60),
            limits,
            never,
            |_, _| {},
        )
        .await
        .unwrap();
    assert_eq!(long.stdout, "y".repeat(10));
    assert!(long.truncated);
    assert_eq!(run(&mut client, "x").await.result.as_deref(), Some("41"));
}

#[tokio::test]
async fn an_endless_loop_is_interrupted_and_the_session_goes_on() {
    let test = "jupyter_kernel::an_endless_loop_is_interrupted_and_the_session_goes_on";
    let Some(python) = testkit::require(test, testkit::ipykernel_python()) else {
        return;
    };
    let kernel = Kernel::start(&python, "interrupt");
    let mut client = kernel.connect(KEY).await.unwrap();
    run(&mut client, "kept = 'still here'").await;
    interrupted_twice(
        &mut client,
        "while True:\n    pass",
        "import time\nwhile True:\n    time.sleep(0.01)",
        "KeyboardInterrupt",
    )
    .await;
    assert_eq!(
        run(&mut client, "kept").await.result.as_deref(),
        Some("'still here'")
    );
    client.shutdown(false).await.unwrap();
}

#[tokio::test]
async fn a_connection_left_open_while_another_client_runs_still_serves() {
    // What a kept connection (`code_sessions::kept`) meets: the session's
    // runs from another process (a CLI run) while it was kept; their
    // results are published to it too and passed over.
    let test = "jupyter_kernel::a_connection_left_open_while_another_client_runs_still_serves";
    let Some(python) = testkit::require(test, testkit::ipykernel_python()) else {
        return;
    };
    let kernel = Kernel::start(&python, "kept");
    let mut kept = kernel.connect(KEY).await.unwrap();
    assert_eq!(run(&mut kept, "x = 1").await.error, None);
    let mut other = kernel.connect(KEY).await.unwrap();
    for _ in 0..5 {
        let ran = run(&mut other, "x += 1; print('from the other', x); x").await;
        assert!(ran.error.is_none(), "{ran:?}");
    }
    let got = run(&mut kept, "print('kept'); x").await;
    assert_eq!(got.result.as_deref(), Some("6"), "{got:?}");
    assert_eq!(
        got.stdout, "kept\n",
        "another client's output leaked: {got:?}"
    );
}

/// Whether process `pid` is gone (or a zombie) within 10 s.
fn ends(pid: u32) -> bool {
    testkit::wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                stat.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    })
}

#[tokio::test]
async fn the_kernel_server_forks_fresh_kernels_that_end_with_their_launchers() {
    let test =
        "jupyter_kernel::the_kernel_server_forks_fresh_kernels_that_end_with_their_launchers";
    let Some(python) = testkit::require(test, testkit::ipykernel_python()) else {
        return;
    };
    let mut first = Kernel::start(&python, "forks");
    let address: Value =
        serde_json::from_slice(&std::fs::read(first.dir.join("server.json")).unwrap()).unwrap();
    // Refused: another key, a launcher that leads no group, bad fields.
    let mut spare = launcher(Stdio::null());
    let good = json!({"key": address["key"], "launcher": spare.id(), "language": "python",
        "argv": ["-f", first.dir.join("second.json").display().to_string()], "env": {}});
    let mut wrong = good.clone();
    wrong["key"] = json!("not-the-key");
    assert_eq!(ask(&address, wrong)["error"], "wrong key");
    let mut member = good.clone();
    member["launcher"] = json!(first.server.id() + 100_000);
    assert!(ask(&address, member)["error"].is_string());
    let mut no_group = good.clone();
    no_group["launcher"] = json!(std::process::id());
    // This test's process leads no group of its own (cargo's does).
    if nix_getpgid_is_not_self() {
        assert!(ask(&address, no_group)["error"].is_string());
    }
    for (field, value) in [
        ("language", json!("ruby")),
        ("argv", json!("x")),
        ("env", json!({"A": 1})),
    ] {
        let mut bad = good.clone();
        bad[field] = value;
        assert!(ask(&address, bad)["error"].is_string(), "{field}");
    }
    // What once ended the server (red team): a key not ASCII, a nesting
    // too deep for Python's parser, a pid past any integer; the server
    // itself, or a launcher of a running kernel, as the launcher.
    let mut odd_key = good.clone();
    odd_key["key"] = json!("\u{e9}\u{1f600}");
    assert_eq!(ask(&address, odd_key)["error"], "wrong key");
    assert!(ask_raw(&address, &"[".repeat(60_000))["error"].is_string());
    for launcher in [
        json!(u64::MAX),
        json!(first.server.id()),
        json!(first.launcher.id()),
    ] {
        let mut bad = good.clone();
        bad["launcher"] = launcher;
        assert!(
            ask(&address, bad.clone())["error"].is_string(),
            "{}",
            bad["launcher"]
        );
    }
    // A client that drips its request does not hold the server: it is
    // cut off after 5 s, and the next is answered.
    let port = address["port"].as_u64().unwrap() as u16;
    let mut drip = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let dripping = std::thread::spawn(move || {
        use std::io::Write;
        for _ in 0..20 {
            if drip.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let began = std::time::Instant::now();
    let mut wrong = good.clone();
    wrong["key"] = json!("x");
    assert_eq!(ask(&address, wrong)["error"], "wrong key");
    assert!(
        began.elapsed() < Duration::from_secs(8),
        "{:?}",
        began.elapsed()
    );
    dripping.join().unwrap();
    // Another user of the machine, with the key, is refused.
    let other = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&python)
        .arg("-c")
        .arg(
            "import socket,sys\ns=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n\
             s.sendall(sys.argv[2].encode()+b'\\n')\nprint(s.makefile().readline())",
        )
        .arg(port.to_string())
        .arg(good.to_string())
        .output();
    if let Some(out) = other.ok().filter(|o| o.status.success()) {
        let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(reply["error"], "not a client of this user", "{reply}");
    } else {
        println!("{test}: no `runuser -u nobody` here: the other-user check was not run");
    }
    // A second kernel from the same server: its own state, its own
    // random numbers.
    let reply = ask(&address, good);
    let second_pid = reply["pid"].as_u64().unwrap() as u32;
    let second_ports = read_json_when(
        &first.dir.join("second.json"),
        |v| v["shell_port"].as_u64().unwrap_or(0) != 0,
        "second kernel",
    );
    let key = second_ports["key"].as_str().unwrap();
    let mut a = first.connect(KEY).await.unwrap();
    let mut b = connect_to(&second_ports, key).await.unwrap();
    run(&mut a, "x = 1").await;
    let draw = "import random; random.random()";
    let (one, two) = (run(&mut a, draw).await, run(&mut b, draw).await);
    assert_ne!(one.result, two.result, "{one:?} {two:?}");
    assert_eq!(
        run(&mut b, "'x' in dir()").await.result.as_deref(),
        Some("False")
    );
    // Its launcher killed alone: the kernel ends too.
    let _ = spare.kill();
    let _ = spare.wait();
    assert!(ends(second_pid), "the kernel outlived its launcher");
    // The first kernel shut down: its launcher is ended by the server.
    a.shutdown(false).await.unwrap();
    let status = testkit::wait_until(Duration::from_secs(10), || {
        matches!(first.launcher.try_wait(), Ok(Some(_)))
    });
    assert!(status, "the launcher outlived its kernel");
}

fn nix_getpgid_is_not_self() -> bool {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    fields[2] != std::process::id().to_string()
}

#[tokio::test]
async fn a_client_with_another_key_hears_nothing_it_takes() {
    let test = "jupyter_kernel::a_client_with_another_key_hears_nothing_it_takes";
    let Some(python) = testkit::require(test, testkit::ipykernel_python()) else {
        return;
    };
    let kernel = Kernel::start(&python, "key");
    // The kernel drops our badly signed requests, and what it publishes
    // is not signed with ours: never ready.
    let shell = TcpStream::connect((
        "127.0.0.1",
        kernel.ports["shell_port"].as_u64().unwrap() as u16,
    ));
    let iopub = TcpStream::connect((
        "127.0.0.1",
        kernel.ports["iopub_port"].as_u64().unwrap() as u16,
    ));
    let control = TcpStream::connect((
        "127.0.0.1",
        kernel.ports["control_port"].as_u64().unwrap() as u16,
    ));
    let got = JupyterClient::connect(
        shell.await.unwrap(),
        iopub.await.unwrap(),
        control.await.unwrap(),
        b"not the key",
        Duration::from_secs(3),
    )
    .await;
    assert!(
        matches!(
            got,
            Err(JupyterError::Unresponsive { .. } | JupyterError::Message { .. })
        ),
        "{:?}",
        got.err()
    );
    // The right key still works after it.
    let mut client = kernel.connect(KEY).await.unwrap();
    assert_eq!(
        run(&mut client, "6 * 7").await.result.as_deref(),
        Some("42")
    );
}

#[tokio::test]
async fn a_javascript_session_keeps_state_prints_fails_and_is_interrupted() {
    let test = "jupyter_kernel::a_javascript_session_keeps_state_prints_fails_and_is_interrupted";
    let Some(python) = testkit::require(test, testkit::ipykernel_python()) else {
        return;
    };
    let node = Command::new("node").arg("--version").output();
    let node = match node {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err("no node on PATH (apt-get install nodejs)".to_owned()),
    };
    if testkit::require(test, node).is_none() {
        return;
    }
    let kernel = Kernel::start_javascript(&python, "javascript");
    let mut client = kernel.connect(KEY).await.unwrap();
    let set = run(&mut client, "let x = 41").await;
    assert_eq!(
        (set.result.as_deref(), &set.error),
        (None, &None),
        "{set:?}"
    );
    let got = run(&mut client, "x + 1").await;
    assert_eq!(got.result.as_deref(), Some("42"), "{got:?}");
    assert_eq!(got.execution_count, Some(2));
    // What it prints comes as it is printed, beside its value.
    let mut heard = String::new();
    let printed = client
        .execute(
            "console.log('out', {a: 1}); console.error('err'); [1, 2]",
            Duration::from_secs(60),
            CodeRunLimits::default(),
            std::future::pending::<()>(),
            |name, text| heard.push_str(&format!("{name}:{text}")),
        )
        .await
        .unwrap();
    assert_eq!(
        (printed.stdout.as_str(), printed.stderr.as_str()),
        ("out { a: 1 }\n", "err\n")
    );
    assert_eq!(printed.result.as_deref(), Some("[ 1, 2 ]"));
    assert!(
        heard.contains("stdout:out") && heard.contains("stderr:err"),
        "{heard}"
    );
    // A thrown error: its name, message and the cell's own frames.
    let failed = run(&mut client, "null.f()").await;
    let error = failed.error.expect("an error");
    assert_eq!(error.name, "TypeError", "{error:?}");
    assert!(error.value.contains("null"), "{error:?}");
    assert!(
        error.traceback.iter().all(|l| !l.contains("runner.js")),
        "{error:?}"
    );
    // A promise as the last value is awaited; modules come from node.
    let awaited = run(
        &mut client,
        "new Promise(r => setTimeout(() => r(x * 2), 50))",
    )
    .await;
    assert_eq!(awaited.result.as_deref(), Some("82"), "{awaited:?}");
    let module = run(&mut client, "require('path').join('a', 'b')").await;
    assert_eq!(module.result.as_deref(), Some("'a/b'"), "{module:?}");
    // An endless loop past its timeout, and a wait on a promise that
    // never settles cancelled by its caller: both interrupted.
    interrupted_twice(
        &mut client,
        "while (true) {}",
        "new Promise(() => {})",
        "Interrupted",
    )
    .await;
    assert_eq!(run(&mut client, "x").await.result.as_deref(), Some("41"));
    // Output printed between cells does not stop node, and a cell larger
    // than a pipe's buffer still goes through.
    run(
        &mut client,
        "globalThis.chatter = setInterval(() => console.log('x'.repeat(1000)), 1)",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let large = format!(
        "clearInterval(chatter); /* {} */ 'through'",
        "y".repeat(200 * 1024)
    );
    assert_eq!(
        run(&mut client, &large).await.result.as_deref(),
        Some("'through'")
    );
    // A loop in a timer, which no interrupt reaches: node is killed after
    // the grace, the session goes on with a fresh one.
    run(&mut client, "setTimeout(() => { for (;;) {} }, 0); 1").await;
    let stuck = past_two_seconds(&mut client, "x").await;
    assert_eq!(
        stuck.error.expect("killed").name,
        "Interrupted",
        "{:?}",
        stuck.stopped
    );
    let fresh = run(&mut client, "typeof x").await;
    assert_eq!(fresh.result.as_deref(), Some("'undefined'"), "{fresh:?}");
    assert!(fresh.stderr.contains("a new one runs"), "{fresh:?}");
    // Node ending with a detached child of its own still holding on: the
    // run says so at once, and the next one has a fresh node.
    let ended = run(
        &mut client,
        "require('child_process').spawn('sleep', ['30'], {detached: true, stdio: 'ignore'}).unref(); process.exit(3)",
    )
    .await;
    assert_eq!(ended.error.expect("node gone").name, "NodeGone");
    assert_eq!(run(&mut client, "1 + 1").await.result.as_deref(), Some("2"));
    client.shutdown(false).await.unwrap();
}
