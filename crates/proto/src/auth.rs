//! The handshake: version check, then mutual challenge–response on the shared secret.
//!
//! ```text
//! connector -> server   Hello { magic, version, role, nonce_c }
//! server -> connector   Challenge { version, nonce_s, proof_s = HMAC(secret, "server" | nonce_c | nonce_s) }
//!                       or Refused { reason }        (wrong version)
//! connector -> server   Proof { proof_c = HMAC(secret, "client" | nonce_c | nonce_s) }
//! server -> connector   Welcome | Refused { reason } (wrong secret)
//! ```
//! The secret never crosses the wire; each side proves it holds it over fresh nonces, so a
//! recorded exchange cannot be replayed and a connector also knows it reached the real server.

use crate::frame::{FrameReader, FrameWriter, ProtoError};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};

/// Bumped whenever a message's encoding changes.
pub const PROTOCOL_VERSION: u32 = 6;
const MAGIC: &str = "kestrel";
const NONCE_BYTES: usize = 32;

/// Who is connecting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Worker,
    Client,
}

#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    magic: String,
    version: u32,
    role: Role,
    #[serde(with = "serde_bytes")]
    nonce: Vec<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
enum HelloReply {
    Challenge {
        version: u32,
        #[serde(with = "serde_bytes")]
        nonce: Vec<u8>,
        #[serde(with = "serde_bytes")]
        proof: Vec<u8>,
    },
    Refused {
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct Proof {
    #[serde(with = "serde_bytes")]
    proof: Vec<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Verdict {
    Welcome,
    Refused { reason: String },
}

fn nonce() -> Vec<u8> {
    let mut n = vec![0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut n);
    n
}

fn mac(secret: &[u8], label: &[u8], a: &[u8], b: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(label);
    m.update(a);
    m.update(b);
    m
}

fn prove(secret: &[u8], label: &[u8], a: &[u8], b: &[u8]) -> Vec<u8> {
    mac(secret, label, a, b).finalize().into_bytes().to_vec()
}

/// Constant-time check of a proof.
fn verify(secret: &[u8], label: &[u8], a: &[u8], b: &[u8], proof: &[u8]) -> bool {
    mac(secret, label, a, b).verify_slice(proof).is_ok()
}

/// The connecting side of the handshake (worker or client).
pub async fn connect_handshake<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    role: Role,
    secret: &[u8],
) -> Result<(), ProtoError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let nonce_c = nonce();
    let hello = Hello {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        role,
        nonce: nonce_c.clone(),
    };
    writer.send(&hello).await?;
    let reply: HelloReply = reader.recv().await.map_err(|e| match e {
        ProtoError::Decode(d) => ProtoError::NotKestrel(d),
        other => other,
    })?;
    let (nonce_s, proof_s) = match reply {
        HelloReply::Refused { reason } => return Err(ProtoError::Refused(reason)),
        HelloReply::Challenge { version, .. } if version != PROTOCOL_VERSION => {
            return Err(ProtoError::Version {
                ours: PROTOCOL_VERSION,
                theirs: version,
            })
        }
        HelloReply::Challenge { nonce, proof, .. } => (nonce, proof),
    };
    if !verify(secret, b"kestrel-server", &nonce_c, &nonce_s, &proof_s) {
        return Err(ProtoError::Auth(
            "the server does not know this access file's secret: the access file is stale or belongs to another server; use the current server's access file".into(),
        ));
    }
    writer
        .send(&Proof {
            proof: prove(secret, b"kestrel-client", &nonce_c, &nonce_s),
        })
        .await?;
    match reader.recv::<Verdict>().await? {
        Verdict::Welcome => Ok(()),
        Verdict::Refused { reason } => Err(ProtoError::Refused(reason)),
    }
}

/// The server side of the handshake. Returns the connector's role. On failure the connector
/// has been told why (when it speaks the protocol) and the caller closes the connection.
pub async fn accept_handshake<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    secret: &[u8],
) -> Result<Role, ProtoError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let hello: Hello = reader.recv().await.map_err(|e| match e {
        ProtoError::Decode(d) => ProtoError::NotKestrel(d),
        other => other,
    })?;
    if hello.magic != MAGIC {
        return Err(ProtoError::NotKestrel(format!(
            "unknown magic {:?}",
            hello.magic
        )));
    }
    if hello.version != PROTOCOL_VERSION {
        let reason = format!(
            "protocol version {} is not supported by this server (it speaks {}); use the same kestrel version on both sides",
            hello.version, PROTOCOL_VERSION
        );
        let _ = writer.send(&HelloReply::Refused { reason }).await;
        return Err(ProtoError::Version {
            ours: PROTOCOL_VERSION,
            theirs: hello.version,
        });
    }
    if hello.nonce.len() != NONCE_BYTES {
        return Err(ProtoError::NotKestrel("bad nonce length".into()));
    }
    let nonce_s = nonce();
    let proof = prove(secret, b"kestrel-server", &hello.nonce, &nonce_s);
    writer
        .send(&HelloReply::Challenge {
            version: PROTOCOL_VERSION,
            nonce: nonce_s.clone(),
            proof,
        })
        .await?;
    let answer: Proof = reader.recv().await.map_err(|e| match e {
        // A connector with another secret stops at the server's proof and leaves.
        ProtoError::Closed => ProtoError::Auth(
            "the connector left without proving the secret (its access file is stale or from another server)".into(),
        ),
        other => other,
    })?;
    if !verify(
        secret,
        b"kestrel-client",
        &hello.nonce,
        &nonce_s,
        &answer.proof,
    ) {
        let reason = "wrong secret: the access file does not belong to this server (stale or copied from another); use the server's current access file".to_string();
        let _ = writer.send(&Verdict::Refused { reason }).await;
        return Err(ProtoError::Auth(
            "connector does not know the secret".into(),
        ));
    }
    writer.send(&Verdict::Welcome).await?;
    Ok(hello.role)
}

