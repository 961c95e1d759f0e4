//! Raft messages between replicas over gRPC: one long-lived client stream per peer
//! (`Raft.Send`), fed by a bounded queue the driver fills without blocking.
//!
//! Messages are raft-rs `eraftpb.Message`s, protobuf-encoded, batched into `RaftBatch`es.
//! Losing messages is fine (raft resends); the sender reports a failed connection to raft
//! (`report_unreachable`) and the fate of each snapshot message (`report_snapshot`).
//!
//! With TLS, a peer must present a replica's certificate of the cluster CA before a single
//! raft message is decoded: raft-rs 0.7 decodes messages with rust-protobuf 2 (advisory
//! RUSTSEC-2024-0437: hostile input can overflow the stack). Batches also carry the cluster's
//! identity and the replica ids, checked against this replica's. With `--insecure` the raft
//! port must be reachable by the replicas alone (a private network).

use crate::node::{NodeHandle, NodeRequest};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use std::time::Duration;
use tessera_proto::backoff::{Backoff, seeded_rng};
use tessera_proto::tls::Security;
use tessera_proto::v1;
use tessera_proto::v1::raft_client::RaftClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Largest raft batch accepted or sent (snapshots of big views travel in one message).
pub const MAX_RAFT_BYTES: usize = 1 << 30;

/// Messages per batch.
const BATCH: usize = 256;

/// Runs the sender to peer `to` at `addr` until the driver drops its queue.
pub async fn run_peer(
    cluster: String,
    me: u64,
    to: u64,
    addr: String,
    mut rx: mpsc::Receiver<Message>,
    node: NodeHandle,
    security: Security,
) {
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    let mut rng = seeded_rng((me << 32) ^ to);
    let mut first: Option<Message> = None;
    loop {
        let msg = match first.take() {
            Some(m) => m,
            None => match rx.recv().await {
                Some(m) => m,
                None => return,
            },
        };
        let endpoint = match security.endpoint(&addr) {
            // HTTP/2 keepalive finds a silently dead peer in seconds, not at TCP's timeout.
            Ok(e) => e
                .connect_timeout(Duration::from_millis(500))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(1))
                .keep_alive_timeout(Duration::from_secs(2))
                .keep_alive_while_idle(true),
            Err(e) => {
                tracing::error!(to, addr, error = %e, "bad peer address; raft messages to it are dropped");
                return;
            }
        };
        let channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(to, addr, error = %e, "peer unreachable");
                lost(&node, to, std::slice::from_ref(&msg));
                // Drop what queued up meanwhile: raft will send fresher messages.
                while let Ok(m) = rx.try_recv() {
                    lost(&node, to, std::slice::from_ref(&m));
                }
                tokio::time::sleep(backoff.next_delay(&mut rng)).await;
                continue;
            }
        };
        backoff.reset();
        let mut client = RaftClient::new(channel)
            .max_encoding_message_size(MAX_RAFT_BYTES)
            .max_decoding_message_size(MAX_RAFT_BYTES);
        let (tx, stream_rx) = mpsc::channel::<v1::RaftBatch>(64);
        let call = tokio::spawn(async move { client.send(ReceiverStream::new(stream_rx)).await });
        let mut next = Some(msg);
        loop {
            let m = match next.take() {
                Some(m) => m,
                None => match rx.recv().await {
                    Some(m) => m,
                    None => {
                        call.abort();
                        return;
                    }
                },
            };
            let mut batch = vec![m];
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let (batch, messages) = encode_batch(&node, to, batch);
            if batch.is_empty() {
                continue;
            }
            let rb = v1::RaftBatch { cluster: cluster.clone(), from: me, to, messages };
            if tx.send(rb).await.is_err() {
                lost(&node, to, &batch);
                break;
            }
            for m in &batch {
                if m.get_msg_type() == MessageType::MsgSnapshot {
                    node.send_raft(NodeRequest::SnapshotSent(to, true));
                }
            }
        }
        if let Ok(Err(status)) = call.await {
            tracing::debug!(to, addr, %status, "raft stream ended");
        }
        tokio::time::sleep(backoff.next_delay(&mut rng)).await;
    }
}

