//! End to end: the real guest kernel (the variant this host needs) boots
//! with the test initramfs, whose init prints a marker, runs `uname -a` and
//! reboots. Slow where guest kernel mode is emulated (~20-30 s), so this is
//! the only such test in vmm-core.

use std::time::Duration;

use vmm_core::devices::serial::ConsoleSink;
use vmm_core::{Machine, MachineConfig, StopReason};

#[test]
fn boots_linux_to_init_and_runs_uname_on_two_vcpus() {
    let Some(assets) = testkit::require(
        "boots_linux_to_init_and_runs_uname_on_two_vcpus",
        testkit::guest_assets(),
    ) else {
        return;
    };
    let console = testkit::Capture::default();
    let machine = Machine::build(MachineConfig {
        kernel: assets.kernel.clone(),
        initrd: Some(assets.initramfs.clone()),
        extra_cmdline: None,
        mem_mib: 128,
        vcpus: 2,
        template: assets.host.cpu_template(),
        console: ConsoleSink::new().with(Box::new(console.clone())),
        disks: Vec::new(),
        vsock: None,
        net: None,
        balloon: false,
    })
    .unwrap();
    let outcome = machine.run(Some(Duration::from_secs(300))).unwrap();
    let log = console.text();
    testkit::guest_faults::assert_no_faults("guest", &log);
    assert_eq!(
        outcome.reason,
        StopReason::Reset,
        "registers: {:?}\nconsole:\n{log}",
        outcome.registers
    );
    assert!(
        log.contains("MICROAGENT-INIT-OK pid=1"),
        "no init marker:\n{log}"
    );
    let uname = log
        .lines()
        .find(|l| l.starts_with("Linux "))
        .unwrap_or_else(|| panic!("no uname -a line:\n{log}"));
    assert!(uname.contains("x86_64"), "{uname}");
    assert!(
        log.contains("MICROAGENT-INIT-OK done"),
        "uname did not succeed:\n{log}"
    );
    assert!(
        log.contains("Brought up 1 node, 2 CPUs"),
        "the second vCPU did not come up:\n{log}"
    );
    assert!(outcome.first_run_ns.is_some());
}
