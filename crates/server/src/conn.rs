//! One client connection on the network thread: read, parse every complete
//! request (pipelining), answer connection-state commands in place, send the
//! engine commands to the executor pool as one job, then write all replies
//! in request order — and only then read again, so a client that does not
//! read its replies cannot make the node buffer without bound.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use protocol::{Reply, RequestParser, RespVersion, Wire};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::budget::{Hold, ALLOWANCE};
use crate::cmd::{arity_ok, errors, is_refused, Cmd};
use crate::data::CallTime;
use crate::exec::{Pools, Run};
use crate::metrics::{micros, Breakdown};
use crate::readbuf::{
    exact_copy, make_small_room, read_charge, shrink_read_buffer, take_request_memory, Taken,
    MAX_READ_ROOM, MIN_ROOM, READ_CHUNK, RETIRED,
};
use crate::reserved::reserved_key_in_write;
use crate::session::{noauth, run_local, Outcome, Session};
use crate::state::{Counters, NodeState};

/// Most pieces of the reply buffer one write hands the kernel (its
/// `IOV_MAX` is 1024).
const MAX_WRITE_SLICES: usize = 512;
/// Longest run of plain SETs the network thread writes itself when the
/// engine needs no waiting for it (see `data::try_sets_inline`). Longer
/// runs go to the executor pool, where runs of several connections merge
/// and the work spreads over the cores.
const MAX_INLINE_SETS: usize = 1;
/// Longest run of plain GETs answered on the network thread. Longer runs
/// go to the executor pool, whose workers spread lookups and checksums over
/// the cores: on 2 cores, whole -P 16 runs on the network thread used ~10 %
/// less CPU but saturated that thread (throughput no better, p50 higher).
const MAX_NET_GETS: usize = 1;
/// Most keys of an `MGET` answered on the network thread: a cluster
/// client's read of up to 1 MiB of a volume's 4 KiB chunks (or a file's
/// 8 KiB chunks), a scan's records. Larger ones go to the executor pool.
/// An MGET is one request, so this is one hand-off saved per request, not
/// per key as for a run of GETs; on the pool the 256 keys of a 1 MiB block
/// read also spread over several read workers and woke each of them (the
/// node's CPU per GiB of sequential block reads fell by about a tenth
/// when this bound went from 64 to 256, session 34 in `bench/RESULTS.md`).
const MAX_NET_MGET_KEYS: usize = 256;
/// What a client may send before it has authenticated on a node with a
/// password (as Redis does): a handful of short arguments. Its requests
/// are parsed one at a time, so an AUTH in a pipeline lifts the limits for
/// the requests behind it.
const UNAUTHENTICATED: protocol::Limits = protocol::Limits {
    max_bulk: 16 << 10,
    max_args: 10,
    max_inline: 16 << 10,
    max_request: 64 << 10,
};

/// Replies to a prefix of some engine commands, with their engine times;
/// how long they waited (queue and hand-back); the commands left for later.
type Answered = (Vec<(Reply, CallTime)>, Duration, Vec<(Cmd, Vec<Bytes>)>);

/// A request's place in the reply order.
enum Slot {
    /// Answered already.
    Ready(Reply, RespVersion),
    /// The next engine result, encoded in this version (an `MGETSHM`'s
    /// values landed in the client's memory first).
    Engine(RespVersion, Option<crate::shm::Landing>),
}

/// What the connection does after a batch.
#[derive(PartialEq, Eq)]
enum After {
    Continue,
    Close,
    Shutdown,
}