/// Encodes a batch: (the messages encoded, their bytes). A message that cannot be encoded is
/// never sent as empty bytes: it is logged and reported lost, like a dropped one (raft
/// resends; a snapshot is reported failed).
fn encode_batch(node: &NodeHandle, to: u64, batch: Vec<Message>) -> (Vec<Message>, Vec<Vec<u8>>) {
    let mut sent = Vec::with_capacity(batch.len());
    let mut bytes = Vec::with_capacity(batch.len());
    for m in batch {
        match tessera_replica::codec::encode_message(&m) {
            Ok(b) => {
                sent.push(m);
                bytes.push(b);
            }
            Err(e) => {
                tracing::error!(to, msg_type = ?m.get_msg_type(), error = %e, "raft message not encodable; dropped");
                lost(node, to, std::slice::from_ref(&m));
            }
        }
    }
    (sent, bytes)
}

fn lost(node: &NodeHandle, to: u64, msgs: &[Message]) {
    node.send_raft(NodeRequest::Unreachable(to));
    for m in msgs {
        if m.get_msg_type() == MessageType::MsgSnapshot {
            node.send_raft(NodeRequest::SnapshotSent(to, false));
        }
    }
}

/// The receiving side: `Raft.Send`.
#[derive(Debug)]
pub struct RaftService {
    /// Cluster identity.
    pub cluster: String,
    /// This replica.
    pub id: u64,
    /// The driver.
    pub node: NodeHandle,
    /// How peers are authenticated.
    pub security: Security,
    /// Refused peers are audited.
    pub audit: std::sync::Arc<crate::authz::AuditLog>,
}

#[tonic::async_trait]
impl v1::raft_server::Raft for RaftService {
    async fn send(&self, req: Request<Streaming<v1::RaftBatch>>) -> Result<Response<v1::RaftAck>, Status> {
        // Before any message is decoded: only a replica of this cluster's CA speaks raft.
        let who = tessera_proto::tls::caller_of(&self.security, &req).map_err(|e| {
            self.audit.record(None, "Raft.Send", "", &Err(e.to_string()));
            Status::unauthenticated(e.to_string())
        })?;
        let verdict = crate::authz::check(&who, &crate::authz::Action::Raft);
        if let Err(why) = verdict {
            self.audit.record(Some(&who), "Raft.Send", "", &Err(why.clone()));
            return Err(Status::permission_denied(why));
        }
        let mut stream = req.into_inner();
        while let Some(b) = stream.message().await? {
            if b.cluster != self.cluster {
                return Err(Status::permission_denied(format!(
                    "raft batch for cluster `{}`, this replica belongs to `{}`",
                    b.cluster, self.cluster
                )));
            }
            if b.to != self.id {
                return Err(Status::invalid_argument(format!("raft batch for replica {}, this is {}", b.to, self.id)));
            }
            // Any replica of this cluster may send: a replica that missed the membership change
            // adding the current leader must still hear from it to catch up. (The raft port is
            // for replicas only; see the module docs.)
            if b.from == 0 || b.from == self.id {
                return Err(Status::invalid_argument(format!("raft batch from replica {}", b.from)));
            }
            let mut msgs = Vec::with_capacity(b.messages.len());
            for bytes in &b.messages {
                let m = Message::parse_from_bytes(bytes)
                    .map_err(|e| Status::invalid_argument(format!("undecodable raft message: {e}")))?;
                if m.from != b.from || m.to != self.id {
                    return Err(Status::invalid_argument(format!(
                        "raft message from {} to {} inside a batch from {} to {}",
                        m.from, m.to, b.from, self.id
                    )));
                }
                msgs.push(m);
            }
            // Beyond the raft queue's bound the batch is dropped: raft resends.
            self.node.send_raft(NodeRequest::Raft(msgs));
        }
        Ok(Response::new(v1::RaftAck {}))
    }
}
