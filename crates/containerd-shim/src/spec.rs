//! What a container's OCI runtime spec (the bundle's `config.json`, or an
//! exec's process spec) asks of its workspace: the command with its
//! environment, directory, user and terminal; vCPUs and memory from its
//! resources; our annotations; and which pod sandbox it belongs to.

use std::collections::HashMap;
use std::path::Path;

use oci_spec::runtime::{Process, Spec};
use workspace::ExecRequest;

use crate::error::ShimError;

/// The annotation naming a registered image to boot instead of the
/// container's own root filesystem.
pub const IMAGE_ANNOTATION: &str = "io.microagent.image";
/// The annotation naming the workspace's network (`user`, `none`, or a
/// network made with `microagent network create`).
pub const NETWORK_ANNOTATION: &str = "io.microagent.network";
/// The annotation setting the workspace's egress mode.
pub const EGRESS_ANNOTATION: &str = "io.microagent.egress";
/// What the CRI plugin says a container is: `sandbox` (the pod's pause
/// container) or `container`.
pub const CONTAINER_TYPE_ANNOTATION: &str = "io.kubernetes.cri.container-type";
/// The pod sandbox a CRI container belongs to.
pub const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

/// Guest memory when the spec sets no limit, MiB.
pub const DEFAULT_MEM_MIB: u64 = 512;
/// The least guest memory given, MiB: below it the guest kernel and agent
/// leave a container too little (a smaller limit is raised to it).
pub const MEM_FLOOR_MIB: u64 = 256;

/// Where a container runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxRole {
    /// In a workspace of its own (a plain container).
    Own,
    /// A pod's sandbox (pause) container: the pod's workspace is its, but
    /// is booted by the pod's first container, from that container's root
    /// filesystem (or now, from `io.microagent.image` when the pod names
    /// one); the pause process itself runs nowhere.
    PodSandbox,
    /// In the workspace of pod sandbox `sandbox`.
    Joins(String),
}

/// What a container's spec asks for.
#[derive(Debug)]
pub struct ContainerPlan {
    /// Its process.
    pub process: ProcessPlan,
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory, MiB.
    pub mem_mib: u64,
    /// A registered image to boot instead of its root filesystem.
    pub image: Option<String>,
    /// The workspace's network.
    pub network: Option<String>,
    /// The workspace's egress mode.
    pub egress: Option<String>,
    /// Where it runs.
    pub placement: SandboxRole,
}

/// One process: what the agent is asked to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessPlan {
    /// Program and arguments.
    pub args: Vec<String>,
    /// Environment, `KEY` and value.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: String,
    /// `uid:gid`.
    pub user: String,
    /// On a pseudo-terminal.
    pub terminal: bool,
    /// The guest directory that is its root, when its container has one
    /// of its own (container.rs); else the guest's root.
    pub root: Option<String>,
}

impl ProcessPlan {
    /// From an OCI process.
    pub fn from_process(process: &Process) -> Result<Self, ShimError> {
        let args = process.args().clone().unwrap_or_default();
        if args.is_empty() || args[0].is_empty() {
            return Err(ShimError::BadSpec("the process has no arguments".into()));
        }
        let env = process
            .env()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (kv, String::new()),
            })
            .collect();
        let user = process.user();
        Ok(Self {
            args,
            env,
            cwd: process.cwd().display().to_string(),
            user: format!("{}:{}", user.uid(), user.gid()),
            terminal: process.terminal().unwrap_or(false),
            root: None,
        })
    }

    /// From an exec's process spec (the JSON containerd sends).
    pub fn from_json(bytes: &[u8]) -> Result<Self, ShimError> {
        let process: Process = serde_json::from_slice(bytes)
            .map_err(|e| ShimError::BadSpec(format!("the exec's process spec: {e}")))?;
        Self::from_process(&process)
    }

    /// The agent's request.
    pub fn request(&self) -> ExecRequest {
        let mut req = ExecRequest::argv(self.args.clone())
            .envs(self.env.iter().cloned())
            .cwd(self.cwd.clone())
            .user(self.user.clone())
            .uncapped_output();
        if self.terminal {
            req = req.terminal(workspace::guest::PtySize::default());
        }
        if let Some(root) = &self.root {
            req = req.root(root.clone());
        }
        req
    }
}

/// Reads `bundle/config.json`.
pub fn load(bundle: &Path) -> Result<Spec, ShimError> {
    let path = bundle.join("config.json");
    Spec::load(&path).map_err(|source| ShimError::Spec { path, source })
}

/// The spec's annotations (none when it has none).
pub fn annotations(spec: &Spec) -> HashMap<String, String> {
    spec.annotations().clone().unwrap_or_default()
}

/// Which sandbox a container's shim serves: the pod's, for a CRI
/// container, else its own (`id`).
pub fn grouping(spec: &Spec, id: &str) -> String {
    match placement(&annotations(spec)) {
        SandboxRole::Joins(sandbox) => sandbox,
        SandboxRole::Own | SandboxRole::PodSandbox => id.to_owned(),
    }
}

fn placement(annotations: &HashMap<String, String>) -> SandboxRole {
    match (
        annotations
            .get(CONTAINER_TYPE_ANNOTATION)
            .map(String::as_str),
        annotations.get(SANDBOX_ID_ANNOTATION),
    ) {
        (Some("container"), Some(sandbox)) if !sandbox.is_empty() => {
            SandboxRole::Joins(sandbox.clone())
        }
        (Some("sandbox"), _) => SandboxRole::PodSandbox,
        _ => SandboxRole::Own,
    }
}

