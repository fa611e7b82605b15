//! `manifest.json`, written beside each image.

use std::path::Path;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::sh;

/// Kernel variants the images pair with (see xtask/src/kernel.rs).
const KERNEL_VARIANTS: &[&str] = &["standard", "compat"];
const KERNEL_FRAGMENT: &str = "guest/kernel/config.fragment";

/// Everything the manifest records.
#[derive(Debug)]
pub struct Manifest {
    pub name: String,
    pub input_hash: String,
    pub image_size_bytes: u64,
    pub image_sha256: String,
    pub tree_bytes: u64,
    pub top_level: Vec<String>,
    pub notable: Vec<String>,
    pub agent_sha256: String,
    pub agent_source: String,
    pub init: String,
    /// Debian packages in the image (minimal: the busybox it copies).
    pub packages: Vec<(String, String)>,
    /// Host packages that made it.
    pub build_tools: Vec<(String, String)>,
    pub kernel: Value,
    /// Suite, variant, sources (debian only; null otherwise).
    pub debian: Value,
    pub build_seconds: f64,
}

fn pairs(list: &[(String, String)]) -> Value {
    Value::Object(
        list.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

impl Manifest {
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "name": self.name,
            "input_hash": self.input_hash,
            "image": "rootfs.ext4",
            "image_size_bytes": self.image_size_bytes,
            "image_sha256": self.image_sha256,
            "tree_bytes": self.tree_bytes,
            "top_level": self.top_level,
            "notable": self.notable,
            "agent": {
                "path": format!("/{}", super::AGENT_PATH),
                "sha256": self.agent_sha256,
                "source": self.agent_source,
            },
            "init": self.init,
            "packages": pairs(&self.packages),
            "build_tools": pairs(&self.build_tools),
            "kernel": self.kernel,
            "build_seconds": (self.build_seconds * 10.0).round() / 10.0,
        });
        if !self.debian.is_null() {
            v["debian"] = self.debian.clone();
        }
        v
    }

    pub fn to_json_string(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.to_json()).expect("JSON values serialize");
        s.push('\n');
        s
    }
}

/// The kernel the images pair with: Debian's linux 6.1 with our config
/// fragment (its sha256 at the time of the image build), either variant.
pub fn kernel_info(repo: &Path) -> Value {
    let fragment = repo.join(KERNEL_FRAGMENT);
    let fragment_sha256 = match std::fs::read(&fragment) {
        Ok(bytes) => Value::String(
            Sha256::digest(&bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        ),
        Err(_) => Value::Null,
    };
    json!({
        "name": "linux-6.1 (guest/kernel)",
        "variants": KERNEL_VARIANTS,
        "config_fragment": KERNEL_FRAGMENT,
        "config_fragment_sha256": fragment_sha256,
        "linux_source": sh::deb_version("linux-source-6.1"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            name: "minimal".into(),
            input_hash: "0123456789abcdef".into(),
            image_size_bytes: 12 << 20,
            image_sha256: "ab".repeat(32),
            tree_bytes: 4 << 20,
            top_level: vec!["/bin/".into(), "/tmp/".into()],
            notable: vec!["/sbin/init -> /usr/bin/microagent-agent".into()],
            agent_sha256: "cd".repeat(32),
            agent_source: "crates/guest-agent".into(),
            init: "symlink".into(),
            packages: vec![("busybox-static".into(), "1:1.35.0-4".into())],
            build_tools: vec![("e2fsprogs".into(), "1.47.0-2".into())],
            kernel: json!({"variants": ["standard", "compat"]}),
            debian: Value::Null,
            build_seconds: 1.2345,
        }
    }

    #[test]
    fn manifest_fields() {
        let text = sample().to_json_string();
        assert!(text.ends_with("}\n"));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["name"], "minimal");
        assert_eq!(v["image"], "rootfs.ext4");
        assert_eq!(v["image_size_bytes"], 12 << 20);
        assert_eq!(v["image_sha256"].as_str().unwrap().len(), 64);
        assert_eq!(v["agent"]["path"], "/usr/bin/microagent-agent");
        assert_eq!(v["agent"]["sha256"].as_str().unwrap().len(), 64);
        assert_eq!(v["packages"]["busybox-static"], "1:1.35.0-4");
        assert_eq!(v["build_tools"]["e2fsprogs"], "1.47.0-2");
        assert_eq!(v["kernel"]["variants"][1], "compat");
        assert_eq!(v["top_level"][0], "/bin/");
        assert_eq!(v["build_seconds"], 1.2);
        assert!(v.get("debian").is_none());
        let mut with_debian = sample();
        with_debian.debian = json!({"suite": "bookworm"});
        assert_eq!(with_debian.to_json()["debian"]["suite"], "bookworm");
    }

    #[test]
    fn kernel_info_names_the_fragment() {
        let v = kernel_info(&crate::cache::repo_root());
        assert_eq!(v["config_fragment"], KERNEL_FRAGMENT);
        assert_eq!(v["config_fragment_sha256"].as_str().unwrap().len(), 64);
        assert_eq!(v["variants"], json!(["standard", "compat"]));
        let missing = kernel_info(Path::new("/nonexistent"));
        assert!(missing["config_fragment_sha256"].is_null());
    }
}
