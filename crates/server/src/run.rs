//! This node's run (one process from start to stop) and what a client can
//! trust of the run before it.
//!
//! A node under `interval` or `none` durability acknowledges writes before
//! they are on its device. If it dies and restarts in between, those
//! writes are gone, and an `FSYNC` the new process answers covers only what
//! the new process took: a client that wrote, saw the node restart, and
//! then synced would be told its writes are durable when they are lost.
//! So each run has an id, and knows which runs before it lost nothing they
//! acknowledged; `RUNID` replies `[id, safe_from, safe_to]`, and the cluster client
//! (`client::runs`) asks it on each new connection and fails its next sync
//! when a node it wrote to without syncing came back from a run that may
//! have lost those writes.
//!
//! Contract:
//! - Run ids of one node only grow as long as its clock does: each is at
//!   least the microseconds since the epoch at its start and above the
//!   last recorded run's.
//! - `safe_from..=safe_to` are the earlier runs known to have lost nothing
//!   they acknowledged (empty, `0..=0`, when the last run may have): the
//!   unbroken chain of such runs that ends with the last recorded one. A
//!   run vouches for itself in the store (`run/lost-nothing`) when it stops
//!   cleanly (every acknowledged write synced first), or at its start under
//!   `sync` durability (every acknowledgement waits for the device); at its
//!   start under any other durability it clears the mark, durably, before
//!   it serves anyone, so a later crash leaves no mark behind. A run the
//!   store could not record at its start (a full device) is above
//!   `safe_to` for the next one, so it is never vouched for by mistake.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use engine::{BatchOp, Db, Durability};

use crate::reserved::RESERVED;

/// The id of the last run that started (so ids only grow).
fn last_key() -> Vec<u8> {
    [RESERVED, b"run/last"].concat()
}

/// The id of a run that lost nothing it acknowledged.
fn lost_nothing_key() -> Vec<u8> {
    [RESERVED, b"run/lost-nothing"].concat()
}

/// The first run of the chain of runs that lost nothing which the last
/// recorded run would extend by a clean stop.
fn chain_start_key() -> Vec<u8> {
    [RESERVED, b"run/chain-start"].concat()
}

/// This run, as `RUNID` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    pub id: u64,
    /// The earlier runs that lost nothing they acknowledged:
    /// `safe_from..=safe_to` (`0..=0`: none).
    pub safe_from: u64,
    pub safe_to: u64,
    /// The first run of the chain this run extends if it stops cleanly
    /// (`safe_from`, or this run when the last one may have lost writes).
    chain_start: u64,
    /// How the previous run ended (`INFO server`, `cluster status`).
    pub previous: PreviousStop,
}

/// How the run before this one ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PreviousStop {
    /// There was none (a new store), or it is not known.
    #[default]
    None,
    /// It lost nothing it acknowledged.
    Clean,
    /// It may have lost writes it acknowledged in its last moments (those
    /// its durability had not synced): other replicas hold them.
    Unclean,
}

impl PreviousStop {
    /// As `INFO server` shows it.
    pub fn name(self) -> &'static str {
        match self {
            PreviousStop::None => "none",
            PreviousStop::Clean => "clean",
            PreviousStop::Unclean => "unclean",
        }
    }
}

fn stored_id(db: &Db, key: &[u8]) -> engine::Result<u64> {
    Ok(db
        .get(key)?
        .and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok())
        .unwrap_or(0))
}

fn id_value(id: u64) -> Bytes {
    Bytes::from(id.to_string())
}

