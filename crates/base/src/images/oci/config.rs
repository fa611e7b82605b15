//! The image config (the part of it a workspace uses) and the defaults it
//! gives workspaces: environment, working directory, user, command.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::tree::ImageTree;
use super::OciError;

/// The image config document (OCI `application/vnd.oci.image.config.v1+json`
/// and Docker's, which share these fields).
#[derive(Debug, Clone, Deserialize)]
pub struct ImageConfig {
    /// `amd64`, ...
    #[serde(default)]
    pub architecture: String,
    /// `linux`, ...
    #[serde(default)]
    pub os: String,
    /// How containers of it run.
    #[serde(default)]
    pub config: Option<RunConfig>,
    /// The layers' uncompressed digests, bottom first.
    pub rootfs: RootFs,
}

/// `config` of an image config.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    /// `KEY=value` entries.
    #[serde(default)]
    pub env: Option<Vec<String>>,
    /// The working directory.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// The user (`name`, `uid`, `name:group`, ...).
    #[serde(default)]
    pub user: Option<String>,
    /// The command (arguments to the entrypoint, if any).
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// The entrypoint.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Labels (`org.opencontainers.image.description`, ...).
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

/// The label or annotation that says what an image is.
pub const DESCRIPTION_KEY: &str = "org.opencontainers.image.description";

/// `rootfs` of an image config.
#[derive(Debug, Clone, Deserialize)]
pub struct RootFs {
    /// `sha256:` digests of the uncompressed layers.
    pub diff_ids: Vec<String>,
}

impl ImageConfig {
    /// Parses and checks that it is a Linux x86-64 image.
    pub fn parse(bytes: &[u8]) -> Result<Self, OciError> {
        let config: ImageConfig =
            serde_json::from_slice(bytes).map_err(|source| OciError::Json {
                what: "config".into(),
                source,
            })?;
        if config.os != "linux" || config.architecture != "amd64" {
            return Err(OciError::Unsupported(format!(
                "the image is for {}/{}; workspaces run linux/amd64",
                config.os, config.architecture
            )));
        }
        Ok(config)
    }
}

/// What workspaces of an image start with (from its config).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct ImageDefaults {
    /// Environment of every command (a command's own values win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory of commands that name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The user commands run as, as the image names it (`node`, `1000:1000`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// That user's uid and gid, resolved in the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// See `uid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// The image's command (Entrypoint then Cmd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// vCPUs a workspace of it gets when its create names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u8>,
    /// Guest memory (MiB) a workspace of it gets when its create names
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mib: Option<u64>,
    /// The least guest memory (MiB) its programs run in: the browser tools
    /// refuse a smaller workspace of it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_mem_mib: Option<u64>,
}

