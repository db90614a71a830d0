//! Kinesis sequence numbers and the order checkpoints are compared in.
//!
//! A sequence number is a decimal string of up to 129 digits: it overflows every integer type,
//! and comparing the strings as text puts `"9"` after `"10"`. Everything that decides whether a
//! record was already processed goes through [`SequenceNumber`]'s order (length, then digits)
//! and [`Position`]'s extended order (then the sub-sequence inside a KPL aggregate, with
//! [`SHARD_END`] after everything), so that rule lives in one place.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The checkpoint value marking a shard fully consumed; its children may start.
pub const SHARD_END: &str = "SHARD_END";

/// The longest sequence number Kinesis issues, in digits.
pub const MAX_DIGITS: usize = 129;

/// A validated Kinesis sequence number.
///
/// Ordered numerically without converting: a longer number is larger, and numbers of one
/// length compare digit by digit. A number of up to 62 digits (Kinesis issues 56) is held in
/// place, so reading one out of an event allocates nothing and a clone is a copy; a longer one
/// is shared, and its clone a reference-count bump.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::SequenceNumber;
///
/// let earlier: SequenceNumber = "9".parse()?;
/// let later: SequenceNumber = "49590338271490256608559692538361571095921575989136588898".parse()?;
/// assert!(earlier < later);
/// assert!("007".parse::<SequenceNumber>().is_err());
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Clone)]
pub struct SequenceNumber(Digits);

/// Numbers of up to this many digits are held in place: every record of a batch carries one,
/// and a block per record for it was a tenth of what the processor added to a bare loop
/// (the `processor` bench). 62 makes the number 64 bytes.
const INLINE: usize = 62;

/// A sequence number's digits, ASCII by construction: in place, or shared when longer.
#[derive(Clone)]
enum Digits {
    /// The first `len` bytes of `bytes`; the rest are zero.
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Shared(Arc<str>),
}

impl Digits {
    fn new(digits: &str) -> Self {
        match u8::try_from(digits.len()) {
            Ok(len) if digits.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..digits.len()].copy_from_slice(digits.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Shared(Arc::from(digits)),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Shared(digits) => digits.as_bytes(),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Checked again here (a few instructions for ASCII), since this crate has no
            // unsafe code: the bytes were digits when they were stored.
            Self::Inline { .. } => {
                std::str::from_utf8(self.as_bytes()).expect("a sequence number is ASCII digits")
            }
            Self::Shared(digits) => digits,
        }
    }
}

/// Equal by their digits, however each is held.
impl PartialEq for SequenceNumber {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_bytes() == other.0.as_bytes()
    }
}

impl Eq for SequenceNumber {}

/// Hashed by its digits, as [`PartialEq`] compares them.
impl std::hash::Hash for SequenceNumber {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl SequenceNumber {
    /// The digits, exactly as Kinesis wrote them.
    ///
    /// ```
    /// # use kinesis_checkpoint::SequenceNumber;
    /// let sequence: SequenceNumber = "42".parse()?;
    /// assert_eq!(sequence.as_str(), "42");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

/// Why a string is not a sequence number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SequenceError {
    /// The string was empty.
    #[error("the sequence number is empty")]
    Empty,
    /// A character other than an ASCII digit.
    #[error("sequence number '{0}' holds a character that is not a decimal digit")]
    NotDigits(String),
    /// A leading zero, which Kinesis never writes: two spellings of one number would compare
    /// unequal.
    #[error("sequence number '{0}' has a leading zero")]
    LeadingZero(String),
    /// Longer than the 129 digits Kinesis issues.
    #[error("sequence number of {0} digits is longer than the {MAX_DIGITS} Kinesis issues")]
    TooLong(usize),
}

impl FromStr for SequenceNumber {
    type Err = SequenceError;

    fn from_str(digits: &str) -> Result<Self, Self::Err> {
        check(digits)?;
        Ok(Self(Digits::new(digits)))
    }
}

/// Whether `digits` is a sequence number as Kinesis writes it.
fn check(digits: &str) -> Result<(), SequenceError> {
    match digits.as_bytes() {
        [] => Err(SequenceError::Empty),
        bytes if bytes.len() > MAX_DIGITS => Err(SequenceError::TooLong(bytes.len())),
        // Every byte checked, without stopping at the first that is not a digit: the check
        // then runs on whole words at once, and a well-formed number (every one Lambda sends)
        // is read to its end either way.
        bytes
            if !bytes
                .iter()
                .fold(true, |digits, byte| digits & byte.is_ascii_digit()) =>
        {
            Err(SequenceError::NotDigits(digits.to_owned()))
        }
        [b'0', _, ..] => Err(SequenceError::LeadingZero(digits.to_owned())),
        _ => Ok(()),
    }
}

impl SequenceNumber {
    /// A placeholder, `0`, for a number about to be read in place
    /// ([`read_into`](Self::read_into)).
    pub(crate) const ZERO: Self = Self(Digits::Inline {
        len: 1,
        bytes: {
            let mut bytes = [0; INLINE];
            bytes[0] = b'0';
            bytes
        },
    });

