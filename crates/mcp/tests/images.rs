//! image_pull and image_import of container images through a real MCP
//! client, without KVM: the `minimal` image here is a small real ext4
//! holding stand-ins for init and the agent (conversion only copies them
//! out), so pulls and imports convert for real; the registry is Debian's
//! `docker-registry` on loopback, fed by skopeo.

mod common;

use common::{text, McpHarness};
use serde_json::json;

/// Registers a `minimal` image whose root filesystem has the two files a
/// conversion takes from it.
fn stand_in_minimal(h: &McpHarness) -> Option<()> {
    let mkfs = testkit::require("stand_in_minimal", testkit::host_tool("mkfs.ext4"))?;
    let src = h.root.join("src-minimal");
    testkit::fake_image_files(&src);
    let tree = h.root.join("minimal-tree");
    std::fs::create_dir_all(tree.join("sbin")).unwrap();
    std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
    std::fs::write(tree.join("sbin/init"), b"stand-in init").unwrap();
    std::fs::write(tree.join("usr/bin/microagent-agent"), b"stand-in agent").unwrap();
    let made = std::process::Command::new(mkfs)
        .args(["-q", "-F", "-d"])
        .arg(&tree)
        .arg(src.join("rootfs.ext4"))
        .arg("8M")
        .status()
        .unwrap();
    assert!(made.success());
    h.ws.image_registry().import_dir("minimal", &src).unwrap();
    Some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_images_pull_and_import_through_mcp() {
    let test = "container_images_pull_and_import_through_mcp";
    let h = McpHarness::new("oci").await;
    let layout = h.root.join("layout");
    testkit::oci::write_layout(&layout);
    let layout_arg = layout.display().to_string();

    // Without the `minimal` image there is nothing to boot it with.
    let message = h
        .fails("image_import", json!({"path": layout_arg}), "NOT_FOUND")
        .await;
    assert!(message.contains("minimal"), "{message}");
    h.fails(
        "image_pull",
        json!({"reference": "Not A Reference!", "insecure": true}),
        "INVALID_INPUT",
    )
    .await;
    let Some(()) = stand_in_minimal(&h) else {
        return;
    };

    let kernels = h.ok("kernel_list", json!({})).await;
    let kernels = kernels["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert_eq!(kernels[0]["used_by"], json!(["minimal"]));
    let imported = h.ok("image_import", json!({"path": layout_arg})).await;
    assert_eq!(imported["name"], "test-1", "{imported}");
    assert_eq!(imported["defaults"]["cwd"], "/srv/app");
    h.fails("image_import", json!({"path": layout_arg}), "CONFLICT")
        .await;
    // Outside the server's roots: refused before anything is read.
    h.fails("image_import", json!({"path": "/etc"}), "FORBIDDEN")
        .await;

    let Some(skopeo) = testkit::require(test, testkit::host_tool("skopeo")) else {
        return;
    };
    let Some(registry) = testkit::require(
        test,
        testkit::oci::Registry::start(&h.root.join("registry")),
    ) else {
        return;
    };
    let target = format!("127.0.0.1:{}/team/tool:2", registry.port);
    testkit::oci::push(&skopeo, &layout, &target);

    let result = h
        .try_call("image_pull", json!({"reference": target, "insecure": true}))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false), "{}", text(&result));
    let pulled = result.structured_content.unwrap();
    assert_eq!(pulled["image"]["name"], "tool-2", "{pulled}");
    assert_eq!(
        pulled["image"]["origin"]["config_digest"],
        imported["origin"]["config_digest"]
    );
    assert!(pulled["downloaded_bytes"].as_u64().unwrap() > 0);
    let again = h
        .ok("image_pull", json!({"reference": target, "insecure": true}))
        .await;
    assert_eq!(again["unchanged"], true, "{again}");
    assert!(text(
        &h.try_call("image_pull", json!({"reference": target, "insecure": true}))
            .await
            .unwrap()
    )
    .contains("up to date"));
    // A loopback registry is plain HTTP without being asked (as Docker).
    let plain = h
        .ok("image_pull", json!({"reference": target, "name": "plain"}))
        .await;
    assert_eq!(plain["image"]["name"], "plain", "{plain}");
    h.ok("image_delete", json!({"name": "plain"})).await;
    // Named by reference where a workspace is created: registered already,
    // so not pulled; `pull: never` of one never pulled changes nothing.
    let created = h
        .ok(
            "workspace_create",
            json!({"name": "byref", "image": target}),
        )
        .await;
    assert_eq!(created["spec"]["image"], "tool-2", "{created}");
    h.ok("workspace_delete", json!({"name": "byref"})).await;
    h.fails(
        "workspace_create",
        json!({"name": "never", "image": format!("127.0.0.1:{}/team/tool:9", registry.port), "pull": "never"}),
        "NOT_FOUND",
    )
    .await;
    assert!(h.ws.list(&Default::default()).unwrap().is_empty());
    h.fails(
        "image_pull",
        json!({"reference": format!("127.0.0.1:{}/team/none:1", registry.port), "insecure": true}),
        "NOT_FOUND",
    )
    .await;
    let names: Vec<String> =
        h.ws.image_registry()
            .list()
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
    assert_eq!(names, ["minimal", "test-1", "tool-2"]);
    // Found by the description its label gave, here and in the registry.
    let found = h
        .ok(
            "image_search",
            json!({"query": "TEAM'S TOOL", "registries": [format!("127.0.0.1:{}", registry.port)]}),
        )
        .await;
    let names: Vec<&str> = found["local"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["test-1", "tool-2"], "{found}");
    assert_eq!(found["local"][1]["description"], "a team's tool for tests");
    let found = h
        .ok(
            "image_search",
            json!({"query": "tool", "registries": [format!("127.0.0.1:{}", registry.port), "127.0.0.1:1"]}),
        )
        .await;
    assert_eq!(
        found["remote"],
        json!([{"registry": format!("127.0.0.1:{}", registry.port), "repository": "team/tool",
                "reference": format!("127.0.0.1:{}/team/tool", registry.port)}]),
        "{found}"
    );
    assert_eq!(
        found["unreachable"][0]["registry"], "127.0.0.1:1",
        "{found}"
    );
    let builtin = h.ok("image_search", json!({"query": "debian"})).await;
    assert_eq!(builtin["local"][0]["registered"], false, "{builtin}");
    h.fails(
        "image_search",
        json!({"registries": ["http://x/y"]}),
        "INVALID_INPUT",
    )
    .await;
    // Converted images boot the `minimal` image's kernel: one file, three users.
    let kernels = h.ok("kernel_list", json!({})).await;
    assert_eq!(
        kernels["kernels"][0]["used_by"],
        json!(["minimal", "test-1", "tool-2"])
    );
}

