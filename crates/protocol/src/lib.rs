//! `protocol` — RESP, the Redis serialization protocol, as LightStore nodes
//! speak it: an incremental, zero-copy request parser (multibulk and inline
//! commands) with hard limits on every length, and a reply encoder for RESP2
//! and RESP3. It owns bytes-on-the-wire only; what commands mean is the
//! server's business.
#![deny(missing_docs)]

mod error;
mod parse;
mod reply;

pub use error::ProtocolError;
pub use parse::{Limits, RequestParser};
pub use reply::{Reply, RespVersion};
