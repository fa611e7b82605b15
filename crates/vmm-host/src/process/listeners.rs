//! What a VMM process binds before it is confined: its published ports'
//! listeners and, for a service, its relay sockets.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use crate::error::{Result, VmmProcessError};
use base::store::ports::PortMapping;
use base::store::workspace_dir::WorkspaceDir;
use base::store::StateDir;
use vmm_core::Machine;

/// Binds the spec's published ports; one that cannot fails the machine.
/// Then the process leaves the host's network namespace for an empty one
/// (its standby's, made ahead, when it has one; its network backend is
/// open by now and the listeners are bound), so every thread it starts is
/// in it. Returns the listeners and whether it
/// left, or why not.
pub(super) fn bind_ports(
    spec: &base::store::spec::WorkspaceSpec,
    machine: &mut Result<Machine>,
    empty_network: Option<std::os::fd::OwnedFd>,
) -> (
    Vec<(PortMapping, std::net::TcpListener)>,
    std::result::Result<(), String>,
) {
    if machine.is_err() {
        return (Vec::new(), Err("the machine was not built".into()));
    }
    let bound: Result<Vec<_>> = spec
        .ports
        .iter()
        .map(|p| {
            Ok((
                *p,
                base::store::ports::bind(p).map_err(VmmProcessError::from)?,
            ))
        })
        .collect();
    let net_ns = crate::guard::leave_host_network(empty_network);
    match bound {
        Ok(listeners) => (listeners, net_ns),
        Err(e) => {
            *machine = Err(e);
            (Vec::new(), net_ns)
        }
    }
}

/// Binds a service's relay sockets in the directory of the workspace it
/// serves, `services/<vsock port>.sock` (`base::store::spec::services`), one per
/// port of `spec.service_ports`. A failure fails the machine, as a port
/// that cannot be bound does.
pub(super) fn bind_relays(
    state: &StateDir,
    ws: &WorkspaceDir,
    spec: &base::store::spec::WorkspaceSpec,
    machine: &mut Result<Machine>,
) -> Vec<(u16, std::os::unix::net::UnixListener)> {
    let Some(serving) = spec.serving.as_ref().filter(|_| machine.is_ok()) else {
        return Vec::new();
    };
    let bound = check_serving(ws, serving, &spec.service_ports)
        .and_then(|()| Ok(WorkspaceDir::new(state, &serving.workspace)?))
        .and_then(|served| {
            let dir = relay_dir(&served)?;
            spec.service_ports
                .iter()
                .enumerate()
                .map(|(slot, &port)| {
                    let vsock_port =
                        base::store::spec::services::relay_vsock_port(serving.index, slot);
                    Ok((port, bind_relay(&dir, vsock_port)?))
                })
                .collect()
        });
    bound.unwrap_or_else(|e| {
        *machine = Err(e);
        Vec::new()
    })
}

/// Whether `ws` is the companion its spec says it is: its record is
/// writable by a VMM that a guest took over, so what it serves is checked
/// against its name (a digest of the served workspace's and the
/// service's, in the reserved namespace), never taken as written.
fn check_serving(
    ws: &WorkspaceDir,
    serving: &base::store::spec::services::Serving,
    ports: &[u16],
) -> Result<()> {
    use base::store::spec::services::{companion_name, validate_service_ports, validate_serving};
    validate_service_ports(ports)
        .and_then(|()| validate_serving(serving))
        .map_err(|e| VmmProcessError::ServicePorts(e.into()))?;
    if ws.name() != companion_name(&serving.workspace, &serving.service) {
        return Err(VmmProcessError::ServicePorts(
            base::store::spec::SpecError::Invalid(format!(
                "`{}` is not the service `{}` of `{}`",
                ws.name(),
                serving.service,
                serving.workspace
            )),
        ));
    }
    Ok(())
}

/// The served workspace's `services/`, opened as a directory of this
/// process's user, 0711, that it was not led to through a link: the
/// served workspace's VMM runs as the VMM account and owns that
/// workspace's directory, so it could have planted one there.
fn relay_dir(served: &WorkspaceDir) -> Result<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = served.services_dir();
    let io = |what: &str| VmmProcessError::host_io(format!("{what} {}", path.display()));
    match std::fs::DirBuilder::new().mode(0o711).create(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io("making")(e)),
        _ => {}
    }
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io("opening"))?;
    // SAFETY: geteuid and getegid take nothing and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    std::os::unix::fs::fchown(&dir, Some(uid), Some(gid)).map_err(io("owning"))?;
    dir.set_permissions(std::fs::Permissions::from_mode(0o711))
        .map_err(io("restricting"))?;
    Ok(dir)
}