/// Answers a connector's hello with a refusal without reading it, for a server that cannot
/// take the connection at all (a plain-TCP connector at a TLS server).
pub async fn refuse_hello<W: AsyncWrite + Unpin>(
    writer: &mut FrameWriter<W>,
    reason: String,
) -> Result<(), ProtoError> {
    writer.send(&HelloReply::Refused { reason }).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameReader;

    async fn pair(
        client_secret: &'static [u8],
        server_secret: &'static [u8],
    ) -> (Result<(), ProtoError>, Result<Role, ProtoError>) {
        let (a, b) = tokio::io::duplex(4096);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let client = async move {
            let (mut r, mut w) = (FrameReader::new(ar), FrameWriter::new(aw));
            connect_handshake(&mut r, &mut w, Role::Worker, client_secret).await
        };
        let server = async move {
            let (mut r, mut w) = (FrameReader::new(br), FrameWriter::new(bw));
            accept_handshake(&mut r, &mut w, server_secret).await
        };
        tokio::join!(client, server)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn same_secret_is_welcome() {
        let (c, s) = rt().block_on(pair(b"s3cret", b"s3cret"));
        c.unwrap();
        assert_eq!(s.unwrap(), Role::Worker);
    }

    #[test]
    fn wrong_secret_fails_on_both_sides_with_reasons() {
        let (c, s) = rt().block_on(pair(b"old", b"new"));
        let c = c.unwrap_err().to_string();
        assert!(c.contains("stale"), "{c}");
        // The server never got a proof, because the connector stopped at the server's proof.
        assert!(s.is_err());
    }

    #[test]
    fn other_protocol_version_is_refused_with_a_reason() {
        let msg = rt().block_on(async {
            let (a, b) = tokio::io::duplex(4096);
            let (ar, aw) = tokio::io::split(a);
            let (br, bw) = tokio::io::split(b);
            let server = async move {
                let (mut r, mut w) = (FrameReader::new(br), FrameWriter::new(bw));
                accept_handshake(&mut r, &mut w, b"x").await
            };
            let client = async move {
                let (mut r, mut w) = (FrameReader::new(ar), FrameWriter::new(aw));
                let hello = Hello {
                    magic: MAGIC.into(),
                    version: 99,
                    role: Role::Client,
                    nonce: nonce(),
                };
                w.send(&hello).await.unwrap();
                r.recv::<HelloReply>().await.unwrap()
            };
            let (s, reply) = tokio::join!(server, client);
            assert!(matches!(s, Err(ProtoError::Version { theirs: 99, .. })));
            reply
        });
        match msg {
            HelloReply::Refused { reason } => assert!(reason.contains("version 99"), "{reason}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_non_kestrel_peer_is_named_as_such() {
        let err = rt().block_on(async {
            let (a, b) = tokio::io::duplex(4096);
            let (_ar, aw) = tokio::io::split(a);
            let (br, bw) = tokio::io::split(b);
            let mut raw = FrameWriter::new(aw);
            raw.feed(bytes::Bytes::from_static(b"\xc0")).await.unwrap();
            raw.flush().await.unwrap();
            let (mut r, mut w) = (FrameReader::new(br), FrameWriter::new(bw));
            accept_handshake(&mut r, &mut w, b"x").await.unwrap_err()
        });
        assert!(matches!(err, ProtoError::NotKestrel(_)), "{err}");
    }
}
