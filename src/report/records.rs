//! A shard's records in a report, kept by ranges: runs of one disposition over the batch's own
//! records, each record's position read only when asked for.
//!
//! The engine ends every invocation with a shard's records and what became of each; most of a
//! batch goes one way (all processed, all duplicates). Building a [`RecordReport`] per record
//! would clone every sequence number and fill a vector as long as the batch, for a report the
//! service reads only to find the one record to report. Here a batch that all went one way is
//! one run, and the positions stay where the records are.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use super::{Disposition, RecordReport};
use crate::sequence::Position;

/// Where the positions of a shard's records are read from, on demand: the batch's own records
/// (the engine's entries), kept alive by the report that names them.
pub(crate) trait PositionSource: Send + Sync {
    /// The position of the record at `index`.
    fn position(&self, index: usize) -> Position;
}

/// Where a [`RecordReports`] reads its positions.
#[derive(Clone)]
enum Positions {
    /// One per record, for a report built record by record.
    Listed(Vec<Position>),
    /// The records from `start` on of a shared source.
    Shared {
        source: Arc<dyn PositionSource>,
        start: usize,
    },
}

/// A shard's records in a report, in order: runs of records that met one disposition, each
/// record's [`RecordReport`] built when it is asked for.
///
/// Read it as a sequence of [`RecordReport`]s ([`iter`](Self::iter), [`get`](Self::get),
/// `for record in &records`), or run by run ([`runs`](Self::runs), [`count`](Self::count)),
/// which reads no position at all.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::report::{Disposition, RecordReport, RecordReports};
/// use kinesis_checkpoint::Position;
///
/// let records: RecordReports = (1..=3)
///     .map(|n| RecordReport {
///         position: Position::record(n.to_string().parse().unwrap()),
///         disposition: if n < 3 { Disposition::Processed } else { Disposition::Reported },
///     })
///     .collect();
/// assert_eq!(records.len(), 3);
/// assert_eq!(records.count(Disposition::Processed), 2);
/// assert_eq!(records.runs().count(), 2, "two runs: processed, then reported");
/// assert_eq!(records.get(2).unwrap().position.to_string(), "3");
/// ```
#[derive(Clone)]
pub struct RecordReports {
    positions: Positions,
    /// Each run's end (exclusive, from the first record) and disposition; ascending ends.
    runs: Vec<(usize, Disposition)>,
}

impl Default for RecordReports {
    fn default() -> Self {
        Self {
            positions: Positions::Listed(Vec::new()),
            runs: Vec::new(),
        }
    }
}

impl RecordReports {
    /// Reports of the records of `source` from `start` on, in order: `count` records of each
    /// `(disposition, count)` of `runs` (a batch's leading duplicates are one run, however
    /// many: nothing is done per record for them).
    pub(crate) fn shared(
        source: Arc<dyn PositionSource>,
        start: usize,
        runs: impl IntoIterator<Item = (Disposition, usize)>,
    ) -> Self {
        let mut records = Self {
            positions: Positions::Shared { source, start },
            runs: Vec::new(),
        };
        for (disposition, count) in runs {
            records.push_run(disposition, count);
        }
        records
    }

    fn push_disposition(&mut self, disposition: Disposition) {
        self.push_run(disposition, 1);
    }

    /// `count` more records of `disposition`.
    fn push_run(&mut self, disposition: Disposition, count: usize) {
        if count == 0 {
            return;
        }
        match self.runs.last_mut() {
            Some((end, last)) if *last == disposition => *end += count,
            _ => {
                let end = self.len() + count;
                self.runs.push((end, disposition));
            }
        }
    }

    /// Adds `record` at the end. A report over a shared source is first turned into a listed
    /// one (the engine never mixes the two: this is for reports built record by record).
    pub(crate) fn push(&mut self, record: RecordReport) {
        if let Positions::Shared { .. } = &self.positions {
            let listed = self.iter().map(|record| record.position).collect();
            self.positions = Positions::Listed(listed);
        }
        if let Positions::Listed(positions) = &mut self.positions {
            positions.push(record.position);
        }
        self.push_disposition(record.disposition);
    }

    /// Moves every record of `other` to the end of these.
    pub(crate) fn append(&mut self, other: Self) {
        if self.is_empty() {
            *self = other;
        } else {
            other.iter().for_each(|record| self.push(record));
        }
    }

    /// Splits the reports at `at`: these keep the records before it, the rest are returned.
    pub(crate) fn split_off(&mut self, at: usize) -> Self {
        let at = at.min(self.len());
        let first = self.runs.partition_point(|(end, _)| *end <= at);
        let mut rest: Vec<(usize, Disposition)> = self.runs[first..]
            .iter()
            .map(|(end, disposition)| (end - at, *disposition))
            .collect();
        rest.retain(|(end, _)| *end > 0);
        self.runs.truncate(first);
        if let Some(&(_, disposition)) = rest.first()
            && self.len() < at
        {
            self.runs.push((at, disposition));
        }
        let positions = match &mut self.positions {
            Positions::Listed(positions) => Positions::Listed(positions.split_off(at)),
            Positions::Shared { source, start } => Positions::Shared {
                source: Arc::clone(source),
                start: *start + at,
            },
        };
        Self {
            positions,
            runs: rest,
        }
    }

