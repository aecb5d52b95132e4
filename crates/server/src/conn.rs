//! Connections: accept, authenticate, then pump frames between the socket and the engine.
//!
//! A bad peer (wrong secret, other protocol, malformed or oversized frame) costs only its own
//! connection: the failure is logged with the peer's address and the server goes on.

use crate::engine::{Inbound, Outbox};
use bytes::Bytes;
use kestrel_proto::messages::{FromWorker, Request};
use kestrel_proto::{accept_handshake, FrameReader, FrameWriter, ProtoError, Role};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// A peer has this long to finish the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// Accepts connections until aborted.
pub async fn accept_loop(
    listener: TcpListener,
    secret: Vec<u8>,
    engine: mpsc::UnboundedSender<Inbound>,
) {
    let secret: std::sync::Arc<[u8]> = secret.into();
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve(stream, peer, secret.clone(), engine.clone()));
            }
            Err(e) => {
                // Out of file descriptors and the like: say so, back off, keep serving.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    secret: std::sync::Arc<[u8]>,
    engine: mpsc::UnboundedSender<Inbound>,
) {
    let (r, w) = stream.into_split();
    let mut reader = FrameReader::new(r);
    let mut writer = FrameWriter::new(w);
    let hs = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        accept_handshake(&mut reader, &mut writer, &secret),
    );
    let role = match hs.await {
        Ok(Ok(role)) => role,
        Ok(Err(ProtoError::Closed)) => return,
        Ok(Err(e)) => {
            tracing::warn!(%peer, "handshake failed, connection closed: {e}");
            return;
        }
        Err(_) => {
            tracing::warn!(%peer, "handshake not finished within {HANDSHAKE_TIMEOUT:?}, connection closed");
            return;
        }
    };
    let conn = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Bytes>();
    let writer_task = tokio::spawn(write_loop(writer, out_rx));
    let outbox = Outbox { conn, tx: out_tx };
    match role {
        Role::Worker => serve_worker(reader, peer, outbox, engine).await,
        Role::Client => serve_client(reader, peer, outbox, engine).await,
    }
    // The engine drops its sender when it forgets the connection; the writer then drains
    // what is queued and ends.
    let _ = writer_task.await;
}

async fn serve_worker(
    mut reader: FrameReader<tokio::net::tcp::OwnedReadHalf>,
    peer: SocketAddr,
    outbox: Outbox,
    engine: mpsc::UnboundedSender<Inbound>,
) {
    let registration = match reader.recv::<FromWorker>().await {
        Ok(FromWorker::Register(r)) => r,
        Ok(other) => {
            tracing::warn!(%peer, "worker sent {other:?} before registering; connection closed");
            return;
        }
        Err(e) => {
            tracing::warn!(%peer, "worker registration failed: {e}");
            return;
        }
    };
    let (id_tx, id_rx) = oneshot::channel();
    if engine
        .send(Inbound::WorkerJoin {
            registration,
            peer,
            outbox,
            reply: id_tx,
        })
        .is_err()
    {
        return;
    }
    let Ok(worker) = id_rx.await else { return };
    let reason = loop {
        match reader.try_recv::<FromWorker>().await {
            Ok(Some(msg)) => {
                if engine.send(Inbound::FromWorker { worker, msg }).is_err() {
                    return;
                }
            }
            Ok(None) => break "connection closed".to_string(),
            Err(e) => {
                tracing::warn!(%peer, worker, "closing worker connection: {e}");
                break e.to_string();
            }
        }
    };
    let _ = engine.send(Inbound::WorkerGone { worker, reason });
}

async fn serve_client(
    mut reader: FrameReader<tokio::net::tcp::OwnedReadHalf>,
    peer: SocketAddr,
    outbox: Outbox,
    engine: mpsc::UnboundedSender<Inbound>,
) {
    let conn = outbox.conn;
    if engine.send(Inbound::ClientJoin { outbox }).is_err() {
        return;
    }
    loop {
        match reader.try_recv::<Request>().await {
            Ok(Some(request)) => {
                if engine.send(Inbound::Client { conn, request }).is_err() {
                    return;
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%peer, "closing client connection: {e}");
                break;
            }
        }
    }
    let _ = engine.send(Inbound::ClientGone { conn });
}

/// Writes queued frames, flushing once per burst so a batch of messages leaves in one write.
async fn write_loop(
    mut writer: FrameWriter<OwnedWriteHalf>,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
) {
    while let Some(frame) = rx.recv().await {
        if writer.feed(frame).await.is_err() {
            return;
        }
        while let Ok(more) = rx.try_recv() {
            if writer.feed(more).await.is_err() {
                return;
            }
        }
        if writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.into_inner().shutdown().await;
}