    /// Reads `digits` into `self`, where it is written once; `self` is left as it was when
    /// `digits` is not a sequence number.
    ///
    /// What an event's reader does for each record: it pushes [`ZERO`](Self::ZERO) and reads
    /// the number into it. A number built in one place and then moved into the reader's vector
    /// was read back, each time, by wider loads than the stores that had just written it, and
    /// the processor waited for those stores to reach the cache (a failed store-to-load
    /// forward): at 100 records the largest single cost of reading an event (the `processor`
    /// bench).
    pub(crate) fn read_into(&mut self, digits: &str) -> Result<(), SequenceError> {
        check(digits)?;
        match (&mut self.0, u8::try_from(digits.len())) {
            (Digits::Inline { len, bytes }, Ok(count)) if digits.len() <= INLINE => {
                bytes[..digits.len()].copy_from_slice(digits.as_bytes());
                bytes[digits.len()..].fill(0);
                *len = count;
            }
            (digits_held, _) => *digits_held = Digits::new(digits),
        }
        Ok(())
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        // Without leading zeros, the longer number is the larger one; equal lengths compare
        // as text because ASCII digits sort like their values.
        let (this, other) = (self.0.as_bytes(), other.0.as_bytes());
        this.len().cmp(&other.len()).then_with(|| this.cmp(other))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SequenceNumber({})", self.as_str())
    }
}

/// A place in a shard in KCL's extended order: a record, a sub-record of a KPL aggregate, or
/// the end of the shard.
///
/// A checkpoint is a `Position`: every record at or below it is done. `sub_sequence: None`
/// means the whole record, so it sorts after each of its sub-records: a checkpoint at
/// `(s, None)` covers all of `s`, one at `(s, Some(4))` covers sub-records 0 to 4 only.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::Position;
///
/// let fifth_of_aggregate = Position::sub_record("100".parse()?, 4);
/// let whole_record = Position::record("100".parse()?);
/// let next = Position::record("101".parse()?);
/// assert!(fifth_of_aggregate < whole_record);
/// assert!(whole_record < next);
/// assert!(next < Position::ShardEnd);
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Position {
    /// A record, or one sub-record of a KPL aggregate.
    Record {
        /// The record's sequence number.
        sequence: SequenceNumber,
        /// The index of the sub-record within its aggregate; `None` for the whole record.
        sub_sequence: Option<u64>,
    },
    /// After the last record of a closed shard: the shard is finished.
    ShardEnd,
}

impl Position {
    /// The whole record at `sequence`.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// let position = Position::record("7".parse()?);
    /// assert_eq!(position.to_string(), "7");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub const fn record(sequence: SequenceNumber) -> Self {
        Self::Record {
            sequence,
            sub_sequence: None,
        }
    }

    /// Sub-record `sub_sequence` of the KPL aggregate at `sequence`.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// let position = Position::sub_record("7".parse()?, 2);
    /// assert_eq!(position.to_string(), "7/2");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub const fn sub_record(sequence: SequenceNumber, sub_sequence: u64) -> Self {
        Self::Record {
            sequence,
            sub_sequence: Some(sub_sequence),
        }
    }

    /// Reads a position as a lease row stores it: a sequence number (or [`SHARD_END`]) and,
    /// inside a KPL aggregate, the sub-sequence number.
    ///
    /// # Errors
    ///
    /// A `checkpoint` that is neither [`SHARD_END`] nor a valid sequence number.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::sequence::SHARD_END;
    /// assert_eq!(Position::from_checkpoint(SHARD_END, None)?, Position::ShardEnd);
    /// assert_eq!(Position::from_checkpoint("12", Some(3))?.to_string(), "12/3");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    pub fn from_checkpoint(
        checkpoint: &str,
        sub_sequence: Option<u64>,
    ) -> Result<Self, SequenceError> {
        if checkpoint == SHARD_END {
            return Ok(Self::ShardEnd);
        }
        Ok(Self::Record {
            sequence: checkpoint.parse()?,
            sub_sequence,
        })
    }

    /// The `checkpoint` string a lease row stores for this position: the sequence number, or
    /// [`SHARD_END`].
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::sequence::SHARD_END;
    /// assert_eq!(Position::ShardEnd.checkpoint(), SHARD_END);
    /// assert_eq!(Position::sub_record("12".parse()?, 3).checkpoint(), "12");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn checkpoint(&self) -> &str {
        match self {
            Self::Record { sequence, .. } => sequence.as_str(),
            Self::ShardEnd => SHARD_END,
        }
    }

    /// The sub-sequence a lease row stores beside [`checkpoint`](Self::checkpoint), if any.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// assert_eq!(Position::sub_record("12".parse()?, 3).sub_sequence(), Some(3));
    /// assert_eq!(Position::record("12".parse()?).sub_sequence(), None);
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub const fn sub_sequence(&self) -> Option<u64> {
        match self {
            Self::Record { sub_sequence, .. } => *sub_sequence,
            Self::ShardEnd => None,
        }
    }
}

