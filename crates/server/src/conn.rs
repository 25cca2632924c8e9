//! One client connection on the network thread: read, parse every complete
//! request (pipelining), answer connection-state commands in place, send the
//! engine commands to the executor pool as one job, then write all replies
//! in request order — and only then read again, so a client that does not
//! read its replies cannot make the node buffer without bound.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use protocol::{Reply, RequestParser, RespVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::cmd::{arity_ok, errors, is_refused, Cmd};
use crate::exec::Executor;
use crate::session::{noauth, run_local, Outcome, Session};
use crate::state::{Counters, NodeState};

/// Buffers larger than this are released after use.
const KEEP_BUFFER: usize = 1 << 20;
/// Bytes read per `read` call (more when a large bulk string is pending).
const READ_CHUNK: usize = 64 << 10;

/// A request's place in the reply order.
enum Slot {
    /// Answered already.
    Ready(Reply, RespVersion),
    /// The next engine result, encoded in this version.
    Engine(RespVersion),
}

/// What the connection does after a batch.
#[derive(PartialEq, Eq)]
enum After {
    Continue,
    Close,
    Shutdown,
}

/// Serves one connection until the client leaves, misbehaves or the node stops.
pub async fn serve<S>(mut stream: S, state: Arc<NodeState>, exec: Arc<Executor>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut session = Session::new(&state);
    let mut parser = RequestParser::new(state.limits);
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut wbuf = BytesMut::new();
    let mut stop = state.shutdown.subscribe();
    loop {
        let mut batch = Vec::new();
        let mut proto_err = None;
        loop {
            match parser.next_request(&mut rbuf) {
                Ok(Some(req)) => batch.push(req),
                Ok(None) => break,
                Err(e) => {
                    proto_err = Some(e);
                    break;
                }
            }
        }
        let mut after = After::Continue;
        if !batch.is_empty() {
            after = run_batch(&state, &exec, &mut session, batch, &mut wbuf).await;
        }
        if let Some(e) = &proto_err {
            tracing::debug!(client = session.id, "protocol error: {e}");
            Reply::Error(format!("ERR {e}")).encode(session.resp, &mut wbuf);
            after = After::Close;
        }
        if !wbuf.is_empty() {
            if stream.write_all(&wbuf).await.is_err() {
                break;
            }
            wbuf.clear();
            if wbuf.capacity() > KEEP_BUFFER {
                wbuf = BytesMut::new();
            }
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
        if rbuf.is_empty() && rbuf.capacity() > KEEP_BUFFER {
            rbuf = BytesMut::with_capacity(READ_CHUNK);
        }
        rbuf.reserve(READ_CHUNK);
        tokio::select! {
            r = stream.read_buf(&mut rbuf) => match r {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
            _ = stop.changed() => break,
        }
    }
    let _ = stream.shutdown().await;
}

/// Answers a batch of requests, appending the encoded replies to `out`.
async fn run_batch(
    state: &Arc<NodeState>,
    exec: &Executor,
    session: &mut Session,
    batch: Vec<Vec<Bytes>>,
    out: &mut BytesMut,
) -> After {
    let mut slots = Vec::with_capacity(batch.len());
    let mut jobs: Vec<(Cmd, Vec<Bytes>)> = Vec::new();
    let mut after = After::Continue;
    for args in batch {
        Counters::bump(&state.counters.commands);
        let Some(name) = args.first() else {
            continue; // the parser never yields empty requests
        };
        let known = Cmd::lookup(name);
        if let Some((cmd, _, _)) = known {
            Counters::bump(&state.counters.calls[cmd.index()]);
        }
        let reply = match known {
            _ if !session.authed
                && !matches!(known, Some((Cmd::Hello | Cmd::Auth | Cmd::Quit, _, _))) =>
            {
                noauth()
            }
            None if is_refused(name) => errors::refused(name),
            None => errors::unknown_command(&args),
            Some((_, cname, arity)) if !arity_ok(arity, args.len()) => errors::wrong_args(cname),
            Some((cmd, _, _)) if cmd.uses_engine() => {
                slots.push(Slot::Engine(session.resp));
                jobs.push((cmd, args));
                continue;
            }
            Some((cmd, _, _)) => match run_local(state, session, cmd, &args) {
                Outcome::Reply(r) => r,
                Outcome::Quit(r) => {
                    slots.push(Slot::Ready(r, session.resp));
                    after = After::Close;
                    break;
                }
                Outcome::Shutdown => {
                    after = After::Shutdown;
                    break;
                }
            },
        };
        slots.push(Slot::Ready(reply, session.resp));
    }
    let mut results = if jobs.is_empty() {
        Vec::new()
    } else {
        match run_on_executor(state, exec, jobs).await {
            Some(r) => r,
            None => {
                Reply::err("internal error: request failed").encode(session.resp, out);
                return After::Close;
            }
        }
    }
    .into_iter();
    for slot in slots {
        match slot {
            Slot::Ready(r, v) => r.encode(v, out),
            Slot::Engine(v) => results
                .next()
                .unwrap_or_else(|| Reply::err("internal error: missing reply"))
                .encode(v, out),
        }
    }
    after
}

/// Runs the engine commands of one batch, in order, as one executor job.
async fn run_on_executor(
    state: &Arc<NodeState>,
    exec: &Executor,
    jobs: Vec<(Cmd, Vec<Bytes>)>,
) -> Option<Vec<Reply>> {
    let (tx, rx) = oneshot::channel();
    let st = state.clone();
    exec.submit(Box::new(move || {
        let replies = jobs
            .iter()
            .map(|(cmd, args)| crate::data::execute(&st, *cmd, args))
            .collect::<Vec<_>>();
        let _ = tx.send(replies);
    }))
    .ok()?;
    rx.await.ok()
}