/// kernel_install without KVM: bad files are refused, a preview changes
/// nothing and returns a token, and wrong or other-plan tokens are refused
/// without writing anything (the e2e suite applies one on a real guest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_install_previews_and_refuses_wrong_tokens() {
    let granted = mcp::Grants::default().host_changes(true);
    let h = McpHarness::with_grants("kinstall", granted).await;
    let junk = h.root.join("junk");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    h.fails(
        "kernel_install",
        json!({"file": junk.display().to_string()}),
        "INVALID_INPUT",
    )
    .await;
    let src = h.root.join("fake");
    testkit::fake_image_files(&src);
    let fake = src.join("vmlinux").display().to_string();
    // The boot check needs the `minimal` image: said before any token.
    let message = h
        .fails("kernel_install", json!({"file": fake}), "NOT_FOUND")
        .await;
    assert!(message.contains("minimal"), "{message}");
    h.ws.image_registry().import_dir("minimal", &src).unwrap();

    let preview = h
        .ok(
            "kernel_install",
            json!({"file": fake, "variant": "standard"}),
        )
        .await;
    assert_eq!(preview["applied"], false, "{preview}");
    let token = preview["token"].as_str().expect("a token").to_owned();
    let writes = preview["plan"]["writes"].as_array().unwrap();
    assert!(
        writes[1]
            .as_str()
            .unwrap()
            .ends_with("current/vmlinux-standard"),
        "{preview}"
    );
    let written = std::path::PathBuf::from(writes[0].as_str().unwrap());
    h.fails(
        "kernel_install",
        json!({"file": fake, "variant": "standard", "confirm": "1-2-3"}),
        "INVALID_INPUT",
    )
    .await;
    // The token of the `standard` plan does not apply the `compat` one.
    h.fails(
        "kernel_install",
        json!({"file": fake, "variant": "compat", "confirm": token}),
        "CONFLICT",
    )
    .await;
    assert!(
        !written.exists(),
        "a refused token wrote {}",
        written.display()
    );
    h.fails(
        "kernel_install",
        json!({"file": fake, "bogus": 1}),
        "INVALID_INPUT",
    )
    .await;
    // A server not granted host changes previews, but applies nothing.
    let plain = McpHarness::new("kinstall-plain").await;
    let src = plain.root.join("fake");
    testkit::fake_image_files(&src);
    let fake = src.join("vmlinux").display().to_string();
    plain
        .ws
        .image_registry()
        .import_dir("minimal", &src)
        .unwrap();
    let preview = plain
        .ok(
            "kernel_install",
            json!({"file": fake, "variant": "standard"}),
        )
        .await;
    let token = preview["token"].as_str().expect("a token").to_owned();
    let message = plain
        .fails(
            "kernel_install",
            json!({"file": fake, "variant": "standard", "confirm": token}),
            "FORBIDDEN",
        )
        .await;
    assert!(message.contains("--allow-host-changes"), "{message}");
    let would = preview["plan"]["writes"][0].as_str().unwrap().to_owned();
    assert!(!std::path::Path::new(&would).exists());
    // From source: a plan of the same action, whatever this host has.
    let source = h.ok("kernel_install", json!({})).await;
    assert_eq!(source["plan"]["action"], "kernel install", "{source}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_gives_its_sizes_and_the_browser_refuses_a_smaller_workspace_at_once() {
    let h = McpHarness::new("sizes").await;
    let src = h.root.join("src-chromium");
    testkit::fake_image_files(&src);
    let defaults = workspace::images::oci::config::ImageDefaults {
        vcpus: Some(2),
        mem_mib: Some(2048),
        min_mem_mib: Some(1024),
        ..Default::default()
    };
    h.ws.image_registry()
        .register_converted(
            "chromium",
            &src.join("vmlinux"),
            &src.join("rootfs.ext4"),
            defaults,
            src.clone(),
            None,
        )
        .unwrap();
    // image_list shows them; a create naming no sizes gets them.
    let listed = h.ok("image_list", json!({})).await.to_string();
    assert!(listed.contains(r#""min_mem_mib":1024"#), "{listed}");
    let made = h
        .ok(
            "workspace_create",
            json!({"name": "b", "image": "chromium"}),
        )
        .await;
    assert_eq!(
        (
            made["spec"]["vcpus"].as_u64(),
            made["spec"]["mem_mib"].as_u64()
        ),
        (Some(2), Some(2048)),
        "{made}"
    );
    // Sizes given win, and one below the image's least is refused by the
    // browser tools at once (INVALID_INPUT naming the least), not after a
    // start that cannot finish.
    let small = h
        .ok(
            "workspace_create",
            json!({"name": "s", "image": "chromium", "vcpus": 1, "mem_mib": "256m"}),
        )
        .await;
    assert_eq!(small["spec"]["mem_mib"], 256, "{small}");
    let message = h
        .fails(
            "browser_open",
            json!({"name": "s", "url": "http://127.0.0.1:1/"}),
            "INVALID_INPUT",
        )
        .await;
    assert!(message.contains("at least 1024 MiB"), "{message}");
    // `debian` records from before sizes existed get its own.
    h.fake_image("debian");
    let deb = h
        .ok("workspace_create", json!({"name": "d", "image": "debian"}))
        .await;
    assert_eq!(deb["spec"]["mem_mib"], 512, "{deb}");
    // At the least it passes that check (and stops at the next: the
    // workspace is not running).
    h.fails(
        "browser_open",
        json!({"name": "b", "url": "http://127.0.0.1:1/"}),
        "NOT_RUNNING",
    )
    .await;
    h.finish().await;
}
