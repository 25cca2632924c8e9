//! Engine commands, run on the executor pool: SET, GET, MSET, MGET, DEL,
//! EXISTS, STRLEN, GETRANGE, SCAN, RANGE, DBSIZE (INFO via `info`, VSET and
//! VDEL via `vcmd`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use engine::{BatchOp, Tagging, ValueMeta};
use protocol::Reply;

use crate::cmd::errors::{self, int};
use crate::cmd::Cmd;
use crate::glob::Glob;
use crate::reserved::{read_visible, visible_parts};
use crate::state::NodeState;

/// Default and largest COUNT of one SCAN call (keys only: no value is read).
const SCAN_DEFAULT_COUNT: usize = 10;
const SCAN_MAX_COUNT: usize = 1000;
/// Default and largest LIMIT of one RANGE call.
const RANGE_DEFAULT_LIMIT: usize = 1000;
const RANGE_MAX_LIMIT: usize = 100_000;
/// DBSIZE counts keys exactly up to this many, then reports this bound.
pub const DBSIZE_CAP: usize = 10_000;
/// Keys read per engine scan while counting.
const DBSIZE_CHUNK: usize = 32;
/// Value bytes one connection's pipelined requests may have read and not yet
/// sent: the executor answers a prefix of a batch within this (at least one
/// request), the connection writes those replies and only then asks for the
/// rest. So a client that pipelines thousands of GETs of large values, and
/// reads slowly or not at all, holds at most this plus one value in the
/// node, not all the values its requests name.
pub const REPLY_BUDGET: usize = 4 << 20;

/// Runs one engine command. `args[0]` is the command name; the arity was checked.
pub fn execute(state: &NodeState, cmd: Cmd, args: &[Bytes]) -> Reply {
    let result = match cmd {
        Cmd::Set => set(state, args),
        Cmd::Get => state.db.get(&args[1]).map(get_reply),
        Cmd::Mset => mset(state, args),
        Cmd::Mget => mget(state, args),
        Cmd::Del => del(state, args),
        Cmd::Exists => {
            let keys: Vec<&[u8]> = args[1..].iter().map(|k| &k[..]).collect();
            state
                .db
                .multi_get(&keys)
                .map(|vals| Reply::Integer(vals.iter().filter(|v| v.is_some()).count() as i64))
        }
        Cmd::Strlen => state
            .db
            .get(&args[1])
            .map(|v| Reply::Integer(v.map_or(0, |v| v.len() as i64))),
        Cmd::Getrange => getrange(state, args),
        Cmd::Scan => scan(state, args),
        Cmd::Range => range(state, args),
        Cmd::Vset => crate::vcmd::vwrite(state, args, false),
        Cmd::Vdel => crate::vcmd::vwrite(state, args, true),
        Cmd::Vbatch => crate::vcmd::vbatch(state, args),
        Cmd::Vcas => crate::vcmd::vcas(state, args),
        Cmd::Vmeta => crate::vcmd::vmeta(state, args),
        // Every write this node acknowledged before, durable on its device
        // whatever `--durability` says (the adapters' FLUSH and fsync).
        Cmd::Fsync => state.db.sync().map(|()| Reply::ok()),
        Cmd::Recluster => recluster(state, args),
        Cmd::Hint => crate::hints::hint(state, args),
        Cmd::Dbsize => dbsize(state).map(|n| Reply::Integer(n as i64)),
        Cmd::Info => Ok(crate::info::info(state, args)),
        _ => Ok(errors::unknown_command(args)),
    };
    result.unwrap_or_else(|e| errors::engine(&e))
}

/// `RECLUSTER [start end]`: rewrites the small values of the keys in
/// `[start, end)` (all keys without arguments; an empty `end` runs to the
/// last key) in key order, so range reads of them read long runs of the
/// device (see the engine's `recluster.rs`). Answers when done, with what
/// it did: `keys`, `rewritten`, `bytes`, `stopped_for_space`.
fn recluster(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let (start, end): (&[u8], &[u8]) = match args.len() {
        1 => (b"", b""),
        3 => (&args[1], &args[2]),
        _ => return Ok(errors::wrong_args("recluster")),
    };
    let s = state.db.recluster(start, end)?;
    let field = |name: &str, v: u64| [Reply::bulk(name.as_bytes()), Reply::Integer(v as i64)];
    Ok(Reply::Array(
        [
            field("keys", s.keys),
            field("rewritten", s.rewritten),
            field("bytes", s.bytes),
            field("stopped_for_space", u64::from(s.stopped_for_space)),
        ]
        .into_iter()
        .flatten()
        .collect(),
    ))
}

