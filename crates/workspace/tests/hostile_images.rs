//! The malicious-image corpus (issue 31): hostile container images through
//! the real paths, `image import` of a layout and a pull from a real
//! registry on loopback, with the limits an embedder serving strangers
//! would set. Each must fail with a clear error, leave a canary tree
//! outside byte-identical, register nothing and leave no scratch or
//! partial file, within bounded memory. No KVM: conversion does not boot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use testkit::disks::{FailingDisk, SmallDisk};
use testkit::oci::{grow_manifest, write_image, ImageLayer, Registry};
use workspace::{ErrorCode, Limits, Workspaces, LIMITS};

const TEST: &str = "hostile_images";

/// Limits small enough that a test can cross them quickly.
const TIGHT: Limits = Limits {
    max_image_bytes: 64 << 20,
    max_image_entries: 10_000,
    max_layer_bytes: 32 << 20,
    max_image_metadata_bytes: 64 << 10,
    ..LIMITS
};

struct Scratch {
    root: PathBuf,
    ws: Workspaces,
    canary: PathBuf,
}

impl Scratch {
    fn new() -> Option<Scratch> {
        testkit::require(TEST, testkit::workspace_image("minimal"))?;
        testkit::require(TEST, testkit::host_tool("mkfs.ext4"))?;
        testkit::require(TEST, testkit::host_tool("debugfs"))?;
        let root = std::env::temp_dir().join(format!("ma-hostile-img-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let canary = root.join("canary");
        std::fs::create_dir_all(canary.join("etc")).unwrap();
        std::fs::write(canary.join("etc/hosts"), "127.0.0.1 canary\n").unwrap();
        std::fs::write(canary.join("etc/resolv.conf"), "nameserver 192.0.2.1\n").unwrap();
        std::fs::write(canary.join("secret"), "host secret\n").unwrap();
        let ws = Workspaces::builder()
            .state_dir(root.join("state"))
            .vmm_program("/nonexistent/vmm")
            .limits(TIGHT)
            .build()
            .unwrap();
        // The built images are registered on first use: before the corpus.
        ws.image_registry().list().unwrap();
        Some(Scratch { root, ws, canary })
    }

    /// Every file under the canary with its bytes.
    fn canary_tree(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    out.insert(p.clone(), Vec::new());
                    walk(&p, out);
                } else {
                    out.insert(p.clone(), std::fs::read(&p).unwrap());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.canary, &mut out);
        out
    }

    /// What the images directory holds: registered images, scratch
    /// directories, blobs that are partial (sorted).
    fn leftovers(&self) -> Vec<String> {
        let images = self.ws.state_dir().root().join("images");
        let mut left: Vec<String> = std::fs::read_dir(&images)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| ![".blobs", ".pulled", ".locks"].contains(&n.as_str()))
            .collect();
        if let Ok(blobs) = std::fs::read_dir(images.join(".blobs/sha256")) {
            left.extend(
                blobs
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains(".partial")),
            );
        }
        left.sort();
        left
    }

    fn layout(&self, name: &str) -> PathBuf {
        self.root.join("layouts").join(name)
    }

    /// Imports `layout`; checks it failed with `code` and changed nothing.
    fn refused(&self, layout: &Path, code: ErrorCode, says: &str) {
        let before = self.canary_tree();
        let had = self.leftovers();
        let got = self
            .ws
            .image_registry()
            .import_path(Some("hostile"), layout, &mut |_| {});
        let err = match got {
            Ok(info) => panic!("{} was imported: {info:?}", layout.display()),
            Err(e) => workspace::Error::from(e),
        };
        let message = err.full_message();
        assert_eq!(err.code(), code, "{}: {message}", layout.display());
        assert!(message.contains(says), "{}: {message}", layout.display());
        assert_eq!(self.canary_tree(), before, "{}", layout.display());
        assert_eq!(self.leftovers(), had, "{}", layout.display());
    }
}

/// A layer of one file of `n` bytes `fill`, gzip-compressed: a bomb.
/// Made in a stream, so the fixture itself holds little memory.
fn bomb(n: u64, fill: u8) -> ImageLayer {
    use sha2::{Digest, Sha256};
    use std::io::Write;
    let mut header = tar::Header::new_gnu();
    header.set_path("zeros").unwrap();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(n);
    header.set_cksum();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut hash = Sha256::new();
    let mut put = |bytes: &[u8]| {
        gz.write_all(bytes).unwrap();
        hash.update(bytes);
    };
    put(header.as_bytes());
    let chunk = vec![fill; 1 << 20];
    let mut left = n;
    while left > 0 {
        let take = left.min(chunk.len() as u64) as usize;
        put(&chunk[..take]);
        left -= take as u64;
    }
    // Padding to a block, then the two zero blocks that end a tar.
    let pad = (512 - (n % 512) as usize) % 512;
    put(&vec![0u8; pad + 1024]);
    ImageLayer {
        blob: gz.finish().unwrap(),
        media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
        diff_id: format!("sha256:{:x}", hash.finalize()),
    }
}