/// Serves one connection until the client leaves, misbehaves or the node stops.
pub async fn serve<S>(mut stream: S, state: Arc<NodeState>, exec: Arc<Pools>, peer_pid: Option<u32>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut session = Session::new(&state);
    session.peer_pid = peer_pid;
    let mut parser = RequestParser::new(state.limits);
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut wbuf = Wire::new();
    let mut stop = state.shutdown.subscribe();
    let mut hold = Hold::new(state.request_budget.clone());
    let mut read_room = READ_CHUNK;
    // Spare room of buffers left behind, still shared with the arguments of
    // the request in progress (see `make_small_room`).
    let mut abandoned = 0;
    // Whether `rbuf`'s allocation may go to the pool of read buffers when
    // replaced: not a large value's buffer (see `make_small_room`).
    let mut poolable = true;
    loop {
        let authed = session.authed;
        parser.set_limits(if authed {
            state.limits
        } else {
            UNAUTHENTICATED
        });
        let mut batch = Vec::new();
        let mut proto_err = None;
        let parse_start = Instant::now();
        loop {
            match parser.next_request(&mut rbuf) {
                Ok(Some(req)) => {
                    batch.push(req);
                    if !authed {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    proto_err = Some(e);
                    break;
                }
            }
        }
        // Unauthenticated requests go one at a time: parse the next one
        // (under the limits the last one left) before reading more.
        let parse_again = !authed && !batch.is_empty() && !rbuf.is_empty();
        // What the connection holds besides the batch, whose arguments are
        // given back as it runs (a client that does not read its replies
        // must not keep request memory it no longer uses).
        let missing = parser.bulk_missing(&rbuf);
        shrink_read_buffer(&mut rbuf, missing, &mut poolable);
        let idle = read_charge(&rbuf, &parser, 0);
        let mut after = After::Continue;
        if !batch.is_empty() {
            let parse = parse_start.elapsed();
            after = run_batch(
                &state,
                &exec,
                &mut session,
                batch,
                parse,
                &mut wbuf,
                &mut stream,
                (&mut hold, idle),
            )
            .await;
        }
        hold.lower_to(idle);
        if let Some(e) = &proto_err {
            tracing::debug!(client = session.id, "protocol error: {e}");
            Reply::Error(format!("ERR {e}")).encode(session.resp, &mut wbuf);
            after = After::Close;
        }
        if !wbuf.is_empty() && write_reply(&mut stream, &mut wbuf, &state).await.is_err() {
            break;
        }
        match after {
            After::Continue => {}
            After::Close => break,
            After::Shutdown => {
                state.request_shutdown();
                break;
            }
        }
        if *stop.borrow() {
            break;
        }
        if parse_again {
            continue;
        }
        // Room for the next read: a pending value's rest if it is large,
        // else the connection's read size (which grows while reads fill it,
        // so that one read takes a whole pipeline of small requests).
        let missing = parser.bulk_missing(&rbuf);
        let large = missing > 0 && rbuf.len() + missing > ALLOWANCE;
        let room = if large {
            missing
        } else {
            // Within the allowance: such reads never touch the budget.
            let free = ALLOWANCE.saturating_sub(rbuf.len());
            missing.max(read_room.min(free)).max(MIN_ROOM)
        };
        if parser.request_bytes() == 0 {
            abandoned = 0;
        }
        if !large {
            make_small_room(
                &mut rbuf,
                room,
                &parser,
                &mut abandoned,
                (&RETIRED, &mut poolable),
            );
        }
        shrink_read_buffer(&mut rbuf, room, &mut poolable);
        // Reading fills the buffer (up to its capacity) and, for a request
        // in progress, adds to what it holds: both come out of the budget.
        let holds = read_charge(&rbuf, &parser, room);
        let read = parser.request_bytes_read() + rbuf.len();
        match take_request_memory(&state, &mut hold, holds, read, &mut stop).await {
            Taken::Yes => {}
            Taken::Stopped => break,
            Taken::No(e) => {
                e.encode(session.resp, &mut wbuf);
                let _ = write_reply(&mut stream, &mut wbuf, &state).await;
                break;
            }
        }
        // A large value gets one buffer of its size, once the budget allows.
        if large && rbuf.capacity() - rbuf.len() < room {
            rbuf = exact_copy(&rbuf, room);
            poolable = false;
        }
        let spare = rbuf.capacity() - rbuf.len();
        // A client holding request memory must keep sending: one that
        // stalls for the wait bound gives it back by being closed.
        let stall_limit = Duration::from_millis(state.config.request_memory_wait_ms);
        let stalled = async {
            if hold.held() > 0 {
                tokio::time::sleep(stall_limit).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            r = stream.read_buf(&mut rbuf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !large && n == spare {
                        read_room = (read_room * 2).min(MAX_READ_ROOM);
                    }
                }
            },
            _ = stalled => {
                hold.release();
                state.request_budget.stalls.fetch_add(1, Ordering::Relaxed);
                Reply::Error(format!(
                    "ERR request timed out: no bytes for {} ms while holding request memory",
                    stall_limit.as_millis()
                ))
                .encode(session.resp, &mut wbuf);
                let _ = write_reply(&mut stream, &mut wbuf, &state).await;
                break;
            }
            _ = stop.changed() => break,
        }
    }
    drop(hold);
    let _ = stream.shutdown().await;
}

/// How one request of a batch was answered, for metrics.
struct Timing {
    /// Index in [`crate::cmd::COMMANDS`], `None` for unknown commands.
    index: Option<usize>,
    /// Time of a command answered on the network thread.
    local: Duration,
    /// Whether it ran on the executor.
    engine: bool,
}

/// Writes `buf` whole, failing with `TimedOut` when one write makes no
/// progress for `reply_timeout_ms`: a client that stops reading its
/// replies is closed rather than kept for good (counted in INFO stats
/// `reply_timeouts`). A client reading slowly but steadily is not.
async fn write_reply<S: AsyncWrite + Unpin>(
    stream: &mut S,
    wire: &mut Wire,
    state: &NodeState,
) -> std::io::Result<()> {
    let limit = Duration::from_millis(state.config.reply_timeout_ms);
    while !wire.is_empty() {
        let slices = wire.slices(MAX_WRITE_SLICES);
        match tokio::time::timeout(limit, stream.write_vectored(&slices)).await {
            Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => wire.advance(n),
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                Counters::bump(&state.counters.reply_timeouts);
                tracing::debug!("closing a client that read no reply for {limit:?}");
                return Err(std::io::ErrorKind::TimedOut.into());
            }
        }
    }
    Ok(())
}

