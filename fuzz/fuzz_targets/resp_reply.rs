//! Feeds arbitrary bytes to the client's RESP reply decoder: it must never
//! panic, and any prefix of a decodable reply must read as "incomplete" or
//! as an error, never as a different reply.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use protocol::decode_reply;

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    if let Ok(Some((_, used))) = decode_reply(&buf) {
        assert!(used <= buf.len());
        let again = decode_reply(&buf.slice(..used));
        assert!(matches!(again, Ok(Some((_, n))) if n == used));
        for cut in [used / 2, used.saturating_sub(1)] {
            if cut < used {
                assert!(matches!(decode_reply(&buf.slice(..cut)), Ok(None) | Err(_)));
            }
        }
    }
});
