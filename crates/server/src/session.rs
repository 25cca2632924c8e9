//! Connection state and the commands answered on the network thread
//! without touching the engine: PING, ECHO, HELLO, AUTH, CLIENT, SELECT,
//! QUIT, SHUTDOWN, COMMAND, CONFIG.

use bytes::Bytes;
use protocol::{Reply, RespVersion};

use crate::cmd::errors::{self, int};
use crate::cmd::{Cmd, COMMANDS};
use crate::glob::glob_match;
use crate::state::NodeState;

/// Per-connection state.
#[derive(Debug)]
pub struct Session {
    /// Client id (CLIENT ID, HELLO).
    pub id: u64,
    /// Protocol version replies are encoded in.
    pub resp: RespVersion,
    /// Whether the client may run commands (always, without requirepass).
    pub authed: bool,
    /// CLIENT SETNAME.
    pub name: Option<Bytes>,
    /// The peer process of a Unix socket connection.
    pub peer_pid: Option<u32>,
    /// The client's shared memory, once attached (see [`crate::shm`]).
    pub shared: Option<std::sync::Arc<crate::shm::Mapping>>,
}

/// What the connection does after a local command.
#[derive(Debug)]
pub enum Outcome {
    /// Send the reply and go on.
    Reply(Reply),
    /// Send the reply, then close.
    Quit(Reply),
    /// Stop the node; close without a reply.
    Shutdown,
}

impl Session {
    /// A new connection's state.
    pub fn new(state: &NodeState) -> Self {
        Session {
            id: state
                .next_client_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            resp: RespVersion::V2,
            authed: state.config.requirepass.is_none(),
            name: None,
            peer_pid: None,
            shared: None,
        }
    }
}

/// `-NOAUTH Authentication required.`
pub fn noauth() -> Reply {
    Reply::Error("NOAUTH Authentication required.".into())
}

fn wrongpass() -> Reply {
    Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
}

/// Checks a user/password pair against `requirepass`.
fn check_auth(state: &NodeState, user: Option<&[u8]>, pass: &[u8]) -> Result<(), Reply> {
    let Some(want) = state.config.requirepass.as_deref() else {
        return Err(Reply::err(
            "AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        ));
    };
    if user.is_some_and(|u| u != b"default") || pass != want.as_bytes() {
        return Err(wrongpass());
    }
    Ok(())
}

/// Runs a connection-state command. `args[0]` is the name; arity was checked.
pub fn run_local(state: &NodeState, s: &mut Session, cmd: Cmd, args: &[Bytes]) -> Outcome {
    Outcome::Reply(match cmd {
        Cmd::Ping => match args {
            [_] => Reply::Simple("PONG"),
            [_, msg] => Reply::Bulk(msg.clone()),
            _ => errors::wrong_args("ping"),
        },
        Cmd::Echo => Reply::Bulk(args[1].clone()),
        Cmd::Runid => Reply::Array(
            [state.run.id, state.run.safe_from, state.run.safe_to]
                .into_iter()
                .map(|id| Reply::Integer(i64::try_from(id).unwrap_or(0)))
                .collect(),
        ),
        Cmd::Hello => hello(state, s, args),
        Cmd::Auth => {
            let (user, pass) = match args {
                [_, p] => (None, p),
                [_, u, p] => (Some(&u[..]), p),
                _ => return Outcome::Reply(errors::syntax()),
            };
            match check_auth(state, user, pass) {
                Ok(()) => {
                    s.authed = true;
                    Reply::ok()
                }
                Err(r) => r,
            }
        }
        Cmd::Client => client(s, args),
        Cmd::Shmattach => match crate::shm::attach(s.peer_pid, args) {
            Ok(map) => {
                let reply = if map.writable() {
                    Reply::Simple(protocol::shm::ATTACHED_WRITABLE)
                } else {
                    Reply::ok()
                };
                s.shared = Some(map);
                reply
            }
            Err(r) => r,
        },
        Cmd::Select => match int(&args[1]) {
            Some(0) => Reply::ok(),
            Some(_) => Reply::err("DB index is out of range"),
            None => errors::not_integer(),
        },
        Cmd::Quit => return Outcome::Quit(Reply::ok()),
        Cmd::Shutdown => {
            for a in &args[1..] {
                let a = a.to_ascii_uppercase();
                if !matches!(a.as_slice(), b"NOSAVE" | b"SAVE" | b"NOW" | b"FORCE") {
                    return Outcome::Reply(errors::syntax());
                }
            }
            return Outcome::Shutdown;
        }
        Cmd::Command => command(args),
        Cmd::Config => config(state, args),
        _ => errors::unknown_command(args),
    })
}

/// HELLO [protover [AUTH user pass] [SETNAME name]].
fn hello(state: &NodeState, s: &mut Session, args: &[Bytes]) -> Reply {
    let mut resp = s.resp;
    if let Some(v) = args.get(1) {
        resp = match int(v) {
            Some(2) => RespVersion::V2,
            Some(3) => RespVersion::V3,
            Some(_) => return Reply::Error("NOPROTO unsupported protocol version".into()),
            None => return Reply::err("Protocol version is not an integer or out of range"),
        };
    }
    let mut authed = s.authed;
    let mut name = None;
    let mut i = 2;
    while i < args.len() {
        let opt = args[i].to_ascii_uppercase();
        match (opt.as_slice(), args.get(i + 1), args.get(i + 2)) {
            (b"AUTH", Some(u), Some(p)) => {
                if let Err(r) = check_auth(state, Some(u), p) {
                    return r;
                }
                authed = true;
                i += 3;
            }
            (b"SETNAME", Some(n), _) => {
                name = Some(n.clone());
                i += 2;
            }
            _ => return errors::syntax(),
        }
    }
    if !authed {
        return Reply::Error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time"
                .into(),
        );
    }
    s.authed = true;
    s.resp = resp;
    if name.is_some() {
        s.name = name;
    }
    let proto = if resp == RespVersion::V3 { 3 } else { 2 };
    Reply::Map(vec![
        (Reply::bulk("server"), Reply::bulk("lightstore")),
        (
            Reply::bulk("version"),
            Reply::bulk(env!("CARGO_PKG_VERSION")),
        ),
        (Reply::bulk("proto"), Reply::Integer(proto)),
        (Reply::bulk("id"), Reply::Integer(s.id as i64)),
        (Reply::bulk("mode"), Reply::bulk("standalone")),
        (Reply::bulk("role"), Reply::bulk("master")),
        (Reply::bulk("modules"), Reply::Array(Vec::new())),
    ])
}

/// CLIENT SETNAME | GETNAME | ID | SETINFO.
fn client(s: &mut Session, args: &[Bytes]) -> Reply {
    let sub = args[1].to_ascii_uppercase();
    match (sub.as_slice(), args.len()) {
        (b"SETNAME", 3) => {
            if args[2].iter().any(|c| *c <= b' ' || *c > b'~') {
                return Reply::err(
                    "Client names cannot contain spaces, newlines or special characters.",
                );
            }
            s.name = (!args[2].is_empty()).then(|| args[2].clone());
            Reply::ok()
        }
        (b"GETNAME", 2) => s.name.clone().map_or(Reply::Null, Reply::Bulk),
        (b"ID", 2) => Reply::Integer(s.id as i64),
        (b"SETINFO", 4) => Reply::ok(),
        (b"SETNAME" | b"GETNAME" | b"ID" | b"SETINFO", _) => errors::wrong_args("client"),
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try CLIENT HELP.",
            errors::show(&args[1])
        )),
    }
}