/// Answers a batch of requests, appending the encoded replies to `out`.
/// `parse` is the time it took to parse the batch (for metrics). When the
/// executor answers only a prefix of the engine commands (their replies
/// reached [`crate::data::REPLY_BUDGET`]), the replies so far are written
/// to `stream` before the rest is asked for, so the client's reading paces
/// how much the node holds.
#[allow(clippy::too_many_arguments)]
async fn run_batch<S: AsyncWrite + Unpin>(
    state: &Arc<NodeState>,
    exec: &Pools,
    session: &mut Session,
    batch: Vec<Vec<Bytes>>,
    parse: Duration,
    out: &mut Wire,
    stream: &mut S,
    (hold, idle): (&mut Hold, usize),
) -> After {
    let start = Instant::now();
    let mut slots = Vec::with_capacity(batch.len());
    let mut timings = Vec::with_capacity(batch.len());
    let mut jobs: Vec<(Cmd, Vec<Bytes>)> = Vec::new();
    let mut after = After::Continue;
    for args in batch {
        Counters::bump(&state.counters.commands);
        let Some(name) = args.first() else {
            continue; // the parser never yields empty requests
        };
        let t = Instant::now();
        let known = Cmd::lookup(name);
        if let Some((cmd, _, _)) = known {
            Counters::bump(&state.counters.calls[cmd.index()]);
        }
        let mut timing = Timing {
            index: known.map(|(cmd, _, _)| cmd.index()),
            local: Duration::ZERO,
            engine: false,
        };
        // A VSET whose values lie in the client's shared memory runs as
        // that VSET (counted as VSETSHM); an MGET whose values land there
        // as that MGET (counted as MGETSHM).
        let mut landing = None;
        let resolved = match known {
            Some((Cmd::Vsetshm, _, _)) if session.authed => {
                crate::shm::resolve(session.shared.as_ref(), args)
                    .map(|vset| (Cmd::lookup(b"vset"), vset))
            }
            Some((Cmd::Mgetshm, _, _)) if session.authed => {
                crate::shm::landing(session.shared.as_ref(), args).map(|(to, mget)| {
                    landing = Some(to);
                    (Cmd::lookup(b"mget"), mget)
                })
            }
            _ => Ok((known, args)),
        };
        let (known, args) = match resolved {
            Ok(resolved) => resolved,
            Err(reply) => {
                timing.local = t.elapsed();
                timings.push(timing);
                slots.push(Slot::Ready(reply, session.resp));
                continue;
            }
        };
        let Some(name) = args.first() else {
            continue;
        };
        let reply = match known {
            _ if !session.authed
                && !matches!(known, Some((Cmd::Hello | Cmd::Auth | Cmd::Quit, _, _))) =>
            {
                noauth()
            }
            None if is_refused(name) => errors::refused(name),
            None => errors::unknown_command(&args),
            Some((_, cname, arity)) if !arity_ok(arity, args.len()) => errors::wrong_args(cname),
            Some((cmd, _, _)) if reserved_key_in_write(cmd, &args).is_some() => {
                errors::reserved_key()
            }
            Some((cmd, _, _)) if cmd.uses_engine() => {
                slots.push(Slot::Engine(session.resp, landing));
                jobs.push((cmd, args));
                timing.engine = true;
                timings.push(timing);
                continue;
            }
            Some((cmd, _, _)) => match run_local(state, session, cmd, &args) {
                Outcome::Reply(r) => r,
                Outcome::Quit(r) => {
                    slots.push(Slot::Ready(r, session.resp));
                    timing.local = t.elapsed();
                    timings.push(timing);
                    after = After::Close;
                    break;
                }
                Outcome::Shutdown => {
                    after = After::Shutdown;
                    break;
                }
            },
        };
        timing.local = t.elapsed();
        timings.push(timing);
        slots.push(Slot::Ready(reply, session.resp));
    }
    let mut slots = VecDeque::from(slots);
    let mut engine_times: Vec<CallTime> = Vec::new();
    let mut queue = Duration::ZERO;
    let mut encode = Duration::ZERO;
    loop {
        let (results, waited, rest) = if jobs.is_empty() {
            (Vec::new(), Duration::ZERO, Vec::new())
        } else {
            // A lone MGET of an `MGETSHM` may read its values straight
            // into the client's memory.
            let landing = match &jobs[..] {
                [_] => slots.iter().find_map(|slot| match slot {
                    Slot::Engine(_, landing) => landing.as_ref(),
                    Slot::Ready(..) => None,
                }),
                _ => None,
            };
            match run_on_executor(state, exec, std::mem::take(&mut jobs), landing).await {
                Some(r) => r,
                None => {
                    Reply::err("internal error: request failed").encode(session.resp, out);
                    return After::Close;
                }
            }
        };
        queue += waited;
        engine_times.extend(results.iter().map(|(_, d)| *d));
        let mut results = results.into_iter().map(|(r, _)| r);
        let encode_start = Instant::now();
        while let Some(slot) = slots.pop_front() {
            match slot {
                Slot::Ready(r, v) => r.encode(v, out),
                Slot::Engine(v, landing) => match results.next() {
                    Some(r) => match &landing {
                        Some(to) => to.land(r).encode(v, out),
                        None => r.encode(v, out),
                    },
                    None if rest.is_empty() => {
                        Reply::err("internal error: missing reply").encode(v, out)
                    }
                    None => {
                        slots.push_front(Slot::Engine(v, landing));
                        break;
                    }
                },
            }
        }
        encode += encode_start.elapsed();
        if slots.is_empty() {
            break;
        }
        // The rest waits until the client has taken these replies, holding
        // only the request memory of the commands not run yet.
        let rest_bytes: usize = rest
            .iter()
            .flat_map(|(_, args)| args.iter())
            .map(|a| a.len() + protocol::ARG_OVERHEAD)
            .sum();
        hold.lower_to(idle + rest_bytes);
        if write_reply(stream, out, state).await.is_err() {
            // The connection is done: nothing more is written to it.
            out.clear();
            return After::Close;
        }
        jobs = rest;
    }
    record(
        state,
        &timings,
        &engine_times,
        parse + encode,
        queue,
        parse + start.elapsed(),
    );
    after
}

