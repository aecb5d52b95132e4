//! The handshake: version negotiation, then mutual challenge–response on the shared secret.
//!
//! ```text
//! connector -> server   Hello { magic, version, role, nonce_c[, oldest] }
//! server -> connector   Challenge { chosen version, nonce_s, proof_s = HMAC(secret, "server" | nonce_c | nonce_s) }
//!                       or Refused { reason }        (no version in common)
//! connector -> server   Proof { proof_c = HMAC(secret, "client" | nonce_c | nonce_s) }
//! server -> connector   Welcome | Refused { reason } (wrong secret)
//! ```
//! The secret never crosses the wire; each side proves it holds it over fresh nonces, so a
//! recorded exchange cannot be replayed and a connector also knows it reached the real server.
//!
//! Versions: a connector says the newest version it speaks (`version`) and, from version 7
//! on, the oldest (`oldest`, left out when it speaks one version only, so its hello is then
//! byte for byte a version-6 hello). The server picks the newest version both speak and names
//! it in its challenge; a server speaks [`OLDEST_PROTOCOL_VERSION`]`..=`[`PROTOCOL_VERSION`]
//! (N−1..N), so workers, clients and SDKs one release behind keep working across an upgrade.

use crate::frame::{FrameReader, FrameWriter, ProtoError};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::ops::RangeInclusive;
use tokio::io::{AsyncRead, AsyncWrite};

/// The newest protocol version this build speaks; bumped whenever a message's encoding changes.
///
/// Version 7 differs from 6 only in the hello (it may carry `oldest`). Version 8 adds trailing
/// fields that are left out when empty (a job's files and placement, a worker's cache): a
/// message without them is written as in 7, so the three differ only in the hello and in
/// what a job or worker that uses data diffusion sends ([`FILES_VERSION`]). Version 9 adds
/// the trailing fields of task graphs (a job's `after`, parent and output modes, a task's
/// `Waiting` state, the deletion of intermediate files), left out when unused
/// ([`GRAPH_VERSION`]). Version 10 adds a worker's allocation and its end
/// ([`ALLOC_VERSION`]). Version 11 adds what a waiting job waits for to the jobs listed
/// ([`WAITING_FOR_VERSION`]), the control of workers ([`WORKERS_VERSION`]), which own
/// output files of a task hold output ([`OUTPUT_FILES_VERSION`]), multi-node tasks
/// ([`NODES_VERSION`]) and task-level dependencies ([`TASK_DEPS_VERSION`]). Version 12 adds
/// function tasks ([`FUNCTIONS_VERSION`]). Version 13 adds watches: a client's `Watch` and the
/// task ends pushed to it ([`WATCH_VERSION`]). Version 14 adds values, the Python results and
/// arguments kept in the workers' caches (`Locate`, `Place`, `Placed`, `DropValues`), the
/// cancel of single tasks (`CancelTasks`) and the bytes through the server in its info
/// ([`VALUES_VERSION`]).
pub const PROTOCOL_VERSION: u32 = 14;

/// The first version with values (see `kestrel_core::values`): a client asks where they are,
/// places and drops them, and cancels single tasks; `ServerInfo` carries the server's traffic.
/// A client does not ask these of an older server, and an older client gets `ServerInfo`
/// without its new fields.
pub const VALUES_VERSION: u32 = 14;

/// The first version in which a client watches jobs (`Ask::Watch`) and the server pushes it
/// each task end of them (`ToClient::Ended`, `ToClient::Gone`): a client asks no watch of an
/// older server, and a server pushes nothing to an older client (which cannot ask for it).
pub const WATCH_VERSION: u32 = 13;

/// The first version that carries function tasks (a template's `function`, a worker's
/// `python`): a client does not submit them to an older server, and a worker does not tell
/// an older server of its Python.
pub const FUNCTIONS_VERSION: u32 = 12;

/// The first version in which a listed job says what its waiting tasks wait for: a server
/// leaves it out for an older client.
pub const WAITING_FOR_VERSION: u32 = 11;

