//! A containerd of the caller's own (Debian's, with its own root, state
//! and socket under /tmp, the CRI plugin off), finding microagent's shim
//! on its PATH and giving it a fresh microagent state directory; `ctr`
//! against it; and the busybox OCI image of [`crate::oci::write_layout`],
//! imported. The containerd suite and `cargo xtask bench containerd` use
//! it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The runtime name `ctr run --runtime` takes.
pub const RUNTIME: &str = "io.containerd.microagent.v2";
/// containerd's own runc shim, the reference.
pub const RUNC_RUNTIME: &str = "io.containerd.runc.v2";
/// The containerd namespace `ctr` uses (the CRI plugin's is `k8s.io`).
pub const NAMESPACE: &str = "microagent-test";
/// The CRI plugin's namespace.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// The runtime handler the CRI plugin is configured with.
pub const CRI_HANDLER: &str = "microagent";
/// The image of the CRI plugin's pod sandboxes (the test image with
/// `/pause`, which it lacks, as its command).
pub const SANDBOX_IMAGE: &str = "docker.io/library/sandbox:test";

/// A running containerd.
#[derive(Debug)]
pub struct Containerd {
    /// Its root, state, socket and log are in here.
    pub root: PathBuf,
    /// The microagent state directory its shims use.
    pub home: PathBuf,
    /// The directory of the shim (and `microagent-vmm` beside it).
    shim_dir: PathBuf,
    /// The namespace `ctr` works in.
    namespace: &'static str,
    child: Option<Child>,
}

/// Why the suite cannot run here, if it cannot.
pub fn missing() -> Option<String> {
    // SAFETY: geteuid reads a process attribute.
    if unsafe { libc::geteuid() } != 0 {
        return Some("containerd and its shims run as root; run the suite as root".into());
    }
    for tool in ["containerd", "ctr"] {
        if let Err(e) = crate::host_tool(tool) {
            return Some(format!("{e} (apt-get install containerd)"));
        }
    }
    if let Err(e) = crate::guest_assets() {
        return Some(e);
    }
    crate::workspace_image("minimal").err()
}

impl Containerd {
    /// Starts one for `name` (a test or bench), its shims `shim` (with
    /// `microagent-vmm` beside it), and waits until it answers.
    pub fn start(name: &str, shim: &Path) -> Self {
        Self::start_with(name, shim, false)
    }

    /// [`Containerd::start`] with the CRI plugin on: its socket is the
    /// same, its runtime `microagent` is our shim, pods on the host's
    /// network need no CNI, and its sandboxes run [`SANDBOX_IMAGE`]
    /// (imported by [`Containerd::import_test_image`]).
    pub fn start_with_cri(name: &str, shim: &Path) -> Self {
        Self::start_with(name, shim, true)
    }

    fn start_with(name: &str, shim: &Path, cri: bool) -> Self {
        let root = PathBuf::from(format!("/tmp/ma-ctrd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let home = root.join("home");
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&home)
            .unwrap();
        crate::cli::vmm_program_beside(shim);
        let plugins = if cri {
            format!(
                r#"[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{root}/cni/bin"
    conf_dir = "{root}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "{CRI_HANDLER}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{CRI_HANDLER}]
    runtime_type = "{RUNTIME}"
"#,
                root = root.display()
            )
        } else {
            r#"disabled_plugins = ["io.containerd.grpc.v1.cri"]
"#
            .to_owned()
        };
        let config = format!(
            r#"version = 2
root = "{root}/root"
state = "{root}/state"
{plugins}[grpc]
  address = "{root}/containerd.sock"
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"
"#,
            root = root.display()
        );

        std::fs::write(root.join("config.toml"), config).unwrap();
        let mut me = Self {
            root,
            home,
            shim_dir: shim.parent().unwrap_or(Path::new("/")).to_owned(),
            namespace: if cri { CRI_NAMESPACE } else { NAMESPACE },
            child: None,
        };
        me.launch();
        me
    }