/// Records per-request metrics of a batch and logs it when it was slow.
/// `shared` (parse + encode) is divided equally among the requests.
fn record(
    state: &NodeState,
    timings: &[Timing],
    engine_times: &[CallTime],
    shared: Duration,
    queue: Duration,
    wall: Duration,
) {
    if timings.is_empty() {
        return;
    }
    let share = micros(shared) / timings.len() as u64;
    let queue_us = micros(queue);
    let mut engine_times = engine_times.iter();
    let mut batch = Breakdown {
        protocol_us: micros(shared),
        ..Breakdown::default()
    };
    for t in timings {
        let b = Breakdown {
            protocol_us: share + micros(t.local),
            queue_us: if t.engine { queue_us } else { 0 },
            ..Breakdown::default()
        };
        let call = if t.engine {
            engine_times.next().copied()
        } else {
            None
        };
        let b = match call {
            Some(c) => Breakdown {
                engine_us: micros(c.total.saturating_sub(c.device)),
                device_us: micros(c.device),
                ..b
            },
            None => b,
        };
        batch.protocol_us += micros(t.local);
        batch.engine_us += b.engine_us;
        batch.device_us += b.device_us;
        state.metrics.record(t.index, b);
    }
    if timings.iter().any(|t| t.engine) {
        batch.queue_us = queue_us;
    }
    if let Some(limit) = state.config.slowlog_ms {
        crate::slowlog::check(limit, timings.len(), timings[0].index, wall, batch);
    }
}

