//! Who holds a volume, and the rule a start checks: a read-write volume to
//! one running workspace, a read-only one to any number, never both. Pure
//! functions over the mounts the workspaces' specs name, so the library's
//! start, restore and listing apply the one rule.

use super::VolumeHolder;
use crate::store::volume_mounts::VolumeMount;

/// A volume mounted by a workspace (its spec names it; its VMM may or may
/// not run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedVolume {
    /// The volume's full name.
    pub volume: String,
    /// The workspace that mounts it, and how.
    pub holder: VolumeHolder,
}

impl MountedVolume {
    /// The mounts of workspace `workspace` (whose VMM runs when `active`)
    /// that name a shared volume: a workspace's own copy is nobody's hold.
    pub fn of<'a>(
        workspace: &'a str,
        active: bool,
        mounts: &'a [VolumeMount],
    ) -> impl Iterator<Item = MountedVolume> + 'a {
        mounts
            .iter()
            .filter(|m| !m.own_copy)
            .map(move |m| MountedVolume {
                volume: m.name.clone(),
                holder: VolumeHolder {
                    workspace: workspace.to_owned(),
                    path: m.path.clone(),
                    read_only: m.read_only,
                    active,
                },
            })
    }
}

/// The holders of volume `name` among `mounted`.
pub fn holders_of(mounted: &[MountedVolume], name: &str) -> Vec<VolumeHolder> {
    mounted
        .iter()
        .filter(|m| m.volume == name)
        .map(|m| m.holder.clone())
        .collect()
}

/// The first running hold among `mounted` that keeps workspace `workspace`
/// from taking `wanted` now: another running workspace's read-write mount
/// of a volume it wants, or its read-only mount of one it wants read-write.
pub fn first_clash<'a>(
    workspace: &str,
    wanted: &[VolumeMount],
    mounted: &'a [MountedVolume],
) -> Option<&'a MountedVolume> {
    mounted.iter().find(|held| {
        held.holder.workspace != workspace
            && held.holder.active
            && wanted.iter().any(|m| {
                !m.own_copy && m.name == held.volume && !(m.read_only && held.holder.read_only)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(name: &str, read_only: bool) -> VolumeMount {
        VolumeMount::parse(&format!(
            "{name}:/mnt/{name}{}",
            if read_only { ":ro" } else { "" }
        ))
        .unwrap()
    }

    fn held(workspace: &str, active: bool, mounts: &[VolumeMount]) -> Vec<MountedVolume> {
        MountedVolume::of(workspace, active, mounts).collect()
    }

    #[test]
    fn read_write_is_for_one_running_workspace() {
        let mounted = held("a", true, &[mount("v", false)]);
        let clash = first_clash("b", &[mount("v", true)], &mounted).unwrap();
        assert_eq!(clash.holder.workspace, "a");
        assert!(first_clash("b", &[mount("v", false)], &mounted).is_some());
        // Its own mount, a stopped holder and another volume are no clash.
        assert!(first_clash("a", &[mount("v", false)], &mounted).is_none());
        let stopped = held("a", false, &[mount("v", false)]);
        assert!(first_clash("b", &[mount("v", false)], &stopped).is_none());
        assert!(first_clash("b", &[mount("w", false)], &mounted).is_none());
    }

    #[test]
    fn read_only_is_for_any_number_but_not_beside_a_writer() {
        let mounted = held("a", true, &[mount("v", true)]);
        assert!(first_clash("b", &[mount("v", true)], &mounted).is_none());
        assert!(first_clash("b", &[mount("v", false)], &mounted).is_some());
    }

    #[test]
    fn own_copies_hold_nothing_and_holders_are_listed_by_volume() {
        let mut copy = mount("v", false);
        copy.own_copy = true;
        assert!(held("a", true, &[copy]).is_empty());
        let mut mounted = held("a", true, &[mount("v", false), mount("w", true)]);
        mounted.extend(held("b", false, &[mount("v", true)]));
        let holders = holders_of(&mounted, "v");
        assert_eq!(holders.len(), 2);
        assert_eq!(holders[1].workspace, "b");
        assert!(holders[1].read_only && !holders[1].active);
    }
}
