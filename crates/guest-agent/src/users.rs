//! Users as container images and `exec --user` name them (`node`, `1000`,
//! `node:staff`, `1000:50`, `root`), resolved against a system's
//! `/etc/passwd` and `/etc/group` the way container runtimes do: a name
//! must be listed; a number need not be (its group is then 0); the group
//! is the user's primary one unless given.

/// Why a user did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    /// A user name /etc/passwd does not list.
    #[error("no user `{0}` in /etc/passwd")]
    User(String),
    /// A group name /etc/group does not list.
    #[error("no group `{0}` in /etc/group")]
    Group(String),
    /// An empty user.
    #[error("the user is empty")]
    Empty,
}

/// A resolved user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
    pub uid: u32,
    pub gid: u32,
    /// The home directory /etc/passwd gives, if the user is listed.
    pub home: Option<String>,
}

/// Resolves `user` (`name`, `uid`, `name:group`, `uid:gid`, ...) against
/// the text of `/etc/passwd` and `/etc/group`.
pub fn resolve(user: &str, passwd: &str, group: &str) -> Result<ResolvedUser, UserError> {
    let user = user.trim();
    if user.is_empty() {
        return Err(UserError::Empty);
    }
    let (user_part, group_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let entry = passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        let uid: u32 = f.get(2)?.parse().ok()?;
        let matches = f.first() == Some(&user_part) || user_part.parse() == Ok(uid);
        let gid = f.get(3).and_then(|g| g.parse::<u32>().ok());
        matches.then(|| (uid, gid, f.get(5).map(|h| h.to_string())))
    });
    let (uid, passwd_gid, home) = match (entry, user_part.parse::<u32>()) {
        (Some(found), _) => found,
        (None, Ok(uid)) => (uid, None, None),
        (None, Err(_)) => return Err(UserError::User(user_part.to_owned())),
    };
    let gid = match group_part {
        None => passwd_gid.unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group
                .lines()
                .find_map(|line| {
                    let f: Vec<&str> = line.split(':').collect();
                    (f.first() == Some(&g)).then(|| f.get(2)?.parse().ok())?
                })
                .ok_or_else(|| UserError::Group(g.to_owned()))?,
        },
    };
    Ok(ResolvedUser { uid, gid, home })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1001::/home/node:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:\n";

    #[test]
    fn users_resolve_by_name_number_and_group() {
        let node = resolve("node", PASSWD, GROUP).unwrap();
        assert_eq!(
            (node.uid, node.gid, node.home.as_deref()),
            (1000, 1001, Some("/home/node"))
        );
        assert_eq!(resolve("node:staff", PASSWD, GROUP).unwrap().gid, 50);
        assert_eq!(resolve("1000:7", PASSWD, GROUP).unwrap().uid, 1000);
        assert_eq!(resolve("root", PASSWD, GROUP).unwrap().uid, 0);
        assert_eq!(
            resolve("4242", PASSWD, GROUP).unwrap(),
            ResolvedUser {
                uid: 4242,
                gid: 0,
                home: None
            }
        );
        assert_eq!(
            resolve("ghost", PASSWD, GROUP),
            Err(UserError::User("ghost".into()))
        );
        assert_eq!(
            resolve("node:nogroup", PASSWD, GROUP),
            Err(UserError::Group("nogroup".into()))
        );
        assert_eq!(resolve(" ", PASSWD, GROUP), Err(UserError::Empty));
    }
}