/// Runs the engine commands of one batch, in order. A run of plain GETs is
/// answered on the network thread as far as the split GET allows (see
/// `netread`), a lone plain SET written there when the engine can take it
/// without waiting; the rest goes to the executor pool as one job (a run of
/// plain GETs or plain SETs as a [`Run`], which a worker may merge with
/// other connections'). Returns each reply with its engine time, and how
/// long the job waited: in the executor queue (submit to start) plus the
/// hand-back to the network thread (job end to this task resuming).
/// When the replies reached the reply budget, only a prefix of `jobs` is
/// answered and the rest is handed back (the third element).
async fn run_on_executor(
    state: &Arc<NodeState>,
    exec: &Pools,
    jobs: Vec<(Cmd, Vec<Bytes>)>,
    landing: Option<&crate::shm::Landing>,
) -> Option<Answered> {
    let all_gets = jobs.iter().all(|(cmd, _)| *cmd == Cmd::Get);
    let all_sets = jobs
        .iter()
        .all(|(cmd, args)| *cmd == Cmd::Set && args.len() == 3);
    if all_gets && jobs.len() <= MAX_NET_GETS {
        if let Some(reads) = &state.net_reads {
            let keys: Vec<&[u8]> = jobs.iter().map(|(_, args)| &args[1][..]).collect();
            let answered = reads.gets(state, &keys).await;
            return complete_gets(state, exec, jobs, answered).await;
        }
    }
    if let ([(Cmd::Mget, args)], Some(reads)) = (&jobs[..], &state.net_reads) {
        if args.len() - 1 <= MAX_NET_MGET_KEYS {
            let keys: Vec<&[u8]> = args[1..].iter().map(|k| &k[..]).collect();
            if let Some(answer) = reads.mget(state, &keys, state.max_reply(), landing).await {
                crate::data::note_multi_get(state, &keys);
                return Some((vec![answer], Duration::ZERO, Vec::new()));
            }
        }
    }
    // A lone VMETA or RANGE ... DIGESTS the index in DRAM can answer.
    if let [(cmd @ (Cmd::Vmeta | Cmd::Range), args)] = &jobs[..] {
        let clock = Instant::now();
        let (reply, counter) = match cmd {
            Cmd::Vmeta => (
                crate::vcmd::try_vmeta(state, args),
                &state.counters.net_vmetas,
            ),
            _ => (
                crate::data::try_range_digests(state, args),
                &state.counters.net_ranges,
            ),
        };
        if let Some(reply) = reply {
            Counters::bump(counter);
            let time = CallTime {
                total: clock.elapsed(),
                device: Duration::ZERO,
            };
            return Some((vec![(reply, time)], Duration::ZERO, Vec::new()));
        }
    }
    if all_sets && jobs.len() <= MAX_INLINE_SETS && state.sets_may_run_inline {
        if let Some(replies) = crate::data::try_sets_inline(state, &jobs) {
            return Some((replies, Duration::ZERO, Vec::new()));
        }
    }
    on_pool(state, exec, jobs, all_gets, all_sets).await
}

