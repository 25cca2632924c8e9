//! The command table: names, arities, where each command runs (the network
//! thread for connection state, the executor pool for engine calls), and the
//! Redis commands LightStore refuses on purpose.

/// A command the node knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    Ping,
    Echo,
    Hello,
    Auth,
    Client,
    Select,
    Quit,
    Shutdown,
    Command,
    Config,
    Set,
    Get,
    Mset,
    Mget,
    Del,
    Exists,
    Strlen,
    Getrange,
    Scan,
    Range,
    Vset,
    Vdel,
    Vbatch,
    Vsetshm,
    Mgetshm,
    Shmattach,
    Vcas,
    Vmeta,
    Fsync,
    Recluster,
    Runid,
    Hint,
    Dbsize,
    Info,
}

/// Every command with its name and Redis-style arity (N: exactly N
/// arguments including the name; -N: at least N).
pub const COMMANDS: &[(Cmd, &str, i32)] = &[
    (Cmd::Ping, "ping", -1),
    (Cmd::Echo, "echo", 2),
    (Cmd::Hello, "hello", -1),
    (Cmd::Auth, "auth", -2),
    (Cmd::Client, "client", -2),
    (Cmd::Select, "select", 2),
    (Cmd::Quit, "quit", -1),
    (Cmd::Shutdown, "shutdown", -1),
    (Cmd::Command, "command", -1),
    (Cmd::Config, "config", -2),
    (Cmd::Set, "set", -3),
    (Cmd::Get, "get", 2),
    (Cmd::Mset, "mset", -3),
    (Cmd::Mget, "mget", -2),
    (Cmd::Del, "del", -2),
    (Cmd::Exists, "exists", -2),
    (Cmd::Strlen, "strlen", 2),
    (Cmd::Getrange, "getrange", 4),
    (Cmd::Scan, "scan", -2),
    (Cmd::Range, "range", -3),
    (Cmd::Vset, "vset", -4),
    (Cmd::Vdel, "vdel", -3),
    (Cmd::Vbatch, "vbatch", -5),
    (Cmd::Vsetshm, "vsetshm", -5),
    (Cmd::Mgetshm, "mgetshm", -4),
    (Cmd::Shmattach, "shmattach", 4),
    (Cmd::Vcas, "vcas", -5),
    (Cmd::Vmeta, "vmeta", -2),
    (Cmd::Fsync, "fsync", 1),
    (Cmd::Recluster, "recluster", -1),
    (Cmd::Runid, "runid", 1),
    (Cmd::Hint, "hint", -4),
    (Cmd::Dbsize, "dbsize", 1),
    (Cmd::Info, "info", -1),
];

/// Redis commands for data types and expiry that LightStore does not have.
const REFUSED: &[&str] = &[
    "expire",
    "pexpire",
    "expireat",
    "pexpireat",
    "expiretime",
    "pexpiretime",
    "ttl",
    "pttl",
    "persist",
    "setex",
    "psetex",
    "getex",
    "getdel",
    "setnx",
    "getset",
    "incr",
    "incrby",
    "incrbyfloat",
    "decr",
    "decrby",
    "append",
    "setrange",
    "msetnx",
    "hset",
    "hget",
    "hmset",
    "hmget",
    "hgetall",
    "hdel",
    "hexists",
    "hincrby",
    "hkeys",
    "hvals",
    "hlen",
    "hscan",
    "lpush",
    "rpush",
    "lpop",
    "rpop",
    "lrange",
    "llen",
    "lindex",
    "lset",
    "lrem",
    "blpop",
    "brpop",
    "sadd",
    "srem",
    "smembers",
    "sismember",
    "scard",
    "spop",
    "sscan",
    "sunion",
    "sinter",
    "zadd",
    "zrem",
    "zrange",
    "zscore",
    "zcard",
    "zincrby",
    "zrank",
    "zscan",
    "xadd",
    "xrange",
    "xread",
    "pfadd",
    "pfcount",
    "setbit",
    "getbit",
    "bitcount",
    "geoadd",
    "publish",
    "subscribe",
    "psubscribe",
    "multi",
    "exec",
    "watch",
    "eval",
    "evalsha",
    "script",
    "function",
    "type",
    "rename",
    "renamenx",
    "keys",
    "randomkey",
    "move",
    "copy",
    "flushdb",
    "flushall",
    "save",
    "bgsave",
    "bgrewriteaof",
    "object",
    "dump",
    "restore",
    "sort",
    "touch",
    "unlink",
    "lcs",
    "substr",
];

impl Cmd {
    /// Looks a command name up, ignoring case.
    pub fn lookup(name: &[u8]) -> Option<(Cmd, &'static str, i32)> {
        COMMANDS
            .iter()
            .find(|(_, n, _)| n.as_bytes().eq_ignore_ascii_case(name))
            .copied()
    }

    /// Index of this command in [`COMMANDS`] (for per-command counters).
    pub fn index(self) -> usize {
        COMMANDS
            .iter()
            .position(|(c, _, _)| *c == self)
            .unwrap_or(0)
    }

