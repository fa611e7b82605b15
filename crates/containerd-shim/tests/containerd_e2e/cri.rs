//! A pod through containerd's CRI plugin (its gRPC API, as the kubelet
//! calls it, with the `k8s-cri` crate: crictl is not packaged): the pod's
//! sandbox and two containers share one workspace microVM, and removing
//! the pod leaves nothing.

use std::path::Path;

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use testkit::containerd::{Containerd, CRI_HANDLER};
use tonic::transport::{Channel, Endpoint, Uri};

async fn connect(socket: &Path) -> RuntimeServiceClient<Channel> {
    let socket = socket.to_owned();
    let channel = Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .expect("connecting to the CRI plugin");
    RuntimeServiceClient::new(channel)
}

fn sandbox_config() -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "pod".into(),
            uid: "pod-uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "pod".into(),
        linux: Some(LinuxPodSandboxConfig {
            // The host's network: the CRI plugin calls no CNI plugin (the
            // workspace has its own network either way).
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container(name: &str, image: &str, script: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}

async fn exec(cri: &mut RuntimeServiceClient<Channel>, id: &str, cmd: &[&str]) -> String {
    let out = cri
        .exec_sync(ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 60,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(
        out.exit_code,
        0,
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pod's two containers see one guest: one boot id, one filesystem,
/// one VMM.
pub fn a_pods_containers_share_one_microvm(shim: &Path) {
    let ctrd = Containerd::start_with_cri("cri", shim);
    let image = ctrd.import_test_image();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut cri = connect(&ctrd.socket()).await;
        let pod = cri
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(sandbox_config()),
                runtime_handler: CRI_HANDLER.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctrd.log()))
            .into_inner()
            .pod_sandbox_id;
        let mut ids = Vec::new();
        for (name, script) in [
            (
                "writer",
                "echo from-writer > /home/app/shared; exec busybox sleep 100000",
            ),
            ("reader", "exec busybox sleep 100000"),
        ] {
            let id = cri
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: pod.clone(),
                    config: Some(container(name, &image, script)),
                    sandbox_config: Some(sandbox_config()),
                })
                .await
                .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"))
                .into_inner()
                .container_id;
            cri.start_container(StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}"));
            ids.push(id);
        }
        let boot_ids: Vec<String> = {
            let mut v = Vec::new();
            for id in &ids {
                v.push(exec(&mut cri, id, &["cat", "/proc/sys/kernel/random/boot_id"]).await);
            }
            v
        };
        assert_eq!(boot_ids[0], boot_ids[1], "two guests");
        // The writer's file, seen by the reader (once the writer ran).
        let mut seen = String::new();
        for _ in 0..30 {
            let read = ["sh", "-c", "cat /home/app/shared 2>&1 || true"];
            seen = exec(&mut cri, &ids[1], &read).await;
            if seen == "from-writer\n" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        assert_eq!(seen, "from-writer\n");
        let vmms: Vec<String> = testkit::leftovers::processes_of(&ctrd.home)
            .into_iter()
            .filter(|p| p.contains("microagent-vmm"))
            .collect();
        assert_eq!(vmms.len(), 1, "{vmms:?}");
        for id in &ids {
            cri.stop_container(StopContainerRequest {
                container_id: id.clone(),
                timeout: 5,
            })
            .await
            .expect("StopContainer");
            cri.remove_container(RemoveContainerRequest {
                container_id: id.clone(),
            })
            .await
            .expect("RemoveContainer");
        }
        cri.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .expect("StopPodSandbox");
        cri.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .expect("RemovePodSandbox");
    });
    let gone = testkit::wait_until(std::time::Duration::from_secs(30), || {
        testkit::leftovers::processes_of(&ctrd.home).is_empty()
    });
    assert!(gone, "{:?}", testkit::leftovers::processes_of(&ctrd.home));
    testkit::leftovers::assert_none(&ctrd.home);
}