/// Fills in, through the executor pool, the GETs of a run that the network
/// thread could not answer (`None` in `answered`).
/// If the pool answers only part of them, the run is answered up to the
/// first GET left unanswered and hands back the GETs from there on.
async fn complete_gets(
    state: &Arc<NodeState>,
    exec: &Pools,
    jobs: Vec<(Cmd, Vec<Bytes>)>,
    answered: Vec<Option<(Reply, CallTime)>>,
) -> Option<Answered> {
    let rest: Vec<(Cmd, Vec<Bytes>)> = jobs
        .iter()
        .zip(&answered)
        .filter(|(_, a)| a.is_none())
        .map(|(job, _)| job.clone())
        .collect();
    let (mut more, queue) = if rest.is_empty() {
        (Vec::new().into_iter(), Duration::ZERO)
    } else {
        let (replies, queue, _) = on_pool(state, exec, rest, true, false).await?;
        (replies.into_iter(), queue)
    };
    let mut replies = Vec::with_capacity(answered.len());
    for a in answered {
        match a.or_else(|| more.next()) {
            Some(r) => replies.push(r),
            None => break,
        }
    }
    let mut jobs = jobs;
    let left = jobs.split_off(replies.len().min(jobs.len()));
    Some((replies, queue, left))
}

/// Runs `jobs` on the executor pool (see [`run_on_executor`]).
async fn on_pool(
    state: &Arc<NodeState>,
    exec: &Pools,
    jobs: Vec<(Cmd, Vec<Bytes>)>,
    all_gets: bool,
    all_sets: bool,
) -> Option<Answered> {
    let (tx, rx) = oneshot::channel();
    let submitted = Instant::now();
    if all_gets || all_sets {
        let run = Run {
            state: state.clone(),
            cmds: jobs,
            submitted,
            reply: tx,
        };
        if all_gets {
            exec.submit_gets(run).ok()?;
        } else {
            exec.submit_sets(run).ok()?;
        }
    } else {
        let st = state.clone();
        let writes = jobs.iter().any(|(cmd, _)| cmd.writes());
        exec.submit(
            Box::new(move || {
                let mut jobs = jobs;
                let queued = submitted.elapsed();
                let replies = crate::data::execute_batch(&st, &jobs);
                let rest = jobs.split_off(replies.len().min(jobs.len()));
                let _ = tx.send((replies, queued, Instant::now(), rest));
            }),
            writes,
        )
        .ok()?;
    }
    let (replies, queued, done, rest) = rx.await.ok()?;
    Some((replies, queued + done.elapsed(), rest))
}
