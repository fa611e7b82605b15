//! `cargo xtask bench images`: a container image's way into a workspace.
//! A busybox image made with umoci is pushed by skopeo to a
//! `docker-registry` on loopback; then `microagent image pull` (download
//! and conversion) beside `skopeo copy` of the same image to a layout
//! (download only), the same for a five-layer image of about 120 MB, and
//! create + start of a workspace of the pulled image
//! beside the same of the built `minimal` image, then warm starts of
//! `minimal` with and without one named volume (its attach cost), all in
//! one run; `--release` measures the build users run (decompression and
//! hashing unoptimised are many times slower).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::bench_workspace::microagent;
use crate::{cache, images, kernel, sh};

const PACKAGES: &[&str] = &["docker-registry", "skopeo", "umoci", "busybox-static"];
/// Applets linked in the bench image.
const APPLETS: &[&str] = &["sh", "cat", "ls", "echo", "true"];

struct Registry(Child);

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The multi-layer image's layers, files per layer and file size: 128 MiB
/// of files that gzip to about 120 MB (half of each block random bytes,
/// half letters of a 16-letter alphabet, as program files and data mix).
const BIG_LAYERS: usize = 4;
const BIG_LAYER_FILES: usize = 32;
const BIG_FILE_BYTES: usize = 1 << 20;

/// An empty image `bench` at `layout`, unpacked (rootless) into
/// `work/bundle`; returns the bundle.
fn new_image(work: &Path, layout: &Path) -> anyhow::Result<std::path::PathBuf> {
    let l = format!("{}:bench", layout.display());
    sh::run(Command::new("umoci").args(["init", "--layout"]).arg(layout))?;
    sh::run(Command::new("umoci").args(["new", "--image", &l]))?;
    let bundle = work.join("bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    sh::run(
        Command::new("umoci")
            .args(["unpack", "--rootless", "--image", &l])
            .arg(&bundle),
    )?;
    Ok(bundle)
}

/// Adds what changed in `bundle` as a layer of `layout`'s `bench`.
fn add_layer(layout: &Path, bundle: &Path) -> anyhow::Result<()> {
    let l = format!("{}:bench", layout.display());
    sh::run(
        Command::new("umoci")
            .args(["repack", "--refresh-bundle", "--image", &l])
            .arg(bundle),
    )
}

/// Sets the image's `PATH` and working directory.
fn configure(layout: &Path) -> anyhow::Result<()> {
    let l = format!("{}:bench", layout.display());
    sh::run(Command::new("umoci").args([
        "config",
        "--image",
        &l,
        "--config.env",
        "PATH=/bin",
        "--config.workingdir",
        "/tmp",
    ]))
}

/// A busybox OCI layout at `layout` (tag `bench`), made with umoci.
fn make_image(work: &Path, layout: &Path) -> anyhow::Result<()> {
    let bundle = new_image(work, layout)?;
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin"))?;
    std::fs::create_dir_all(rootfs.join("etc"))?;
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    std::fs::write(rootfs.join("etc/os-release"), "ID=bench\n")?;
    add_layer(layout, &bundle)?;
    configure(layout)
}

/// The multi-layer image at `layout`: the busybox layer, then
/// [`BIG_LAYERS`] layers of generated files (the same bytes every run).
fn make_big_image(work: &Path, layout: &Path) -> anyhow::Result<()> {
    make_image(work, layout)?;
    let bundle = work.join("bundle");
    for layer in 0..BIG_LAYERS {
        let dir = bundle.join("rootfs/data").join(format!("layer{layer}"));
        std::fs::create_dir_all(&dir)?;
        for file in 0..BIG_LAYER_FILES {
            let seed = (layer * BIG_LAYER_FILES + file) as u64 + 1;
            std::fs::write(
                dir.join(format!("f{file}")),
                generated(seed, BIG_FILE_BYTES),
            )?;
        }
        add_layer(layout, &bundle)?;
    }
    Ok(())
}

/// `len` bytes from `seed`: each 4 KiB block half random bytes, half
/// letters `a`..`p`.
fn generated(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        // xorshift64: fast, and the same bytes for the same seed.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..len)
        .map(|i| {
            let r = next() as u8;
            if i % 4096 < 2048 {
                r
            } else {
                b'a' + (r & 15)
            }
        })
        .collect()
}

/// Bytes under `dir` (a layout: its blobs, as downloaded).
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

fn start_registry(work: &Path) -> anyhow::Result<(Registry, u16)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = work.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            work.join("registry").display()
        ),
    )?;
    let child = Command::new("/usr/bin/docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting docker-registry")?;
    let registry = Registry(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("docker-registry did not listen within 20 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((registry, port))
}

/// `skopeo copy` of `layout`'s `bench` to the loopback registry as `target`.
fn push(layout: &Path, target: &str) -> anyhow::Result<()> {
    sh::run(
        Command::new("skopeo")
            .args(["copy", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:bench", layout.display()))
            .arg(format!("docker://{target}")),
    )
}

/// `skopeo copy` of `target` from the loopback registry to a layout at
/// `dest` (the download alone).
fn fetch(target: &str, dest: &Path) -> anyhow::Result<()> {
    sh::run(
        Command::new("skopeo")
            .args(["copy", "--src-tls-verify=false"])
            .arg(format!("docker://{target}"))
            .arg(format!("oci:{}:bench", dest.display())),
    )
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn timed<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, f64)> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed().as_secs_f64()))
}

