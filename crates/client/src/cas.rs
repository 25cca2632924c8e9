//! Compare-and-set on one key: read a key with its version, then write it
//! only if no one else has written it since (`VCAS` on each replica, which
//! compares and writes atomically on that node).
//!
//! Contract of [`Cluster::write_if_version`]:
//! - `Some(version)`: every replica that answered held `expected` and took
//!   the write, and the write quorum did (as for [`Cluster::mset`]);
//!   replicas that were down get it later as a hint.
//! - `None`: some replica holds another version — someone wrote since the
//!   caller read. Replicas still at `expected` may have taken the write;
//!   there it is an ordinary newer copy that reads and repair spread, so a
//!   caller that gets `None` must read again before deciding anything.
//!
//! Two callers racing from the same `expected` can therefore both get
//! `None` (each won on a different replica), but never both `Some`: a
//! replica takes at most one of two writes that expect the same version,
//! and `Some` needs every replica that answered.

use protocol::versioned::Versioned;
use protocol::Reply;

use crate::cluster::{Cluster, Inner};
use crate::error::{ClientError, Result};
use crate::kv::{clone_error, KeyWrite};

impl Cluster {
    /// Reads `key` as stored, with its version: version 0 and no value
    /// when no replica has it, the tombstone's version and no value when
    /// it was deleted. The version is what [`Cluster::write_if_version`]
    /// expects.
    pub fn get_versioned(&self, key: &[u8]) -> Result<Versioned> {
        let stored = self.mget_stored(&[key])?.pop().flatten();
        Ok(stored.map_or(
            Versioned {
                version: 0,
                value: None,
            },
            Versioned::decode,
        ))
    }

    /// Stores `value` (`None`: deletes) under `key` if its version is still
    /// `expected` (see the module doc for what `Some` and `None` promise).
    pub fn write_if_version(
        &self,
        key: &[u8],
        expected: u64,
        value: Option<&[u8]>,
    ) -> Result<Option<u64>> {
        self.inner.write_if_version(key, expected, value)
    }
}

impl Inner {
    fn write_if_version(
        &self,
        key: &[u8],
        expected: u64,
        value: Option<&[u8]>,
    ) -> Result<Option<u64>> {
        let version = self.next_version_after(expected);
        let (version_text, expected_text) = (version.to_string(), expected.to_string());
        let mut req: Vec<&[u8]> = vec![
            b"VCAS",
            key,
            expected_text.as_bytes(),
            version_text.as_bytes(),
        ];
        match value {
            Some(v) => req.extend([&b"SET"[..], v]),
            None => req.push(b"DEL"),
        }
        let (replicas, targets) = self.write_targets(key);
        let mut state = KeyWrite {
            missed_by: replicas
                .iter()
                .copied()
                .filter(|r| !targets.contains(r))
                .collect(),
            ..KeyWrite::default()
        };
        let jobs: Vec<(usize, Vec<&[&[u8]]>)> =
            targets.iter().map(|&n| (n, vec![&req[..]])).collect();
        let mut conflict = false;
        let mut runs = std::collections::BTreeMap::new();
        for (node, r) in self.pipeline_all_checked_runs(&jobs) {
            match r.map(|(run, mut replies)| (run, replies.pop())) {
                Ok((run, Some(Reply::Integer(1)))) => {
                    state.acked_by.push(node);
                    runs.insert(node, run);
                }
                Ok((_, Some(Reply::Integer(0)))) => conflict = true,
                Ok((_, other)) => {
                    state.refused = Some(ClientError::UnexpectedReply {
                        node: self.nodes[node].addr.clone(),
                        command: "VCAS".into(),
                        reply: format!("{other:?}"),
                    })
                }
                Err(e) if e.is_node_failure() => {
                    state.missed_by.push(node);
                    state.last = Some(clone_error(&e));
                }
                Err(e) => state.refused = Some(e),
            }
        }
        // Taken where acknowledged, even if another replica refused it.
        self.note_acked_alone(std::slice::from_ref(&state), &runs);
        if conflict {
            return Ok(None);
        }
        self.record_hints(&[(key, value)], &version_text, std::slice::from_ref(&state));
        self.quorum_met(state, replicas.len())?;
        Ok(Some(version))
    }
}
