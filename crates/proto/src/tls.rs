//! Optional TLS for worker and client connections (rustls with the `ring` provider).
//!
//! The server presents a certificate; the access file carries that certificate, and connectors
//! trust exactly it (pinning) rather than any certificate authority: whoever holds the access
//! file already trusts the server, so no CA and no host-name matching are needed. The
//! challenge–response handshake on the shared secret still runs inside TLS.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

pub use tokio_rustls::{TlsAcceptor, TlsConnector};

/// File names of a generated certificate and key inside a server directory.
pub const CERT_FILE: &str = "tls-cert.pem";
pub const KEY_FILE: &str = "tls-key.pem";

/// The reading half of a connection, plain or TLS.
pub type ConnRead = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a connection, plain or TLS.
pub type ConnWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Splits a plain TCP connection into boxed halves (no lock between them).
pub fn split_plain(stream: TcpStream) -> (ConnRead, ConnWrite) {
    let (r, w) = stream.into_split();
    (Box::new(r), Box::new(w))
}

/// Splits a TLS connection into boxed halves.
pub fn split_tls<S>(stream: S) -> (ConnRead, ConnWrite)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    (Box::new(r), Box::new(w))
}

/// What can go wrong setting TLS up, each naming the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {err}")]
    Read { path: PathBuf, err: std::io::Error },
    #[error("cannot write {path}: {err}")]
    Write { path: PathBuf, err: std::io::Error },
    #[error(
        "{path} holds no PEM certificate ({err}); give a PEM file (`-----BEGIN CERTIFICATE-----`)"
    )]
    BadCert { path: String, err: String },
    #[error("{path} holds no PEM private key ({err}); give an unencrypted PEM key (PKCS#8, PKCS#1 or SEC1)")]
    BadKey { path: PathBuf, err: String },
    #[error("the certificate and key do not fit together: {0}")]
    Config(String),
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(String),
    #[error("{0} exists without {1}; delete it to have a new pair generated, or give both with --tls-cert/--tls-key")]
    HalfPair(PathBuf, PathBuf),
}

/// A certificate and its private key, as PEM text.
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|err| TlsError::Read {
        path: path.to_owned(),
        err,
    })
}

impl Identity {
    /// Reads a certificate and key the user provides.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
        let id = Identity {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        };
        id.cert_der(&cert.display().to_string())?;
        id.key_der(key)?;
        Ok(id)
    }

    /// The pair in `dir` (`tls-cert.pem`, `tls-key.pem`), generated on first use for `names`
    /// (host names and addresses the certificate is made out to; connectors pin the certificate
    /// itself, so the names are informative).
    pub fn self_signed_in(dir: &Path, names: &[String]) -> Result<Identity, TlsError> {
        let cert = dir.join(CERT_FILE);
        let key = dir.join(KEY_FILE);
        match (cert.exists(), key.exists()) {
            (true, true) => return Identity::from_files(&cert, &key),
            (true, false) => return Err(TlsError::HalfPair(cert, key)),
            (false, true) => return Err(TlsError::HalfPair(key, cert)),
            (false, false) => {}
        }
        let id = Identity::generate(names)?;
        write_file(&key, &id.key_pem, 0o600)?;
        write_file(&cert, &id.cert_pem, 0o644)?;
        Ok(id)
    }

    /// A fresh self-signed certificate for `names`.
    pub fn generate(names: &[String]) -> Result<Identity, TlsError> {
        let mut names: Vec<String> = names.iter().filter(|n| !n.is_empty()).cloned().collect();
        if names.is_empty() {
            names.push("localhost".into());
        }
        names.sort();
        names.dedup();
        let ck = rcgen::generate_simple_self_signed(names)
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        Ok(Identity {
            cert_pem: ck.cert.pem(),
            key_pem: ck.key_pair.serialize_pem(),
        })
    }

    fn cert_der(&self, origin: &str) -> Result<CertificateDer<'static>, TlsError> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).map_err(|e| TlsError::BadCert {
            path: origin.to_string(),
            err: e.to_string(),
        })
    }

    fn key_der(&self, origin: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| TlsError::BadKey {
            path: origin.to_owned(),
            err: e.to_string(),
        })
    }

    /// The server side: accepts TLS with this certificate.
    pub fn acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::BadCert {
                    path: "the certificate".into(),
                    err: e.to_string(),
                })?;
        let key = self.key_der(Path::new("the key"))?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