/// Runs the engine commands of one pipelined batch in order. Runs of plain
/// GETs become one multi-get (their values are read from the device in
/// parallel) and runs of plain `SET k v` one atomic write batch (one log
/// append and, under `sync` durability, one device sync); a run whose
/// combined call fails is retried command by command so every reply carries
/// its own error. Returns each reply with its share of engine time: for a
/// prefix of the batch (at least one command) once the replies reach
/// [`REPLY_BUDGET`]; the caller sends them and asks for the rest.
pub fn execute_batch(state: &NodeState, jobs: &[(Cmd, Vec<Bytes>)]) -> Vec<(Reply, CallTime)> {
    let mut out = Vec::with_capacity(jobs.len());
    let mut bytes = 0usize;
    let mut i = 0;
    while i < jobs.len() && bytes < REPLY_BUDGET {
        let kind = group_kind(&jobs[i]);
        let mut j = i + 1;
        while kind.is_some() && j < jobs.len() && group_kind(&jobs[j]) == kind {
            j += 1;
        }
        let run = &jobs[i..j];
        let clock = CallClock::start();
        let grouped = match kind {
            Some(Group::Get) if run.len() > 1 => get_run(state, run),
            Some(Group::Set) if run.len() > 1 => set_run(state, run),
            Some(Group::Versioned) if run.len() > 1 => crate::vcmd::vwrite_run(state, run),
            _ => None,
        };
        match grouped {
            Some(replies) => {
                let share = clock.stop().share(replies.len());
                let answered = replies.len();
                bytes += replies.iter().map(reply_bytes).sum::<usize>();
                out.extend(replies.into_iter().map(|r| (r, share)));
                if answered < run.len() {
                    break; // the run's values reached the budget
                }
            }
            None => {
                for (cmd, args) in run {
                    let clock = CallClock::start();
                    let r = execute(state, *cmd, args);
                    bytes += reply_bytes(&r);
                    out.push((r, clock.stop()));
                    if bytes >= REPLY_BUDGET {
                        return out;
                    }
                }
            }
        }
        i = j;
    }
    out
}

/// About how many bytes a reply holds (its values; framing not counted).
pub fn reply_bytes(reply: &Reply) -> usize {
    match reply {
        Reply::Bulk(b) => b.len(),
        Reply::Status(t) | Reply::Error(t) | Reply::Verbatim(t) => t.len(),
        Reply::Array(items) => items.iter().map(reply_bytes).sum(),
        Reply::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| reply_bytes(k) + reply_bytes(v))
            .sum(),
        _ => 8,
    }
}

/// Time an engine call took on the executor, and the part of it spent
/// waiting for the device (reads, writes, syncs; see [`flash::iotime`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTime {
    /// Wall time of the call.
    pub total: Duration,
    /// Device time within `total`.
    pub device: Duration,
}

impl CallTime {
    /// This time divided equally among `n` requests.
    pub fn share(self, n: usize) -> CallTime {
        let n = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        CallTime {
            total: self.total / n,
            device: self.device / n,
        }
    }
}

/// Measures one engine call: wall time and this thread's device time.
struct CallClock(Instant);

impl CallClock {
    fn start() -> CallClock {
        let _ = flash::iotime::take();
        CallClock(Instant::now())
    }

