//! The NBD wire protocol (fixed newstyle, `doc/proto.md` of the NBD
//! project): constants, and pure functions that parse what a client sends
//! and encode what the server answers. No I/O here, so every decoder is
//! unit-tested and fuzzed on its own.

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: after the greeting, and before every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of every request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
/// The server will not pad the EXPORT_NAME reply with zeros if asked.
pub const FLAG_NO_ZEROES: u16 = 2;
/// Client flags.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1;
/// The client wants no zero padding after EXPORT_NAME.
pub const FLAG_C_NO_ZEROES: u32 = 2;

/// Options.
pub mod opt {
    /// Select an export, old style (no reply header, no errors).
    pub const EXPORT_NAME: u32 = 1;
    /// End the handshake.
    pub const ABORT: u32 = 2;
    /// List exports.
    pub const LIST: u32 = 3;
    /// Start TLS (not offered).
    pub const STARTTLS: u32 = 5;
    /// Describe an export.
    pub const INFO: u32 = 6;
    /// Describe and select an export.
    pub const GO: u32 = 7;
    /// Use structured replies.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Select metadata contexts.
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
pub mod rep {
    /// Done.
    pub const ACK: u32 = 1;
    /// One export of a LIST.
    pub const SERVER: u32 = 2;
    /// One piece of export information.
    pub const INFO: u32 = 3;
    /// One metadata context.
    pub const META_CONTEXT: u32 = 4;
    /// Unknown option.
    pub const ERR_UNSUP: u32 = 0x8000_0001;
    /// Forbidden by policy.
    pub const ERR_POLICY: u32 = 0x8000_0002;
    /// Malformed.
    pub const ERR_INVALID: u32 = 0x8000_0003;
    /// No such export.
    pub const ERR_UNKNOWN: u32 = 0x8000_0006;
    /// The server is shutting down.
    pub const ERR_SHUTDOWN: u32 = 0x8000_0007;
    /// Too big to answer.
    pub const ERR_TOO_BIG: u32 = 0x8000_0009;
}

/// Information types of INFO/GO.
pub mod info {
    /// Size and transmission flags (always sent).
    pub const EXPORT: u16 = 0;
    /// Canonical name.
    pub const NAME: u16 = 1;
    /// Description.
    pub const DESCRIPTION: u16 = 2;
    /// Block size constraints.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags.
pub mod tflag {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1;
    /// Read-only export.
    pub const READ_ONLY: u16 = 1 << 1;
    /// FLUSH supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// FUA supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// TRIM supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// WRITE_ZEROES supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// Flush and FUA are visible on every connection.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// CACHE supported.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// WRITE_ZEROES with FAST_ZERO supported.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Commands.
pub mod cmd {
    /// Read.
    pub const READ: u16 = 0;
    /// Write (payload follows).
    pub const WRITE: u16 = 1;
    /// Disconnect.
    pub const DISC: u16 = 2;
    /// Flush.
    pub const FLUSH: u16 = 3;
    /// Discard.
    pub const TRIM: u16 = 4;
    /// Prefetch.
    pub const CACHE: u16 = 5;
    /// Write zeros.
    pub const WRITE_ZEROES: u16 = 6;
    /// Allocation status.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cflag {
    /// Force unit access.
    pub const FUA: u16 = 1;
    /// WRITE_ZEROES: keep the range allocated.
    pub const NO_HOLE: u16 = 1 << 1;
    /// READ: do not fragment.
    pub const DF: u16 = 1 << 2;
    /// BLOCK_STATUS: one extent.
    pub const REQ_ONE: u16 = 1 << 3;
    /// WRITE_ZEROES: fail unless fast.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunk types and flags.
pub mod chunk {
    /// Last chunk of a reply.
    pub const FLAG_DONE: u16 = 1;
    /// No payload.
    pub const NONE: u16 = 0;
    /// Data at an offset.
    pub const OFFSET_DATA: u16 = 1;
    /// Extents of a metadata context.
    pub const BLOCK_STATUS: u16 = 5;
    /// An error.
    pub const ERROR: u16 = 0x8001;
}

/// `base:allocation` status bits.
pub const STATE_HOLE: u32 = 1;
/// Reads as zeros.
pub const STATE_ZERO: u32 = 2;
/// The one metadata context served, and the id it gets.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Context id of `base:allocation`.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// A request header (28 bytes; WRITE's payload follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Command flags.
    pub flags: u16,
    /// Command.
    pub kind: u16,
    /// Opaque id echoed in the reply.
    pub handle: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u32,
}

/// Bytes of a request header.
pub const REQUEST_LEN: usize = 28;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

impl Request {
    /// Parses a header; `None` when the magic is wrong (the stream cannot
    /// be resynchronised: the connection is closed).
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Option<Request> {
        (be32(b, 0) == REQUEST_MAGIC).then(|| Request {
            flags: be16(b, 4),
            kind: be16(b, 6),
            handle: be64(b, 8),
            offset: be64(b, 16),
            length: be32(b, 24),
        })
    }

