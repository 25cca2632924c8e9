//! Redis glob patterns (`SCAN MATCH`, `CONFIG GET`): `*`, `?`, `[abc]`,
//! `[^a-z]`, and `\` escapes, on bytes. Matching is linear-time with
//! backtracking to the last `*`, so no pattern can make it explode.

/// One pattern element; all but `Star` match exactly one byte.
#[derive(Debug)]
enum Token {
    Star,
    Any,
    Lit(u8),
    Class { negate: bool, ranges: Vec<(u8, u8)> },
}

impl Token {
    fn matches(&self, c: u8) -> bool {
        match self {
            Token::Star | Token::Any => true,
            Token::Lit(l) => *l == c,
            Token::Class { negate, ranges } => {
                ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c)) != *negate
            }
        }
    }
}

fn tokenize(p: &[u8]) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'*' => {
                if !matches!(out.last(), Some(Token::Star)) {
                    out.push(Token::Star);
                }
                i += 1;
            }
            b'?' => {
                out.push(Token::Any);
                i += 1;
            }
            b'\\' if i + 1 < p.len() => {
                out.push(Token::Lit(p[i + 1]));
                i += 2;
            }
            b'[' => {
                i += 1;
                let negate = p.get(i) == Some(&b'^');
                if negate {
                    i += 1;
                }
                let mut ranges = Vec::new();
                while i < p.len() && p[i] != b']' {
                    if p[i] == b'\\' && i + 1 < p.len() {
                        ranges.push((p[i + 1], p[i + 1]));
                        i += 2;
                    } else if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
                        let (a, b) = (p[i], p[i + 2]);
                        ranges.push((a.min(b), a.max(b)));
                        i += 3;
                    } else {
                        ranges.push((p[i], p[i]));
                        i += 1;
                    }
                }
                i += 1; // the closing ']' (or past the end)
                out.push(Token::Class { negate, ranges });
            }
            c => {
                out.push(Token::Lit(c));
                i += 1;
            }
        }
    }
    out
}

/// A compiled glob, for matching many strings against one pattern.
#[derive(Debug)]
pub struct Glob(Vec<Token>);

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &[u8]) -> Glob {
        Glob(tokenize(pattern))
    }

    /// Whether `s` matches (case-sensitive).
    pub fn matches(&self, s: &[u8]) -> bool {
        matches_tokens(&self.0, s)
    }
}

/// Whether `s` matches the Redis glob `pattern` (case-sensitive).
pub fn glob_match(pattern: &[u8], s: &[u8]) -> bool {
    matches_tokens(&tokenize(pattern), s)
}

fn matches_tokens(toks: &[Token], s: &[u8]) -> bool {
    let (mut t, mut i) = (0usize, 0usize);
    // Position after the last star and the input index it was tried at.
    let mut backtrack: Option<(usize, usize)> = None;
    while i < s.len() {
        match toks.get(t) {
            Some(Token::Star) => {
                backtrack = Some((t + 1, i));
                t += 1;
            }
            Some(tok) if tok.matches(s[i]) => {
                t += 1;
                i += 1;
            }
            _ => match backtrack {
                Some((bt, bi)) => {
                    t = bt;
                    i = bi + 1;
                    backtrack = Some((bt, bi + 1));
                }
                None => return false,
            },
        }
    }
    toks[t.min(toks.len())..]
        .iter()
        .all(|tok| matches!(tok, Token::Star))
}

#[cfg(test)]
mod tests {
    use super::glob_match as m;

    #[test]
    fn redis_glob_rules() {
        assert!(m(b"*", b""));
        assert!(m(b"*", b"anything"));
        assert!(m(b"user:*", b"user:42"));
        assert!(!m(b"user:*", b"users:42"));
        assert!(m(b"h?llo", b"hello"));
        assert!(!m(b"h?llo", b"hllo"));
        assert!(m(b"h[ae]llo", b"hallo"));
        assert!(!m(b"h[ae]llo", b"hillo"));
        assert!(m(b"h[^e]llo", b"hallo"));
        assert!(!m(b"h[^e]llo", b"hello"));
        assert!(m(b"h[a-b]llo", b"hbllo"));
        assert!(m(b"h[b-a]llo", b"hallo"));
        assert!(!m(b"h[a-b]llo", b"hcllo"));
        assert!(m(b"a\\*b", b"a*b"));
        assert!(!m(b"a\\*b", b"axb"));
        assert!(m(b"[\\]]", b"]"));
        assert!(m(b"*a*b*c*", b"xxaxxbxxcxx"));
        assert!(!m(b"*a*b*c*", b"xxaxxcxxbxx"));
        assert!(m(b"k\x00*", b"k\x00\xff"));
        assert!(!m(b"abc", b"abcd"));
        assert!(!m(b"", b"a"));
    }

    #[test]
    fn pathological_pattern_is_fast() {
        let s = vec![b'a'; 10_000];
        let mut p = b"*a".repeat(50);
        p.push(b'b');
        let t = std::time::Instant::now();
        assert!(!m(&p, &s));
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }
}