/// How many times each of the multi-layer image's pulls is timed.
const PULLS: usize = 3;

/// The multi-layer image's pulls.
struct BigPull {
    target: String,
    downloaded: u64,
    /// `image pull`: the download, checked (converted at first use).
    pull: f64,
    /// `image pull --convert` right after it: the conversion alone.
    convert: f64,
    /// `image pull --convert` into a fresh state directory: both, the
    /// layers applied as they come.
    pull_converting: f64,
    download: f64,
    split: PullSplit,
}

/// Where one pull's time went, from its progress lines: seconds from the
/// start to the layer list, to the last layer in, to the conversion's
/// last step (the root filesystem; layers are applied as they come, so
/// most of that work overlaps the downloads), and to the end.
#[derive(Default)]
struct PullSplit {
    resolved: f64,
    downloaded: f64,
    applied: f64,
    total: f64,
}

/// `microagent image pull --convert` of `target` into `home`, its stderr
/// lines timed as they come.
fn split_pull(bin: &Path, home: &Path, target: &str) -> anyhow::Result<PullSplit> {
    use std::io::BufRead;
    let began = Instant::now();
    let mut child = Command::new(bin)
        .args(["image", "pull", target, "--insecure", "--convert", "--json"])
        .env("MICROAGENT_HOME", home)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running microagent image pull")?;
    let mut split = PullSplit::default();
    let stderr = child.stderr.take().context("no stderr")?;
    for line in std::io::BufReader::new(stderr).lines() {
        let (line, at) = (line?, began.elapsed().as_secs_f64());
        if line.contains(" layer(s), ") {
            split.resolved = at;
        } else if line.ends_with(" MiB downloaded") {
            split.downloaded = at;
        } else if line == "writing the root filesystem" {
            split.applied = at;
        }
    }
    anyhow::ensure!(child.wait()?.success(), "microagent image pull failed");
    split.total = began.elapsed().as_secs_f64();
    Ok(split)
}

/// Pushes the multi-layer image to a registry of its own and times, in
/// turns, `skopeo copy` of it to a fresh layout, `microagent image pull`
/// of it into a fresh state directory (nothing cached) and then its
/// conversion (`pull --convert` of the same image), and `image pull
/// --convert` into another fresh one, median of [`PULLS`] each.
fn pull_beside_skopeo(work: &Path, bin: &Path, home: &Path) -> anyhow::Result<BigPull> {
    let big = work.join("big");
    std::fs::create_dir_all(&big)?;
    let layout = big.join("layout");
    make_big_image(&big, &layout)?;
    let (_registry, port) = start_registry(&big)?;
    let target = format!("127.0.0.1:{port}/big:1");
    push(&layout, &target)?;
    let (mut pulls, mut downloads, mut downloaded) = (Vec::new(), Vec::new(), 0);
    let (mut converts, mut pulls_converting) = (Vec::new(), Vec::new());
    let pull = [
        "image",
        "pull",
        target.as_str(),
        "--insecure",
        "--json",
        "--convert",
    ];
    for round in 0..PULLS {
        let copy = big.join(format!("copy{round}"));
        let (_, t) = timed(|| fetch(&target, &copy))?;
        downloads.push(t);
        downloaded = bytes_under(&copy.join("blobs"));
        let _ = std::fs::remove_dir_all(&copy);
        let fresh = home.with_extension(format!("big{round}"));
        let (_, t) = timed(|| microagent(bin, &fresh, &pull[..5]))?;
        pulls.push(t);
        let (converted, t) = timed(|| microagent(bin, &fresh, &pull))?;
        anyhow::ensure!(
            converted["image"]["rootfs_bytes"].as_u64() > Some(0),
            "--convert did not convert: {converted}"
        );
        converts.push(t);
        let _ = std::fs::remove_dir_all(&fresh);
        let (_, t) = timed(|| microagent(bin, &fresh, &pull))?;
        pulls_converting.push(t);
        let _ = std::fs::remove_dir_all(&fresh);
    }
    let fresh = home.with_extension("big-split");
    let split = split_pull(bin, &fresh, &target);
    let _ = std::fs::remove_dir_all(&fresh);
    Ok(BigPull {
        target,
        downloaded,
        pull: median(&mut pulls),
        convert: median(&mut converts),
        pull_converting: median(&mut pulls_converting),
        download: median(&mut downloads),
        split: split?,
    })
}