/// The first version in which a client asks for one worker in full, for the workers that
/// left, or to stop workers, and a worker says it leaves (SIGTERM): a client asks an older
/// server none of it, and a worker tells an older server nothing.
pub const WORKERS_VERSION: u32 = 11;

/// The first version in which a worker says which of a task's own output files it left in
/// place (`TaskOutput::files`), and a server tells a client which output files a task wrote
/// (`RowOutput::Written`): neither is sent to an older peer.
pub const OUTPUT_FILES_VERSION: u32 = 11;

/// The first version that carries multi-node tasks (a job's `nodes`, an assignment's workers):
/// a client does not submit them to an older server, and a server gives them only to workers
/// of this version or later.
pub const NODES_VERSION: u32 = 11;

/// The first version that carries dependencies of single tasks (a job's `deps`): a client does
/// not send them to an older server.
pub const TASK_DEPS_VERSION: u32 = 11;

/// The first version in which a worker says which allocation it runs in and when that ends:
/// a worker does not send them to an older server.
pub const ALLOC_VERSION: u32 = 10;

/// The first version that carries task graphs: a client does not send `after`, a parent or
/// output modes to an older server.
pub const GRAPH_VERSION: u32 = 9;

/// The first version that carries files, stores, policies and caches. Older peers refuse
/// those fields' longer arrays: a client does not send them to an older server, and a server
/// does not give tasks with files to a worker that reported no cache.
pub const FILES_VERSION: u32 = 8;

/// The oldest protocol version this build still speaks (at least N−1; 6 still, as 6 and 7
/// differ only in the hello). A message whose encoding changes between versions must be
/// encoded for the version a connection negotiated.
pub const OLDEST_PROTOCOL_VERSION: u32 = 6;

/// The versions this build speaks.
pub const SPOKEN_VERSIONS: RangeInclusive<u32> = OLDEST_PROTOCOL_VERSION..=PROTOCOL_VERSION;
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
    /// The newest version the connector speaks.
    version: u32,
    role: Role,
    #[serde(with = "serde_bytes")]
    nonce: Vec<u8>,
    /// The oldest version it speaks, when older than `version` (absent before version 7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    oldest: Option<u32>,
}

impl Hello {
    /// The versions the connector speaks.
    fn versions(&self) -> RangeInclusive<u32> {
        self.oldest.unwrap_or(self.version).min(self.version)..=self.version
    }
}

/// The newest version in both `ours` and `theirs`, if they share one.
pub fn negotiate(ours: &RangeInclusive<u32>, theirs: &RangeInclusive<u32>) -> Option<u32> {
    let newest = (*ours.end()).min(*theirs.end());
    (newest >= *ours.start() && newest >= *theirs.start()).then_some(newest)
}

/// How a range of versions reads in a message: "6" or "6 to 7".
fn spoken(versions: &RangeInclusive<u32>) -> String {
    if versions.start() == versions.end() {
        versions.start().to_string()
    } else {
        format!("{} to {}", versions.start(), versions.end())
    }
}

/// What the server learned from a handshake that succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// Who connected.
    pub role: Role,
    /// The protocol version the connection speaks from now on.
    pub version: u32,
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

/// The connecting side of the handshake (worker or client) on a stream already open, offering
/// every version this build speaks; returns the version the connection speaks. A connector
/// that has the server's access file goes through [`crate::client::connect_as`] instead: it
/// offers only what that server reads, and times the handshake out.
pub async fn connect_handshake<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    role: Role,
    secret: &[u8],
) -> Result<u32, ProtoError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    connect_handshake_speaking(reader, writer, role, secret, SPOKEN_VERSIONS).await
}

