//! Container-image fixtures: an OCI image layout written here (busybox
//! and files that exercise layers: a marker changed by a second layer, a
//! whiteout, a user, a working directory, environment), and a real
//! registry (Debian's `docker-registry`) on a free loopback port.

use std::path::Path;

use sha2::{Digest, Sha256};

/// A layer under construction: a tar of entries owned by root.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_mtime(1_700_000_000);
        h.set_size(size);
        h
    }

    fn file(mut self, path: &str, mode: u32, data: &[u8]) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, mode, data.len() as u64);
        self.0.append_data(&mut h, path, data).unwrap();
        self
    }

    fn dir(mut self, path: &str, uid: u64) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, 0o755, 0);
        h.set_uid(uid);
        h.set_gid(uid);
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }

    fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// Writes `bytes` as a blob of the layout; returns its descriptor.
fn blob(layout: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let digest = sha(bytes);
    let path = layout.join("blobs/sha256").join(&digest[7..]);
    std::fs::write(path, bytes).unwrap();
    serde_json::json!({ "mediaType": media_type, "digest": digest, "size": bytes.len() })
}

/// A layer for [`write_image`]: its blob's bytes as stored, its media
/// type, and the digest of its uncompressed tar (the config's `diff_id`).
#[derive(Debug)]
pub struct ImageLayer {
    /// The blob (a tar, or a gzip or zstd of one).
    pub blob: Vec<u8>,
    /// Its media type.
    pub media_type: &'static str,
    /// `sha256:` of the uncompressed tar.
    pub diff_id: String,
}

impl ImageLayer {
    /// A plain tar layer of `entries`: (path, link target or None, data).
    pub fn tar(entries: &[(&str, Option<&str>, &[u8])]) -> Self {
        let mut layer = Layer::new();
        for (path, link, data) in entries {
            layer = match link {
                Some(target) => layer.symlink(path, target),
                None => layer.file(path, 0o644, data),
            };
        }
        let bytes = layer.bytes();
        Self {
            diff_id: sha(&bytes),
            blob: bytes,
            media_type: "application/vnd.oci.image.layer.v1.tar",
        }
    }

    /// The same layer, zstd-compressed.
    pub fn zstd(self) -> Self {
        Self {
            blob: zstd::encode_all(&self.blob[..], 3).unwrap(),
            media_type: "application/vnd.oci.image.layer.v1.tar+zstd",
            diff_id: self.diff_id,
        }
    }

    /// The same layer, gzip-compressed.
    pub fn gzip(self) -> Self {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut gz, &self.blob).unwrap();
        Self {
            blob: gz.finish().unwrap(),
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
            diff_id: self.diff_id,
        }
    }
}

/// An OCI image layout at `layout` of `layers` (bottom first) with the
/// image config `config` (`Env`, `User`, `WorkingDir`, ...) and `padding`
/// bytes of whitespace in its config blob, tagged `test:1`; returns the
/// config blob's path.
pub fn write_image(
    layout: &Path,
    layers: &[ImageLayer],
    config: serde_json::Value,
    padding: usize,
) -> std::path::PathBuf {
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.diff_id.as_str()).collect();
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": diff_ids }
    });
    let config_bytes = format!("{config}{}", " ".repeat(padding));
    let config = blob(
        layout,
        "application/vnd.oci.image.config.v1+json",
        config_bytes.as_bytes(),
    );
    let config_path = layout
        .join("blobs/sha256")
        .join(&config["digest"].as_str().unwrap()[7..]);
    let layers: Vec<_> = layers
        .iter()
        .map(|l| blob(layout, l.media_type, &l.blob))
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": layers,
    });
    let mut manifest = blob(
        layout,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().as_bytes(),
    );
    manifest["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": "test:1" });
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": [manifest] });
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    config_path
}

/// Grows the manifest of the image [`write_image`] wrote at `layout` by an
/// annotation of `bytes` bytes (a manifest over a metadata limit).
pub fn grow_manifest(layout: &Path, bytes: usize) {
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let entry = &mut index["manifests"][0];
    let old = layout
        .join("blobs/sha256")
        .join(&entry["digest"].as_str().unwrap()[7..]);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&old).unwrap()).unwrap();
    manifest["annotations"] = serde_json::json!({ "padding": "x".repeat(bytes) });
    let grown = blob(
        layout,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().as_bytes(),
    );
    std::fs::remove_file(old).unwrap();
    entry["digest"] = grown["digest"].clone();
    entry["size"] = grown["size"].clone();
    std::fs::write(index_path, index.to_string()).unwrap();
}