/// COMMAND [COUNT | DOCS | INFO | LIST ...]: minimal answers clients accept.
fn command(args: &[Bytes]) -> Reply {
    let Some(sub) = args.get(1) else {
        return Reply::Array(Vec::new());
    };
    match sub.to_ascii_uppercase().as_slice() {
        b"COUNT" => Reply::Integer(COMMANDS.len() as i64),
        b"DOCS" => Reply::Map(Vec::new()),
        b"LIST" => Reply::Array(COMMANDS.iter().map(|(_, n, _)| Reply::bulk(n)).collect()),
        _ => Reply::Array(Vec::new()),
    }
}

/// The settings CONFIG GET reports, as name/value pairs.
fn settings(state: &NodeState) -> Vec<(&'static str, String)> {
    let c = &state.config;
    vec![
        ("save", String::new()),
        ("appendonly", "no".into()),
        ("databases", "1".into()),
        ("maxmemory", "0".into()),
        ("timeout", "0".into()),
        ("port", state.tcp_port.to_string()),
        ("bind", c.listen.clone()),
        ("maxclients", c.maxclients.to_string()),
        (
            "protected-mode",
            if c.protected_mode { "yes" } else { "no" }.into(),
        ),
        (
            "hinted-handoff",
            if c.hinted_handoff { "yes" } else { "no" }.into(),
        ),
        ("proto-max-bulk-len", state.limits.max_bulk.to_string()),
        ("max-request", state.limits.max_request.to_string()),
        (
            "max-request-memory",
            state.request_budget.limit().to_string(),
        ),
        ("max-reply", state.max_reply().to_string()),
        ("durability", c.durability.clone()),
        ("dir", c.data_dir.display().to_string()),
        ("io-threads", "1".into()),
        ("executor-threads", c.write_threads().to_string()),
        ("read-threads", c.read_threads().to_string()),
    ]
}

/// CONFIG GET pattern...; CONFIG RESETSTAT zeroes the request statistics
/// (`INFO stats`, `commandstats`, `latency_breakdown`, the metrics
/// endpoint's counters) as Redis does; CONFIG SET/REWRITE are not
/// supported.
fn config(state: &NodeState, args: &[Bytes]) -> Reply {
    let sub = args[1].to_ascii_uppercase();
    match sub.as_slice() {
        b"RESETSTAT" if args.len() == 2 => {
            state.counters.reset();
            state.metrics.reset();
            Reply::ok()
        }
        b"RESETSTAT" => errors::wrong_args("config|resetstat"),
        b"GET" if args.len() >= 3 => {
            let all = settings(state);
            let mut out = Vec::new();
            for (name, val) in &all {
                if args[2..]
                    .iter()
                    .any(|p| glob_match(&p.to_ascii_lowercase(), name.as_bytes()))
                {
                    out.push((Reply::bulk(name), Reply::bulk(val)));
                }
            }
            Reply::Map(out)
        }
        b"GET" => errors::wrong_args("config|get"),
        _ => Reply::err(format!(
            "CONFIG {} is not supported by LightStore",
            errors::show(&args[1]).to_ascii_uppercase()
        )),
    }
}