/// Starts a run on `db` (before the node serves anyone): reads what the
/// last run left, records this one, and makes that durable. A store that
/// refuses the record (a full device or host file system, where the node
/// still starts to serve reads) keeps the last run's: the mark then vouches
/// for that run, never for this one, so clients stay on the safe side.
pub fn begin(db: &Db, durability: Durability) -> engine::Result<Run> {
    let last = stored_id(db, &last_key())?;
    let vouched = stored_id(db, &lost_nothing_key())?;
    let chain = stored_id(db, &chain_start_key())?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let id = now.max(last + 1);
    let clean = vouched != 0 && vouched == last;
    let (safe_from, safe_to) = if clean {
        (
            if chain == 0 || chain > last {
                last
            } else {
                chain
            },
            last,
        )
    } else {
        (0, 0)
    };
    let run = Run {
        id,
        safe_from,
        safe_to,
        chain_start: if clean { safe_from } else { id },
        previous: match (last, clean) {
            (0, _) => PreviousStop::None,
            (_, true) => PreviousStop::Clean,
            (_, false) => PreviousStop::Unclean,
        },
    };
    if run.previous == PreviousStop::Unclean {
        tracing::warn!(
            previous_run = last,
            "the last run of this node ended without a clean stop: writes it acknowledged in \
             its last moments (those its durability had not synced) may be missing here; \
             other replicas hold them (reads take the newest copy, `lightstore cluster repair` \
             copies them back) and clients' next sync reports any no other replica took"
        );
    }
    let mark = match durability {
        Durability::Sync => BatchOp::Put(lost_nothing_key().into(), id_value(run.id)),
        _ => BatchOp::Delete(lost_nothing_key().into()),
    };
    let recorded = db
        .write_batch(&[
            BatchOp::Put(last_key().into(), id_value(run.id)),
            BatchOp::Put(chain_start_key().into(), id_value(run.chain_start)),
            mark,
        ])
        .and_then(|()| db.sync());
    if let Err(e) = recorded {
        tracing::warn!(error = %e, "cannot record this run; clients will treat its stop as unclean unless it stops cleanly");
    }
    Ok(run)
}

/// Ends `run` cleanly: call once no write can arrive any more; syncs every
/// acknowledged write and vouches for the run (recording it too, in case
/// its start could not). A store that refuses the mark (full) only syncs:
/// clients then treat the stop as unclean.
pub fn end(db: &Db, run: Run) -> engine::Result<()> {
    let id = id_value(run.id);
    if let Err(e) = db.write_batch(&[
        BatchOp::Put(last_key().into(), id.clone()),
        BatchOp::Put(chain_start_key().into(), id_value(run.chain_start)),
        BatchOp::Put(lost_nothing_key().into(), id),
    ]) {
        tracing::warn!(error = %e, "cannot mark this run's clean stop");
    }
    db.sync()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Durability = Durability::Interval(std::time::Duration::from_millis(100));

    #[test]
    fn a_run_vouches_for_the_clean_chain_before_it() {
        let dev = flash::NandDevice::new(flash::NandConfig {
            page_size: 4096,
            capacity: 16 << 20,
            ..flash::NandConfig::default()
        });
        let db = Db::open(dev, engine::Options::small_for_tests()).expect("open");
        let range = |r: Run| (r.safe_from, r.safe_to);
        let first = begin(&db, INTERVAL).expect("begin");
        assert_eq!(range(first), (0, 0), "no run before");
        assert_eq!(first.previous, PreviousStop::None);
        // Crash (no end): the next run cannot vouch for it.
        let second = begin(&db, INTERVAL).expect("begin");
        assert!(second.id > first.id);
        assert_eq!(range(second), (0, 0), "the first run crashed");
        assert_eq!(second.previous, PreviousStop::Unclean);
        end(&db, second).expect("end");
        let third = begin(&db, Durability::Sync).expect("begin");
        assert_eq!(range(third), (second.id, second.id), "a clean stop");
        assert_eq!(third.previous, PreviousStop::Clean);
        // Under sync durability a crash loses nothing acknowledged; the
        // chain goes on: a client that saw only the second run is safe.
        let fourth = begin(&db, INTERVAL).expect("begin");
        assert_eq!(range(fourth), (second.id, third.id));
        end(&db, fourth).expect("end");
        let fifth = begin(&db, INTERVAL).expect("begin");
        assert_eq!(
            range(fifth),
            (second.id, fourth.id),
            "three clean runs in a row"
        );
        // An interval run that crashes breaks the chain.
        let sixth = begin(&db, INTERVAL).expect("begin");
        assert_eq!(range(sixth), (0, 0));
        assert!(sixth.id > fifth.id);
        end(&db, sixth).expect("end");
        let seventh = begin(&db, INTERVAL).expect("begin");
        assert_eq!(range(seventh), (sixth.id, sixth.id), "a new chain");
    }
}
