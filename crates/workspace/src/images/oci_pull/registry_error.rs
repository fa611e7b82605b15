//! Why a registry did not give an image: what the registry client said,
//! with the reference, and the stable code each cause maps to; and the
//! errors of a pull, which the manifest fetch, the layer downloads and
//! the registration share.

use oci_client::errors::OciDistributionError;

use base::images::oci::OciError;

/// Why the registry could not give the image.
#[derive(Debug, thiserror::Error)]
#[error("pulling `{reference}` from its registry failed")]
pub struct RegistryError {
    /// The reference.
    pub reference: String,
    /// What the client said.
    #[source]
    pub source: OciDistributionError,
}

/// The stable code: a missing image or tag is NOT_FOUND, refused
/// credentials FORBIDDEN, a digest mismatch INVALID_INPUT, the rest
/// (unreachable, server errors) INTERNAL.
impl crate::error::ConcernError for RegistryError {
    fn code(&self) -> base::code::ErrorCode {
        use base::code::ErrorCode;
        match &self.source {
            OciDistributionError::ImageManifestNotFoundError(_) => ErrorCode::NotFound,
            OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::UnauthorizedError { .. } => ErrorCode::Forbidden,
            OciDistributionError::DigestError(_)
            | OciDistributionError::UnsupportedMediaTypeError(_)
            | OciDistributionError::UnsupportedSchemaVersionError(_) => ErrorCode::InvalidInput,
            OciDistributionError::RegistryError { envelope, .. }
                if envelope.errors.iter().any(|e| {
                    matches!(
                        e.code,
                        oci_client::errors::OciErrorCode::ManifestUnknown
                            | oci_client::errors::OciErrorCode::NameUnknown
                    )
                }) =>
            {
                ErrorCode::NotFound
            }
            _ => ErrorCode::Internal,
        }
    }
}

/// Why the registry side of a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The reference, the image or a layer cannot be used.
    #[error(transparent)]
    Oci(#[from] OciError),
    /// The registry refused or could not be reached.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The image could not be registered (or, with a pull policy of
    /// never, was not pulled before).
    #[error(transparent)]
    Image(#[from] base::images::registry::ImageError),
}

impl From<RegistryError> for crate::error::Error {
    fn from(e: RegistryError) -> Self {
        crate::error::Error::Registry(crate::error::ConcernFailure::new(e))
    }
}

/// A pull's error as the crate's: an image or conversion failure is an
/// image error, as an import's is.
impl From<PullError> for crate::error::Error {
    fn from(e: PullError) -> Self {
        use base::images::registry::ImageError;
        match e {
            PullError::Oci(e) => crate::error::Error::Image(ImageError::Oci(e)),
            PullError::Registry(e) => e.into(),
            PullError::Image(e) => crate::error::Error::Image(e),
        }
    }
}
