//! Errors of the cluster client.

use std::time::Duration;

/// What a cluster call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The cluster description is unusable (no nodes, bad address, ...).
    #[error("cluster configuration: {0}")]
    Config(String),
    /// A node could not be reached or the connection broke.
    #[error("node {node}: {source}")]
    Io {
        /// The node's address.
        node: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A node did not answer in time.
    #[error("node {node}: no answer within {timeout:?}")]
    Timeout {
        /// The node's address.
        node: String,
        /// The configured call timeout.
        timeout: Duration,
    },
    /// A node sent bytes that are not RESP.
    #[error("node {node}: {source}")]
    Protocol {
        /// The node's address.
        node: String,
        /// What was wrong.
        source: protocol::ReplyError,
    },
    /// A node answered with an error reply.
    #[error("node {node}: {message}")]
    Server {
        /// The node's address.
        node: String,
        /// The error text (for example `ERR NOSPACE ...`).
        message: String,
    },
    /// A node answered with a reply of the wrong shape.
    #[error("node {node}: unexpected reply to {command}: {reply}")]
    UnexpectedReply {
        /// The node's address.
        node: String,
        /// The command sent.
        command: String,
        /// The reply, abbreviated.
        reply: String,
    },
    /// Fewer replicas acknowledged a write than the write quorum asks.
    #[error("write reached {acked} of the {needed} replicas it needs: {last}")]
    Quorum {
        /// Replicas that acknowledged.
        acked: usize,
        /// Replicas needed.
        needed: usize,
        /// The last replica error.
        last: Box<ClientError>,
    },
    /// A node restarted without a clean stop after it acknowledged writes
    /// that were not yet durable and that no other replica took (see
    /// `runs.rs`): they may be lost. Reported once to each writer, by its
    /// next sync ([`crate::LossCursor`]).
    #[error("node {node}: {why}")]
    LostWrites {
        /// The node's address.
        node: String,
        /// What it acknowledged, and which runs.
        why: String,
    },
    /// Every replica of a key (or too many nodes for a range) is down.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl ClientError {
    /// Whether the error means the node is unreachable or misbehaving (as
    /// opposed to answering an error for this request): such a node is
    /// marked down and the request fails over to another replica.
    pub fn is_node_failure(&self) -> bool {
        matches!(
            self,
            ClientError::Io { .. } | ClientError::Timeout { .. } | ClientError::Protocol { .. }
        )
    }
}

/// Result of cluster calls.
pub type Result<T> = std::result::Result<T, ClientError>;
