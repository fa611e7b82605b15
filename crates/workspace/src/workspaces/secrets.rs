//! Secrets as workspaces use them: the store front ends manage, and the
//! values and mask a command given secret names runs with.

use super::manager::Workspaces;
use crate::error::Result;
use crate::secrets::{SecretMask, SecretStore, SecretValue};

impl Workspaces {
    /// The secrets of this state directory.
    pub fn secrets(&self) -> SecretStore {
        SecretStore::new(&self.state)
    }

    /// The values of `names` and the mask of their output; an unknown name
    /// is NOT_FOUND.
    pub(crate) fn resolve_secrets(
        &self,
        names: &[String],
    ) -> Result<(Vec<(String, SecretValue)>, SecretMask)> {
        let values = self.secrets().resolve(names)?;
        let mask = SecretMask::new(values.iter().map(|(_, v)| v));
        Ok((values, mask))
    }
}