/// The plan of a container from its spec; `max_vcpus` bounds the vCPUs a
/// CPU quota asks for.
pub fn plan(spec: &Spec, max_vcpus: u8) -> Result<ContainerPlan, ShimError> {
    let process = spec
        .process()
        .as_ref()
        .ok_or_else(|| ShimError::BadSpec("it has no process".into()))?;
    let resources = spec.linux().as_ref().and_then(|l| l.resources().as_ref());
    let cpu = resources.and_then(|r| r.cpu().as_ref());
    let vcpus = match (
        cpu.and_then(|c| c.quota()),
        cpu.and_then(|c| c.period()).filter(|p| *p > 0),
    ) {
        // A quota of 1.5 CPUs gets 2 vCPUs: the guest can use no more
        // than its vCPUs, so a quota is rounded up, never down.
        (Some(quota), Some(period)) if quota > 0 => {
            let n = (quota as u64).div_ceil(period);
            u8::try_from(n)
                .unwrap_or(u8::MAX)
                .clamp(1, max_vcpus.max(1))
        }
        _ => 1,
    };
    let mem_mib = match resources
        .and_then(|r| r.memory().as_ref())
        .and_then(|m| m.limit())
    {
        Some(limit) if limit > 0 => (limit as u64).div_ceil(1 << 20).max(MEM_FLOOR_MIB),
        _ => DEFAULT_MEM_MIB,
    };
    let annotations = annotations(spec);
    Ok(ContainerPlan {
        process: ProcessPlan::from_process(process)?,
        vcpus,
        mem_mib,
        image: annotations.get(IMAGE_ANNOTATION).cloned(),
        network: annotations.get(NETWORK_ANNOTATION).cloned(),
        egress: annotations.get(EGRESS_ANNOTATION).cloned(),
        placement: placement(&annotations),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Spec {
        serde_json::from_value(json).unwrap()
    }

    fn base() -> serde_json::Value {
        serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "args": ["sh", "-c", "echo hi"],
                "env": ["PATH=/bin", "EMPTY=", "NOVALUE"],
                "cwd": "/srv",
                "user": {"uid": 1000, "gid": 100},
                "terminal": true
            },
            "root": {"path": "rootfs"}
        })
    }

    #[test]
    fn the_process_is_taken_as_the_spec_gives_it() {
        let plan = plan(&spec(base()), 4).unwrap();
        assert_eq!(plan.process.args, ["sh", "-c", "echo hi"]);
        assert_eq!(
            plan.process.env,
            [
                ("PATH".into(), "/bin".into()),
                ("EMPTY".into(), String::new()),
                ("NOVALUE".into(), String::new())
            ]
        );
        assert_eq!(plan.process.cwd, "/srv");
        assert_eq!(plan.process.user, "1000:100");
        assert!(plan.process.terminal);
        assert_eq!((plan.vcpus, plan.mem_mib), (1, DEFAULT_MEM_MIB));
        assert_eq!(plan.placement, SandboxRole::Own);
    }

    #[test]
    fn a_quota_rounds_up_to_vcpus_and_memory_has_a_floor() {
        let mut json = base();
        json["linux"] = serde_json::json!({"resources": {
            "cpu": {"quota": 150000, "period": 100000},
            "memory": {"limit": 700 * 1024 * 1024 + 1}
        }});
        let p = plan(&spec(json.clone()), 4).unwrap();
        assert_eq!((p.vcpus, p.mem_mib), (2, 701));
        json["linux"]["resources"]["cpu"]["quota"] = 100_000_000.into();
        json["linux"]["resources"]["memory"]["limit"] = (16 << 20).into();
        let p = plan(&spec(json), 4).unwrap();
        assert_eq!((p.vcpus, p.mem_mib), (4, MEM_FLOOR_MIB));
    }

    #[test]
    fn cri_containers_join_their_sandbox() {
        let mut json = base();
        json["annotations"] = serde_json::json!({
            CONTAINER_TYPE_ANNOTATION: "container",
            SANDBOX_ID_ANNOTATION: "pod1",
            IMAGE_ANNOTATION: "debian",
            NETWORK_ANNOTATION: "none"
        });
        let s = spec(json.clone());
        let p = plan(&s, 4).unwrap();
        assert_eq!(p.placement, SandboxRole::Joins("pod1".into()));
        assert_eq!(grouping(&s, "c1"), "pod1");
        assert_eq!(p.image.as_deref(), Some("debian"));
        assert_eq!(p.network.as_deref(), Some("none"));
        json["annotations"][CONTAINER_TYPE_ANNOTATION] = "sandbox".into();
        let s = spec(json);
        assert_eq!(plan(&s, 4).unwrap().placement, SandboxRole::PodSandbox);
        assert_eq!(grouping(&s, "pod1"), "pod1");
    }

    #[test]
    fn a_process_without_arguments_is_refused() {
        let mut json = base();
        json["process"]["args"] = serde_json::json!([]);
        assert!(matches!(plan(&spec(json), 1), Err(ShimError::BadSpec(_))));
        assert!(ProcessPlan::from_json(b"{").is_err());
    }
}
