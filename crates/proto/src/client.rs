//! A client connection: connect, authenticate, ask, wait.

use crate::access::Access;
use crate::auth::{connect_handshake_speaking, Role, SPOKEN_VERSIONS, WATCH_VERSION};
use crate::frame::{FrameReader, FrameWriter, ProtoError};
use crate::messages::{Answer, Ask, Refusal, RefusalKind, Request, ToClient, WaitProgress};
use crate::tls::{ConnRead, ConnWrite};
use kestrel_core::JobId;
use std::ops::RangeInclusive;
use std::time::Duration;
use tokio::net::TcpStream;

/// How long to try to reach a server before giving up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the server at {addr} ({err}); it is not running or the access file is stale: start it with `kestrel server start`, or point to the right one with --server-dir")]
    Unreachable { addr: String, err: std::io::Error },
    #[error("the server at {0} did not answer within {CONNECT_TIMEOUT:?}; check the address and that no firewall is in the way")]
    ConnectTimeout(String),
    /// Transparent: shown once, not again as its own cause (`error: X: X`).
    #[error(transparent)]
    Proto(#[from] ProtoError),
    /// The server refused the request; its message says why.
    #[error("{0}")]
    Server(String),
    /// The request names a job, task or worker the server does not have; the message says which.
    #[error("{0}")]
    NotFound(String),
    #[error("the server sent an unexpected answer: {0}")]
    Unexpected(String),
    #[error("TLS with the server at {addr} failed ({err}); the server runs without TLS (on loopback, or --tls off), or with another certificate than the access file's: use the server's current access file")]
    Tls { addr: String, err: String },
}

impl From<Refusal> for ClientError {
    fn from(r: Refusal) -> ClientError {
        match r.kind {
            RefusalKind::NotFound => ClientError::NotFound(r.message),
            RefusalKind::Refused => ClientError::Server(r.message),
        }
    }
}

/// Connects TCP to the access file's address, with a timeout and a clear message on failure.
pub async fn dial(access: &Access) -> Result<TcpStream, ClientError> {
    let addr = access.address();
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addr)).await {
        Err(_) => return Err(ClientError::ConnectTimeout(addr)),
        Ok(Err(err)) => return Err(ClientError::Unreachable { addr, err }),
        Ok(Ok(s)) => s,
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Connects to the access file's address, in TLS when the access file carries a certificate.
pub async fn open(access: &Access) -> Result<(ConnRead, ConnWrite), ClientError> {
    let stream = dial(access).await?;
    let Some(cert) = &access.tls_cert else {
        return Ok(crate::tls::split_plain(stream));
    };
    let addr = access.address();
    let tls_err = |err: String| ClientError::Tls {
        addr: addr.clone(),
        err,
    };
    let connector = crate::tls::connector(cert).map_err(|e| tls_err(e.to_string()))?;
    let name = crate::tls::server_name(&access.host);
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, stream))
        .await
        .map_err(|_| ClientError::ConnectTimeout(addr.clone()))?
        .map_err(|e| tls_err(e.to_string()))?;
    Ok(crate::tls::split_tls(tls))
}

/// Opens a connection to the access file's server and authenticates as `role`, offering the
/// `versions` that server reads ([`Access::versions_for`]); the handshake has
/// [`CONNECT_TIMEOUT`] (a port that takes the connection and never answers is not waited on
/// for ever). Returns the connection and the version chosen. Clients and workers both connect
/// through here.
pub async fn connect_as(
    access: &Access,
    role: Role,
    versions: RangeInclusive<u32>,
) -> Result<(FrameReader<ConnRead>, FrameWriter<ConnWrite>, u32), ClientError> {
    let versions = access.versions_for(versions);
    let (r, w) = open(access).await?;
    let mut reader = FrameReader::new(r);
    let mut writer = FrameWriter::new(w);
    let secret = access.secret_bytes();
    let version = tokio::time::timeout(
        CONNECT_TIMEOUT,
        connect_handshake_speaking(&mut reader, &mut writer, role, &secret, versions),
    )
    .await
    .map_err(|_| ClientError::ConnectTimeout(access.address()))??;
    Ok((reader, writer, version))
}