/// [`connect_handshake`] for a connector that speaks `versions` (an older client, in tests
/// of compatibility).
pub async fn connect_handshake_speaking<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    role: Role,
    secret: &[u8],
    versions: RangeInclusive<u32>,
) -> Result<u32, ProtoError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let nonce_c = nonce();
    let newest = *versions.end();
    let hello = Hello {
        magic: MAGIC.into(),
        version: newest,
        role,
        nonce: nonce_c.clone(),
        oldest: (*versions.start() < newest).then_some(*versions.start()),
    };
    writer.send(&hello).await?;
    let reply: HelloReply = reader.recv().await.map_err(|e| match e {
        ProtoError::Decode(d) => ProtoError::NotKestrel(d),
        other => other,
    })?;
    let (chosen, nonce_s, proof_s) = match reply {
        HelloReply::Refused { reason } => return Err(ProtoError::Refused(reason)),
        HelloReply::Challenge { version, .. } if !versions.contains(&version) => {
            return Err(ProtoError::Version {
                ours: spoken(&versions),
                theirs: version.to_string(),
            })
        }
        HelloReply::Challenge {
            version,
            nonce,
            proof,
        } => (version, nonce, proof),
    };
    if !verify(secret, b"kestrel-server", &nonce_c, &nonce_s, &proof_s) {
        return Err(ProtoError::Auth(
            "the server does not know this access file's secret: the access file is stale (the server's secret was rotated with `server start --new-secret`, or the file belongs to another server); use the server's current access file".into(),
        ));
    }
    writer
        .send(&Proof {
            proof: prove(secret, b"kestrel-client", &nonce_c, &nonce_s),
        })
        .await?;
    match reader.recv::<Verdict>().await? {
        Verdict::Welcome => Ok(chosen),
        Verdict::Refused { reason } => Err(ProtoError::Refused(reason)),
    }
}

