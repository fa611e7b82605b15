//! `cargo xtask`: builds guest assets (kernels, initramfs), boots them, runs
//! the test suite with skip accounting, and benchmarks the VMM.

mod bench;
mod bench_agent;
mod bench_balloon;
mod bench_browser;
mod bench_code;
mod bench_containerd;
mod bench_density;
mod bench_devices;
mod bench_forks;
mod bench_idle;
mod bench_images;
mod bench_list;
mod bench_net;
mod bench_servers;
mod bench_snapshot;
mod bench_tasks;
mod bench_tti;
mod bench_workspace;
mod boot;
mod bundle;
mod cache;
mod call_edges;
mod cpio;
mod dist;
mod fuzz;
mod fuzz_inputs;
mod images;
mod initramfs;
mod kernel;
mod mcp_clients;
mod modules;
mod nolibc;
mod passt;
mod rootfs;
mod run_cmd;
mod sh;
mod soak;
mod test_cmd;
mod test_lanes;
mod tidy;
mod tidy_docs;
mod tidy_structure;

use anyhow::bail;

const HELP: &str = "\
cargo xtask <task> [options]

tasks:
  setup                         build every guest asset this host needs (cached): kernel,
                                test initramfs, device test rootfs, minimal and debian images;
                                and the MCP clients the HTTP tests use (Python SDK, conformance)
  guest-kernel [--variant V]    build the guest kernel; V = host (default), standard, compat
  initramfs                     build the test initramfs (marker, uname -a, reboot)
  test-rootfs                   build the ext4 root filesystem of the device tests
  rootfs [minimal|debian|all]   build workspace root images (default all): busybox + agent,
                                or Debian bookworm minbase + python3 + agent (docs/images.md);
                                MICROAGENT_AGENT_BIN=PATH uses a prebuilt static agent
  run [-- COMMAND...]           build the kernel, the minimal image and microagent, then run
                                COMMAND (default `uname -a`) in a fresh workspace
  boot [-- ARGS]                build assets and microagent, boot the guest, show its console;
                                ARGS go to `microagent vmm boot` (e.g. --vcpus 2)
  test [--no-lint] [--only A,B]  fmt check, clippy, 20 s of queue fuzzing, then the whole
                                test suite, its binaries one lane per core
                                (MICROAGENT_TEST_LANES), with a passed/failed/skipped summary
  soak [--processes N] [--rounds N] [--cmdline OPTIONS]
                                the guest stress check (docs/host-compat.md): N short-lived
                                processes after heavy I/O in a booted guest (default 1000),
                                for N rounds (default 3); fails on any guest process fault;
                                OPTIONS are extra guest kernel options to test a hypothesis
  dist [--with containerd]      the binaries as shipped, in target/dist/: microagent, the
                                lean VMM process microagent-vmm (static, LTO) and the guest's
                                agent and init beside them (and the containerd shim
                                containerd-shim-microagent-v2 with --with containerd)
  dist --bundle [--binaries DIR] [--kernels host|all] [--out DIR]
                                the release tarball microagent-VERSION-x86_64-linux.tar.gz:
                                bin/, libexec/microagent/, share/microagent/ (kernels and
                                minimal), completions, man pages, systemd unit, install.sh
  modules [--edges]             each crate's module cycles (from its `use crate::`/`super::`
                                paths, and for folders also its calls of the central types'
                                methods) and source files per folder; fails on a cycle;
                                --edges lists every edge instead, call edges marked
  fuzz [--seconds N]            random virtio queues into blk, vsock and net processing (default 30 s)
  bench vmm [--runs N] [--against DIST_DIR]
                                VMM figures: process start to first KVM_RUN, time to the
                                init marker, VMM RSS beyond guest memory; the RSS of a
                                running workspace's microagent-vmm (target: 2.5 MiB);
                                --against also measures another build's `dist` output
  bench devices                 vsock round trip and throughput, virtio-blk sequential read,
                                each beside the host's own loopback figure
  bench agent                   guest agent exec round trip and file throughput, beside the
                                agent running as a host process
  bench images [--release]      `image pull` (download + convert) of a busybox image and of a
                                five-layer ~120 MB one from a registry on loopback beside
                                `skopeo copy`; create + start of a workspace of it beside
                                one of `minimal`
  bench tasks                   `task run` to its command running beside a cold boot, a warm
                                start and a warm start with a clone; host PSS of 4 tasks at once
  bench tti [--runs N] [--cold-runs N] [--release] [--against DIST_DIR]
                                time to interactive: CLI create+start+exec and MCP
                                workspace_create+start+exec from a pool, a warm snapshot and
                                cold, beside an exec round trip; `start` alone warm beside
                                cold with the VMM's steps; fork launch to vCPU running
                                beside the VMM program's bare start (default 10 runs each)
                                (with --against, also --against-cache DIR: the asset cache
                                the other build's own `cargo xtask` filled, for an older
                                build whose agent speaks an older protocol; vmm, snapshot too)
  bench density [--forks N]      forks of one snapshot running at once (10, 50, N; default
                                100), every agent answering: host PSS per fork, split into
                                the pages its guest dirtied and what VMM and passt hold
                                (`--release`: the release VMM, as users run it)
  bench idle [--forks N]        forks idle with --idle-pause 45s (default 10): host CPU of all
                                of them running idle beside paused, and exec on a paused fork
                                (it resumes) beside exec on it running; then hibernated: what
                                is left, and exec on one (it is restored) beside a warm start
                                (`--release` as above)
  bench list [--workspaces N]   `microagent list` over N workspaces (default 1000), beside
                                the process's own floor (`--release` as above)
  bench balloon                 a 1 GiB guest fills 200 MiB of tmpfs and frees it: host PSS
                                given back and how fast, beside what the fill cost
  bench containerd [--runs N]   `ctr run` to the container's first output through our shim,
                                cold (image converted, guest booted) and warm, beside
                                containerd's runc shim on the same image
  bench browser [--runs N]      first `browser open` (Chromium's start included) and a later
                                `browser snapshot`, beside `exec WS -- true`, same workspace
  bench code [--runs N]         `code_run` of 1+1 on a warm session beside `exec true` (library
                                and CLI), and a pooled workspace's session start to 1st result
  bench servers [--runs N]      `exec WS -- true` on a workspace of a server reached over
                                ssh (Debian's sshd on loopback) beside one of this host
  bench workspace [--runs N]    create, start, exec, stop, delete through the CLI; VMM RSS
                                and host disk of a running workspace
  bench snapshot [--runs N] [--against DIST_DIR]
                                snapshot take (pause, size), restore to vCPU running and to
                                agent ready, 5 forks' memory, each beside a cold boot;
                                --against measures another build's `dist` output too
  bench net                     TCP throughput and round trip: guest to host over the user
                                network, host to guest over a published port, beside the
                                host's own loopback

Assets are cached in $MICROAGENT_CACHE (default ~/.cache/microagent), keyed by a hash
of their inputs; the newest of each is linked from <cache>/current/.
";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((t, r)) => (t.as_str(), r),
        None => {
            print!("{HELP}");
            return Ok(());
        }
    };
    match task {
        "setup" => {
            run_cmd::ensure_runtime_debs()?;
            run_cmd::ensure_vmm_account()?;
            run_cmd::ensure_kvm_group()?;
            passt::ensure_fixed()?;
            sh::ensure_debs(run_cmd::TAP_NETWORK_PACKAGES)?;
            kernel::build(kernel::variant_for_host()?)?;
            initramfs::build()?;
            rootfs::build()?;
            images::run(&[])?;
            mcp_clients::ensure()
        }
        "guest-kernel" => {
            let variant = match rest {
                [] => kernel::variant_for_host()?,
                [flag, v] if flag == "--variant" => kernel::parse_variant(v)?,
                _ => bail!("usage: cargo xtask guest-kernel [--variant host|standard|compat]"),
            };
            // The path on stdout, for scripts.
            kernel::build(variant).map(|vmlinux| println!("{}", vmlinux.display()))
        }
        "initramfs" => initramfs::build().map(drop),
        "test-rootfs" => rootfs::build().map(drop),
        "rootfs" => images::run(rest),
        "run" => run_cmd::run(rest.strip_prefix(&["--".to_string()][..]).unwrap_or(rest)),
        "boot" => boot::run(rest.strip_prefix(&["--".to_string()][..]).unwrap_or(rest)),
        "test" => test_cmd::run(rest),
        "fuzz" => fuzz::run(rest),
        "dist" => match rest {
            [] => dist::build().map(drop),
            [with, what] if with == "--with" && what == "containerd" => {
                dist::build_with_shim().map(drop)
            }
            [flag, options @ ..] if flag == "--bundle" => bundle::run(options),
            _ => bail!("usage: cargo xtask dist [--with containerd | --bundle [--binaries DIR] [--kernels host|all] [--out DIR]]"),
        },
        "soak" => soak::run(rest),
        "modules" => modules::run(&cache::repo_root(), rest),
        "bench" => match rest {
            [what] if what == "devices" => bench_devices::run(),
            [what] if what == "agent" => bench_agent::run(),
            [what, more @ ..] if what == "images" => bench_images::run_bench(more),
            [what] if what == "tasks" => bench_tasks::run(),
            [what, more @ ..] if what == "tti" => bench_tti::run(more),
            [what, more @ ..] if what == "density" => bench_density::run(more),
            [what, more @ ..] if what == "idle" => bench_idle::run(more),
            [what, more @ ..] if what == "list" => bench_list::run(more),
            [what, more @ ..] if what == "balloon" => bench_balloon::run(more),
            [what, more @ ..] if what == "containerd" => bench_containerd::run(more),
            [what, more @ ..] if what == "net" => bench_net::run(more),
            [what, more @ ..] if what == "servers" => bench_servers::run(more),
            [what, more @ ..] if what == "browser" => bench_browser::run(more),
            [what, more @ ..] if what == "code" => bench_code::run(more),
            [what, more @ ..] if what == "workspace" => bench_workspace::run(more),
            [what, more @ ..] if what == "snapshot" => bench_snapshot::run(more),
            _ => bench::run(rest),
        },
        "-h" | "--help" | "help" => {
            print!("{HELP}");
            Ok(())
        }
        other => bail!("unknown task `{other}`\n\n{HELP}"),
    }
}
