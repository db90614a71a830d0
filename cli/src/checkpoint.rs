//! `kinesis-checkpoint set-checkpoint` and `reset`: move one shard's checkpoint by hand, to
//! recover a stuck shard (skip a record that can never succeed, finish a parent that will never
//! be read again) or to replay from an earlier point.
//!
//! The move is refused while another owner's lease is live, since that invocation is working
//! from the old checkpoint; `--force` takes the lease from it instead, so its own final write is
//! fenced and cannot undo the move. Every move asks for confirmation unless `--yes`.

use std::io::{BufRead, Write};

use kinesis_checkpoint::store::LeaseState;
use kinesis_checkpoint::store::dynamo::Moved;
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position};

use crate::Error;
use crate::console::confirm;

/// Where to move a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// After this record (or sub-record of a KPL aggregate): the next batch starts after it.
    At(Position),
    /// No checkpoint: the shard starts again from the mapping's starting position.
    TrimHorizon,
    /// `SHARD_END`: the shard is finished and its children may run.
    Finished,
}

impl Target {
    fn position(&self) -> Option<Position> {
        match self {
            Self::At(position) => Some(position.clone()),
            Self::TrimHorizon => None,
            Self::Finished => Some(Position::ShardEnd),
        }
    }
}

/// What was asked of [`move_checkpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// Take a live lease from its holder.
    pub force: bool,
    /// Do not ask.
    pub yes: bool,
}

/// Why a move did not happen.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// A live lease is held and `--force` was not given.
    #[error(
        "shard '{key}' is leased by '{owner}' for {seconds} more seconds: an invocation is \
         working from the current checkpoint. Wait for it to finish, or add --force to take the \
         lease from it (its records then run again)"
    )]
    LeaseHeld {
        /// The shard.
        key: LeaseKey,
        /// Who holds it.
        owner: String,
        /// How long the lease still runs.
        seconds: u64,
    },
    /// The operator did not confirm.
    #[error("not confirmed: nothing was written")]
    NotConfirmed,
}

/// Moves `key`'s checkpoint to `target` after showing the change and asking on `out`/`input`.
/// Returns the row as it was.
///
/// # Errors
///
/// [`MoveError`] when a live lease is held (without `force`) or the operator said no; the
/// store's error when the table could not be read or written.
///
/// ```no_run
/// # use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey};
/// # use kinesis_checkpoint_cli::checkpoint::{Options, Target, move_checkpoint};
/// # async fn run() -> Result<(), kinesis_checkpoint_cli::Error> {
/// let store = DynamoLeaseStore::new(&aws_config::load_from_env().await, "orders-leases");
/// let key = LeaseKey::new("orders", "shardId-000000000000");
/// let options = Options { force: false, yes: true };
/// move_checkpoint(&store, &key, &Target::Finished, options, &mut std::io::empty(), &mut std::io::stdout()).await?;
/// # Ok(())
/// # }
/// ```
pub async fn move_checkpoint(
    store: &DynamoLeaseStore,
    key: &LeaseKey,
    target: &Target,
    options: Options,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<LeaseState, Error> {
    let current = store.row(key).await?;
    if !options.force
        && let Some(error) = held(key, &current)
    {
        return Err(error.into());
    }
    let to = target.position();
    writeln!(
        out,
        "shard {key} (table {}): checkpoint {} -> {}",
        store.table(),
        current.position().map_or_else(
            |error| format!("unreadable ({error})"),
            |position| describe(position.as_ref())
        ),
        describe(to.as_ref()),
    )?;
    if let Some(failing) = &current.failing {
        writeln!(
            out,
            "  forgets the failing record {} ({} attempts: {})",
            failing.sequence, failing.attempts, failing.last_error
        )?;
    }
    if let Some(owner) = &current.lease_owner {
        writeln!(out, "  takes the lease from {owner}")?;
    }
    if !options.yes && !confirm("Move the checkpoint?", input, out)? {
        return Err(MoveError::NotConfirmed.into());
    }
    match store
        .move_checkpoint(key, to.as_ref(), options.force)
        .await?
    {
        Moved::Moved(before) => {
            writeln!(out, "moved")?;
            Ok(before)
        }
        // Taken between the read and the write.
        Moved::Held(now) => Err(held(key, &now).map_or_else(
            || "the lease was taken meanwhile; try again".into(),
            Into::into,
        )),
    }
}

fn held(key: &LeaseKey, state: &LeaseState) -> Option<MoveError> {
    let now = now_ms();
    match (&state.lease_owner, state.lease_expiry) {
        (Some(owner), Some(expiry)) if expiry >= now => Some(MoveError::LeaseHeld {
            key: key.clone(),
            owner: owner.clone(),
            seconds: (expiry - now).div_ceil(1_000),
        }),
        _ => None,
    }
}

fn describe(position: Option<&Position>) -> String {
    match position {
        None => "none (trim horizon)".to_owned(),
        Some(Position::ShardEnd) => "SHARD_END (finished)".to_owned(),
        Some(position) => match position.sub_sequence() {
            Some(sub) => format!("{} sub-record {sub}", position.checkpoint()),
            None => position.checkpoint().to_owned(),
        },
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