    fn stop(self) -> CallTime {
        let total = self.0.elapsed();
        CallTime {
            total,
            device: flash::iotime::take().min(total),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Group {
    Get,
    Set,
    Versioned,
}

fn group_kind((cmd, args): &(Cmd, Vec<Bytes>)) -> Option<Group> {
    match cmd {
        Cmd::Get => Some(Group::Get),
        Cmd::Set if args.len() == 3 => Some(Group::Set),
        Cmd::Vset | Cmd::Vdel => Some(Group::Versioned),
        _ => None,
    }
}

/// Serves GET runs of several connections with one multi-get (their values
/// are read from the device in one batch), then answers each: each run as
/// far as its values fit [`REPLY_BUDGET`] (at least one GET). If the
/// combined call fails, each run is executed on its own so every reply
/// carries its own outcome. Each run is charged the whole call's time (it
/// waited for all of it), split equally among its GETs.
pub fn execute_gets(group: Vec<crate::exec::Run>) {
    let Some(state) = group.first().map(|r| r.state.clone()) else {
        return;
    };
    let queued: Vec<Duration> = group.iter().map(|r| r.submitted.elapsed()).collect();
    let keys: Vec<&[u8]> = group
        .iter()
        .flat_map(|r| r.cmds.iter().map(get_key))
        .collect();
    let lens: Vec<usize> = group.iter().map(|r| r.cmds.len()).collect();
    let clock = CallClock::start();
    let merged = state.db.multi_get_bounded(&keys, &lens, REPLY_BUDGET);
    let call = clock.stop();
    drop(keys);
    let mut values = merged.ok().map(Vec::into_iter);
    for (mut run, queued) in group.into_iter().zip(queued) {
        let share = call.share(run.cmds.len());
        let replies: Vec<(Reply, CallTime)> = match values.as_mut().and_then(Iterator::next) {
            Some(answered) => answered
                .into_iter()
                .map(|v| (get_reply(v), share))
                .collect(),
            None => execute_batch(&state, &run.cmds),
        };
        let rest = run.cmds.split_off(replies.len().min(run.cmds.len()));
        let _ = run.reply.send((replies, queued, Instant::now(), rest));
    }
}

/// Serves plain-SET runs of several connections with one atomic write
/// batch (one log append; under `sync` durability one device sync), then
/// answers each. If the combined batch fails (an invalid key, a full
/// device), each run is executed on its own so every reply carries its own
/// outcome. Each run is charged the whole batch's time (it waited for all
/// of it), split equally among its SETs.
pub fn execute_sets(group: Vec<crate::exec::Run>) {
    let Some(state) = group.first().map(|r| r.state.clone()) else {
        return;
    };
    let queued: Vec<Duration> = group.iter().map(|r| r.submitted.elapsed()).collect();
    let ops: Vec<BatchOp> = group
        .iter()
        .flat_map(|r| r.cmds.iter().map(set_op))
        .collect();
    let clock = CallClock::start();
    let merged = {
        let _shared = state.write_order.read();
        state.db.write_batch(&ops)
    };
    drop(ops);
    let call = clock.stop();
    for (mut run, queued) in group.into_iter().zip(queued) {
        let share = call.share(run.cmds.len());
        let replies = match &merged {
            Ok(()) => vec![(Reply::ok(), share); run.cmds.len()],
            // The merged batch already waited for GC; run by run, each
            // write would wait again for nothing.
            Err(e) if e.is_no_space() => vec![(errors::engine(e), share); run.cmds.len()],
            Err(_) => execute_batch(&state, &run.cmds),
        };
        let rest = run.cmds.split_off(replies.len().min(run.cmds.len()));
        let _ = run.reply.send((replies, queued, Instant::now(), rest));
    }
}

/// Runs a connection's run of plain SETs on the calling (network) thread
/// if the engine can take it without waiting ([`engine::Db::try_write_batch`]):
/// under `interval` durability a small SET is a copy into the log buffer
/// and a memtable insert, cheaper than the two thread hand-offs of the
/// executor pool. `None`, with nothing written, where it would wait or
/// fail; the caller then queues the run as usual.
pub fn try_sets_inline(
    state: &NodeState,
    run: &[(Cmd, Vec<Bytes>)],
) -> Option<Vec<(Reply, CallTime)>> {
    let _shared = state.write_order.try_read()?;
    let ops: Vec<BatchOp> = run.iter().map(set_op).collect();
    let clock = CallClock::start();
    let written = state.db.try_write_batch(&ops);
    let share = clock.stop().share(run.len());
    if !matches!(written, Ok(true)) {
        return None;
    }
    state
        .counters
        .inline_sets
        .fetch_add(run.len() as u64, std::sync::atomic::Ordering::Relaxed);
    Some(vec![(Reply::ok(), share); run.len()])
}

/// The key of a plain `GET key`.
fn get_key((_, args): &(Cmd, Vec<Bytes>)) -> &[u8] {
    &args[1]
}

/// A GET's reply.
pub fn get_reply(value: Option<Bytes>) -> Reply {
    value.map_or(Reply::Null, Reply::Bulk)
}

/// The write of a plain `SET key value`.
fn set_op((_, args): &(Cmd, Vec<Bytes>)) -> BatchOp {
    BatchOp::Put(args[1].clone(), args[2].clone())
}

/// A run of plain GETs as one multi-get, answered as far as its values fit
/// [`REPLY_BUDGET`] (at least one).
fn get_run(state: &NodeState, run: &[(Cmd, Vec<Bytes>)]) -> Option<Vec<Reply>> {
    let keys: Vec<&[u8]> = run.iter().map(get_key).collect();
    let mut vals = state
        .db
        .multi_get_bounded(&keys, &[keys.len()], REPLY_BUDGET)
        .ok()?;
    Some(vals.pop()?.into_iter().map(get_reply).collect())
}

/// MGET: all values, or an error when together they exceed the node's
/// `max_reply` (nothing past that bound is read; a single reply cannot be
/// split the way a pipeline can).
fn mget(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let keys: Vec<&[u8]> = args[1..].iter().map(|k| &k[..]).collect();
    note_multi_get(state, &keys);
    let mut vals = state
        .db
        .multi_get_bounded(&keys, &[keys.len()], state.max_reply())?;
    let vals = vals.pop().unwrap_or_default();
    if vals.len() < keys.len() {
        return Ok(Reply::err(format!(
            "reply too large: the values of these {} keys exceed max-reply ({} bytes); ask for fewer keys per MGET",
            keys.len(),
            state.max_reply()
        )));
    }
    Ok(Reply::Array(vals.into_iter().map(get_reply).collect()))
}

fn set_run(state: &NodeState, run: &[(Cmd, Vec<Bytes>)]) -> Option<Vec<Reply>> {
    let ops: Vec<BatchOp> = run.iter().map(set_op).collect();
    let _shared = state.write_order.read();
    state.db.write_batch(&ops).ok()?;
    Some(vec![Reply::ok(); run.len()])
}

/// SET key value [NX|XX] [GET] [KEEPTTL].
fn set(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let (key, value) = (&args[1], &args[2]);
    let (mut nx, mut xx, mut get) = (false, false, false);
    for opt in &args[3..] {
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GET" => get = true,
            b"KEEPTTL" => {}
            b"EX" | b"PX" | b"EXAT" | b"PXAT" => return Ok(errors::refused(b"SET EX/PX")),
            _ => return Ok(errors::syntax()),
        }
    }
    if nx && xx {
        return Ok(errors::syntax());
    }
    if !(nx || xx || get) {
        let _shared = state.write_order.read();
        state.db.put(key, value)?;
        return Ok(Reply::ok());
    }
    let _exclusive = state.write_order.write();
    let old = state.db.get(key)?;
    let write = (!nx || old.is_none()) && (!xx || old.is_some());
    if write {
        state.db.put(key, value)?;
    }
    Ok(match (get, write) {
        (true, _) => old.map_or(Reply::Null, Reply::Bulk),
        (false, true) => Reply::ok(),
        (false, false) => Reply::Null,
    })
}

/// MSET k v [k v ...]: one atomic batch.
fn mset(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    if args.len().is_multiple_of(2) {
        return Ok(errors::wrong_args("mset"));
    }
    let ops: Vec<BatchOp> = args[1..]
        .chunks_exact(2)
        .map(|kv| BatchOp::Put(kv[0].clone(), kv[1].clone()))
        .collect();
    let _shared = state.write_order.read();
    state.db.write_batch(&ops)?;
    Ok(Reply::ok())
}

/// DEL k...: deletes atomically, replies how many distinct keys existed.
fn del(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let mut keys: Vec<&[u8]> = args[1..].iter().map(|k| &k[..]).collect();
    keys.sort_unstable();
    keys.dedup();
    let _exclusive = state.write_order.write();
    let vals = state.db.multi_get(&keys)?;
    let ops: Vec<BatchOp> = keys
        .iter()
        .zip(&vals)
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| BatchOp::Delete(Bytes::copy_from_slice(k)))
        .collect();
    if !ops.is_empty() {
        state.db.write_batch(&ops)?;
    }
    Ok(Reply::Integer(ops.len() as i64))
}

/// The byte range `[from, to)` GETRANGE returns for a value of `len` bytes,
/// with Redis's rules for negative and out-of-range indexes.
pub fn getrange_bounds(len: usize, start: i64, end: i64) -> Option<(usize, usize)> {
    let len = i64::try_from(len).ok()?;
    if len == 0 || (start < 0 && end < 0 && start > end) {
        return None;
    }
    let s = if start < 0 { len + start } else { start }.max(0);
    let e = if end < 0 { len + end } else { end }.max(0).min(len - 1);
    if s > e {
        return None;
    }
    Some((usize::try_from(s).ok()?, usize::try_from(e + 1).ok()?))
}

/// GETRANGE key start end.
fn getrange(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let (Some(start), Some(end)) = (int(&args[2]), int(&args[3])) else {
        return Ok(errors::not_integer());
    };
    let v = state.db.get(&args[1])?.unwrap_or_default();
    Ok(match getrange_bounds(v.len(), start, end) {
        Some((a, b)) => Reply::Bulk(v.slice(a..b)),
        None => Reply::Bulk(Bytes::new()),
    })
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE string].
fn scan(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let Some(cursor) = std::str::from_utf8(&args[1])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return Ok(Reply::err("invalid cursor"));
    };
    let mut pattern: Option<Glob> = None;
    let mut count = SCAN_DEFAULT_COUNT;
    let mut type_ok = true;
    let mut opts = args[2..].chunks(2);
    for pair in opts.by_ref() {
        let [name, val] = pair else {
            return Ok(errors::syntax());
        };
        match name.to_ascii_uppercase().as_slice() {
            b"MATCH" => pattern = Some(Glob::new(val)),
            b"COUNT" => match int(val) {
                Some(n) if n >= 1 => count = usize::try_from(n).unwrap_or(usize::MAX),
                _ => return Ok(errors::not_integer()),
            },
            b"TYPE" => type_ok = val.eq_ignore_ascii_case(b"string"),
            _ => return Ok(errors::syntax()),
        }
    }
    let start = if cursor == 0 {
        Bytes::new()
    } else {
        match state.cursors.lock().get(cursor) {
            Some(k) => k,
            None => return Ok(Reply::err("invalid or expired cursor")),
        }
    };
    let count = count.min(SCAN_MAX_COUNT);
    let keys = read_visible(&start, b"", count, |s, e, n| state.db.scan_keys(s, e, n))?;
    let next = match keys.last() {
        Some(last) if keys.len() == count => {
            let mut k = last.to_vec();
            k.push(0);
            state.cursors.lock().insert(Bytes::from(k))
        }
        _ => 0,
    };
    let keys = keys
        .into_iter()
        .filter(|k| type_ok && pattern.as_ref().is_none_or(|p| p.matches(k)))
        .map(Reply::Bulk)
        .collect();
    Ok(Reply::Array(vec![
        Reply::Bulk(Bytes::from(next.to_string())),
        Reply::Array(keys),
    ]))
}