    /// Whether the command writes (runs on the write pool).
    pub fn writes(self) -> bool {
        matches!(
            self,
            Cmd::Set
                | Cmd::Mset
                | Cmd::Del
                | Cmd::Vset
                | Cmd::Vdel
                | Cmd::Vbatch
                | Cmd::Vsetshm
                | Cmd::Vcas
                | Cmd::Fsync
                | Cmd::Recluster
                | Cmd::Hint
        )
    }

    /// Whether the command calls the engine (runs on the executor pool).
    pub fn uses_engine(self) -> bool {
        matches!(
            self,
            Cmd::Set
                | Cmd::Get
                | Cmd::Mset
                | Cmd::Mget
                | Cmd::Del
                | Cmd::Exists
                | Cmd::Strlen
                | Cmd::Getrange
                | Cmd::Scan
                | Cmd::Range
                | Cmd::Vset
                | Cmd::Vdel
                | Cmd::Vbatch
                | Cmd::Vsetshm
                | Cmd::Mgetshm
                | Cmd::Vcas
                | Cmd::Vmeta
                | Cmd::Fsync
                | Cmd::Recluster
                | Cmd::Hint
                | Cmd::Dbsize
                | Cmd::Info
        )
    }
}

/// Whether `argc` arguments satisfy `arity`.
pub fn arity_ok(arity: i32, argc: usize) -> bool {
    let argc = i64::try_from(argc).unwrap_or(i64::MAX);
    if arity >= 0 {
        argc == i64::from(arity)
    } else {
        argc >= -i64::from(arity)
    }
}

/// Whether `name` is a Redis command refused on purpose.
pub fn is_refused(name: &[u8]) -> bool {
    REFUSED
        .iter()
        .any(|n| n.as_bytes().eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_arity() {
        assert_eq!(Cmd::lookup(b"gEt").map(|c| c.0), Some(Cmd::Get));
        assert!(Cmd::lookup(b"nope").is_none());
        assert!(arity_ok(2, 2) && !arity_ok(2, 3));
        assert!(arity_ok(-3, 5) && !arity_ok(-3, 2));
        assert!(is_refused(b"EXPIRE") && !is_refused(b"get"));
        for (i, (c, _, _)) in COMMANDS.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }

    #[test]
    fn a_failed_device_is_an_ioerr_reply() {
        let e = engine::Error::DeviceFailed("device sync failed: EIO".into());
        let mut out = bytes::BytesMut::new();
        errors::engine(&e).encode(protocol::RespVersion::V2, &mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with("-ERR IOERR device sync failed: EIO"),
            "{text}"
        );
        assert!(text.contains("restart the node"), "{text}");
    }
}

/// Error replies shared by the command modules.
pub mod errors {
    use bytes::Bytes;
    use protocol::Reply;

    /// `-ERR wrong number of arguments for 'get' command`.
    pub fn wrong_args(name: &str) -> Reply {
        Reply::err(format!("wrong number of arguments for '{name}' command"))
    }

    /// A write naming a key of the node's reserved range (`reserved.rs`).
    pub fn reserved_key() -> Reply {
        Reply::err(
            "keys starting with \\xff\\xff\\xff\\xfflightstore/ are reserved for the node's own records",
        )
    }

    /// `-ERR syntax error`.
    pub fn syntax() -> Reply {
        Reply::err("syntax error")
    }

    /// `-ERR value is not an integer or out of range`.
    pub fn not_integer() -> Reply {
        Reply::err("value is not an integer or out of range")
    }

    /// A short, printable rendering of a client-supplied argument.
    pub fn show(arg: &[u8]) -> String {
        let s = String::from_utf8_lossy(&arg[..arg.len().min(128)]);
        s.replace(['\r', '\n'], " ")
    }

    /// `-ERR unknown command 'X', with args beginning with: 'a' 'b' `.
    pub fn unknown_command(args: &[Bytes]) -> Reply {
        let name = args.first().map(|a| show(a)).unwrap_or_default();
        let mut msg = format!("unknown command '{name}', with args beginning with: ");
        for a in args.iter().skip(1) {
            if msg.len() > 256 {
                break;
            }
            msg.push_str(&format!("'{}' ", show(a)));
        }
        Reply::err(msg)
    }

    /// `-ERR LightStore stores plain keys and values: 'EXPIRE' is not supported`.
    pub fn refused(name: &[u8]) -> Reply {
        Reply::err(format!(
            "LightStore stores plain keys and values: '{}' is not supported",
            show(name).to_ascii_uppercase()
        ))
    }

    /// The reply for an engine error.
    pub fn engine(e: &engine::Error) -> Reply {
        match e {
            engine::Error::NoSpace => Reply::err(
                "NOSPACE device full (delete data and let garbage collection reclaim space)",
            ),
            engine::Error::HostFull(why) => Reply::err(format!(
                "NOSPACE {why} (deletes still work; writes resume by themselves once space is \
                 freed there or deletes let garbage collection return some)"
            )),
            engine::Error::ValueTooLarge { .. } => Reply::err(format!("value too large: {e}")),
            // Others as they display (`DeviceFailed` starts with IOERR:
            // `-ERR IOERR …`).
            _ => Reply::err(e),
        }
    }

    /// Parses an integer argument.
    pub fn int(arg: &[u8]) -> Option<i64> {
        std::str::from_utf8(arg).ok()?.parse().ok()
    }
}