    /// Makes the first record `to` when it is `from`.
    pub(crate) fn replace_first(&mut self, from: Disposition, to: Disposition) {
        let Some(&(end, disposition)) = self.runs.first() else {
            return;
        };
        if disposition != from || from == to {
            return;
        }
        if end == 1 {
            self.runs[0].1 = to;
            // A run of `to` right after it now starts at the first record.
            if self.runs.get(1).is_some_and(|&(_, next)| next == to) {
                self.runs.remove(0);
            }
        } else {
            self.runs.insert(0, (1, to));
        }
    }

    /// How many records.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::RecordReports;
    /// assert_eq!(RecordReports::default().len(), 0);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.runs.last().map_or(0, |(end, _)| *end)
    }

    /// Whether there are no records.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::RecordReports;
    /// assert!(RecordReports::default().is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The runs of records that met one disposition, in order: the indexes of each run's
    /// records and their disposition. Reads no position.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::{Disposition, RecordReports};
    /// fn processed(records: &RecordReports) -> usize {
    ///     records
    ///         .runs()
    ///         .filter(|(_, disposition)| *disposition == Disposition::Processed)
    ///         .map(|(range, _)| range.len())
    ///         .sum()
    /// }
    /// assert_eq!(processed(&RecordReports::default()), 0);
    /// ```
    pub fn runs(&self) -> impl Iterator<Item = (Range<usize>, Disposition)> + '_ {
        let starts = std::iter::once(0).chain(self.runs.iter().map(|(end, _)| *end));
        starts
            .zip(&self.runs)
            .map(|(start, &(end, disposition))| (start..end, disposition))
    }

    /// How many records met `disposition`.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::{Disposition, RecordReports};
    /// assert_eq!(RecordReports::default().count(Disposition::Processed), 0);
    /// ```
    #[must_use]
    pub fn count(&self, disposition: Disposition) -> usize {
        self.runs()
            .filter(|(_, met)| *met == disposition)
            .map(|(range, _)| range.len())
            .sum()
    }

    /// The disposition of the record at `index`, without reading its position.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::RecordReports;
    /// assert_eq!(RecordReports::default().disposition(0), None);
    /// ```
    #[must_use]
    pub fn disposition(&self, index: usize) -> Option<Disposition> {
        let run = self.runs.partition_point(|(end, _)| *end <= index);
        self.runs.get(run).map(|(_, disposition)| *disposition)
    }

    /// The report of the record at `index`.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::RecordReports;
    /// assert!(RecordReports::default().get(0).is_none());
    /// ```
    #[must_use]
    pub fn get(&self, index: usize) -> Option<RecordReport> {
        let disposition = self.disposition(index)?;
        Some(RecordReport {
            position: self.position(index),
            disposition,
        })
    }

    fn position(&self, index: usize) -> Position {
        match &self.positions {
            Positions::Listed(positions) => positions[index].clone(),
            Positions::Shared { source, start } => source.position(start + index),
        }
    }

    /// The first record's report.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::RecordReports;
    /// assert!(RecordReports::default().first().is_none());
    /// ```
    #[must_use]
    pub fn first(&self) -> Option<RecordReport> {
        self.get(0)
    }

    /// The last record's report.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::RecordReports;
    /// assert!(RecordReports::default().last().is_none());
    /// ```
    #[must_use]
    pub fn last(&self) -> Option<RecordReport> {
        self.len().checked_sub(1).and_then(|last| self.get(last))
    }

    /// Every record's report, in order, each built as the iterator reaches it.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::RecordReports;
    /// assert_eq!(RecordReports::default().iter().count(), 0);
    /// ```
    #[must_use]
    pub const fn iter(&self) -> Iter<'_> {
        Iter {
            records: self,
            run: 0,
            index: 0,
        }
    }
}

/// The reports of [`RecordReports::iter`], in order.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    records: &'a RecordReports,
    /// The run `index` lies in, or before it.
    run: usize,
    /// The next record.
    index: usize,
}