/// What a `RANGE` asks for, after `start end`.
struct RangeOpts {
    limit: usize,
    keys_only: bool,
    digests: bool,
}

impl RangeOpts {
    /// `[LIMIT n] [KEYSONLY | DIGESTS]`, or the error reply.
    fn parse(args: &[Bytes]) -> Result<RangeOpts, Reply> {
        let mut limit = RANGE_DEFAULT_LIMIT;
        let (mut keys_only, mut digests) = (false, false);
        let mut opts = args[3..].iter();
        while let Some(opt) = opts.next() {
            if opt.eq_ignore_ascii_case(b"KEYSONLY") {
                keys_only = true;
            } else if opt.eq_ignore_ascii_case(b"DIGESTS") {
                digests = true;
            } else if opt.eq_ignore_ascii_case(b"LIMIT") {
                match opts.next().and_then(|n| int(n)) {
                    Some(n) if n >= 0 => limit = usize::try_from(n).unwrap_or(usize::MAX),
                    _ => return Err(errors::not_integer()),
                }
            } else {
                return Err(errors::syntax());
            }
        }
        if keys_only && digests {
            return Err(errors::syntax());
        }
        Ok(RangeOpts {
            limit: limit.min(RANGE_MAX_LIMIT),
            keys_only,
            digests,
        })
    }
}