    /// Starts the containerd process (again, after [`Containerd::stop`]).
    pub fn launch(&mut self) {
        let path = format!(
            "{}:{}",
            self.shim_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("containerd.log"))
            .unwrap();
        let mut cmd = Command::new(crate::host_tool("containerd").unwrap());
        cmd.arg("--config")
            .arg(self.root.join("config.toml"))
            .env("PATH", path)
            .env("MICROAGENT_HOME", &self.home)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(warm) = crate::shared_warm_dir() {
            cmd.env("MICROAGENT_WARM_DIR", warm);
        }
        self.child = Some(cmd.spawn().expect("starting containerd"));
        let up = crate::wait_until(Duration::from_secs(30), || {
            self.ctr(&["version"]).status.success()
        });
        assert!(up, "containerd did not answer:\n{}", self.log());
    }

    /// Stops the containerd process (its shims keep running).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill takes two integers.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("containerd.log")).unwrap_or_default()
    }

    /// `ctr ARGS` against it.
    pub fn ctr_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(crate::host_tool("ctr").unwrap());
        cmd.arg("--address")
            .arg(self.root.join("containerd.sock"))
            .args(["--namespace", self.namespace])
            .args(args);
        cmd
    }

    /// Runs `ctr ARGS` with no stdin.
    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_command(args)
            .stdin(Stdio::null())
            .output()
            .expect("running ctr")
    }

    /// Runs `ctr ARGS` and panics unless it succeeds; its stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert!(
            out.status.success(),
            "ctr {args:?} failed: {}\n{}\ncontainerd log tail:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log(), 40)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes the busybox test image and imports it; its name. With the
    /// CRI plugin on, [`SANDBOX_IMAGE`] too.
    pub fn import_test_image(&self) -> String {
        let name = "docker.io/library/test:1";
        self.import_layout(name, &["sh"]);
        if self.namespace == CRI_NAMESPACE {
            // A command the image does not have: the pod's pause process
            // must run nowhere.
            self.import_layout(SANDBOX_IMAGE, &["/pause"]);
        }
        name.to_owned()
    }

    /// Imports a second test image, `other:1`, whose `/etc/marker` is
    /// `marker`; returns its name.
    pub fn import_other_image(&self, marker: &str) -> String {
        let name = "docker.io/library/other:1";
        self.import_marked(name, &["sh"], marker);
        name.to_owned()
    }

    fn import_layout(&self, name: &str, cmd: &[&str]) {
        self.import_marked(name, cmd, "layer two\n");
    }

    fn import_marked(&self, name: &str, cmd: &[&str], marker: &str) {
        let dir = self.root.join(name.replace(['/', ':'], "_"));
        let layout = dir.join("layout");
        crate::oci::write_layout_marked(&layout, cmd, marker);
        let archive = dir.join("layout.tar");
        let mut tar = tar::Builder::new(std::fs::File::create(&archive).unwrap());
        tar.append_dir_all(".", &layout).unwrap();
        tar.finish().unwrap();
        self.ctr_ok(&[
            "images",
            "import",
            "--index-name",
            name,
            archive.to_str().unwrap(),
        ]);
    }

    /// Its socket (the CRI plugin's too).
    pub fn socket(&self) -> PathBuf {
        self.root.join("containerd.sock")
    }

    /// The PIDs of this containerd's shims.
    pub fn shim_pids(&self) -> Vec<u32> {
        let sock = self.root.join("containerd.sock").display().to_string();
        crate::leftovers::processes_of(Path::new(&sock))
            .iter()
            .filter(|p| p.contains("containerd-shim-microagent-v2"))
            .filter_map(|p| p.split(':').next()?.parse().ok())
            .collect()
    }

    /// Waits until process `pid` is gone.
    pub fn wait_gone(pid: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for task in self
            .ctr(&["tasks", "ls", "-q"])
            .stdout
            .split(|b| *b == b'\n')
        {
            let task = String::from_utf8_lossy(task).trim().to_owned();
            if !task.is_empty() {
                let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", &task]);
                let _ = self.ctr(&["tasks", "rm", "-f", &task]);
            }
        }
        self.stop();
        for pid in self.shim_pids() {
            // SAFETY: kill takes two integers.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        for line in crate::leftovers::processes_of(&self.home) {
            if let Some(pid) = line.split(':').next().and_then(|p| p.parse::<i32>().ok()) {
                // SAFETY: kill takes two integers.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        // What containerd mounted under its root, deepest first.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let root = self.root.display().to_string();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|p| p.starts_with(&root))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = Command::new("umount").args(["-l", p]).status();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
