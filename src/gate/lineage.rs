//! What both parent rules share: the stream's shards as the gate last saw them, the parents
//! known finished, and the steps every rule takes before looking at a parent's records (is it
//! finished already, expired, still open?) and after (mark it `SHARD_END`).
//!
//! Kept for the life of the process: parents never change, a closed shard stays closed, and a
//! finished shard stays finished.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::topology::{ShardInfo, StartingPosition, Topology, TopologyError};
use crate::clock::{self, Clock};
use crate::key::LeaseKey;
use crate::report::Held;
use crate::sequence::SHARD_END;
use crate::store::{CheckpointStore, LeaseError, LeaseState};

/// A day: finished rows outlive the stream's retention by one, so a late redelivery of a
/// parent's records still finds them `SHARD_END`.
const GRACE: Duration = Duration::from_hours(24);

/// The gate's knowledge of the stream, shared by the shard rule and the partition-key rule.
pub(super) struct Lineage {
    pub(super) topology: Arc<dyn Topology>,
    pub(super) starting_position: StartingPosition,
    pub(super) retention: Option<Duration>,
    /// What a finished row's expiry is counted from.
    pub(super) clock: Arc<dyn Clock>,
    shards: Mutex<HashMap<String, HashMap<String, ShardInfo>>>,
    finished: Mutex<HashSet<LeaseKey>>,
}

impl Lineage {
    /// Nothing known yet: every shard is asked of `topology` once.
    pub(super) fn new(topology: Arc<dyn Topology>, starting_position: StartingPosition) -> Self {
        Self {
            topology,
            starting_position,
            retention: None,
            clock: clock::system(),
            shards: Mutex::new(HashMap::new()),
            finished: Mutex::new(HashSet::new()),
        }
    }

    /// What both modes settle before looking at a parent's records: `Err(None)` when it is
    /// known finished (remembered, marked `SHARD_END`, or expired from the stream),
    /// `Err(Some(..))` while it is still open; otherwise its row and its view in the topology,
    /// for the mode's own check.
    pub(super) async fn closed_parent(
        &self,
        store: &dyn CheckpointStore,
        parent: &LeaseKey,
    ) -> Result<Result<(LeaseState, ShardInfo), Option<Held>>, LeaseError> {
        if self.is_finished(parent) {
            return Ok(Err(None));
        }
        let row = store.read(parent).await?;
        if row.checkpoint.as_deref() == Some(SHARD_END) {
            self.remember_finished(parent);
            return Ok(Err(None));
        }
        let Some(info) = self.shard(parent.stream(), parent.shard(), true).await? else {
            tracing::info!(
                parent = parent.shard(),
                "the parent has expired from the stream: finished"
            );
            self.remember_finished(parent);
            return Ok(Err(None));
        };
        if !info.closed {
            return Ok(Err(Some(Held::ParentOpen {
                parent: parent.shard().to_owned(),
            })));
        }
        Ok(Ok((row, info)))
    }

    /// Writes `SHARD_END` on an exhausted parent (unless its checkpoint moved meanwhile), with
    /// its expiry for `DynamoDB` TTL.
    pub(super) async fn finish(
        &self,
        store: &dyn CheckpointStore,
        parent: &LeaseKey,
        expected: Option<&str>,
    ) -> Result<(), LeaseError> {
        let retention = match self.retention {
            Some(retention) => retention,
            None => self.topology.retention(parent.stream()).await?,
        };
        let expires_at =
            (self.clock.now_millis() / 1_000).saturating_add((retention + GRACE).as_secs());
        if store.finish(parent, expected, expires_at).await? {
            tracing::info!(
                parent = parent.shard(),
                "the parent is exhausted: marked SHARD_END"
            );
            self.remember_finished(parent);
        }
        Ok(())
    }

    /// The topology's view of one shard: from the cache, or asked again when the cache does not
    /// know the shard (it may be new), or when `closing` matters and the cache saw it open (it
    /// may have closed since). Parents never change, and a closed shard stays closed.
    pub(super) async fn shard(
        &self,
        stream: &str,
        shard: &str,
        closing: bool,
    ) -> Result<Option<ShardInfo>, TopologyError> {
        let cached = self
            .shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(stream)
            .and_then(|shards| shards.get(shard))
            .filter(|info| info.closed || !closing)
            .cloned();
        if cached.is_some() {
            return Ok(cached);
        }
        let shards = self.topology.shards(stream).await?;
        let found = shards.iter().find(|info| info.id == shard).cloned();
        self.shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                stream.to_owned(),
                shards
                    .into_iter()
                    .map(|info| (info.id.clone(), info))
                    .collect(),
            );
        Ok(found)
    }

    pub(super) fn is_finished(&self, key: &LeaseKey) -> bool {
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(key)
    }

    pub(super) fn remember_finished(&self, key: &LeaseKey) {
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone());
    }
}

/// Why a shard waits when `error` left its parents unknown.
pub(super) fn held_unknown(error: &dyn fmt::Display) -> Held {
    Held::Unknown {
        error: error.to_string(),
    }
}