/// Largest `LIMIT` of a listing answered on the network thread (a cluster
/// scan's page for up to a few hundred records); larger ones, which would
/// hold the thread and every connection on it for longer, go to the pool.
/// The engine bounds the walk too (older versions and deletions passed).
const MAX_NET_RANGE_KEYS: usize = 256;

/// A listing could not be answered from DRAM alone (see
/// [`try_range_digests`]).
struct Declined;

/// `RANGE start end [LIMIT n] DIGESTS` answered from DRAM alone, on the
/// network thread as a lone `VMETA` is: the reply [`range`] gives, or
/// `None` when the pool must answer it instead (a keytable block the
/// listing needs is not cached, an entry older than value tags whose
/// version is in its value, a `LIMIT` over [`MAX_NET_RANGE_KEYS`] or a
/// walk past many deleted or older entries, a bad argument or an error,
/// which the pool reports).
pub fn try_range_digests(state: &NodeState, args: &[Bytes]) -> Option<Reply> {
    let opts = RangeOpts::parse(args).ok()?;
    if !opts.digests || opts.limit > MAX_NET_RANGE_KEYS {
        return None;
    }
    let listed = read_visible(&args[1], &args[2], opts.limit, |s, e, n| {
        match state.db.try_scan_meta_bounded(s, e, n, state.max_reply()) {
            Ok(Some(found)) => Ok(found),
            Ok(None) | Err(_) => Err(Declined),
        }
    })
    .ok()?;
    if listed.iter().any(|(_, meta)| meta.tag == Tagging::Unknown) {
        return None;
    }
    digests_reply(state, listed).ok()
}

