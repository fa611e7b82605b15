//! Container images end to end through the `microagent` binary: an OCI
//! image layout this test writes (busybox, a marker file changed by a
//! second layer, a whiteout, a user, a working directory, environment)
//! pushed by skopeo to a real registry (Debian's `docker-registry`) on
//! this machine's loopback and pulled, imported as a layout and as a
//! `docker save` tarball (made by skopeo), a tarball that is not an image
//! refused, and a workspace of the pulled image booted on the real guest
//! kernel.

use testkit::cli::CliHome;
use testkit::disks::{FailingDisk, SmallDisk};
use testkit::oci::{write_layout, Registry};

fn home(test: &str) -> CliHome {
    CliHome::new(env!("CARGO_BIN_EXE_microagent"), test)
}

/// The guest kernel and the `minimal` image, or the test is skipped (and
/// says why).
fn guest_with_minimal(test: &str) -> Option<(testkit::GuestAssets, std::path::PathBuf)> {
    let assets = testkit::require(test, testkit::guest_assets())?;
    let minimal = testkit::require(test, testkit::workspace_image("minimal"))?;
    Some((assets, minimal))
}

/// A file of an ext4 image, read with debugfs.
fn ext4_cat(image: &str, path: &str) -> String {
    let debugfs = testkit::host_tool("debugfs").unwrap();
    let out = std::process::Command::new(debugfs)
        .args(["-R", &format!("cat {path}"), image])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn container_images_import_and_boot_with_their_defaults() {
    let test = "container_images_import_and_boot_with_their_defaults";
    let Some(_) = testkit::require(test, testkit::workspace_image("minimal")) else {
        return;
    };
    let Some(_) = testkit::require(test, testkit::host_tool("mkfs.ext4")) else {
        return;
    };
    let cli = home("oci-import");
    let layout = cli.home().join("layout");
    write_layout(&layout);

    // Pushed to a registry on loopback, then pulled: named by its tag.
    let skopeo = testkit::require(test, testkit::host_tool("skopeo"));
    let registry = skopeo
        .as_ref()
        .and_then(|_| testkit::require(test, Registry::start(&cli.home().join("registry"))));
    let mut boot_image = "layout";
    if let (Some(skopeo), Some(registry)) = (&skopeo, &registry) {
        let target = format!("127.0.0.1:{}/test:1", registry.port);
        testkit::oci::push(skopeo, &layout, &target);
        let pulled = cli.ok_json(&["image", "pull", &target, "--insecure", "--json"]);
        assert_eq!(pulled["image"]["name"], "test-1", "{pulled}");
        assert_eq!(pulled["unchanged"], false);
        assert!(
            pulled["downloaded_bytes"].as_u64().unwrap() > 1_000_000,
            "{pulled}"
        );
        assert_eq!(pulled["image"]["origin"]["reference"], target);
        // Downloaded and checked; the root filesystem is made at first use.
        assert_eq!(pulled["image"]["awaiting_conversion"], true, "{pulled}");
        assert!(!cli.home().join("images/test-1/rootfs.ext4").exists());
        let listed = cli.ok_json(&["image", "ls", "--json"]);
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["name"] == "test-1" && i["awaiting_conversion"] == true),
            "{listed}"
        );
        let shown = cli.ok(&["image", "inspect", "test-1"]).stdout;
        assert!(shown.contains("made at its first use"), "{shown}");
        // The same digest again: nothing downloaded, the image unchanged;
        // with --convert, converted now (its config's defaults read).
        let again = cli.ok_json(&[
            "image",
            "pull",
            &target,
            "--insecure",
            "--convert",
            "--json",
        ]);
        assert_eq!(
            (
                again["unchanged"].as_bool(),
                again["downloaded_bytes"].as_u64()
            ),
            (Some(true), Some(0))
        );
        assert_eq!(again["image"]["defaults"]["cwd"], "/srv/app", "{again}");
        assert_eq!(again["image"].get("awaiting_conversion"), None, "{again}");
        assert!(cli.home().join("images/test-1/rootfs.ext4").exists());
        // Removed and pulled again: its layers come from the cache.
        cli.ok_json(&["image", "rm", "test-1", "--json"]);
        let cached = cli.ok_json(&["image", "pull", &target, "--insecure", "--json"]);
        assert_eq!(cached["downloaded_bytes"], 0, "{cached}");
        assert_eq!(cached["cached_layers"], 2, "{cached}");
        // Two zstd layers, downloaded side by side: both applied in order.
        let zstd_layout = cli.home().join("zstd-layout");
        let layers = [
            testkit::oci::ImageLayer::tar(&[
                ("etc/one", None, b"first\n"),
                ("etc/both", None, b"from one\n"),
            ])
            .zstd(),
            testkit::oci::ImageLayer::tar(&[("etc/both", None, b"from two\n")]).zstd(),
        ];
        testkit::oci::write_image(&zstd_layout, &layers, serde_json::json!({}), 0);
        let zstd_target = format!("127.0.0.1:{}/zstd:1", registry.port);
        testkit::oci::push(skopeo, &zstd_layout, &zstd_target);
        let zstd_pulled = cli.ok_json(&[
            "image",
            "pull",
            &zstd_target,
            "--insecure",
            "--convert",
            "--json",
        ]);
        assert_eq!(zstd_pulled["image"]["name"], "zstd-1", "{zstd_pulled}");
        let rootfs = cli.home().join("images/zstd-1/rootfs.ext4");
        let rootfs = rootfs.to_str().unwrap();
        assert_eq!(ext4_cat(rootfs, "/etc/one"), "first\n");
        assert_eq!(ext4_cat(rootfs, "/etc/both"), "from two\n");
        // An unknown tag, and a registry that is not there.
        let missing = cli.run(&[
            "image",
            "pull",
            &format!("127.0.0.1:{}/test:nope", registry.port),
            "--insecure",
            "--json",
        ]);
        assert_eq!(missing.error_code(), "NOT_FOUND", "{}", missing.stderr);
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let nobody = format!("127.0.0.1:{}/test:1", closed.local_addr().unwrap().port());
        drop(closed);
        let refused = cli.run(&["image", "pull", &nobody, "--insecure", "--json"]);
        assert_eq!(refused.error_code(), "INTERNAL", "{}", refused.stderr);
        boot_image = "test-1";
    }

    // The layout: named by its tag, taken by the pull already.
    let first = cli.run(&["image", "import", layout.to_str().unwrap(), "--json"]);
    if boot_image == "test-1" {
        assert_eq!(first.error_code(), "CONFLICT", "{}", first.stderr);
    } else {
        assert_eq!(first.status, 0, "{}", first.stderr);
        cli.ok_json(&["image", "rm", "test-1", "--json"]);
    }
    let layout_arg = layout.to_str().unwrap();
    let info = cli.ok_json(&["image", "import", layout_arg, "--name", "layout", "--json"]);
    assert_eq!(info["name"], "layout", "{info}");
    assert_eq!(info["boot_args"], "init=/.microagent/init");
    assert_eq!(info["defaults"]["cwd"], "/srv/app");
    assert_eq!(
        (
            info["defaults"]["uid"].as_u64(),
            info["defaults"]["gid"].as_u64()
        ),
        (Some(1000), Some(1000))
    );
    assert_eq!(info["origin"]["layers"].as_array().unwrap().len(), 2);
    let rootfs = info["rootfs"].as_str().unwrap().to_owned();
    assert_eq!(ext4_cat(&rootfs, "/etc/marker"), "layer two\n");
    assert_eq!(
        ext4_cat(&rootfs, "/sbin/init"),
        "#!/bin/sh\necho not-our-init\n"
    );
    assert_eq!(ext4_cat(&rootfs, "/tmp/gone"), "", "the whiteout hid it");

    // The same image as `docker save` writes it.
    if let Some(skopeo) = &skopeo {
        let archive = cli.home().join("saved.tar");
        let copy = std::process::Command::new(skopeo)
            .arg("copy")
            .arg(format!("oci:{}:test:1", layout.display()))
            .arg(format!("docker-archive:{}:saved:2", archive.display()))
            .output()
            .unwrap();
        assert!(
            copy.status.success(),
            "{}",
            String::from_utf8_lossy(&copy.stderr)
        );
        let saved = cli.ok_json(&["image", "import", archive.to_str().unwrap(), "--json"]);
        assert_eq!(saved["name"], "saved-2", "{saved}");
        assert_eq!(saved["defaults"], info["defaults"]);
        assert_eq!(
            saved["origin"]["config_digest"],
            info["origin"]["config_digest"]
        );
        assert_eq!(
            ext4_cat(saved["rootfs"].as_str().unwrap(), "/etc/marker"),
            "layer two\n"
        );
    }

    // Not an image: refused, nothing registered, no scratch left.
    let junk = cli.home().join("junk.tar");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    let before = cli.ok_json(&["image", "ls", "--json"]);
    let bad = cli.run(&[
        "image",
        "import",
        junk.to_str().unwrap(),
        "--name",
        "junk",
        "--json",
    ]);
    assert_eq!(bad.error_code(), "INVALID_INPUT", "{}", bad.stderr);
    assert_eq!(cli.ok_json(&["image", "ls", "--json"]), before);
    let leftovers: Vec<_> = std::fs::read_dir(cli.home().join("images"))
        .unwrap()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // The layer cache and the pulled images' records stay;
            // scratch directories must not.
            name.starts_with('.') && ![".blobs", ".pulled", ".locks"].contains(&name.as_str())
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    if let Ok(blobs) = std::fs::read_dir(cli.home().join("images/.blobs/sha256")) {
        let partial: Vec<_> = blobs
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".partial"))
            .collect();
        assert!(partial.is_empty(), "{partial:?}");
    }

    // A workspace of it boots our init and runs as the image says.
    if testkit::require(test, testkit::guest_assets()).is_none() {
        return;
    }
    let made = cli.ok_json(&["create", "box", "--image", boot_image, "--json"]);
    // The pulled image (pulled again from cached layers, not converted)
    // was converted by its first use.
    let image = cli.ok_json(&["image", "inspect", boot_image, "--json"]);
    assert_eq!(image.get("awaiting_conversion"), None, "{image}");
    assert_eq!(image["defaults"]["cwd"], "/srv/app", "{made}");
    let started = cli.run(&["start", "box", "--json"]);
    if started.status != 0 {
        let logs = cli.run(&["logs", "box"]);
        panic!(
            "start failed: {}\nconsole:\n{}",
            started.stderr, logs.stdout
        );
    }
    check_cgroup(&cli, "box");
    let run = cli.ok_json(&[
        "exec", "box", "--json", "--",
        "sh", "-c", "cat /etc/marker; id -u; pwd; echo $GREETING; cat /etc/os-release; test -e /tmp/gone || echo gone; echo $HOME",
    ]);
    let out = run["stdout"].as_str().unwrap();
    assert_eq!(
        out,
        "layer two\n1000\n/srv/app\nhello from the image\nID=microagent-oci-test\nNAME=\"OCI test\"\ngone\n/home/app\n",
        "{run}"
    );
    // A command's own directory still wins; writes go to the workspace's layer.
    let tmp = cli.ok_json(&[
        "exec",
        "box",
        "--json",
        "--cwd",
        "/tmp",
        "--",
        "sh",
        "-c",
        "pwd; echo kept > /srv/app/f; cat /srv/app/f",
    ]);
    assert_eq!(tmp["stdout"], "/tmp\nkept\n", "{tmp}");
    // Another user for one command: by name, resolved in the guest.
    let root = cli.ok_json(&[
        "exec",
        "box",
        "--json",
        "--user",
        "root",
        "--",
        "sh",
        "-c",
        "id -u; echo $HOME",
    ]);
    assert_eq!(root["stdout"], "0\n/root\n", "{root}");
    let ghost = cli.run(&["exec", "box", "--json", "--user", "ghost", "--", "id"]);
    assert_eq!(ghost.error_code(), "INVALID_INPUT", "{}", ghost.stderr);
    cli.ok_json(&["delete", "box", "--force", "--yes", "--json"]);

    // Named by reference where a workspace's image is named: pulled first
    // (plain HTTP to loopback without --insecure), or with --pull never
    // refused, changing nothing.
    let Some(registry) = &registry else {
        return;
    };
    let unpulled = format!("127.0.0.1:{}/test:9", registry.port);
    let never = cli.run(&[
        "create", "nb", "--image", &unpulled, "--pull", "never", "--json",
    ]);
    assert_eq!(never.error_code(), "NOT_FOUND", "{}", never.stderr);
    assert!(never.stdout.contains("test-9"), "{}", never.stdout);
    assert_eq!(cli.ok_json(&["list", "--json"]), serde_json::json!([]));
    cli.ok_json(&["image", "rm", "test-1", "--json"]);
    let target = format!("127.0.0.1:{}/test:1", registry.port);
    let ran = cli.ok_json(&[
        "run",
        "--image",
        &target,
        "--json",
        "--",
        "cat",
        "/etc/marker",
    ]);
    assert_eq!(ran["stdout"], "layer two\n", "{ran}");
    let image = cli.ok_json(&["image", "inspect", "test-1", "--json"]);
    assert_eq!(image["origin"]["reference"], target.as_str(), "{image}");
}

