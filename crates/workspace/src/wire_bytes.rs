//! Bytes in JSON as one base64 string (a third larger, not four times as
//! an array of numbers): what a remote call carries of files and output.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Deserializer, Serializer};

pub(crate) fn serialize<S: Serializer>(bytes: &[u8], to: S) -> Result<S::Ok, S::Error> {
    to.serialize_str(&STANDARD.encode(bytes))
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(from)?;
    STANDARD.decode(text).map_err(serde::de::Error::custom)
}

/// The same for bytes that may be absent (`null`).
pub(crate) mod optional {
    use super::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        bytes: &Option<Vec<u8>>,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => to.serialize_some(&STANDARD.encode(bytes)),
            None => to.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        from: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(from)?
            .map(|text| STANDARD.decode(text).map_err(serde::de::Error::custom))
            .transpose()
    }
}
