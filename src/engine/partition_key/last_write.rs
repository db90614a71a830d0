//! The partition-key mode's last write: the keys' rows, alone or (with a transactional
//! handler) with the records' writes.

use super::commits::{Batch, key_commits_of, write};
use crate::engine::attempt::Runner;
use crate::engine::keyed;
use crate::handler::Handler;
use crate::report::StopReason;

/// Writes the keys' rows at the end of a batch: with a transactional handler, with the
/// records' writes (see `transact`); otherwise as [`write`] does. Returns the keys whose rows
/// were not written, and why; `run` learns the records that failed at the commit.
pub(super) async fn commit<H: Handler>(
    runner: &Runner<'_, H>,
    batch: &Batch<'_>,
    run: &mut keyed::Run,
) -> Vec<(String, StopReason)> {
    #[cfg(feature = "dynamodb")]
    if runner.settings.transactional {
        return super::transact::commit(runner, batch, run).await;
    }
    let commits = key_commits_of(batch, &run.states);
    write(runner.settings.store.as_ref(), &commits).await
}