pub fn run_bench(args: &[String]) -> anyhow::Result<()> {
    let release = match args {
        [] => false,
        [flag] if flag == "--release" => true,
        _ => bail!("usage: cargo xtask bench images [--release]"),
    };
    sh::ensure_debs(PACKAGES)?;
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = cache::build_microagent_as(release)?;
    let work = std::env::temp_dir().join(format!("microagent-bench-images-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    // Short: workspace sockets live under it.
    let home = std::path::PathBuf::from(format!("/tmp/ma-bimg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let result = (|| {
        let layout = work.join("layout");
        make_image(&work, &layout)?;
        let (_registry, port) = start_registry(&work)?;
        let target = format!("127.0.0.1:{port}/bench:1");
        push(&layout, &target)?;
        let (_, download) = timed(|| fetch(&target, &work.join("copy")))?;
        let (pulled, pull) = timed(|| {
            microagent(
                &bin,
                &home,
                &[
                    "image",
                    "pull",
                    &target,
                    "--insecure",
                    "--convert",
                    "--json",
                ],
            )
        })?;
        let name = pulled["image"]["name"]
            .as_str()
            .unwrap_or("bench-1")
            .to_owned();
        let (_, again) = timed(|| {
            microagent(
                &bin,
                &home,
                &["image", "pull", &target, "--insecure", "--json"],
            )
        })?;
        let big = pull_beside_skopeo(&work, &bin, &home)?;
        let boot = |image: &str, ws: &str| -> anyhow::Result<f64> {
            let (_, t) = timed(|| {
                microagent(&bin, &home, &["create", ws, "--image", image, "--json"])?;
                microagent(&bin, &home, &["start", ws, "--json"])
            })?;
            microagent(&bin, &home, &["delete", ws, "--force", "--yes", "--json"])?;
            Ok(t)
        };
        let oci_boot = boot(&name, "oci")?;
        let minimal_boot = boot("minimal", "min")?;
        // The warm snapshot exists now: warm starts without and with one
        // volume, alternated, so drift hits both alike.
        microagent(&bin, &home, &["volume", "create", "bench", "--json"])?;
        let (mut plain, mut with_volume) = (Vec::new(), Vec::new());
        for round in 0..3 {
            plain.push(boot("minimal", &format!("plain{round}"))?);
            let ws = format!("vol{round}");
            let (_, t) = timed(|| {
                microagent(&bin, &home, &["create", &ws, "-v", "bench:/data", "--json"])?;
                microagent(&bin, &home, &["start", &ws, "--json"])
            })?;
            microagent(&bin, &home, &["delete", &ws, "--force", "--yes", "--json"])?;
            with_volume.push(t);
        }
        let (plain, with_volume) = (median(&mut plain), median(&mut with_volume));
        let bytes = pulled["image"]["rootfs_bytes"].as_u64().unwrap_or(0);
        println!(
            "container image `{target}` (busybox, {} MiB root filesystem):",
            bytes >> 20
        );
        println!("  microagent image pull --convert              {pull:>7.2} s");
        println!("  skopeo copy to a layout (download only)      {download:>7.2} s");
        println!("  microagent image pull again (same digest)    {again:>7.2} s");
        println!("  create + start of a workspace of it          {oci_boot:>7.2} s");
        println!("  create + start of a `minimal` workspace      {minimal_boot:>7.2} s");
        println!(
            "multi-layer image `{}` ({} layers, {:.0} MB downloaded, {} MiB of files), median of {PULLS}:",
            big.target,
            BIG_LAYERS + 1,
            big.downloaded as f64 / 1e6,
            (BIG_LAYERS * BIG_LAYER_FILES * BIG_FILE_BYTES) >> 20
        );
        println!(
            "  microagent image pull (download, checked)    {:>7.2} s ({:.2}x skopeo)",
            big.pull,
            big.pull / big.download
        );
        println!(
            "  skopeo copy to a layout (download only)      {:>7.2} s",
            big.download
        );
        println!(
            "  its conversion after (pull --convert again)  {:>7.2} s",
            big.convert
        );
        println!(
            "  microagent image pull --convert, fresh       {:>7.2} s ({:.2}x skopeo)",
            big.pull_converting,
            big.pull_converting / big.download
        );
        let s = &big.split;
        println!(
            "  one more pull --convert, split: manifest {:.2} s, then every layer in {:.2} s, the last applied {:.2} s later (layers apply as they come), filesystem and registration {:.2} s",
            s.resolved,
            s.downloaded - s.resolved,
            s.applied - s.downloaded,
            s.total - s.applied
        );
        println!("volume attach (warm starts, median of 3 each, same run):");
        println!("  create + warm start, no volume               {plain:>7.2} s");
        println!("  create + warm start, one volume (1 GiB)      {with_volume:>7.2} s");
        println!(
            "  attach cost                                  {:>7.2} s",
            with_volume - plain
        );
        anyhow::Ok(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&home);
    result
}
