//! An image's manifest from its registry, read within a byte limit.
//!
//! oci-client reads a manifest response whole into memory before looking
//! at it, so a registry that sends one without end would grow the puller
//! until the host kills it. This fetch uses oci-client for the registry's
//! authentication only, then reads the response itself: a declared length
//! over `Limits::max_image_metadata_bytes` is refused before the body, and
//! the body is counted as it arrives. The bytes are checked against the
//! digest the reference names, and an index resolves to its linux/amd64
//! manifest the same way.

use oci_client::client::linux_amd64_resolver;
use oci_client::errors::{OciDistributionError, OciEnvelope};
use oci_client::manifest::{OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use sha2::{Digest, Sha256};

use super::registry_error::{PullError, RegistryError};
use base::images::oci::OciError;

/// The manifest types asked for (OCI and Docker, images and indexes).
const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
                      application/vnd.oci.image.index.v1+json, \
                      application/vnd.docker.distribution.manifest.v2+json, \
                      application/vnd.docker.distribution.manifest.list.v2+json";

/// Where manifests come from: the registry client (for its tokens), an
/// HTTP client made like it, the credentials, and the byte limit.
pub(crate) struct ManifestSource<'a> {
    pub client: &'a Client,
    pub http: reqwest::Client,
    pub auth: &'a RegistryAuth,
    /// Plain HTTP to the reference's registry.
    pub insecure: bool,
    /// The most bytes one manifest may have.
    pub limit: u64,
}

impl ManifestSource<'_> {
    /// `reference`'s image manifest for linux/amd64 and its digest.
    pub(crate) async fn image_manifest(
        &self,
        reference: &Reference,
    ) -> Result<(OciImageManifest, String), PullError> {
        let (manifest, digest) = self.manifest(reference).await?;
        let index = match manifest {
            OciManifest::Image(image) => return Ok((image, digest)),
            OciManifest::ImageIndex(index) => index,
        };
        let failed = |what: &str| RegistryError {
            reference: reference.whole(),
            source: OciDistributionError::ImageManifestNotFoundError(what.to_owned()),
        };
        let chosen = linux_amd64_resolver(&index.manifests)
            .ok_or_else(|| failed("the image index has no linux/amd64 manifest"))?;
        match self.manifest(&reference.clone_with_digest(chosen)).await? {
            (OciManifest::Image(image), digest) => Ok((image, digest)),
            (OciManifest::ImageIndex(_), _) => {
                Err(failed("the image index names another index for linux/amd64").into())
            }
        }
    }

    /// One manifest (an image's or an index) and the digest of its bytes.
    async fn manifest(&self, reference: &Reference) -> Result<(OciManifest, String), PullError> {
        let registry_error = |source| RegistryError {
            reference: reference.whole(),
            source,
        };
        // A bearer token where the registry hands them out (oci-client
        // keeps it for the layers); Basic credentials are sent as they are.
        let token = self
            .client
            .auth(reference, self.auth, RegistryOperation::Pull)
            .await
            .map_err(registry_error)?;
        let url = manifest_url(reference, self.insecure);
        let mut request = self.http.get(&url).header(reqwest::header::ACCEPT, ACCEPT);
        request = match (token, self.auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            (None, _) => request,
        };
        let mut response = request.send().await.map_err(|e| registry_error(e.into()))?;
        let over = || OciError::OverLimit {
            what: "manifest bytes",
            limit: self.limit,
        };
        if response.content_length().is_some_and(|n| n > self.limit) {
            return Err(over().into());
        }
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| registry_error(e.into()))?
        {
            if (body.len() + chunk.len()) as u64 > self.limit {
                return Err(over().into());
            }
            body.extend_from_slice(&chunk);
        }
        if status != reqwest::StatusCode::OK {
            return Err(registry_error(status_error(status, &body, &url)).into());
        }
        let digest = format!("sha256:{:x}", Sha256::digest(&body));
        if let Some(named) = reference.digest() {
            if named != digest {
                return Err(OciError::DigestMismatch {
                    what: "the manifest".into(),
                    expected: named.to_owned(),
                    actual: digest,
                }
                .into());
            }
        }
        let manifest: OciManifest = serde_json::from_slice(&body).map_err(|e| {
            registry_error(OciDistributionError::ManifestParsingError(e.to_string()))
        })?;
        let schema = match &manifest {
            OciManifest::Image(m) => m.schema_version,
            OciManifest::ImageIndex(i) => i.schema_version,
        };
        if schema != 2 {
            return Err(
                registry_error(OciDistributionError::UnsupportedSchemaVersionError(
                    schema.into(),
                ))
                .into(),
            );
        }
        Ok((manifest, digest))
    }
}

/// `/v2/<repository>/manifests/<digest or tag>` on the reference's registry.
fn manifest_url(reference: &Reference, insecure: bool) -> String {
    let scheme = if insecure { "http" } else { "https" };
    let named = reference.digest().or(reference.tag()).unwrap_or("latest");
    let ns = reference
        .namespace()
        .map(|ns| format!("?ns={ns}"))
        .unwrap_or_default();
    format!(
        "{scheme}://{}/v2/{}/manifests/{named}{ns}",
        reference.resolve_registry(),
        reference.repository()
    )
}

/// What a refused request means, as oci-client reports it (so the codes
/// `RegistryError::code` gives stay the same): the registry's error
/// envelope where it sent one.
fn status_error(status: reqwest::StatusCode, body: &[u8], url: &str) -> OciDistributionError {
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return OciDistributionError::UnauthorizedError {
            url: url.to_owned(),
        };
    }
    if status.is_client_error() {
        if let Ok(envelope) = serde_json::from_slice::<OciEnvelope>(body) {
            return OciDistributionError::RegistryError {
                envelope,
                url: url.to_owned(),
            };
        }
    }
    OciDistributionError::ServerError {
        code: status.as_u16(),
        url: url.to_owned(),
        message: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_digest_first_then_the_tag() {
        let tagged: Reference = "127.0.0.1:5000/team/app:1".parse().unwrap();
        assert_eq!(
            manifest_url(&tagged, true),
            "http://127.0.0.1:5000/v2/team/app/manifests/1"
        );
        let digest = format!("sha256:{}", "a".repeat(64));
        let pinned = tagged.clone_with_digest(digest.clone());
        assert_eq!(
            manifest_url(&pinned, false),
            format!("https://127.0.0.1:5000/v2/team/app/manifests/{digest}")
        );
    }

    #[test]
    fn refusals_keep_the_registry_s_codes() {
        let url = "http://r/v2/x/manifests/1";
        let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"no"}]}"#;
        assert!(matches!(
            status_error(reqwest::StatusCode::NOT_FOUND, body, url),
            OciDistributionError::RegistryError { .. }
        ));
        assert!(matches!(
            status_error(reqwest::StatusCode::UNAUTHORIZED, b"", url),
            OciDistributionError::UnauthorizedError { .. }
        ));
        assert!(matches!(
            status_error(reqwest::StatusCode::BAD_GATEWAY, &[b'x'; 4096], url),
            OciDistributionError::ServerError { code: 502, ref message, .. } if message.len() == 512
        ));
    }
}
