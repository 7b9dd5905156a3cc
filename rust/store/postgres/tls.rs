//! TLS for the PostgreSQL connection, with libpq's `sslmode` and `sslrootcert` meanings, over
//! rustls (the wheel carries its own TLS: no system OpenSSL is needed).
//!
//! | `sslmode` | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default, as in libpq) | if the server offers TLS | no |
//! | `require` | always | no; but with `sslrootcert`, as `verify-ca` (libpq does the same) |
//! | `verify-ca` | always | signed by a CA in `sslrootcert` |
//! | `verify-full` | always | as `verify-ca`, and issued for the host the URL names |
//!
//! `prefer` and `require` without a root certificate protect against eavesdropping, not against
//! a server that impersonates the real one (libpq's documented behaviour); across an untrusted
//! network use `verify-full`. libpq's `allow` is refused rather than treated as something else.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{self, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error as TlsError, RootCertStore,
    SignatureScheme,
};
use tokio_postgres::config::SslMode as DriverSslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::errors::{LedgerError, Result};

/// libpq's `sslmode` values that fencepost supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// Parse the URL's `sslmode` (absent: `prefer`).
    pub fn parse(value: Option<&str>) -> Result<Self> {
        Ok(match value {
            None | Some("prefer") => Self::Prefer,
            Some("disable") => Self::Disable,
            Some("require") => Self::Require,
            Some("verify-ca") => Self::VerifyCa,
            Some("verify-full") => Self::VerifyFull,
            Some(other) => {
                return Err(LedgerError::invalid(
                    "target",
                    format!(
                        "sslmode={other} is not supported; use disable, prefer, require, \
                         verify-ca or verify-full"
                    ),
                ))
            }
        })
    }

    /// What the driver negotiates: it knows only whether TLS is off, optional or required;
    /// the checks of the `verify-*` modes are the certificate verifier's.
    pub fn driver(self) -> DriverSslMode {
        match self {
            Self::Disable => DriverSslMode::Disable,
            Self::Prefer => DriverSslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => DriverSslMode::Require,
        }
    }
}

/// The TLS connector for `mode`, trusting the CA certificates in the PEM file `rootcert`.
pub fn connector(mode: SslMode, rootcert: Option<&str>) -> Result<MakeRustlsConnect> {
    let provider = Arc::new(crypto::ring::default_provider());
    let verifier =
        match (mode, rootcert) {
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => return Err(LedgerError::invalid(
                "target",
                "sslmode=verify-ca and verify-full need sslrootcert=<path of the PEM file with \
                 the CA certificate that signed the server's>",
            )),
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => Verifier {
                provider: Arc::clone(&provider),
                chain: None,
                name: false,
            },
            (SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull, Some(path)) => {
                let chain = WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots(path)?),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| {
                    LedgerError::invalid(
                        "target",
                        format!("sslrootcert={path} cannot be used as a trust anchor ({e})"),
                    )
                })?;
                Verifier {
                    provider: Arc::clone(&provider),
                    chain: Some(chain),
                    name: mode == SslMode::VerifyFull,
                }
            }
        };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| LedgerError::invalid("target", format!("no TLS protocol version ({e})")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The certificates of the PEM file at `path`, as trust anchors.
fn roots(path: &str) -> Result<RootCertStore> {
    let bad = |why: String| {
        LedgerError::invalid(
            "target",
            format!("sslrootcert={path}: {why}; give the path of a PEM file of CA certificates"),
        )
    };
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        store
            .add(cert)
            .map_err(|e| bad(format!("a certificate is not usable ({e})")))?;
    }
    if store.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    Ok(store)
}

/// The server certificate check of every mode. The handshake's signatures are always checked
/// (the server holds the key of the certificate it shows); beyond that:
/// - no `chain` (`prefer`, `require`): the certificate itself is not checked, libpq's meaning
///   of those modes — encryption without authentication;
/// - `chain` without `name` (`verify-ca`): it must chain to a trusted CA, for any host name
///   (webpki checks the chain before the name, so a name mismatch is the only error forgiven);
/// - `chain` and `name` (`verify-full`): and be issued for the host the URL names.
#[derive(Debug)]
struct Verifier {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
    name: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, TlsError> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(TlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, TlsError> {
        let algorithms = &self.provider.signature_verification_algorithms;
        crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, TlsError> {
        let algorithms = &self.provider.signature_verification_algorithms;
        crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_libpq_names_them() {
        assert_eq!(SslMode::parse(None).unwrap(), SslMode::Prefer);
        assert_eq!(
            SslMode::parse(Some("verify-full")).unwrap(),
            SslMode::VerifyFull
        );
        let e = SslMode::parse(Some("allow")).unwrap_err().to_string();
        assert!(
            e.contains("sslmode=allow") && e.contains("verify-full"),
            "{e}"
        );
    }

    #[test]
    fn verify_modes_need_a_root_certificate() {
        let e = connector(SslMode::VerifyCa, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("sslrootcert"), "{e}");
        assert!(connector(SslMode::Require, None).is_ok());
    }

    #[test]
    fn a_root_file_without_certificates_is_refused() {
        let path = std::env::temp_dir().join(format!("fp-empty-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate\n").unwrap();
        let p = path.to_str().unwrap();
        let e = connector(SslMode::VerifyFull, Some(p))
            .err()
            .unwrap()
            .to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(e.contains("no certificate"), "{e}");
        let e = connector(SslMode::VerifyFull, Some("/nonexistent/ca.pem"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