/// The server side of the handshake. Returns the connector's role and the version chosen. On
/// failure the connector has been told why (when it speaks the protocol) and the caller closes
/// the connection.
pub async fn accept_handshake<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    secret: &[u8],
) -> Result<Handshake, ProtoError>
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
    let theirs = hello.versions();
    let Some(chosen) = negotiate(&SPOKEN_VERSIONS, &theirs) else {
        let reason = format!(
            "protocol version {} is not supported by this server (it speaks {}); use kestrel of the same release on both sides, or at most one release apart",
            spoken(&theirs),
            spoken(&SPOKEN_VERSIONS)
        );
        let _ = writer.send(&HelloReply::Refused { reason }).await;
        return Err(ProtoError::Version {
            ours: spoken(&SPOKEN_VERSIONS),
            theirs: spoken(&theirs),
        });
    };
    if hello.nonce.len() != NONCE_BYTES {
        return Err(ProtoError::NotKestrel("bad nonce length".into()));
    }
    let nonce_s = nonce();
    let proof = prove(secret, b"kestrel-server", &hello.nonce, &nonce_s);
    writer
        .send(&HelloReply::Challenge {
            version: chosen,
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
        let reason = "wrong secret: the access file is stale (the server's secret was rotated with `server start --new-secret`, or the file was copied from another server); use the server's current access file".to_string();
        let _ = writer.send(&Verdict::Refused { reason }).await;
        return Err(ProtoError::Auth(
            "connector does not know the secret".into(),
        ));
    }
    writer.send(&Verdict::Welcome).await?;
    Ok(Handshake {
        role: hello.role,
        version: chosen,
    })
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
    ) -> (Result<u32, ProtoError>, Result<Handshake, ProtoError>) {
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
        assert_eq!(c.unwrap(), PROTOCOL_VERSION);
        assert_eq!(
            s.unwrap(),
            Handshake {
                role: Role::Worker,
                version: PROTOCOL_VERSION
            }
        );
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
                    oldest: Some(98),
                };
                w.send(&hello).await.unwrap();
                r.recv::<HelloReply>().await.unwrap()
            };
            let (s, reply) = tokio::join!(server, client);
            match s {
                Err(ProtoError::Version { theirs, .. }) => assert_eq!(theirs, "98 to 99"),
                other => panic!("expected a version error, got {other:?}"),
            }
            reply
        });
        match msg {
            HelloReply::Refused { reason } => assert!(
                reason.contains(
                    &format!("version 98 to 99 is not supported by this server (it speaks 6 to {PROTOCOL_VERSION})")
                ),
                "{reason}"
            ),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_newest_version_both_speak_is_chosen() {
        assert_eq!(negotiate(&(6..=7), &(6..=7)), Some(7));
        assert_eq!(negotiate(&(6..=7), &(6..=6)), Some(6));
        assert_eq!(negotiate(&(6..=7), &(7..=8)), Some(7));
        assert_eq!(negotiate(&(6..=7), &(5..=9)), Some(7));
        assert_eq!(negotiate(&(6..=7), &(8..=9)), None);
        assert_eq!(negotiate(&(6..=7), &(4..=5)), None);
    }

    #[test]
    fn a_connector_of_the_previous_version_is_served_in_its_version() {
        let (a, b) = tokio::io::duplex(4096);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let (c, s) = rt().block_on(async {
            let client = async move {
                let (mut r, mut w) = (FrameReader::new(ar), FrameWriter::new(aw));
                let old = OLDEST_PROTOCOL_VERSION..=OLDEST_PROTOCOL_VERSION;
                connect_handshake_speaking(&mut r, &mut w, Role::Client, b"k", old).await
            };
            let server = async move {
                let (mut r, mut w) = (FrameReader::new(br), FrameWriter::new(bw));
                accept_handshake(&mut r, &mut w, b"k").await
            };
            tokio::join!(client, server)
        });
        assert_eq!(c.unwrap(), OLDEST_PROTOCOL_VERSION);
        assert_eq!(s.unwrap().version, OLDEST_PROTOCOL_VERSION);
    }

    /// The hello of version 6, as version 6 encoded and decoded it.
    #[derive(Serialize, Deserialize, Debug)]
    struct HelloV6 {
        magic: String,
        version: u32,
        role: Role,
        #[serde(with = "serde_bytes")]
        nonce: Vec<u8>,
    }

    #[test]
    fn a_single_version_hello_is_the_version_6_hello_byte_for_byte() {
        let nonce = vec![7u8; NONCE_BYTES];
        let now = crate::frame::encode(&Hello {
            magic: MAGIC.into(),
            version: 6,
            role: Role::Worker,
            nonce: nonce.clone(),
            oldest: None,
        })
        .unwrap();
        let then = crate::frame::encode(&HelloV6 {
            magic: MAGIC.into(),
            version: 6,
            role: Role::Worker,
            nonce,
        })
        .unwrap();
        assert_eq!(now, then);
        // And a version-6 hello decodes, speaking version 6 only.
        let hello: Hello = crate::frame::decode(&then).unwrap();
        assert_eq!(hello.versions(), 6..=6);
    }

    /// A version-6 server reads a hello as exactly its 4 fields and closes on any other. A
    /// client given such a server's access file (protocol 6) offers version 6 alone, in a hello
    /// that server reads; given a version-7 server's, it offers 6..=7, which that server reads.
    #[test]
    fn a_client_offers_an_older_server_only_the_version_it_speaks() {
        let hello_seen_by_a_v6_server = |protocol: u32| {
            rt().block_on(async {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let port = listener.local_addr().unwrap().port();
                let mut access = crate::Access::generate("127.0.0.1".into(), port);
                access.protocol = protocol;
                let server = async {
                    let (stream, _) = listener.accept().await.unwrap();
                    let (r, w) = stream.into_split();
                    let (mut r, mut w) = (FrameReader::new(r), FrameWriter::new(w));
                    let hello = r.recv::<HelloV6>().await;
                    if hello.is_ok() {
                        let reason = "a version-6 server read the hello".to_string();
                        w.send(&HelloReply::Refused { reason }).await.unwrap();
                    }
                    hello
                };
                let (hello, client) = tokio::join!(server, crate::Client::connect(&access));
                assert!(client.is_err(), "the fake server lets nobody in");
                hello
            })
        };
        let hello = hello_seen_by_a_v6_server(6).expect("a version-6 server reads it");
        assert_eq!((hello.magic.as_str(), hello.version), (MAGIC, 6));
        let err = hello_seen_by_a_v6_server(PROTOCOL_VERSION).expect_err("a range");
        assert!(matches!(err, ProtoError::Decode(_)), "{err}");
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