/// Binds `<vsock_port>.sock` in `dir` (through the descriptor, so no link
/// is followed), replacing a socket a run before left; connectable by the
/// served workspace's VMM, which runs as another account when its starter
/// was root (none but this user can add or swap names in `dir`).
fn bind_relay(dir: &std::fs::File, vsock_port: u32) -> Result<std::os::unix::net::UnixListener> {
    use std::os::fd::AsRawFd;
    let name = format!("{vsock_port}.sock");
    let path = PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()));
    let io = |what: &str| VmmProcessError::host_io(format!("{what} relay socket {name}"));
    let c_name = std::ffi::CString::new(name.as_str()).map_err(|e| io("naming")(e.into()))?;
    // SAFETY: a valid directory descriptor and C string; unlinkat removes
    // a name in that directory only.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c_name.as_ptr(), 0) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(io("removing the old")(e));
        }
    }
    // Made 0666 by the umask, not by a chmod of its path after the bind
    // (which a link swapped in meanwhile would redirect). Nothing else of
    // this process makes files meanwhile: it has not started its threads.
    // SAFETY: umask takes and returns a mode and cannot fail.
    let before = unsafe { libc::umask(0o111) };
    let bound = std::os::unix::net::UnixListener::bind(&path);
    // SAFETY: as above.
    unsafe { libc::umask(before) };
    bound.map_err(io("binding"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(test: &str) -> (StateDir, WorkspaceDir) {
        let root = std::env::temp_dir().join(format!("ma-relays-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let state = StateDir::at(&root).unwrap();
        let ws = WorkspaceDir::new(&state, "dev").unwrap();
        std::fs::create_dir_all(ws.path()).unwrap();
        (state, ws)
    }

    #[test]
    fn a_relay_replaces_a_stale_socket_in_a_directory_of_this_user() {
        let (state, ws) = served("stale");
        let dir = relay_dir(&ws).unwrap();
        let stale = std::os::unix::net::UnixListener::bind(ws.service_relay(50_000)).unwrap();
        drop(stale);
        let relay = bind_relay(&dir, 50_000).unwrap();
        std::os::unix::net::UnixStream::connect(ws.service_relay(50_000)).unwrap();
        relay.accept().unwrap();
        let mode = std::fs::metadata(ws.services_dir())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o711);
        std::fs::remove_dir_all(state.root()).unwrap();
    }

    #[test]
    fn only_the_companion_a_name_says_serves_its_workspace() {
        use base::store::spec::services::{companion_name, Serving};
        let (state, _) = served("forged");
        let spec = base::store::spec::WorkspaceSpec {
            service_ports: vec![5432],
            serving: Some(Serving {
                workspace: "dev".into(),
                index: 0,
                service: "db".into(),
            }),
            ..Default::default()
        };
        let real = WorkspaceDir::new(&state, &companion_name("dev", "db")).unwrap();
        check_serving(&real, spec.serving.as_ref().unwrap(), &spec.service_ports).unwrap();
        // A record that names another workspace's service, or a place
        // past the list, binds nothing there.
        for other in [
            "attacker",
            &companion_name("dev", "web"),
            &companion_name("other", "db"),
        ] {
            let ws = WorkspaceDir::new(&state, other).unwrap();
            assert!(
                check_serving(&ws, spec.serving.as_ref().unwrap(), &spec.service_ports).is_err(),
                "{other}"
            );
        }
        let far = base::store::spec::WorkspaceSpec {
            serving: Some(Serving {
                index: usize::MAX,
                ..spec.serving.clone().unwrap()
            }),
            ..spec.clone()
        };
        assert!(check_serving(&real, far.serving.as_ref().unwrap(), &far.service_ports).is_err());
        std::fs::remove_dir_all(state.root()).unwrap();
    }

    #[test]
    fn a_planted_link_for_the_directory_is_not_followed() {
        let (state, ws) = served("planted");
        let elsewhere = state.root().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, ws.services_dir()).unwrap();
        assert!(
            relay_dir(&ws).is_err(),
            "a link was taken for the directory"
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        std::fs::remove_dir_all(state.root()).unwrap();
    }
}