impl Iterator for Iter<'_> {
    type Item = RecordReport;

    fn next(&mut self) -> Option<RecordReport> {
        let runs = &self.records.runs;
        while runs
            .get(self.run)
            .is_some_and(|(end, _)| *end <= self.index)
        {
            self.run += 1;
        }
        let &(_, disposition) = runs.get(self.run)?;
        let index = self.index;
        self.index += 1;
        Some(RecordReport {
            position: self.records.position(index),
            disposition,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.records.len() - self.index;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a RecordReports {
    type Item = RecordReport;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<RecordReport> for RecordReports {
    fn from_iter<I: IntoIterator<Item = RecordReport>>(records: I) -> Self {
        let mut reports = Self::default();
        reports.extend(records);
        reports
    }
}

impl Extend<RecordReport> for RecordReports {
    fn extend<I: IntoIterator<Item = RecordReport>>(&mut self, records: I) {
        for record in records {
            self.push(record);
        }
    }
}

impl PartialEq for RecordReports {
    fn eq(&self, other: &Self) -> bool {
        self.runs == other.runs && self.iter().eq(other.iter())
    }
}

impl Eq for RecordReports {}

impl fmt::Debug for RecordReports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Disposition::{Duplicate, NotAttempted, Processed, Reported};

    /// The positions 1 to n, as a shared source.
    struct Numbers;

    impl PositionSource for Numbers {
        fn position(&self, index: usize) -> Position {
            Position::record((index + 1).to_string().parse().unwrap())
        }
    }

    fn shared(dispositions: &[Disposition]) -> RecordReports {
        RecordReports::shared(
            Arc::new(Numbers),
            0,
            dispositions.iter().map(|&disposition| (disposition, 1)),
        )
    }

    fn listed(dispositions: &[Disposition]) -> RecordReports {
        dispositions
            .iter()
            .enumerate()
            .map(|(index, disposition)| RecordReport {
                position: Numbers.position(index),
                disposition: *disposition,
            })
            .collect()
    }

    fn shown(records: &RecordReports) -> Vec<(String, Disposition)> {
        records
            .iter()
            .map(|record| (record.position.to_string(), record.disposition))
            .collect()
    }

    #[test]
    fn a_run_given_whole_reads_as_its_records_given_one_by_one() {
        let whole = RecordReports::shared(
            Arc::new(Numbers),
            0,
            [
                (Duplicate, 3),
                (Processed, 0),
                (Duplicate, 1),
                (Processed, 2),
            ],
        );
        let one_by_one = shared(&[
            Duplicate, Duplicate, Duplicate, Duplicate, Processed, Processed,
        ]);
        assert_eq!(shown(&whole), shown(&one_by_one));
        assert_eq!(
            whole.runs().count(),
            2,
            "an empty run adds none, and like runs join"
        );
        assert_eq!(whole.count(Duplicate), 4);
        assert_eq!(whole.len(), 6);
    }

    #[test]
    fn records_of_one_disposition_in_a_row_are_one_run() {
        let records = shared(&[
            Duplicate, Duplicate, Processed, Processed, Processed, Reported,
        ]);
        let runs: Vec<_> = records.runs().collect();
        assert_eq!(
            runs,
            [(0..2, Duplicate), (2..5, Processed), (5..6, Reported)]
        );
        assert_eq!(records.len(), 6);
        assert_eq!(records.count(Processed), 3);
        assert_eq!(records.disposition(4), Some(Processed));
        assert_eq!(records.disposition(6), None);
        assert_eq!(records.last().unwrap().position.to_string(), "6");
    }

    #[test]
    fn a_shared_and_a_listed_report_of_the_same_records_are_equal_and_read_alike() {
        let dispositions = [Processed, Processed, Reported, NotAttempted];
        assert_eq!(shared(&dispositions), listed(&dispositions));
        assert_eq!(shown(&shared(&dispositions)), shown(&listed(&dispositions)));
        assert_ne!(shared(&dispositions), shared(&[Processed; 4]));
    }

    #[test]
    fn splitting_inside_a_run_keeps_each_record_with_its_position_and_disposition() {
        for make in [shared, listed] {
            let all = [Processed, Processed, Processed, Reported, NotAttempted];
            for at in 0..=all.len() {
                let mut head = make(&all);
                let tail = head.split_off(at);
                let whole = shown(&make(&all));
                assert_eq!(shown(&head), whole[..at], "split at {at}");
                assert_eq!(shown(&tail), whole[at..], "split at {at}");
                assert_eq!(head.len() + tail.len(), all.len());
            }
        }
    }

    #[test]
    fn the_first_record_changes_alone_and_merges_with_a_run_after_it() {
        let mut records = shared(&[NotAttempted, NotAttempted, Processed]);
        records.replace_first(NotAttempted, Reported);
        assert_eq!(
            records.runs().collect::<Vec<_>>(),
            [(0..1, Reported), (1..2, NotAttempted), (2..3, Processed)]
        );
        let mut records = shared(&[NotAttempted, Reported]);
        records.replace_first(NotAttempted, Reported);
        assert_eq!(records.runs().collect::<Vec<_>>(), [(0..2, Reported)]);
        let mut records = shared(&[Processed, NotAttempted]);
        records.replace_first(NotAttempted, Reported);
        assert_eq!(shown(&records), shown(&shared(&[Processed, NotAttempted])));
    }

    #[test]
    fn appending_to_an_empty_report_takes_the_other_whole() {
        let mut records = RecordReports::default();
        records.append(shared(&[Processed, Reported]));
        assert_eq!(shown(&records), shown(&shared(&[Processed, Reported])));
        records.append(listed(&[NotAttempted]));
        assert_eq!(records.len(), 3);
        assert_eq!(records.get(2).unwrap().disposition, NotAttempted);
    }
}
