//! Guest faults that explain themselves: a real-guest test fails with the
//! guest console's tail when a guest process dies of a signal the test did
//! not expect, or when the guest kernel logs such a death (docs/testing.md).

/// What the guest kernel prints when a user process dies of a fault (the
/// `show_unhandled_signals` lines) or the kernel itself goes wrong.
const FAULT_MARKERS: &[&str] = &[
    "segfault at ",
    "general protection fault",
    "traps: ",
    "invalid opcode",
    "Kernel panic",
    "BUG: ",
    "Oops: ",
];

/// Console lines shown with a failure.
pub const TAIL_LINES: usize = 40;

/// The console lines that report a guest process (or kernel) fault.
pub fn fault_lines(console: &str) -> Vec<&str> {
    console
        .lines()
        .filter(|l| FAULT_MARKERS.iter().any(|m| l.contains(m)))
        .collect()
}

/// The last `n` lines of a console.
pub fn tail(console: &str, n: usize) -> String {
    let lines: Vec<&str> = console.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether `signal` is one a process gets for a fault of its own (SIGILL,
/// SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV): no test expects these.
pub fn is_fault_signal(signal: i32) -> bool {
    matches!(signal, 4..=8 | 11)
}

/// Panics with the console's fault lines and tail when the guest logged a
/// fault; `what` names the guest in the message.
pub fn assert_no_faults(what: &str, console: &str) {
    let faults = fault_lines(console);
    assert!(
        faults.is_empty(),
        "{what}: the guest logged a process fault:\n{}\n--- last {TAIL_LINES} console lines ---\n{}",
        faults.join("\n"),
        tail(console, TAIL_LINES)
    );
}

/// Panics with the console tail when a guest process ended by a fault
/// signal; `what` names the command.
pub fn assert_not_faulted(what: &str, signal: Option<i32>, console: &str) {
    if let Some(sig) = signal.filter(|s| is_fault_signal(*s)) {
        panic!(
            "{what} died of signal {sig} in the guest\n--- last {TAIL_LINES} console lines ---\n{}",
            tail(console, TAIL_LINES)
        );
    }
}

/// The console of every workspace under the state directory `home`, by
/// workspace name.
pub fn workspace_consoles(home: &std::path::Path) -> Vec<(String, String)> {
    let Some(all) = crate::open_state_dir(home) else {
        return Vec::new();
    };
    let names = all
        .list(&workspace::ListFilter::default())
        .unwrap_or_default();
    names
        .into_iter()
        .filter_map(|meta| {
            let lines = all.workspace(&meta.name).ok()?.logs(None).ok()?;
            Some((meta.name, lines.join("\n")))
        })
        .collect()
}

/// Panics with the console's fault lines and tail when the guest of any
/// workspace under the state directory `home` logged a fault.
pub fn assert_no_faults_in(home: &std::path::Path) {
    for (name, console) in workspace_consoles(home) {
        assert_no_faults(&format!("workspace {name}"), &console);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE: &str = "\
[    1.0] Run /init as init process
[  168.5] sleep[39]: segfault at 0 ip 00000000004a4d02 sp 00007fff4485fda8 error 4 in busybox[401000+184000]
[  168.6] Code: 48 c7 c0 70 ff ff ff
[  239.1] traps: tail[84] general protection fault ip:41bf19 sp:7ffd148c9380 error:0
[  240.0] all fine here
";

    #[test]
    fn finds_the_kernel_fault_lines() {
        let faults = fault_lines(CONSOLE);
        assert_eq!(faults.len(), 2, "{faults:?}");
        assert!(faults[0].contains("sleep[39]: segfault"));
        assert!(faults[1].contains("tail[84]"));
        assert!(fault_lines("[ 1.0] Run /init\n[ 2.0] ok\n").is_empty());
    }

    #[test]
    fn tails_and_signals() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a\n", 5), "a");
        assert!(is_fault_signal(11) && is_fault_signal(7) && is_fault_signal(4));
        assert!(!is_fault_signal(9) && !is_fault_signal(15) && !is_fault_signal(2));
    }

    #[test]
    fn a_fault_fails_with_the_console_tail() {
        let err = std::panic::catch_unwind(|| assert_no_faults("guest e2e", CONSOLE))
            .expect_err("a segfault line must fail");
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.contains("sleep[39]: segfault") && msg.contains("all fine here"));
        assert_no_faults("clean", "[ 1.0] ok\n");

        let err = std::panic::catch_unwind(|| assert_not_faulted("sleep", Some(11), CONSOLE))
            .expect_err("SIGSEGV must fail");
        assert!(err.downcast_ref::<String>().unwrap().contains("signal 11"));
        assert_not_faulted("sleep", Some(9), CONSOLE);
        assert_not_faulted("sleep", None, CONSOLE);
    }
}