impl Ord for Position {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Self::ShardEnd, Self::ShardEnd) => Ordering::Equal,
            (Self::ShardEnd, Self::Record { .. }) => Ordering::Greater,
            (
                Self::Record {
                    sequence,
                    sub_sequence,
                },
                other,
            ) => cmp_record(sequence, *sub_sequence, other),
        }
    }
}

/// Orders the record at `sequence` (sub-record `sub_sequence`) against `other`, as
/// [`Position`]'s order does, without building a position for it: deduping a batch against its
/// checkpoint would otherwise clone and drop a sequence number per record.
pub(crate) fn cmp_record(
    sequence: &SequenceNumber,
    sub_sequence: Option<u64>,
    other: &Position,
) -> Ordering {
    match other {
        Position::ShardEnd => Ordering::Less,
        Position::Record {
            sequence: right,
            sub_sequence: right_sub,
        } => sequence
            .cmp(right)
            .then_with(|| match (sub_sequence, right_sub) {
                // The whole record comes after every one of its parts.
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some(l), Some(r)) => l.cmp(r),
            }),
    }
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// `sequence`, `sequence/sub` inside an aggregate, or `SHARD_END`.
impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Record {
                sequence,
                sub_sequence: None,
            } => write!(f, "{sequence}"),
            Self::Record {
                sequence,
                sub_sequence: Some(sub),
            } => write!(f, "{sequence}/{sub}"),
            Self::ShardEnd => f.write_str(SHARD_END),
        }
    }
}

// The range a gap names: a span of one shard's records in this order, shared by the gap's
// reading (the gate's topology reads it), its report, and the local streams that serve it.

/// Where the reading of a skipped range starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadFrom {
    /// After this record (`AFTER_SEQUENCE_NUMBER`): the checkpoint, a record done whole.
    After(SequenceNumber),
    /// At this record (`AT_SEQUENCE_NUMBER`): the reported record of a shard never
    /// checkpointed, or the aggregate a checkpoint stops inside.
    At(SequenceNumber),
    /// From the oldest record (`TRIM_HORIZON`): the partition-key mode's gate reading a closed
    /// parent from its start.
    TrimHorizon,
}

impl ReadFrom {
    /// Where reading resumes after `checkpoint`: after a record done whole, or at the aggregate
    /// a position inside it names (its remaining sub-records are read again, and dedupe drops
    /// the ones done); `None` after `SHARD_END`, where nothing follows.
    ///
    /// ```
    /// use kinesis_checkpoint::Position;
    /// use kinesis_checkpoint::gap::ReadFrom;
    ///
    /// let done = Position::record("100".parse()?);
    /// assert_eq!(ReadFrom::resuming(&done), Some(ReadFrom::After("100".parse()?)));
    /// let inside = Position::sub_record("100".parse()?, 3);
    /// assert_eq!(ReadFrom::resuming(&inside), Some(ReadFrom::At("100".parse()?)));
    /// assert_eq!(ReadFrom::resuming(&Position::ShardEnd), None);
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn resuming(checkpoint: &Position) -> Option<Self> {
        match checkpoint {
            Position::Record {
                sequence,
                sub_sequence: None,
            } => Some(Self::After(sequence.clone())),
            Position::Record { sequence, .. } => Some(Self::At(sequence.clone())),
            Position::ShardEnd => None,
        }
    }
}

/// A range of one shard's records the event source mapping skipped: from [`from`](Self::from)
/// up to, not including, the record [`before`](Self::before) (the batch's first).
///
/// ```
/// use kinesis_checkpoint::gap::{ReadFrom, SkippedRange};
///
/// let range = SkippedRange { from: ReadFrom::After("100".parse()?), before: "200".parse()? };
/// assert_eq!(range.to_string(), "after 100 up to 200");
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRange {
    /// Where reading starts.
    pub from: ReadFrom,
    /// The first record not in the range: the batch's first record.
    pub before: SequenceNumber,
}

impl SkippedRange {
    /// Whether `sequence` lies in the range (a record at or after the start, before the end).
    ///
    /// ```
    /// # use kinesis_checkpoint::gap::{ReadFrom, SkippedRange};
    /// let range = SkippedRange { from: ReadFrom::At("100".parse()?), before: "200".parse()? };
    /// assert!(range.contains(&"100".parse()?) && !range.contains(&"200".parse()?));
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn contains(&self, sequence: &SequenceNumber) -> bool {
        let started = match &self.from {
            ReadFrom::After(after) => sequence > after,
            ReadFrom::At(at) => sequence >= at,
            ReadFrom::TrimHorizon => true,
        };
        started && *sequence < self.before
    }
}

impl fmt::Display for SkippedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.from {
            ReadFrom::After(after) => write!(f, "after {after} up to {}", self.before),
            ReadFrom::At(at) => write!(f, "from {at} up to {}", self.before),
            ReadFrom::TrimHorizon => write!(f, "from the trim horizon up to {}", self.before),
        }
    }
}

#[cfg(test)]
mod tests;