/// An OCI image layout of a busybox image, tagged `test:1`.
pub fn write_layout(layout: &Path) {
    write_layout_running(layout, &["sh"]);
}

/// [`write_layout`] with `cmd` as the image's command (a pod sandbox's
/// image runs one that lasts).
pub fn write_layout_running(layout: &Path, cmd: &[&str]) {
    write_layout_marked(layout, cmd, "layer two\n");
}

/// [`write_layout_running`] whose top layer's `/etc/marker` holds
/// `marker`: another image of the same shape.
pub fn write_layout_marked(layout: &Path, cmd: &[&str], marker: &str) {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut base = Layer::new()
        .file("bin/busybox", 0o755, &busybox)
        .file(
            "etc/os-release",
            0o644,
            b"ID=microagent-oci-test\nNAME=\"OCI test\"\n",
        )
        .file(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .file("etc/group", 0o644, b"root:x:0:\napp:x:1000:\n")
        .file("etc/marker", 0o644, b"layer one\n")
        // Not ours: the image's own init must stay and not be run.
        .file("sbin/init", 0o755, b"#!/bin/sh\necho not-our-init\n")
        .file("tmp/gone", 0o644, b"hidden by the next layer\n");
    for applet in ["sh", "cat", "id", "pwd", "env", "test", "echo"] {
        base = base.symlink(&format!("bin/{applet}"), "busybox");
    }
    let base = base.bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &base).unwrap();
    let base_gz = gz.finish().unwrap();
    let top = Layer::new()
        .file("etc/marker", 0o644, marker.as_bytes())
        .file("tmp/.wh.gone", 0o644, b"")
        .dir("home/app", 1000)
        .dir("srv/app", 1000)
        .bytes();
    let layers = [
        ImageLayer {
            diff_id: sha(&base),
            blob: base_gz,
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
        },
        ImageLayer {
            diff_id: sha(&top),
            blob: top,
            media_type: "application/vnd.oci.image.layer.v1.tar",
        },
    ];
    write_image(
        layout,
        &layers,
        serde_json::json!({
            "Env": ["PATH=/bin", "GREETING=hello from the image"],
            "WorkingDir": "/srv/app",
            "User": "app",
            "Cmd": cmd,
            "Labels": {"org.opencontainers.image.description": "a team's tool for tests"}
        }),
        0,
    );
}

/// An OCI image layout at `layout` (tag `test:1`) whose command is
/// busybox's httpd serving `body` as `/` on `port`: a service's image.
pub fn write_layout_serving(layout: &Path, port: u16, body: &str) {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let layer = Layer::new()
        .file("bin/busybox", 0o755, &busybox)
        .symlink("bin/sh", "busybox")
        .file("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n")
        .file("etc/group", 0o644, b"root:x:0:\n")
        .file("srv/www/index.html", 0o644, body.as_bytes())
        .bytes();
    let layers = [ImageLayer {
        diff_id: sha(&layer),
        blob: layer,
        media_type: "application/vnd.oci.image.layer.v1.tar",
    }];
    let port = port.to_string();
    write_image(
        layout,
        &layers,
        serde_json::json!({
            "Env": ["PATH=/bin"],
            "Cmd": ["busybox", "httpd", "-f", "-p", port, "-h", "/srv/www"],
        }),
        0,
    );
}

/// A `docker-registry` serving on a free loopback port from a private
/// directory, stopped when dropped.
#[derive(Debug)]
pub struct Registry {
    child: std::process::Child,
    /// Its loopback port.
    pub port: u16,
}

impl Registry {
    /// Starts one storing in `dir`; why not when it cannot.
    pub fn start(dir: &Path) -> Result<Self, String> {
        let bin = crate::host_tool("docker-registry")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let config = dir.join("registry.yml");
        std::fs::create_dir_all(dir.join("data")).map_err(|e| e.to_string())?;
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let child = std::process::Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting docker-registry: {e}"))?;
        let registry = Self { child, port };
        let up = crate::wait_until(std::time::Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        if !up {
            return Err("docker-registry did not listen within 20 s".into());
        }
        Ok(registry)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pushes the layout's `test:1` to `target` (`HOST:PORT/REPO:TAG`, plain
/// HTTP) with skopeo.
pub fn push(skopeo: &Path, layout: &Path, target: &str) {
    let push = std::process::Command::new(skopeo)
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:test:1", layout.display()))
        .arg(format!("docker://{target}"))
        .output()
        .unwrap();
    assert!(
        push.status.success(),
        "skopeo push: {}",
        String::from_utf8_lossy(&push.stderr)
    );
}