/// A digest listing as `RANGE ... DIGESTS` sends it: each key followed by
/// its digest (Null for a key deleted between the listing and its digest;
/// only entries older than value tags need that second look).
fn digests_reply(state: &NodeState, listed: Vec<(Bytes, ValueMeta)>) -> engine::Result<Reply> {
    note_listed(state, listed.iter().map(|(k, _)| &k[..]));
    let mut out = Vec::with_capacity(listed.len() * 2);
    for (key, meta) in listed {
        let digest = crate::vcmd::digest(state, &key, meta)?;
        out.push(Reply::Bulk(key));
        out.push(digest);
    }
    Ok(Reply::Array(out))
}

/// RANGE start end [LIMIT n] [KEYSONLY | DIGESTS]: ordered pairs with
/// start <= key < end (empty end = unbounded) as a flat array k1 v1 k2 v2
/// ...; with KEYSONLY only the keys, with DIGESTS each key followed by its
/// digest as VMETA gives it (`[version, crc32c, length, deleted]`, or Null
/// for a key deleted meanwhile). Neither reads a value from the device.
fn range(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let RangeOpts {
        limit,
        keys_only,
        digests,
    } = match RangeOpts::parse(args) {
        Ok(opts) => opts,
        Err(reply) => return Ok(reply),
    };
    let too_large = |max: usize| {
        Reply::err(format!(
            "reply too large: this range holds more than max-reply ({max} bytes); use a smaller LIMIT"
        ))
    };
    // Each visible part is bounded by max-reply on its own; a range spans
    // two parts only when it reaches past the reserved keys.
    if keys_only {
        return match read_visible(&args[1], &args[2], limit, |s, e, n| {
            state.db.scan_keys_bounded(s, e, n, state.max_reply())
        }) {
            Err(engine::Error::TooLarge { max }) => Ok(too_large(max)),
            other => Ok(Reply::Array(other?.into_iter().map(Reply::Bulk).collect())),
        };
    }
    if digests {
        let listed = match read_visible(&args[1], &args[2], limit, |s, e, n| {
            state.db.scan_meta_bounded(s, e, n, state.max_reply())
        }) {
            Err(engine::Error::TooLarge { max }) => return Ok(too_large(max)),
            other => other?,
        };
        return digests_reply(state, listed);
    }
    let pairs = match read_visible(&args[1], &args[2], limit, |s, e, n| {
        state.db.scan_bounded(s, e, n, state.max_reply())
    }) {
        Err(engine::Error::TooLarge { max }) => return Ok(too_large(max)),
        other => other?,
    };
    note_listed(state, pairs.iter().map(|(k, _)| &k[..]));
    let mut out = Vec::with_capacity(pairs.len() * 2);
    for (k, v) in pairs {
        out.push(Reply::Bulk(k));
        out.push(Reply::Bulk(v));
    }
    Ok(Reply::Array(out))
}