/// `kernel install --file`: a preview changes nothing, a wrong token or a
/// changed file is refused, and the token installs the kernel after it
/// booted the `minimal` image. Runs against a cache of its own (links to
/// the built assets) so the suites' current kernel stays as it is.
#[test]
fn kernel_install_from_a_file_boots_it_first_and_needs_the_token() {
    let test = "kernel_install_from_a_file_boots_it_first_and_needs_the_token";
    let Some((assets, minimal)) = guest_with_minimal(test) else {
        return;
    };
    let scratch = home("kinstall-files");
    let cache = scratch.home().join("cache");
    let current = cache.join("current");
    std::fs::create_dir_all(&current).unwrap();
    let real_kernel = std::fs::canonicalize(&assets.kernel).unwrap();
    let kernel_link = current.join(assets.host.kernel_variant().vmlinux_file());
    std::os::unix::fs::symlink(&real_kernel, &kernel_link).unwrap();
    std::os::unix::fs::symlink(
        std::fs::canonicalize(minimal).unwrap(),
        current.join("rootfs-minimal.ext4"),
    )
    .unwrap();
    let cli = home("kernel-install").with_env("MICROAGENT_CACHE", &cache);
    let file = scratch.home().join("vmlinux");
    std::fs::copy(&real_kernel, &file).unwrap();
    let file_arg = file.to_str().unwrap();

    // Not a kernel: refused before any plan.
    let junk = scratch.home().join("junk");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    let bad = cli.run(&[
        "kernel",
        "install",
        "--file",
        junk.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(bad.error_code(), "INVALID_INPUT", "{}", bad.stdout);

    let preview = cli.ok_json(&["kernel", "install", "--file", file_arg, "--json"]);
    assert_eq!(preview["applied"], false, "{preview}");
    let token = preview["token"].as_str().expect("a token").to_owned();
    let writes = preview["plan"]["writes"].as_array().unwrap();
    assert!(
        writes[0].as_str().unwrap().contains("/kernel/file-"),
        "{preview}"
    );
    let unchanged = || std::fs::read_link(&kernel_link).unwrap() == real_kernel;
    assert!(unchanged(), "a preview changed the current kernel");

    let confirm = |token: &str| {
        cli.run(&[
            "kernel",
            "install",
            "--file",
            file_arg,
            "--confirm",
            token,
            "--json",
        ])
    };
    let wrong = confirm("1-2-3");
    assert_eq!(wrong.error_code(), "INVALID_INPUT", "{}", wrong.stdout);
    // The file changed since the preview: its plan (sha256) changed.
    let mut changed = std::fs::read(&real_kernel).unwrap();
    changed.push(0);
    std::fs::write(&file, &changed).unwrap();
    let stale = confirm(&token);
    assert_eq!(stale.error_code(), "CONFLICT", "{}", stale.stdout);
    assert!(unchanged(), "a refused token changed the current kernel");

    std::fs::copy(&real_kernel, &file).unwrap();
    let done = cli.ok_json(&[
        "kernel",
        "install",
        "--file",
        file_arg,
        "--confirm",
        &token,
        "--json",
    ]);
    assert_eq!(done["applied"], true, "{done}");
    assert!(
        done["version"]
            .as_str()
            .unwrap()
            .starts_with("Linux version 6.1"),
        "{done}"
    );
    let installed = std::fs::read_link(&kernel_link).unwrap();
    assert!(
        installed.starts_with(cache.join("kernel")) && installed.ends_with("vmlinux"),
        "{}",
        installed.display()
    );
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(&real_kernel).unwrap()
    );
    // A token applies its plan once.
    let replayed = confirm(&token);
    assert_eq!(
        replayed.error_code(),
        "INVALID_INPUT",
        "{}",
        replayed.stdout
    );
    // The check left no workspace and no image behind, and no staging.
    let staging: Vec<_> = std::fs::read_dir(cache.join("kernel"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".staging"))
        .collect();
    assert!(staging.is_empty(), "{staging:?}");
    let left = cli.ok_json(&["list", "--json"]);
    assert_eq!(left.as_array().map(Vec::len), Some(0), "{left}");
    let images = cli.ok_json(&["image", "ls", "--json"]);
    assert!(!images.to_string().contains("kernel-check"), "{images}");
    // The same again: nothing to do, so no token.
    let again = cli.ok_json(&["kernel", "install", "--file", file_arg, "--json"]);
    assert!(again["token"].is_null(), "{again}");
    assert!(again["plan"]["writes"].is_null(), "{again}");
}

/// `image build --from minimal`: a preview registers nothing; a failing
/// step registers nothing and leaves no workspace; the confirmed build
/// copies a host file in, runs a command, and a workspace of the new image
/// sees both.
#[test]
fn image_build_on_an_image_copies_runs_and_saves_it() {
    let test = "image_build_on_an_image_copies_runs_and_saves_it";
    if guest_with_minimal(test).is_none() {
        return;
    }
    let cli = home("image-build");
    let src = cli.home().join("hello.txt");
    std::fs::write(&src, "from the host\n").unwrap();
    let copy = format!("{}:/opt/hello.txt", src.display());
    let args = [
        "image",
        "build",
        "tools",
        "--from",
        "minimal",
        "--copy",
        &copy,
        "--run",
        "echo built > /etc/marker",
        "--json",
    ];
    let preview = cli.ok_json(&args);
    assert_eq!(preview["applied"], false, "{preview}");
    let token = preview["token"].as_str().expect("a token").to_owned();
    let notes = preview["plan"]["notes"].to_string();
    assert!(notes.contains("echo built > /etc/marker"), "{notes}");
    let missing = cli.run(&["image", "inspect", "tools", "--json"]);
    assert_eq!(missing.error_code(), "NOT_FOUND", "a preview registered it");

    // A failing step: its stderr comes back, nothing is registered.
    let failed = cli.run(&[
        "image",
        "build",
        "broken",
        "--from",
        "minimal",
        "--run",
        "echo no such luck >&2; exit 3",
        "--yes",
        "--json",
    ]);
    assert_eq!(failed.error_code(), "INVALID_INPUT", "{}", failed.stdout);
    assert!(failed.stdout.contains("no such luck"), "{}", failed.stdout);
    let broken = cli.run(&["image", "inspect", "broken", "--json"]);
    assert_eq!(broken.error_code(), "NOT_FOUND");

    let mut confirmed = args.to_vec();
    confirmed.extend(["--confirm", &token]);
    let built = cli.ok_json(&confirmed);
    assert_eq!(built["applied"], true, "{built}");
    assert_eq!(built["image"]["name"], "tools", "{built}");
    assert_eq!(built["image"]["boot_args"], "init=/.microagent/init");
    let left = cli.ok_json(&["list", "--json"]);
    assert_eq!(left.as_array().map(Vec::len), Some(0), "{left}");

    // As the images' unprivileged user (kept by the save: tar_out records
    // owners), whose home is its own.
    let out = cli.run(&[
        "run",
        "--image",
        "tools",
        "--user",
        "user",
        "--",
        "sh",
        "-c",
        "id -u; id -g; cat /etc/marker /opt/hello.txt; touch $HOME/mine && echo home is $HOME",
    ]);
    assert_eq!(out.status, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout,
        "1000\n1000\nbuilt\nfrom the host\nhome is /home/user\n"
    );
}

/// `setup`: with the built assets there is nothing to do; on a host with
/// an empty asset cache and state the plan names the kernel build, the
/// `minimal` image (from the agent and init binaries named) and the
/// `debian` image, and nothing changes without its token.
#[test]
fn setup_previews_what_is_missing_and_changes_nothing_without_the_token() {
    let test = "setup_previews_what_is_missing_and_changes_nothing_without_the_token";
    let ready = home("setup-ready");
    if testkit::require(test, testkit::guest_assets()).is_some()
        && testkit::workspace_image("minimal").is_ok()
        && testkit::workspace_image("debian").is_ok()
    {
        let nothing = ready.ok_json(&["setup", "--json"]);
        assert!(nothing["token"].is_null(), "{nothing}");
        assert_eq!(nothing["plan"]["steps"], serde_json::json!([]), "{nothing}");
    }

    let bare = home("setup-bare");
    let cache = bare.home().join("empty-cache");
    std::fs::create_dir_all(&cache).unwrap();
    let binaries = bare.home().join("bin");
    std::fs::create_dir_all(&binaries).unwrap();
    for name in ["agent", "init"] {
        std::fs::write(binaries.join(name), b"stand-in").unwrap();
    }
    let cli = home("setup-bare-state")
        .with_env("MICROAGENT_CACHE", &cache)
        .with_env("MICROAGENT_AGENT_BIN", binaries.join("agent"))
        .with_env("MICROAGENT_INIT_BIN", binaries.join("init"));
    let preview = cli.ok_json(&["setup", "--with", "debian", "--json"]);
    assert_eq!(preview["applied"], false, "{preview}");
    let token = preview["token"].as_str().expect("a token").to_owned();
    let writes = preview["plan"]["writes"].to_string();
    for want in ["vmlinux", "images/minimal", "images/debian"] {
        assert!(writes.contains(want), "{want}: {preview}");
    }
    // Root only for steps that need it (package installs, the VMMs'
    // account, the kvm group), not for the images: a user builds `debian`
    // in their subordinate ids.
    let steps = preview["plan"]["steps"].as_array().map_or(0, Vec::len);
    assert_eq!(
        preview["plan"]["needs_root"].as_bool().unwrap_or(false),
        steps > 0,
        "{preview}"
    );
    let notes = preview["plan"]["notes"].to_string();
    assert!(
        notes.contains(&binaries.join("agent").display().to_string()),
        "{notes}"
    );
    // Without --with debian, a first run's plan: no debian image.
    let first = cli.ok_json(&["setup", "--json"]);
    let writes = first["plan"]["writes"].to_string();
    assert!(
        writes.contains("images/minimal") && !writes.contains("images/debian"),
        "{first}"
    );
    let wrong = cli.run(&["setup", "--confirm", "1-2-3", "--json"]);
    assert_eq!(wrong.error_code(), "INVALID_INPUT", "{}", wrong.stdout);
    // A token is bound to its plan: another state directory's is wrong.
    let other = ready.run(&["setup", "--confirm", &token, "--json"]);
    assert!(other.status != 0, "{}", other.stdout);
    let left: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert!(left.is_empty(), "a preview wrote into the cache: {left:?}");
}

/// A pull whose layer store fails (`mount` mounts it on the store; `fail`
/// makes it fail): the error names one of `errors` and nothing is left: no
/// image, no partial layer.
fn a_failed_pull_leaves_nothing<G>(
    test: &str,
    tag: &str,
    mount: impl FnOnce(&std::path::Path) -> Option<G>,
    fail: impl FnOnce(&mut G),
    errors: &[&str],
) {
    let Some(skopeo) = testkit::require(test, testkit::host_tool("skopeo")) else {
        return;
    };
    let Some(_) = testkit::require(test, testkit::workspace_image("minimal")) else {
        return;
    };
    let cli = home(tag);
    let Some(registry) = testkit::require(test, Registry::start(&cli.home().join("registry")))
    else {
        return;
    };
    let layout = cli.home().join("layout");
    write_layout(&layout);
    let target = format!("127.0.0.1:{}/{tag}:1", registry.port);
    testkit::oci::push(&skopeo, &layout, &target);
    // The store exists once anything was imported.
    cli.ok_json(&["image", "ls", "--json"]);
    let blobs = cli.home().join("images/.blobs");
    let Some(mut disk) = mount(&blobs) else {
        return;
    };
    fail(&mut disk);
    let pulled = cli.run(&["image", "pull", &target, "--insecure", "--json"]);
    let left: Vec<_> = walk(&blobs);
    drop(disk);
    assert_ne!(pulled.status, 0, "{}", pulled.stdout);
    let message = pulled.json()["error"]["message"].to_string();
    assert!(errors.iter().any(|e| message.contains(e)), "{message}");
    assert!(left.is_empty(), "left in the layer store: {left:?}");
    let missing = cli.run(&["image", "inspect", &format!("{tag}-1"), "--json"]);
    assert_eq!(missing.error_code(), "NOT_FOUND", "{}", missing.stdout);
}

/// ENOSPC: the layer store a 128 KiB tmpfs (root only); the image's layers
/// are bigger.
#[test]
fn a_full_disk_fails_the_pull_and_leaves_nothing() {
    let test = "a_full_disk_fails_the_pull_and_leaves_nothing";
    a_failed_pull_leaves_nothing(
        test,
        "full",
        |at| SmallDisk::mount(test, at, "128k"),
        |_| {},
        &["No space left"],
    );
}

/// EIO: the layer store on a disk whose device fails every write (root
/// only); the download is synced before it is kept, so the pull fails.
#[test]
fn a_failing_disk_fails_the_pull_and_leaves_nothing() {
    let test = "a_failing_disk_fails_the_pull_and_leaves_nothing";
    a_failed_pull_leaves_nothing(
        test,
        "eio",
        |at| FailingDisk::mount(test, at),
        |disk| disk.fail(true),
        &["Input/output error", "Read-only file system"],
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The workspace's VMM runs in a cgroup of its own, limited to its guest
/// memory plus the overhead, where the host has the v1 controllers and we
/// may make groups (our hosts, as root); elsewhere it says why not.
fn check_cgroup(cli: &testkit::cli::CliHome, name: &str) {
    let inspected = cli.ok_json(&["inspect", name, "--json"]);
    let protections = inspected["runtime"]["protections"].to_string();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !(root && std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()) {
        assert!(protections.contains("cgroup"), "{protections}");
        return;
    }
    assert!(protections.contains("cgroup v1: memory"), "{protections}");
    let pid = inspected["runtime"]["pid"].as_u64().unwrap();
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let memory = groups
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
        .unwrap();
    assert!(memory.contains(&format!("/microagent/{name}-")), "{groups}");
    let limit = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory{memory}/memory.limit_in_bytes"
    ))
    .unwrap();
    let mem_mib = inspected["spec"]["mem_mib"].as_u64().unwrap();
    let want = (mem_mib + workspace::host::cgroup::MEMORY_OVERHEAD_MIB) << 20;
    assert_eq!(limit.trim(), want.to_string());
}