/// Where an image came from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct OciOrigin {
    /// The reference pulled, or the name in the archive (may be empty).
    pub reference: String,
    /// The manifest's digest.
    pub manifest_digest: String,
    /// The config's digest.
    pub config_digest: String,
    /// The layers' digests, bottom first.
    pub layers: Vec<String>,
    /// What it says it is ([`DESCRIPTION_KEY`] of its config's labels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl ImageDefaults {
    /// The vCPUs of a new workspace of it: `asked`, else the image's, else
    /// the default.
    pub fn vcpus_or(&self, asked: Option<u8>) -> u8 {
        asked
            .or(self.vcpus)
            .unwrap_or(crate::store::spec::defaults::VCPUS)
    }

    /// The guest memory (MiB) of a new workspace of it: `asked`, else the
    /// image's, else the default.
    pub fn mem_mib_or(&self, asked: Option<u64>) -> u64 {
        asked
            .or(self.mem_mib)
            .unwrap_or(crate::store::spec::defaults::MEM_MIB)
    }

    /// The defaults of `config`, the user resolved in the unpacked `tree`.
    pub fn from_config(config: &RunConfig, tree: &Path) -> Result<Self, OciError> {
        let mut env = BTreeMap::new();
        for kv in config.env.iter().flatten() {
            if let Some((k, v)) = kv.split_once('=') {
                if !k.is_empty() {
                    env.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        let command: Vec<String> = config
            .entrypoint
            .iter()
            .flatten()
            .chain(config.cmd.iter().flatten())
            .cloned()
            .collect();
        let user = config.user.clone().filter(|u| !u.is_empty());
        let (uid, gid) = match &user {
            Some(user) => {
                // HOME comes from the guest's passwd at each exec (agent).
                let (uid, gid, _home) = resolve_user(user, tree)?;
                (Some(uid), Some(gid))
            }
            None => (None, None),
        };
        Ok(Self {
            env,
            cwd: config.working_dir.clone().filter(|d| d.starts_with('/')),
            user,
            uid,
            gid,
            command: (!command.is_empty()).then_some(command),
            // Sizes come from our own builds, never from an image's config.
            ..Self::default()
        })
    }
}

/// An image's `User` as uid, gid and home directory, looked up in the
/// tree's /etc/passwd and /etc/group as the container runtime would.
fn resolve_user(user: &str, tree: &Path) -> Result<(u32, u32, Option<String>), OciError> {
    // Read as the image has them: regular files inside the tree, bounded.
    let image = ImageTree::open(tree)?;
    let text = |rel| -> Result<String, OciError> {
        let data = image.read_small(rel)?.unwrap_or_default();
        Ok(String::from_utf8_lossy(&data).into_owned())
    };
    let passwd = text("etc/passwd")?;
    let group = text("etc/group")?;
    let found = guest_agent::users::resolve(user, &passwd, &group)
        .map_err(|e| OciError::Unsupported(format!("the image runs as `{user}`, but {e}")))?;
    Ok((found.uid, found.gid, found.home))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_resolve_by_name_number_and_group() {
        let tree = std::env::temp_dir().join(format!("ma-ocicfg-{}", std::process::id()));
        std::fs::create_dir_all(tree.join("etc")).unwrap();
        std::fs::write(
            tree.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1001::/home/node:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(tree.join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        assert_eq!(
            resolve_user("node", &tree).unwrap(),
            (1000, 1001, Some("/home/node".into()))
        );
        assert_eq!(resolve_user("node:staff", &tree).unwrap().1, 50);
        assert_eq!(resolve_user("1000:7", &tree).unwrap().0, 1000);
        assert_eq!(resolve_user("4242", &tree).unwrap(), (4242, 0, None));
        assert!(resolve_user("ghost", &tree).is_err());
        assert!(resolve_user("node:nogroup", &tree).is_err());

        let run = RunConfig {
            env: Some(vec!["PATH=/usr/bin:/bin".into(), "A=b=c".into()]),
            working_dir: Some("/app".into()),
            user: Some("node".into()),
            cmd: Some(vec!["node".into()]),
            entrypoint: Some(vec!["docker-entrypoint.sh".into()]),
            labels: None,
        };
        let d = ImageDefaults::from_config(&run, &tree).unwrap();
        assert_eq!(d.env["A"], "b=c");
        assert!(!d.env.contains_key("HOME"), "the agent sets HOME per user");
        assert_eq!(d.cwd.as_deref(), Some("/app"));
        assert_eq!((d.uid, d.gid), (Some(1000), Some(1001)));
        assert_eq!(
            d.command,
            Some(vec!["docker-entrypoint.sh".into(), "node".into()])
        );
        std::fs::remove_dir_all(tree).unwrap();
    }

    #[test]
    fn configs_for_other_platforms_are_refused() {
        let arm =
            br#"{"architecture":"arm64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
        assert!(matches!(
            ImageConfig::parse(arm),
            Err(OciError::Unsupported(_))
        ));
        let ok = br#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"]},"rootfs":{"type":"layers","diff_ids":["sha256:00"]}}"#;
        let c = ImageConfig::parse(ok).unwrap();
        assert_eq!(c.rootfs.diff_ids.len(), 1);
        assert!(matches!(
            ImageConfig::parse(b"[]"),
            Err(OciError::Json { .. })
        ));
    }
}