/// An authenticated client connection.
pub struct Client {
    reader: FrameReader<ConnRead>,
    writer: FrameWriter<ConnWrite>,
    next_id: u64,
    /// The protocol version the connection speaks.
    version: u32,
}

impl Client {
    /// Connects and authenticates.
    pub async fn connect(access: &Access) -> Result<Client, ClientError> {
        Client::connect_speaking(access, SPOKEN_VERSIONS).await
    }

    /// [`Client::connect`] for a client that speaks only `versions` of the protocol (tests of
    /// compatibility with older clients). It offers those the access file's server speaks
    /// ([`Access::versions_for`]).
    pub async fn connect_speaking(
        access: &Access,
        versions: RangeInclusive<u32>,
    ) -> Result<Client, ClientError> {
        let (reader, writer, version) = connect_as(access, Role::Client, versions).await?;
        Ok(Client {
            reader,
            writer,
            next_id: 1,
            version,
        })
    }

    /// The protocol version the connection speaks (chosen by the server in the handshake).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Watches `jobs` (and with `submitted`, every job this connection submits from now on):
    /// the server pushes their task ends to this connection as [`ToClient::Ended`] frames,
    /// which [`Client::call`] and [`Client::wait`] skip, so a client that reads them splits
    /// the connection next ([`Client::into_parts`]). Returns the jobs the server does not
    /// have. Refused without asking by a server older than [`WATCH_VERSION`].
    pub async fn watch(
        &mut self,
        jobs: Vec<JobId>,
        submitted: bool,
    ) -> Result<Vec<JobId>, ClientError> {
        if self.version < WATCH_VERSION {
            return Err(ClientError::Server(format!(
                "the server speaks protocol {}, older than {WATCH_VERSION}, which a watch needs: upgrade the server (`kestrel server info` shows its version)",
                self.version
            )));
        }
        match self.call(Ask::Watch { jobs, submitted }).await? {
            Answer::Watching { missing } => Ok(missing),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Splits the connection into its parts, for a client that multiplexes requests and
    /// pushes itself (a watch's [`ToClient::Ended`] frames come between replies): the frame
    /// reader and writer, the protocol version the connection speaks, and the id its next
    /// request is to take (ids so far were used by [`Client::call`]; the server answers each
    /// by its id).
    pub fn into_parts(self) -> (FrameReader<ConnRead>, FrameWriter<ConnWrite>, u32, u64) {
        (self.reader, self.writer, self.version, self.next_id)
    }

    /// Sends a request and returns its answer (frames that are not its reply, a watch's
    /// pushes among them, are skipped).
    pub async fn call(&mut self, ask: Ask) -> Result<Answer, ClientError> {
        let id = self.send(ask).await?;
        loop {
            match self.reader.recv::<ToClient>().await? {
                ToClient::Reply { id: rid, result } if rid == id => {
                    return result.map_err(ClientError::from)
                }
                _ => continue,
            }
        }
    }

    async fn send(&mut self, body: Ask) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        self.writer.send(&Request { id, body }).await?;
        Ok(id)
    }

    /// Waits until every job in `jobs` (every unfinished job if empty) is done, calling
    /// `progress` with the counts every `every`.
    pub async fn wait(
        &mut self,
        jobs: Vec<JobId>,
        every: Duration,
        mut progress: impl FnMut(&WaitProgress),
    ) -> Result<WaitProgress, ClientError> {
        let id = self
            .send(Ask::Wait {
                jobs,
                progress_ms: every.as_millis() as u64,
            })
            .await?;
        loop {
            match self.reader.recv::<ToClient>().await? {
                ToClient::Progress {
                    id: pid,
                    progress: p,
                } if pid == id => progress(&p),
                ToClient::Reply { id: rid, result } if rid == id => {
                    return match result.map_err(ClientError::from)? {
                        Answer::WaitDone(p) => Ok(p),
                        other => Err(ClientError::Unexpected(format!("{other:?}"))),
                    };
                }
                _ => continue,
            }
        }
    }
}
