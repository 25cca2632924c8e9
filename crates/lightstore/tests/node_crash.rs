//! Several clients write concurrently under `sync` durability (SET, DEL and
//! MSET of their own keys, each read back after its reply) while the node
//! is killed with SIGKILL at a random moment, again and again. Each client
//! owns its keys and is their oracle: after every restart a key holds its
//! last acknowledged value or one of the writes that were in flight.

mod node_support;

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use node_support::{encode, read_reply, Node, Resp};

const CLIENTS: u64 = 4;
const KEYS_PER_CLIENT: u64 = 30;
const KILLS: u64 = 8;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

#[derive(Clone, Default)]
struct Slot {
    acked: Option<Vec<u8>>,
    in_flight: Vec<Option<Vec<u8>>>,
}

type Oracle = HashMap<u64, Slot>;

fn key(client: u64, k: u64) -> Vec<u8> {
    format!("c{client}:k{k:03}").into_bytes()
}

/// Sends one request; an I/O error means the node is gone.
fn try_call(conn: &mut BufReader<TcpStream>, args: &[&[u8]]) -> std::io::Result<Resp> {
    conn.get_mut().write_all(&encode(args))?;
    read_reply(conn)
}

/// Writes until the node dies; returns the oracle of this client's keys.
fn client(port: u16, id: u64, round: u64, mut oracle: Oracle) -> Oracle {
    let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return oracle;
    };
    let mut conn = BufReader::new(stream);
    let mut rng = Rng(0x9E37_79B9 ^ (id << 32) ^ (round << 8) ^ 1);
    for version in 0u64.. {
        let value = |k: u64, rng: &mut Rng| -> Vec<u8> {
            let len = 1 + rng.below(3000) as usize;
            let tag = format!("c{id}k{k}r{round}v{version}:");
            tag.bytes().cycle().take(len.max(tag.len())).collect()
        };
        let ops: Vec<(u64, Option<Vec<u8>>)> = match rng.below(10) {
            0..=5 => {
                let k = rng.below(KEYS_PER_CLIENT);
                vec![(k, Some(value(k, &mut rng)))]
            }
            6 => vec![(rng.below(KEYS_PER_CLIENT), None)],
            _ => {
                let mut ks: Vec<u64> = (0..2 + rng.below(3))
                    .map(|_| rng.below(KEYS_PER_CLIENT))
                    .collect();
                ks.sort_unstable();
                ks.dedup();
                ks.into_iter()
                    .map(|k| (k, Some(value(k, &mut rng))))
                    .collect()
            }
        };
        let keys: Vec<Vec<u8>> = ops.iter().map(|(k, _)| key(id, *k)).collect();
        let reply = match &ops[..] {
            [(_, None)] => try_call(&mut conn, &[b"DEL", &keys[0]]),
            [(_, Some(v))] => try_call(&mut conn, &[b"SET", &keys[0], v]),
            _ => {
                let mut args: Vec<&[u8]> = vec![b"MSET"];
                for (i, (_, v)) in ops.iter().enumerate() {
                    args.push(&keys[i]);
                    args.push(v.as_deref().unwrap_or_default());
                }
                try_call(&mut conn, &args)
            }
        };
        match reply {
            Ok(Resp::Simple(_)) | Ok(Resp::Int(_)) => {
                for (k, v) in &ops {
                    let slot = oracle.entry(*k).or_default();
                    slot.acked = v.clone();
                    slot.in_flight.clear();
                }
            }
            Ok(other) => panic!("client {id}: unexpected reply {other:?}"),
            Err(_) => {
                for (k, v) in ops {
                    oracle.entry(k).or_default().in_flight.push(v);
                }
                return oracle;
            }
        }
        // Read one of them back: only this client writes its keys.
        let i = rng.below(ops.len() as u64) as usize;
        let want = match &oracle[&ops[i].0].acked {
            Some(v) => Resp::Bulk(v.clone()),
            None => Resp::Nil,
        };
        match try_call(&mut conn, &[b"GET", &keys[i]]) {
            Ok(got) => assert_eq!(got, want, "client {id}: read back {}", ops[i].0),
            Err(_) => return oracle,
        }
    }
    oracle
}

fn check(node: &Node, oracles: &mut [Oracle], what: &str) {
    let mut conn = BufReader::new(node.connect());
    for (id, oracle) in oracles.iter_mut().enumerate() {
        for (k, slot) in oracle.iter_mut() {
            let got = match try_call(&mut conn, &[b"GET", &key(id as u64, *k)]) {
                Ok(Resp::Bulk(v)) => Some(v),
                Ok(Resp::Nil) => None,
                other => panic!("{what}: GET c{id}:k{k}: {other:?}"),
            };
            assert!(
                got == slot.acked || slot.in_flight.contains(&got),
                "{what}: key c{id}:k{k:03} lost or wrong"
            );
            *slot = Slot {
                acked: got,
                in_flight: Vec::new(),
            };
        }
    }
}

#[test]
fn concurrent_clients_lose_nothing_acknowledged_across_kill_9() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut oracles: Vec<Oracle> = (0..CLIENTS).map(|_| Oracle::new()).collect();
    let mut rng = Rng(0x5EED);
    for round in 0..KILLS {
        let mut node = Node::start_in(tmp.path(), &["--durability", "sync"]).expect("node starts");
        check(&node, &mut oracles, &format!("after kill {round}"));
        let port = node.port;
        let clients: Vec<_> = std::mem::take(&mut oracles)
            .into_iter()
            .enumerate()
            .map(|(id, o)| std::thread::spawn(move || client(port, id as u64, round, o)))
            .collect();
        std::thread::sleep(Duration::from_millis(200 + rng.below(600)));
        node.child.kill().expect("SIGKILL"); // no clean shutdown
        node.child.wait().expect("wait");
        oracles = clients
            .into_iter()
            .map(|c| c.join().expect("client thread"))
            .collect();
    }
    let node = Node::start_in(tmp.path(), &[]).expect("node restarts");
    check(&node, &mut oracles, "at the end");
    let keys: usize = oracles.iter().map(|o| o.len()).sum();
    assert!(keys > 40, "only {keys} keys written");
}
