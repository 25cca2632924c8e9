//! Named records the adapters keep in the cluster (block volumes, file
//! systems, mount leases): the rule for their names, and their text form,
//! one `name=value` per line, which any tool can read.

/// Longest record name.
pub const MAX_NAME: usize = 200;

/// Whether `name` is 1-[`MAX_NAME`] letters, digits, '-', '_' or '.';
/// if not, the message to show, naming it as `what` ("volume name").
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?}: use 1-{MAX_NAME} letters, digits, '-', '_' or '.'"
        ))
    }
}

/// The value of field `name` in a record's text, if present.
pub fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_fields() {
        assert!(check_name("x", "vol-1_a.b").is_ok());
        for bad in ["", "a b", "a/b", &"n".repeat(MAX_NAME + 1)] {
            assert!(check_name("x", bad).is_err(), "{bad}");
        }
        let text = "id=00ff\nsize=10\nsize_x=3\n";
        assert_eq!(field(text, "size"), Some("10"));
        assert_eq!(field(text, "id"), Some("00ff"));
        assert_eq!(field(text, "none"), None);
    }
}