/// This process's peak resident memory, KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn hostile_images_are_refused_and_leave_the_host_as_it_was() {
    let Some(s) = Scratch::new() else {
        return;
    };
    let canary = s.canary.display().to_string();

    // `etc` a link to a host directory: the conversion's hosts and
    // resolv.conf must not land there.
    let layout = s.layout("etc-link");
    let etc_target = format!("{canary}/etc");
    write_image(
        &layout,
        &[ImageLayer::tar(&[("etc", Some(&etc_target), b"")])],
        serde_json::json!({}),
        0,
    );
    let before = s.canary_tree();
    // Converted inside the image (its own, empty /etc) or refused: the
    // canary stays either way.
    if let Ok(info) =
        s.ws.image_registry()
            .import_path(Some("etclink"), &layout, &mut |_| {})
    {
        s.ws.image_registry()
            .remove(&info.name, Vec::new())
            .unwrap();
    }
    assert_eq!(s.canary_tree(), before, "the host's files changed");

    // A working directory above the root, and one through a link out.
    let layout = s.layout("workdir");
    write_image(
        &layout,
        &[ImageLayer::tar(&[("bin/true", None, b"")])],
        serde_json::json!({"WorkingDir": format!("/../../../..{canary}/made")}),
        0,
    );
    s.refused(&layout, ErrorCode::InvalidInput, "above the image's root");
    assert!(!s.canary.join("made").exists());

    // passwd a link to /dev/zero with a named user: a bounded read of a
    // regular file inside the tree, not an endless one.
    let layout = s.layout("passwd");
    write_image(
        &layout,
        &[ImageLayer::tar(&[
            ("etc/passwd", Some("/dev/zero"), b""),
            ("etc/group", Some(&format!("{canary}/secret")), b""),
        ])],
        serde_json::json!({"User": "nobody"}),
        0,
    );
    s.refused(&layout, ErrorCode::InvalidInput, "passwd");

    // A gzip bomb: 256 MiB of zeros in about 256 KiB, over the 64 MiB
    // the limits allow.
    let layout = s.layout("bomb");
    write_image(&layout, &[bomb(256 << 20, 0)], serde_json::json!({}), 0);
    s.refused(&layout, ErrorCode::InvalidInput, "over the limit");

    // A config over the metadata limit.
    let layout = s.layout("big-config");
    write_image(
        &layout,
        &[ImageLayer::tar(&[("a", None, b"a")])],
        serde_json::json!({}),
        128 << 10,
    );
    s.refused(&layout, ErrorCode::InvalidInput, "over the limit");

    // A manifest over the metadata limit.
    let layout = s.layout("big-manifest");
    write_image(
        &layout,
        &[ImageLayer::tar(&[("a", None, b"a")])],
        serde_json::json!({}),
        0,
    );
    grow_manifest(&layout, 256 << 10);
    s.refused(&layout, ErrorCode::InvalidInput, "over the limit");

    // A layout whose config blob is a link to a host file (its digest
    // would be printed), then to /dev/zero.
    let layout = s.layout("blob-link");
    let config = write_image(
        &layout,
        &[ImageLayer::tar(&[("a", None, b"a")])],
        serde_json::json!({}),
        0,
    );
    for target in [format!("{canary}/secret"), "/dev/zero".to_owned()] {
        std::fs::remove_file(&config).unwrap();
        std::os::unix::fs::symlink(&target, &config).unwrap();
        s.refused(&layout, ErrorCode::InvalidInput, "symbolic link");
    }

    // The same bomb, config and manifest through a real registry on
    // loopback.
    let skopeo = testkit::require(TEST, testkit::host_tool("skopeo"));
    let registry = skopeo
        .as_ref()
        .and_then(|_| testkit::require(TEST, Registry::start(&s.root.join("registry"))));
    if let (Some(skopeo), Some(registry)) = (&skopeo, &registry) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // The manifest is read by our own bounded request, not oci-client's
        // (which reads it whole): refused as it crosses the limit.
        for (name, says) in [
            ("bomb", "over the limit"),
            ("big-config", "over the limit"),
            ("big-manifest", "over the limit of 65536 manifest bytes"),
        ] {
            let target = format!("127.0.0.1:{}/{name}:1", registry.port);
            testkit::oci::push(skopeo, &s.layout(name), &target);
            let before = s.canary_tree();
            let had = s.leftovers();
            let got = pull(&s, &runtime, &target, "pulled", true);
            let err =
                workspace::Error::from(got.err().unwrap_or_else(|| panic!("{target} pulled")));
            let message = err.full_message();
            assert_eq!(err.code(), ErrorCode::InvalidInput, "{target}: {message}");
            assert!(message.contains(says), "{target}: {message}");
            assert_eq!(s.canary_tree(), before);
            assert_eq!(s.leftovers(), had, "{target}");
        }
        // Pulled to be converted at first use: the bomb's download is
        // within its limit, so the pull is kept; its first use fails as
        // the pull above did, registers nothing and leaves no scratch,
        // and it can be removed.
        let target = format!("127.0.0.1:{}/bomb:1", registry.port);
        let had = s.leftovers();
        let pulled = pull(&s, &runtime, &target, "later", false)
            .unwrap_or_else(|e| panic!("{target}: {}", workspace::Error::from(e)));
        assert!(pulled.image.awaiting_conversion);
        let err = workspace::Error::from(s.ws.image_registry().get("later").unwrap_err());
        let message = err.full_message();
        assert_eq!(err.code(), ErrorCode::InvalidInput, "{message}");
        assert!(message.contains("over the limit"), "{message}");
        let found = s.ws.image_registry().find("later").unwrap().unwrap();
        assert!(found.awaiting_conversion, "{found:?}");
        s.ws.images().remove("later").unwrap();
        assert!(s.ws.image_registry().find("later").unwrap().is_none());
        assert_eq!(s.leftovers(), had, "{target}");
    }

    // Nothing above held much: the bomb went to disk, within its limit.
    let peak = peak_rss_kib();
    assert!(peak < 512 << 10, "peak resident memory {peak} KiB");
    let _ = std::fs::remove_dir_all(&s.root);
}

