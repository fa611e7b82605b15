//! A pod through containerd's CRI plugin (its gRPC API, as the kubelet
//! calls it, with the `k8s-cri` crate: crictl is not packaged): the pod's
//! sandbox and two containers of two images share one workspace microVM,
//! each in its own root filesystem, and removing the pod leaves nothing.

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

/// The pod's two containers, of two images, share one guest (one boot id,
/// one VMM) and each sees its own root filesystem: the second one's,
/// copied in with its owners, is gone once it is removed.
pub fn a_pods_containers_share_one_microvm(shim: &Path) {
    let ctrd = Containerd::start_with_cri("cri", shim);
    let image = ctrd.import_test_image();
    let other = ctrd.import_other_image("image b\n");
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
        for (name, image, script) in [
            (
                "writer",
                &image,
                "echo from-writer > /home/app/shared; exec busybox sleep 100000",
            ),
            ("reader", &other, "exec busybox sleep 100000"),
        ] {
            let id = cri
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: pod.clone(),
                    config: Some(container(name, image, script)),
                    sandbox_config: Some(sandbox_config()),
                })
                .await
                .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", ctrd.log()))
                .into_inner()
                .container_id;
            cri.start_container(StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}"));
            ids.push(id);
        }
        let (writer, reader) = (ids[0].clone(), ids[1].clone());
        let boot_id = ["cat", "/proc/sys/kernel/random/boot_id"];
        assert_eq!(
            exec(&mut cri, &writer, &boot_id).await,
            exec(&mut cri, &reader, &boot_id).await,
            "two guests"
        );
        // Each runs in its own image.
        assert_eq!(
            exec(&mut cri, &writer, &["cat", "/etc/marker"]).await,
            "layer two\n"
        );
        assert_eq!(
            exec(&mut cri, &reader, &["cat", "/etc/marker"]).await,
            "image b\n"
        );
        // The writer's file is in the writer's filesystem alone.
        let mut seen = String::new();
        for _ in 0..30 {
            seen = exec(
                &mut cri,
                &writer,
                &["sh", "-c", "cat /home/app/shared 2>&1 || true"],
            )
            .await;
            if seen == "from-writer\n" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        assert_eq!(seen, "from-writer\n");
        let absent = [
            "sh",
            "-c",
            "test -e /home/app/shared && echo there || echo absent",
        ];
        assert_eq!(exec(&mut cri, &reader, &absent).await, "absent\n");
        // The image's user owns its home in the copy: it can write there.
        let write = [
            "sh",
            "-c",
            "id -u; echo mine > /home/app/mine && cat /home/app/mine",
        ];
        assert_eq!(exec(&mut cri, &reader, &write).await, "1000\nmine\n");
        let vmms: Vec<String> = testkit::leftovers::processes_of(&ctrd.home)
            .into_iter()
            .filter(|p| p.contains("microagent-vmm"))
            .collect();
        assert_eq!(vmms.len(), 1, "{vmms:?}");
        // The reader's root, seen from the writer (the guest's root).
        let copy = format!("/var/lib/microagent/containers/{reader}");
        let probe = format!("test -d {copy} && echo kept || echo removed");
        let probe = ["sh", "-c", probe.as_str()];
        assert_eq!(exec(&mut cri, &writer, &probe).await, "kept\n");
        for id in [&reader, &writer] {
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
            if id == &reader {
                assert_eq!(exec(&mut cri, &writer, &probe).await, "removed\n");
            }
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
