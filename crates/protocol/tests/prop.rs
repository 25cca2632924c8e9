//! Property tests: any request encodes and parses back identically however
//! the bytes are split, and arbitrary bytes never make the parser panic.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use protocol::{Limits, RequestParser};

fn encode(req: &[Vec<u8>]) -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_slice(format!("*{}\r\n", req.len()).as_bytes());
    for a in req {
        out.put_slice(format!("${}\r\n", a.len()).as_bytes());
        out.put_slice(a);
        out.put_slice(b"\r\n");
    }
    out.to_vec()
}

proptest! {
    #[test]
    fn roundtrip_with_arbitrary_splits(
        reqs in prop::collection::vec(prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6), 1..8),
        cuts in prop::collection::vec(1usize..17, 1..64),
    ) {
        let wire: Vec<u8> = reqs.iter().flat_map(|r| encode(r)).collect();
        let mut p = RequestParser::new(Limits::default());
        let mut buf = BytesMut::new();
        let mut got: Vec<Vec<Bytes>> = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < wire.len() {
            let n = cuts[i % cuts.len()].min(wire.len() - at);
            buf.extend_from_slice(&wire[at..at + n]);
            at += n;
            i += 1;
            while let Some(r) = p.next_request(&mut buf).expect("valid input") {
                got.push(r);
            }
        }
        let want: Vec<Vec<Bytes>> = reqs.iter().map(|r| r.iter().map(|a| Bytes::copy_from_slice(a)).collect()).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut p = RequestParser::new(Limits { max_bulk: 1 << 16, max_args: 1 << 10, max_inline: 1 << 10, max_request: 1 << 18 });
        let mut buf = BytesMut::from(&bytes[..]);
        for _ in 0..64 {
            match p.next_request(&mut buf) {
                Ok(Some(_)) => continue,
                Ok(None) => {
                    prop_assert!(p.request_bytes() <= 1 << 18);
                    prop_assert!(p.request_bytes_read() <= p.request_bytes());
                    break;
                }
                Err(_) => break,
            }
        }
    }
}