/// `target` pulled from a loopback registry as `name` (converted now or
/// at first use, as `convert` says), quietly.
fn pull(
    s: &Scratch,
    runtime: &tokio::runtime::Runtime,
    target: &str,
    name: &str,
    convert: bool,
) -> Result<workspace::images::pull::Pulled, workspace::images::pull::PullError> {
    let req = workspace::images::oci_pull::PullRequest {
        reference: target.to_owned(),
        name: Some(name.to_owned()),
        insecure: true,
        convert,
    };
    let progress: workspace::images::oci_pull::PullProgress = std::sync::Arc::new(
        std::sync::Mutex::new(|_: workspace::images::oci_pull::PullEvent| {}),
    );
    runtime.block_on(workspace::images::pull::pull(
        s.ws.image_registry(),
        &req,
        progress,
    ))
}

/// An image converted onto a state directory that fails (`mount` mounts
/// it; `fail` makes it fail once the store is made; the layer unpacks to
/// `layer_bytes`): a clear error naming one of `errors`, nothing
/// registered, no scratch left.
fn a_failed_conversion_leaves_nothing<G>(
    test: &str,
    mount: impl FnOnce(&Path) -> Option<G>,
    fail: impl FnOnce(&mut G),
    layer_bytes: u64,
    errors: &[&str],
    scratch_may_stay: bool,
) {
    if testkit::require(test, testkit::workspace_image("minimal")).is_none() {
        return;
    }
    let root = std::env::temp_dir().join(format!("ma-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // Assets of the minimal image alone (the debian one would not fit).
    let cache_current = testkit::cache_root().unwrap().join("current");
    let assets = root.join("assets");
    std::fs::create_dir_all(&assets).unwrap();
    for entry in std::fs::read_dir(&cache_current).unwrap() {
        let name = entry.unwrap().file_name();
        let name = name.to_string_lossy();
        if name.starts_with("vmlinux-") || name == "rootfs-minimal.ext4" {
            std::os::unix::fs::symlink(cache_current.join(&*name), assets.join(&*name)).unwrap();
        }
    }
    let state = root.join("state");
    let Some(mut disk) = mount(&state) else {
        let _ = std::fs::remove_dir_all(&root);
        return;
    };
    let ws = Workspaces::builder()
        .state_dir(&state)
        .assets(Some(assets))
        .vmm_program("/nonexistent/vmm")
        .build()
        .unwrap();
    let listed = ws.image_registry().list();
    let layout = root.join("layout");
    // Not zeros: a sparse write would take no room.
    write_image(
        &layout,
        &[bomb(layer_bytes, 0x55)],
        serde_json::json!({}),
        0,
    );
    fail(&mut disk);
    let got = ws
        .image_registry()
        .import_path(Some("big"), &layout, &mut |_| {});
    let left: Vec<String> = std::fs::read_dir(state.join("images"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    drop(disk);
    let _ = std::fs::remove_dir_all(&root);
    let names: Vec<String> = listed.unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["minimal"], "the minimal image fits");
    let err = workspace::Error::from(got.unwrap_err());
    let message = err.full_message();
    assert!(errors.iter().any(|e| message.contains(e)), "{message}");
    // A disk that turned read-only keeps this process's scratch (the next
    // process's first scratch sweeps it); nothing else may stay.
    let ours = format!(".scratch-{}-", std::process::id());
    let left: Vec<&String> = left
        .iter()
        .filter(|n| !(scratch_may_stay && n.starts_with(&ours)) && *n != ".locks")
        .collect();
    assert_eq!(left, ["minimal"], "only the minimal image is left");
}

/// ENOSPC: the state directory a 48 MiB tmpfs holding the `minimal` image
/// it converts with; the layer unpacks to 64 MiB.
#[test]
fn a_conversion_onto_a_full_disk_leaves_nothing() {
    let test = "a_conversion_onto_a_full_disk_leaves_nothing";
    a_failed_conversion_leaves_nothing(
        test,
        |at| SmallDisk::mount(test, at, "48m"),
        |_| {},
        64 << 20,
        &["No space left"],
        false,
    );
}

/// EIO: the state directory on a disk whose device fails every write once
/// the store is made; the layer unpacks to 4 MiB.
#[test]
fn a_conversion_onto_a_failing_disk_leaves_nothing() {
    let test = "a_conversion_onto_a_failing_disk_leaves_nothing";
    a_failed_conversion_leaves_nothing(
        test,
        |at| FailingDisk::mount(test, at),
        |disk| disk.fail(true),
        4 << 20,
        // ext4 turns read-only once its journal cannot be written.
        &["Input/output error", "Read-only file system"],
        true,
    );
}

/// A guest that streams without end while `image build` saves it (a
/// build step leaves a sparse file of a tebibyte, which the agent's
/// archive sends as that many zeros): the save stops at
/// `max_image_bytes`, the build fails with a clear error, and no image,
/// workspace or scratch is left.
#[test]
fn a_guest_streaming_without_end_stops_the_build_at_its_limit() {
    let test = "a_guest_streaming_without_end_stops_the_build_at_its_limit";
    if testkit::require(test, testkit::kvm()).is_none()
        || testkit::require(test, testkit::workspace_image("minimal")).is_none()
        || testkit::require(test, testkit::host_tool("mkfs.ext4")).is_none()
    {
        return;
    }
    // The VMM binary `cargo test --workspace` builds beside the test's
    // deps directory.
    let exe = std::env::current_exe().unwrap();
    let vmm = exe.parent().unwrap().with_file_name("microagent-vmm");
    if !vmm.exists() {
        testkit::skip(
            test,
            &format!(
                "{} is not built (cargo build -p microagent-vmm)",
                vmm.display()
            ),
        );
        return;
    }
    let root = std::env::temp_dir().join(format!("ma-endless-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // The minimal image's own files archive to about 4.3 MiB. Zeros of a
    // sparse file cost the guest's kernel time to read (emulated here,
    // about 140 KiB/s): 5 MiB keeps the stream short.
    let limits = Limits {
        max_image_bytes: 5 << 20,
        ..TIGHT
    };
    let mut builder = Workspaces::builder()
        .state_dir(root.join("state"))
        .vmm_program(&vmm)
        .limits(limits);
    if let Some(warm) = testkit::shared_warm_dir() {
        builder = builder.warm_dir(warm);
    }
    let ws = builder.build().unwrap();
    let req = workspace::images::build::ImageBuildRequest {
        name: "endless".into(),
        from: Some(workspace::images::build::BuildBase::Image("minimal".into())),
        run: vec!["truncate -s 1099511627776 /endless".into()],
        ..Default::default()
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let progress: workspace::host::plan::ProgressFn = std::sync::Arc::new(|_: &str| {});
    let preview = runtime
        .block_on(ws.images().build(&req, None, progress.clone()))
        .unwrap();
    let token = preview.preview.token.clone().expect("a token");
    let built = runtime.block_on(ws.images().build(&req, Some(&token), progress));
    let images: Vec<String> = ws
        .image_registry()
        .list()
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    let workspaces = ws.list(&workspace::ListFilter::default()).unwrap();
    let left: Vec<String> = std::fs::read_dir(root.join("state/images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && ![".blobs", ".pulled", ".locks"].contains(&n.as_str()))
        .collect();
    let _ = std::fs::remove_dir_all(&root);
    let err = match built {
        Ok(b) => panic!("the endless image was built: {:?}", b.image),
        Err(e) => e,
    };
    let message = err.full_message();
    assert_eq!(err.code(), ErrorCode::InvalidInput, "{message}");
    assert!(
        message.contains("over the limit of 5242880 bytes saved from the guest"),
        "{message}"
    );
    assert!(!images.contains(&"endless".to_owned()), "{images:?}");
    assert!(workspaces.is_empty(), "{workspaces:?}");
    assert!(left.is_empty(), "scratch left: {left:?}");
}
