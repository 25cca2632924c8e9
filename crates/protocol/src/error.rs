//! Protocol errors: malformed or oversized requests.

/// A request that cannot be parsed. After any of these the connection's
/// byte stream cannot be trusted, so the server answers `-ERR Protocol
/// error: ...` and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// `*N` with N not a number, negative (other than -1) or over the limit.
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// `$N` with N not a number or negative.
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// A bulk string longer than the configured maximum.
    #[error("Protocol error: bulk length {len} exceeds the limit of {max} bytes")]
    BulkTooLarge {
        /// Announced length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// More arguments than the configured maximum.
    #[error("Protocol error: {count} arguments exceed the limit of {max}")]
    TooManyArguments {
        /// Announced count.
        count: usize,
        /// Configured maximum.
        max: usize,
    },
    /// A request whose arguments add up to more than the configured maximum.
    #[error("Protocol error: request larger than the limit of {max} bytes")]
    RequestTooLarge {
        /// Configured maximum.
        max: usize,
    },
    /// An element of a multibulk request that is not a bulk string.
    #[error("Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// A bulk string not followed by CRLF.
    #[error("Protocol error: bulk string not terminated by CRLF")]
    MissingCrlf,
    /// An inline command line longer than the maximum.
    #[error("Protocol error: too big inline request")]
    InlineTooLong,
    /// An inline command with unbalanced quotes.
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
}
