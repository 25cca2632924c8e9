//! Feeds arbitrary bytes to the NBD server's decoders: the request header,
//! INFO/GO option data and LIST/SET_META_CONTEXT option data. They must
//! never panic; a header that parses must encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd::proto::{parse_info, parse_meta, Request, REQUEST_LEN};

fuzz_target!(|data: &[u8]| {
    if let Some(head) = data.get(..REQUEST_LEN) {
        let head: &[u8; REQUEST_LEN] = head.try_into().expect("28 bytes");
        if let Some(r) = Request::parse(head) {
            assert_eq!(&r.encode(), head);
        }
    }
    let _ = parse_info(data);
    let _ = parse_meta(data);
});
