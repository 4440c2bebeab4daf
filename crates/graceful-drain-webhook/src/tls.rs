//! TLS for the admission server: TLS 1.2 and 1.3 only (ring provider), ALPN `h2` and
//! `http/1.1`, an optional client CA, and a certificate resolver that re-reads the
//! certificate and key files for new handshakes; the client CA file is re-read the same
//! way ([`ReloadingClientVerifier`]).
//!
//! cert-manager rotates the Secret and the kubelet swaps the volume's `..data` symlink;
//! we never watch files (inotify misses symlink swaps). Instead [`ReloadingResolver`]
//! re-reads both files at most every [`RECHECK`] and swaps the served key when their
//! content changed and parses; connections already open keep their session.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

/// How often the certificate files are compared with the loaded ones. The kubelet syncs
/// Secret volumes about once a minute, so seconds are plenty, and two small file reads
/// every few seconds cost nothing.
pub const RECHECK: Duration = Duration::from_secs(2);

/// TLS errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM certificate or key.
    #[error("parse {path}: {message}")]
    Parse {
        /// The certificate or key file at fault.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
    /// rustls refused the configuration.
    #[error("configure TLS")]
    Rustls(#[from] rustls::Error),
    /// The client CA could not be turned into a verifier.
    #[error("client CA {path}: {message}")]
    ClientCa {
        /// The client CA file.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
}

#[derive(Debug, Default)]
struct State {
    checked: Option<Instant>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    current: Option<Arc<CertifiedKey>>,
}

/// A `ResolvesServerCert` serving the key pair found in two files, re-read for new
/// handshakes when they change.
#[derive(Debug)]
pub struct ReloadingResolver {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl ReloadingResolver {
    /// A resolver for `cert`/`key`; nothing is loaded until [`ReloadingResolver::reload`].
    pub fn new(cert: PathBuf, key: PathBuf) -> ReloadingResolver {
        ReloadingResolver {
            cert_path: cert,
            key_path: key,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-reads the files now. `Ok(true)` when a new key pair was loaded; on error the
    /// previous one stays in service.
    pub fn reload(&self) -> Result<bool, Error> {
        let cert_pem = read(&self.cert_path)?;
        let key_pem = read(&self.key_path)?;
        {
            let mut state = self.lock();
            state.checked = Some(Instant::now());
            if state.current.is_some() && state.cert_pem == cert_pem && state.key_pem == key_pem {
                return Ok(false);
            }
        }
        let key = self.parse(&cert_pem, &key_pem)?;
        let mut state = self.lock();
        state.cert_pem = cert_pem;
        state.key_pem = key_pem;
        state.current = Some(Arc::new(key));
        tracing::info!(cert = %self.cert_path.display(), "serving certificate loaded");
        Ok(true)
    }

    fn parse(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, Error> {
        let parse_err = |path: &Path, message: String| Error::Parse {
            path: path.to_path_buf(),
            message,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| parse_err(&self.cert_path, e.to_string()))?;
        if chain.is_empty() {
            return Err(parse_err(&self.cert_path, "no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| parse_err(&self.key_path, e.to_string()))?;
        CertifiedKey::from_der(chain, key, &self.provider)
            .map_err(|e| parse_err(&self.key_path, e.to_string()))
    }

    /// Reloads when the last check is older than [`RECHECK`]; errors are logged.
    pub fn maybe_reload(&self) {
        let due = self.lock().checked.is_none_or(|t| t.elapsed() >= RECHECK);
        if due && let Err(error) = self.reload() {
            self.lock().checked = Some(Instant::now());
            tracing::warn!(error = %graceful_drain_core::error::chain(&error), "reload serving certificate; keeping the previous one");
        }
    }

    /// Whether a key pair is loaded.
    pub fn loaded(&self) -> bool {
        self.lock().current.is_some()
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.maybe_reload();
        self.lock().current.clone()
    }
}

/// The server configuration: TLS 1.3 and 1.2, ALPN h2 then http/1.1, certificates from
/// `resolver`, and client certificates required and verified against `client_ca` if set.
pub fn server_config(
    resolver: Arc<ReloadingResolver>,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let verifier = ReloadingClientVerifier::new(path, provider, RECHECK)?;
            builder.with_client_cert_verifier(Arc::new(verifier))
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Builds a verifier of client certificates signed by a CA in `pem` (from `path`).
fn client_verifier(
    path: &Path,
    pem: &[u8],
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, Error> {
    let ca_err = |message: String| Error::ClientCa {
        path: path.to_path_buf(),
        message,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots
            .add(cert.map_err(|e| ca_err(e.to_string()))?)
            .map_err(|e| ca_err(e.to_string()))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| ca_err(e.to_string()))
}

/// Client certificates verified against the CA file as it is now: re-read at most every
/// `recheck` on a handshake, and swapped when its content changed and parses (the last
/// good CA stays otherwise), so a rotated client CA is picked up like a rotated serving
/// certificate, without a restart. It names no acceptable CA in its request (an empty
/// list lets the client send its certificate, as kube-apiserver does).
#[derive(Debug)]
pub struct ReloadingClientVerifier {
    path: PathBuf,
    provider: Arc<CryptoProvider>,
    recheck: Duration,
    state: Mutex<ClientCa>,
}

#[derive(Debug)]
struct ClientCa {
    checked: Instant,
    pem: Vec<u8>,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl ReloadingClientVerifier {
    /// A verifier of the CA in `path`, which must be readable and valid now.
    pub fn new(
        path: &Path,
        provider: Arc<CryptoProvider>,
        recheck: Duration,
    ) -> Result<Self, Error> {
        let pem = read(path)?;
        let verifier = client_verifier(path, &pem, &provider)?;
        Ok(ReloadingClientVerifier {
            path: path.to_path_buf(),
            provider,
            recheck,
            state: Mutex::new(ClientCa {
                checked: Instant::now(),
                pem,
                verifier,
            }),
        })
    }

    /// The verifier of the CA file's current content.
    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked.elapsed() >= self.recheck {
            state.checked = Instant::now();
            match read(&self.path) {
                Ok(pem) if pem != state.pem => {
                    match client_verifier(&self.path, &pem, &self.provider) {
                        Ok(verifier) => {
                            tracing::info!(path = %self.path.display(), "client CA reloaded");
                            state.pem = pem;
                            state.verifier = verifier;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "client CA changed but does not parse; keeping the last good one");
                        }
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "client CA unreadable; keeping the last good one");
                }
            }
        }
        state.verifier.clone()
    }
}

impl ClientCertVerifier for ReloadingClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(resolver: &ReloadingResolver) -> Vec<u8> {
        resolver.lock().current.as_ref().unwrap().cert[0].to_vec()
    }

    #[test]
    fn a_broken_rotation_keeps_the_last_good_pair() {
        let dir = tempfile::tempdir().unwrap();
        let first = graceful_drain_core::certs::generate("t", &["localhost".into()], &[]).unwrap();
        let paths = graceful_drain_core::certs::write(&first, dir.path()).unwrap();
        let resolver = ReloadingResolver::new(paths.cert.clone(), paths.key.clone());
        assert!(!resolver.loaded());
        assert!(resolver.reload().unwrap());
        assert!(
            !resolver.reload().unwrap(),
            "unchanged files are not reloaded"
        );
        let good = served(&resolver);

        let second = graceful_drain_core::certs::generate("t", &["localhost".into()], &[]).unwrap();
        // Half-written rotation: new certificate, old key.
        std::fs::write(&paths.cert, &second.cert).unwrap();
        let err = resolver.reload().unwrap_err();
        assert!(err.to_string().contains("tls.key"), "{err}");
        assert_eq!(served(&resolver), good);
        std::fs::write(&paths.key, &second.key).unwrap();
        assert!(resolver.reload().unwrap());
        assert_ne!(served(&resolver), good);

        std::fs::remove_file(&paths.cert).unwrap();
        assert!(matches!(resolver.reload(), Err(Error::Read { .. })));
        assert!(resolver.loaded());
    }
}