/// Hands a multi-get's keys to reclustering, if it is on and they are in
/// strictly ascending order (a block volume's or a file's chunks read in
/// order, a scan's values).
pub fn note_multi_get(state: &NodeState, keys: &[&[u8]]) {
    if state.recluster.is_some()
        && keys.len() >= crate::recluster::MIN_KEYS
        && keys.windows(2).all(|w| w[0] < w[1])
    {
        note_listed(state, keys.iter().copied());
    }
}

/// Hands a range read's keys (in key order) to reclustering, if it is on.
fn note_listed<'a>(state: &NodeState, mut keys: impl ExactSizeIterator<Item = &'a [u8]>) {
    let (Some(work), n) = (&state.recluster, keys.len()) else {
        return;
    };
    if let (Some(first), Some(last)) = (keys.next(), keys.last()) {
        work.listed(first, last, n);
    }
}

/// Number of keys, exact up to [`DBSIZE_CAP`] (then the cap): the engine
/// has no key count, so this scans the key space in small chunks.
pub fn dbsize(state: &NodeState) -> engine::Result<usize> {
    let mut n = 0;
    for (start, end) in visible_parts(b"", b"") {
        if n >= DBSIZE_CAP {
            break;
        }
        scan_key_pages(&state.db, start, &end, DBSIZE_CHUNK, |page| {
            n += page.len();
            n < DBSIZE_CAP
        })?;
    }
    Ok(n.min(DBSIZE_CAP))
}

/// Lists the keys of `[start, end)` (empty `end`: unbounded) in pages of
/// `page` keys, handing each page to `f` until it returns false or the
/// range ends. Reads no value.
pub fn scan_key_pages(
    db: &engine::Db,
    mut start: Vec<u8>,
    end: &[u8],
    page: usize,
    mut f: impl FnMut(&[Bytes]) -> bool,
) -> engine::Result<()> {
    loop {
        let keys = db.scan_keys(&start, end, page)?;
        if !f(&keys) {
            return Ok(());
        }
        match keys.last() {
            Some(last) if keys.len() == page => {
                start = last.to_vec();
                start.push(0);
            }
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::getrange_bounds as b;

    #[test]
    fn getrange_index_math_matches_redis() {
        // "Hello World" (11 bytes), examples from the Redis docs.
        assert_eq!(b(11, 0, 3), Some((0, 4)));
        assert_eq!(b(11, -3, -1), Some((8, 11)));
        assert_eq!(b(11, 0, -1), Some((0, 11)));
        assert_eq!(b(11, 10, 100), Some((10, 11)));
        assert_eq!(b(11, -100, 2), Some((0, 3)));
        assert_eq!(b(11, 5, 3), None);
        assert_eq!(b(11, 11, 20), None);
        assert_eq!(b(11, -1, -5), None);
        assert_eq!(b(11, -100, -50), Some((0, 1)));
        assert_eq!(b(0, 0, -1), None);
        assert_eq!(b(3, i64::MIN, i64::MAX), Some((0, 3)));
    }
}
