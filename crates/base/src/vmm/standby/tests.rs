//! The claim protocol end to end in one process: a standby's listener on
//! a thread, claims and refusals from the test.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::vmm::fd_pass::send_with_fd;
use crate::vmm::launch::VmmLaunch;

fn home(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("standby-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn me() -> PathBuf {
    std::env::current_exe().unwrap()
}

const SHAPE: StandbyShape = StandbyShape {
    vcpus: 1,
    mem_mib: 256,
};

#[test]
fn the_setting_is_bounded_and_off_by_default() {
    let home = home("config");
    assert_eq!(StandbyConfig::load(&home).unwrap().count, 0);
    let file = home.join(crate::host::settings::CONFIG_FILE);
    std::fs::write(&file, r#"{"standby": {"count": 200}}"#).unwrap();
    assert_eq!(StandbyConfig::load(&home).unwrap().count, MAX_STANDBYS);
    std::fs::write(&file, r#"{"standby": {"count": 1, "program": "x"}}"#).unwrap();
    assert!(StandbyConfig::load(&home).is_err());
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn standby_arguments_round_trip_and_refuse_others() {
    let plain = StandbyArgs {
        home: PathBuf::from("/state"),
        shape: SHAPE,
        like: None,
    };
    let args = standby_args(&plain);
    assert_eq!(standby_from_args(&args), Some(plain.clone()));
    for (at, bad) in [(5, "0"), (5, "33"), (7, "1"), (7, "0x10")] {
        let mut odd = args.clone();
        odd[at] = bad.into();
        assert_eq!(standby_from_args(&odd), None, "{bad}");
    }
    assert_eq!(standby_from_args(&args[..6]), None);
    let mut other = args.clone();
    other[1] = "serve-workspace".into();
    assert_eq!(standby_from_args(&other), None);
    // The workspace it is made like: a name, or nothing at all.
    let like = StandbyArgs {
        like: Some("dev".into()),
        ..plain
    };
    let args = standby_args(&like);
    assert_eq!(standby_from_args(&args), Some(like));
    for bad in ["../x", "", "a/b"] {
        let mut odd = args.clone();
        *odd.last_mut().unwrap() = bad.into();
        assert_eq!(standby_from_args(&odd), None, "{bad}");
    }
    let mut odd = args.clone();
    odd.push("extra".into());
    assert_eq!(standby_from_args(&odd), None);
}

#[test]
fn a_standby_takes_one_claim_with_its_descriptors() {
    let home = home("claim");
    let listener = ClaimListener::bind(&home, SHAPE).unwrap();
    assert_eq!(waiting(&home, SHAPE, &me()), 1);
    let other = StandbyShape {
        vcpus: 2,
        mem_mib: 256,
    };
    assert_eq!(waiting(&home, other, &me()), 0);
    let waiter = std::thread::spawn(move || listener.wait(Duration::from_secs(20)));
    let launch = VmmLaunch::new(
        Path::new("/bin/true"),
        &home,
        "ws1",
        vmm_core::KernelVariant::Standard,
    )
    .restoring(Path::new("/snap"))
    .with_ticket("t1")
    .watching_owner();
    let log = std::fs::File::create(home.join("vmm.log")).unwrap();
    let owner: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    // No standby of another shape; an owner descriptor the launch
    // does not announce is refused before any socket is touched.
    assert_eq!(
        claim(&home, other, &me(), &launch, &log, Some(&owner)),
        None
    );
    let plain = VmmLaunch::new(
        Path::new("/bin/true"),
        &home,
        "ws1",
        vmm_core::KernelVariant::Standard,
    );
    assert_eq!(claim(&home, SHAPE, &me(), &plain, &log, Some(&owner)), None);
    assert_eq!(
        claim(&home, SHAPE, &me(), &launch, &log, Some(&owner)),
        Some(std::process::id())
    );
    let taken = waiter.join().unwrap().unwrap().expect("a claim");
    assert_eq!(taken.launch.workspace, "ws1");
    assert_eq!(taken.launch.restore, Some(PathBuf::from("/snap")));
    assert_eq!(taken.launch.ticket.as_deref(), Some("t1"));
    assert!(taken.owner.is_some());
    // The log descriptor is the file sent.
    let sent = std::fs::metadata(home.join("vmm.log")).unwrap();
    let got = std::fs::metadata(format!("/proc/self/fd/{}", taken.log.as_raw_fd())).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((sent.dev(), sent.ino()), (got.dev(), got.ino()));
    // Taken: its socket is gone; no standby is left to claim.
    assert_eq!(waiting(&home, SHAPE, &me()), 0);
    assert_eq!(
        claim(&home, SHAPE, &me(), &launch, &log, Some(&owner)),
        None
    );
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn a_malformed_claim_is_refused_and_the_standby_waits_on() {
    let home = home("malformed");
    let listener = ClaimListener::bind(&home, SHAPE).unwrap();
    let path = listener.path().to_owned();
    let waiter = std::thread::spawn(move || listener.wait(Duration::from_secs(30)));
    let log = std::fs::File::create(home.join("vmm.log")).unwrap();
    let cases: [&[u8]; 3] = [
        &(MAX_CLAIM_BYTES as u32 + 1).to_le_bytes(),
        &[3, 0, 0, 0, b'a', 0, b'b'],
        &[1, 0, 0],
    ];
    for bytes in cases {
        let stream = UnixStream::connect(&path).unwrap();
        send_with_fd(&stream, bytes, log.as_fd()).unwrap();
        let mut answer = Vec::new();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let _ = (&stream).read_to_end(&mut answer);
        assert!(answer.is_empty(), "{answer:?}");
    }
    // No descriptor at all.
    let stream = UnixStream::connect(&path).unwrap();
    (&stream).write_all(&[1, 0, 0, 0, b'x']).unwrap();
    let _ = (&stream).read_to_end(&mut Vec::new());
    // Still waiting after all that: then asked to end.
    assert_eq!(retire_all(&home), 1);
    assert!(waiter.join().unwrap().unwrap().is_none());
    assert!(!path.exists(), "the socket goes with its standby");
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn retired_standbys_end_without_a_claim() {
    let home = home("retire");
    let waiters: Vec<_> = [
        SHAPE,
        StandbyShape {
            vcpus: 2,
            mem_mib: 512,
        },
    ]
    .into_iter()
    .map(|shape| {
        let listener = ClaimListener::bind(&home, shape).unwrap();
        std::thread::spawn(move || listener.wait(Duration::from_secs(30)))
    })
    .collect();
    assert_eq!(retire_all(&home), 2);
    for waiter in waiters {
        assert!(waiter.join().unwrap().unwrap().is_none());
    }
    assert_eq!(retire_all(&home), 0);
    std::fs::remove_dir_all(&home).unwrap();
}

/// A valid claim's bytes for `home` (length first).
fn claim_bytes(home: &Path) -> Vec<u8> {
    let launch = VmmLaunch::new(
        Path::new("/bin/true"),
        home,
        "ws1",
        vmm_core::KernelVariant::Standard,
    );
    let args: Vec<Vec<u8>> = launch
        .args()
        .iter()
        .map(|a| a.as_bytes().to_vec())
        .collect();
    let body = args.join(&0u8);
    let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
    bytes.extend(body);
    bytes
}

#[test]
fn a_standby_whose_claimer_gave_up_ends_unclaimed() {
    let home = home("gave-up");
    let listener = ClaimListener::bind(&home, SHAPE).unwrap();
    let path = listener.path().to_owned();
    let waiter = std::thread::spawn(move || listener.wait(Duration::from_secs(30)));
    let log = std::fs::File::create(home.join("vmm.log")).unwrap();
    let stream = UnixStream::connect(&path).unwrap();
    send_with_fd(&stream, &claim_bytes(&home), log.as_fd()).unwrap();
    let mut answer = [0u8; 1];
    (&stream).read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"1");
    // The claimer went its own way: no `g`.
    drop(stream);
    assert!(waiter.join().unwrap().unwrap().is_none());
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn only_a_standby_of_the_same_program_and_state_directory_is_claimed() {
    let home = home("generation");
    let other_home = home.join("other");
    std::fs::create_dir(&other_home).unwrap();
    assert_eq!(generation(&me()), generation(&me()));
    assert_ne!(generation(&me()), generation(Path::new("/bin/sh")));
    assert_eq!(generation(Path::new("/nonexistent")), None);
    let listener = ClaimListener::bind(&home, SHAPE).unwrap();
    let waiter = std::thread::spawn(move || listener.wait(Duration::from_secs(30)));
    let log = std::fs::File::create(home.join("vmm.log")).unwrap();
    let launch = |home: &Path| {
        VmmLaunch::new(
            Path::new("/bin/true"),
            home,
            "ws1",
            vmm_core::KernelVariant::Standard,
        )
    };
    // Another program's standbys are not this caller's to take.
    assert_eq!(waiting(&home, SHAPE, Path::new("/bin/sh")), 0);
    assert_eq!(
        claim(
            &home,
            SHAPE,
            Path::new("/bin/sh"),
            &launch(&home),
            &log,
            None
        ),
        None
    );
    // A claim naming another state directory is refused, and the
    // standby, its name taken by that claimer, ends.
    assert_eq!(waiting(&home, SHAPE, &me()), 1);
    assert_eq!(
        claim(&home, SHAPE, &me(), &launch(&other_home), &log, None),
        None
    );
    assert!(waiter.join().unwrap().unwrap().is_none());
    assert_eq!(waiting_all(&home), 0);
    std::fs::remove_dir_all(&home).unwrap();
}

#[test]
fn names_left_by_processes_gone_are_swept_and_not_counted() {
    let home = home("sweep");
    let dir = standby_dir(&home);
    std::fs::create_dir_all(&dir).unwrap();
    // A pid no process has (above the kernel's pid_max).
    let dead = dir.join("1x256-0011223344556677-99999999.sock");
    std::fs::write(&dead, b"").unwrap();
    let odd = dir.join("1x256-0011223344556677-nopid.sock");
    std::fs::write(&odd, b"").unwrap();
    let fresh_claim = dir.join("1x256-0011223344556677-1.sock.claimed-5");
    std::fs::write(&fresh_claim, b"").unwrap();
    // Its cgroups' record goes too (the groups named there are removed
    // only when they are ours under the cgroup root: none here).
    let record = dir.join("1x256-0011223344556677-99999999.cgroups");
    std::fs::write(&record, "/tmp/not-a-cgroup\n").unwrap();
    let live_record = dir.join(format!(
        "1x256-0011223344556677-{}.cgroups",
        std::process::id()
    ));
    std::fs::write(&live_record, "").unwrap();
    // So does the log of the passt it started ahead.
    let passt_log = dir.join("1x256-0011223344556677-99999999.passt.log");
    std::fs::write(&passt_log, b"").unwrap();
    let live_passt_log = dir.join(format!(
        "1x256-0011223344556677-{}.passt.log",
        std::process::id()
    ));
    std::fs::write(&live_passt_log, b"").unwrap();
    // And the directory it made its private root on ahead.
    let root = dir.join("1x256-0011223344556677-99999999.root");
    std::fs::create_dir(&root).unwrap();
    let live_root = dir.join(format!(
        "1x256-0011223344556677-{}.root",
        std::process::id()
    ));
    std::fs::create_dir(&live_root).unwrap();
    let log = dir.join("standby.log");
    std::fs::write(&log, b"kept").unwrap();
    assert_eq!(waiting_all(&home), 0);
    sweep(&home);
    assert!(!dead.exists() && !odd.exists() && !record.exists());
    assert!(!passt_log.exists() && !root.exists());
    assert!(live_record.exists(), "a live standby's record is its own");
    assert!(live_root.exists(), "a live standby's root is its own");
    assert!(
        live_passt_log.exists(),
        "a live standby's passt log is its own"
    );
    assert!(fresh_claim.exists(), "a claim under way is left alone");
    assert!(log.exists());
    std::fs::remove_dir_all(&home).unwrap();
}