fn write_file(path: &Path, body: &str, mode: u32) -> Result<(), TlsError> {
    let werr = |err| TlsError::Write {
        path: path.to_owned(),
        err,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(werr)?;
    f.write_all(body.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(werr)?;
    // The umask may have narrowed the mode on creation; set it exactly.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(werr)
}

/// The connecting side: speaks TLS and accepts exactly the certificate `cert_pem` (the first
/// certificate in it).
pub fn connector(cert_pem: &str) -> Result<TlsConnector, TlsError> {
    let pinned =
        CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| TlsError::BadCert {
            path: "the access file's tls_cert".into(),
            err: e.to_string(),
        })?;
    let provider = provider();
    let verifier = Pinned {
        cert: pinned,
        algorithms: provider.signature_verification_algorithms,
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The name sent in the TLS hello. The pinned verifier does not check it, so any valid name
/// does; the access file's host is used when it is one.
pub fn server_name(host: &str) -> ServerName<'static> {
    ServerName::try_from(host.to_string())
        .unwrap_or_else(|_| ServerName::try_from("kestrel").expect("a valid DNS name"))
}

/// Accepts the server's certificate only if it is byte for byte the pinned one, and checks the
/// handshake signatures with it, so the peer must hold the matching private key.
#[derive(Debug)]
struct Pinned {
    cert: CertificateDer<'static>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the server's certificate is not the one in the access file".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn talk(server: &Identity, pinned: &str) -> std::io::Result<Vec<u8>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let acceptor = server.acceptor().unwrap();
        let srv = tokio::spawn(async move {
            let (s, _) = listener.accept().await?;
            let mut tls = acceptor.accept(s).await?;
            tls.write_all(b"hi").await?;
            tls.shutdown().await
        });
        let s = TcpStream::connect(addr).await?;
        let mut tls = connector(pinned)
            .unwrap()
            .connect(server_name("127.0.0.1"), s)
            .await?;
        let mut got = Vec::new();
        tls.read_to_end(&mut got).await?;
        let _ = srv.await;
        Ok(got)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn the_pinned_certificate_is_trusted_and_no_other() {
        let a = Identity::generate(&["127.0.0.1".into()]).unwrap();
        let b = Identity::generate(&["127.0.0.1".into()]).unwrap();
        assert_eq!(rt().block_on(talk(&a, &a.cert_pem)).unwrap(), b"hi");
        let err = rt()
            .block_on(talk(&a, &b.cert_pem))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the one in the access file"), "{err}");
    }

    #[test]
    fn generated_pairs_persist_with_a_private_key() {
        let dir = tempfile::tempdir().unwrap();
        let first = Identity::self_signed_in(dir.path(), &["localhost".into()]).unwrap();
        let mode = |f| {
            std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(KEY_FILE), 0o600);
        let again = Identity::self_signed_in(dir.path(), &["other".into()]).unwrap();
        assert_eq!(first.cert_pem, again.cert_pem, "reused, not regenerated");
        std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let e = Identity::self_signed_in(dir.path(), &[]).unwrap_err();
        assert!(e.to_string().contains("delete it"), "{e}");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("c.pem");
        let key = dir.path().join("k.pem");
        std::fs::write(&cert, "not pem").unwrap();
        std::fs::write(&key, "not pem").unwrap();
        let e = Identity::from_files(&cert, &key).unwrap_err().to_string();
        assert!(
            e.contains("c.pem") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = connector("garbage").err().expect("refused").to_string();
        assert!(e.contains("tls_cert"), "{e}");
    }
}
