//! `protocol` — RESP, the Redis serialization protocol, as LightStore nodes
//! speak it: an incremental, zero-copy request parser (multibulk and inline
//! commands) with hard limits on every length, and a reply encoder for RESP2
//! and RESP3; the client side (request encoding, a bounded reply decoder);
//! the versioned-value layout and the shared-memory contract the cluster
//! client and nodes share. It owns bytes-on-the-wire only; what commands
//! mean is the server's business.
#![deny(missing_docs)]

mod decode;
mod error;
mod parse;
mod reply;
mod scan;
pub mod shm;
pub mod versioned;
mod wire;

pub use decode::{
    decode_reply, encode_request, reply_size_hint, ReplyError, RequestSink, MAX_REPLY_BULK,
    MAX_REPLY_DEPTH, MAX_REPLY_ELEMENTS,
};
pub use error::ProtocolError;
pub use parse::{Limits, RequestParser, ARG_OVERHEAD};
pub use reply::{Reply, RespVersion, Sink};
pub use scan::ReplyScan;
pub use wire::Wire;