    /// Encodes it (for tests and fuzzing).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// An option reply.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// A simple reply header (READ data, if any, follows).
pub fn simple_reply(error: u32, handle: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b
}

/// A structured reply chunk header for `len` payload bytes.
pub fn chunk_header(flags: u16, kind: u16, handle: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(20);
    b.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// A final ERROR chunk.
pub fn error_chunk(handle: u64, error: u32, message: &str) -> Vec<u8> {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut b = chunk_header(chunk::FLAG_DONE, chunk::ERROR, handle, 6 + msg.len() as u32);
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// An INFO/GO request: the export name and the information asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name.
    pub name: String,
    /// Information types asked for.
    pub requests: Vec<u16>,
}

/// Parses INFO/GO data; `None` if the lengths do not add up or the name is
/// not UTF-8.
pub fn parse_info(data: &[u8]) -> Option<InfoRequest> {
    let name_len = be32(data.get(..4)?, 0) as usize;
    let rest = data.get(4..)?;
    let name = std::str::from_utf8(rest.get(..name_len)?).ok()?.to_string();
    let rest = &rest[name_len..];
    let n = be16(rest.get(..2)?, 0) as usize;
    let list = rest.get(2..)?;
    if list.len() != 2 * n {
        return None;
    }
    let requests = list.chunks_exact(2).map(|c| be16(c, 0)).collect();
    Some(InfoRequest { name, requests })
}

/// A LIST/SET_META_CONTEXT request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest {
    /// Export name.
    pub name: String,
    /// Queries.
    pub queries: Vec<String>,
}

/// Parses LIST/SET_META_CONTEXT data; `None` if malformed.
pub fn parse_meta(data: &[u8]) -> Option<MetaRequest> {
    let name_len = be32(data.get(..4)?, 0) as usize;
    let mut rest = data.get(4..)?;
    let name = std::str::from_utf8(rest.get(..name_len)?).ok()?.to_string();
    rest = &rest[name_len..];
    let n = be32(rest.get(..4)?, 0) as usize;
    rest = &rest[4..];
    let mut queries = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let len = be32(rest.get(..4)?, 0) as usize;
        let q = std::str::from_utf8(rest.get(4..4 + len)?).ok()?.to_string();
        rest = &rest[4 + len..];
        queries.push(q);
    }
    rest.is_empty().then_some(MetaRequest { name, queries })
}

/// `NBD_INFO_EXPORT` payload.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&info::EXPORT.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b
}

/// `NBD_INFO_BLOCK_SIZE` payload.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(14);
    b.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    for v in [min, preferred, max] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b
}

/// `NBD_INFO_NAME` payload.
pub fn info_name(name: &str) -> Vec<u8> {
    let mut b = info::NAME.to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b
}

/// `NBD_REP_SERVER` data for one export.
pub fn rep_server(name: &str) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b
}

/// `NBD_REP_META_CONTEXT` data.
pub fn rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = id.to_be_bytes().to_vec();
    b.extend_from_slice(name.as_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_magic_is_refused() {
        let r = Request {
            flags: cflag::FUA,
            kind: cmd::WRITE,
            handle: 0xdead_beef_0000_0001,
            offset: 1 << 40,
            length: 4096,
        };
        assert_eq!(Request::parse(&r.encode()), Some(r));
        let mut bad = r.encode();
        bad[0] ^= 1;
        assert_eq!(Request::parse(&bad), None);
    }

    #[test]
    fn info_requests_parse_only_when_lengths_add_up() {
        let mut d = 4u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"vol1");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&info::NAME.to_be_bytes());
        assert_eq!(
            parse_info(&d),
            Some(InfoRequest {
                name: "vol1".into(),
                requests: vec![info::BLOCK_SIZE, info::NAME]
            })
        );
        assert_eq!(parse_info(&d[..d.len() - 1]), None, "short list");
        let mut long = d.clone();
        long.push(0);
        assert_eq!(parse_info(&long), None, "trailing byte");
        assert_eq!(parse_info(&[0, 0, 0, 99]), None, "name past the end");
        assert_eq!(parse_info(&[]), None);
    }

    #[test]
    fn meta_requests_parse() {
        let mut d = 1u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"v");
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&15u32.to_be_bytes());
        d.extend_from_slice(b"base:allocation");
        assert_eq!(
            parse_meta(&d),
            Some(MetaRequest {
                name: "v".into(),
                queries: vec!["base:allocation".into()]
            })
        );
        assert_eq!(parse_meta(&d[..d.len() - 2]), None);
        let mut huge = 1u32.to_be_bytes().to_vec();
        huge.extend_from_slice(b"v");
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_meta(&huge), None, "claims 4G queries, has none");
    }
}

#[cfg(test)]
mod property_tests {
    use super::*;

    proptest::proptest! {
        /// Arbitrary option data never panics the decoders, and a request
        /// header that parses encodes back to the same bytes.
        #[test]
        fn decoders_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = parse_info(&data);
            let _ = parse_meta(&data);
            if let Some(head) = data.get(..REQUEST_LEN) {
                let mut h = [0u8; REQUEST_LEN];
                h.copy_from_slice(head);
                h[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
                let r = Request::parse(&h).expect("magic set");
                proptest::prop_assert_eq!(r.encode(), h);
            }
        }
    }
}
