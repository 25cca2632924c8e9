//! Feeds arbitrary bytes to the RESP request parser, whole and split in two:
//! it must never panic, splitting must not change what it parses, and what
//! it says a request holds stays within `max_request`.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use protocol::{Limits, RequestParser};

fn parse(chunks: &[&[u8]]) -> (Vec<Vec<bytes::Bytes>>, bool) {
    let limits = Limits {
        max_bulk: 1 << 20,
        max_args: 1 << 12,
        max_inline: 1 << 12,
        max_request: 1 << 21,
    };
    let mut p = RequestParser::new(limits);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for c in chunks {
        buf.extend_from_slice(c);
        loop {
            match p.next_request(&mut buf) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {
                    assert!(p.request_bytes() <= limits.max_request);
                    assert!(p.request_bytes_read() <= p.request_bytes());
                    break;
                }
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

fuzz_target!(|data: &[u8]| {
    let whole = parse(&[data]);
    let mid = data.len() / 2;
    let split = parse(&[&data[..mid], &data[mid..]]);
    if !whole.1 && !split.1 {
        assert_eq!(whole.0, split.0);
    }
});
