//! `kinesis-checkpoint doctor`: checks a deployment's Kinesis and `DynamoDB` Streams event source
//! mappings against what the toolkit needs, and says for each problem what to change.
//!
//! The toolkit's guarantees rest on settings it cannot see from inside a function: without
//! `ReportBatchItemFailures` Lambda reads a partial failure as success and loses the reported
//! records; retry and age limits make Lambda discard records (payload and all) that the toolkit
//! still holds back or retries; a `ParallelizationFactor` above 1 breaks a per-shard checkpoint;
//! and a missing permission shows only when the first batch fails. A `DynamoDB` stream's mapping
//! must also set a tumbling window, without which its events name no shard. The doctor reads
//! them from the SAM or `CloudFormation` template offline, or, through
//! [`deployed`](crate::deployed), from the Lambda and IAM APIs as the template a deployed
//! function would come from.
//!
//! The template is parsed with `yaml-rust2`, which drops `CloudFormation`'s short-form tags
//! (`!Ref X` reads as `X`, `!GetAtt X.Arn` as `X.Arn`); references are then recognised by the
//! logical ids they name, which is all the checks need.

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;

use serde::Serialize;
use yaml_rust2::{Yaml, YamlLoader};

mod dynamodb;
mod iam;

use iam::{flatten, tokens};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; nothing to change.
    Info,
    /// Works, at a cost or a risk.
    Warning,
    /// Loses, skips or blocks records, or fails at the first batch.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Self::Info => "INFO",
            Self::Warning => "WARNING",
            Self::Error => "ERROR",
        })
    }
}

/// One problem found, and what to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// How bad it is.
    pub severity: Severity,
    /// What it is about: a function and its event, or a mapping's logical id.
    pub subject: String,
    /// What is wrong, and what follows from it.
    pub problem: String,
    /// What to change.
    pub fix: String,
}

impl Finding {
    /// What a check found about `subject`.
    pub(crate) fn new(subject: &str, severity: Severity, problem: String, fix: &str) -> Self {
        Self {
            severity,
            subject: subject.to_owned(),
            problem,
            fix: fix.to_owned(),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<7} {}: {}\n        fix: {}",
            self.severity, self.subject, self.problem, self.fix
        )
    }
}

/// A template that cannot be checked.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// Not YAML (or JSON).
    #[error("the template is not readable YAML: {0}")]
    Unreadable(String),
    /// No `Resources` section.
    #[error("the template has no Resources section")]
    NoResources,
}

/// The checkpoint modes a function can run in (`CHECKPOINT_MODE`).
const MODES: [&str; 2] = ["shard", "partition-key"];

/// The longest tumbling window Lambda accepts, and the one the toolkit recommends: each window
/// ends with one more invocation per shard.
const LONGEST_WINDOW: i64 = 900;

/// What a mapping reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A Kinesis data stream.
    Kinesis,
    /// A `DynamoDB` table's stream.
    DynamoDbStreams,
}

impl Source {
    /// What becomes of records Lambda discards: the Kinesis shard mode reads them back from
    /// the stream; nothing reads them back from a `DynamoDB` stream.
    fn gap(self) -> &'static str {
        match self {
            Self::Kinesis => {
                "the shard mode reads such a gap back; the partition-key mode cannot see it"
            }
            Self::DynamoDbStreams => {
                "the toolkit sees such a gap in a DynamoDB stream but cannot read it back: \
                 the records are lost"
            }
        }
    }

    /// The ledger's `EVENT_SOURCE` for this source.
    fn event_source(self) -> &'static str {
        match self {
            Self::Kinesis => "kinesis",
            Self::DynamoDbStreams => "dynamodb-streams",
        }
    }
}

/// Checks every Kinesis and `DynamoDB` Streams event source mapping of the template `text` (YAML
/// or JSON).
///
/// # Errors
///
/// The text is not YAML, or has no `Resources`.
///
/// ```
/// use kinesis_checkpoint_cli::doctor::{Severity, check_template};
///
/// let template = r"
/// Resources:
///   Fn:
///     Type: AWS::Serverless::Function
///     Properties:
///       Events:
///         Orders:
///           Type: Kinesis
///           Properties:
///             Stream: arn:aws:kinesis:us-east-1:123456789012:stream/orders
///             MaximumRetryAttempts: 3
/// ";
/// let findings = check_template(template)?;
/// assert!(findings.iter().any(|f| f.severity == Severity::Error && f.problem.contains("ReportBatchItemFailures")));
/// assert!(findings.iter().any(|f| f.problem.contains("MaximumRetryAttempts")));
///
/// // A DynamoDB stream without a tumbling window: its events name no shard.
/// let template = r"
/// Resources:
///   Fn:
///     Type: AWS::Serverless::Function
///     Properties:
///       Events:
///         Changes:
///           Type: DynamoDB
///           Properties:
///             Stream: arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000
///             StartingPosition: TRIM_HORIZON
///             FunctionResponseTypes: [ReportBatchItemFailures]
/// ";
/// let findings = check_template(template)?;
/// assert!(findings.iter().any(|f| f.severity == Severity::Error && f.problem.contains("TumblingWindowInSeconds")));
/// # Ok::<(), kinesis_checkpoint_cli::doctor::DoctorError>(())
/// ```
pub fn check_template(text: &str) -> Result<Vec<Finding>, DoctorError> {
    let docs = YamlLoader::load_from_str(text)
        .map_err(|error| DoctorError::Unreadable(error.to_string()))?;
    let template = docs.into_iter().next().unwrap_or(Yaml::BadValue);
    let Some(resources) = template["Resources"].as_hash() else {
        return Err(DoctorError::NoResources);
    };
    let template = Template {
        resources: resources
            .iter()
            .filter_map(|(id, resource)| Some((id.as_str()?.to_owned(), resource.clone())))
            .collect(),
        parameters: template["Parameters"].clone(),
        globals: template["Globals"]["Function"].clone(),
    };
    let mut findings = Vec::new();
    let mut mappings = 0;
    for (id, resource) in &template.resources {
        match resource["Type"].as_str() {
            Some("AWS::Serverless::Function") => {
                let Some(events) = resource["Properties"]["Events"].as_hash() else {
                    continue;
                };
                for (name, event) in events {
                    let source = match event["Type"].as_str() {
                        Some("Kinesis") => Source::Kinesis,
                        Some("DynamoDB") => Source::DynamoDbStreams,
                        _ => continue,
                    };
                    mappings += 1;
                    let subject = format!("{id} event {}", name.as_str().unwrap_or("?"));
                    let properties = &event["Properties"];
                    template.check_mapping(
                        &subject,
                        properties,
                        &properties["Stream"],
                        id,
                        source,
                        &mut findings,
                    );
                }
            }
            Some("AWS::Lambda::EventSourceMapping") => {
                let properties = &resource["Properties"];
                let Some(source) = template.source(&properties["EventSourceArn"]) else {
                    continue;
                };
                mappings += 1;
                let function = template
                    .referenced_ids(&properties["FunctionName"])
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                template.check_mapping(
                    id,
                    properties,
                    &properties["EventSourceArn"],
                    &function,
                    source,
                    &mut findings,
                );
            }
            _ => {}
        }
    }
    if mappings == 0 {
        findings.push(Finding::new(
            "template",
            Severity::Error,
            "no Kinesis or DynamoDB Streams event source mapping found".to_owned(),
            "add a Kinesis or DynamoDB event to the function (SAM `Events: {Type: Kinesis}` \
             or `{Type: DynamoDB}`) or an AWS::Lambda::EventSourceMapping",
        ));
    }
    findings.sort_by_key(|finding| std::cmp::Reverse(finding.severity));
    Ok(findings)
}

/// The parts of a template the checks read.
struct Template {
    resources: BTreeMap<String, Yaml>,
    parameters: Yaml,
    globals: Yaml,
}

/// A permission a statement may grant.
#[derive(Debug)]
struct Statement {
    actions: Vec<String>,
    resources: Vec<String>,
}

impl Template {
    /// A scalar, with a `!Ref` to a parameter replaced by the parameter's default.
    fn value(&self, value: &Yaml) -> Yaml {
        let name = match value {
            Yaml::String(name) => Some(name.as_str()),
            Yaml::Hash(_) => value["Ref"].as_str(),
            _ => None,
        };
        match name {
            Some(name) if !self.parameters[name].is_badvalue() => {
                self.parameters[name]["Default"].clone()
            }
            _ => value.clone(),
        }
    }

    fn number(&self, value: &Yaml) -> Option<i64> {
        match self.value(value) {
            Yaml::Integer(n) => Some(n),
            Yaml::String(text) => text.parse().ok(),
            _ => None,
        }
    }

    /// The logical ids of this template's resources that `value` refers to.
    fn referenced_ids(&self, value: &Yaml) -> Vec<String> {
        tokens(&flatten(value))
            .into_iter()
            .filter(|token| self.resources.contains_key(*token))
            .map(str::to_owned)
            .collect()
    }

    /// The function's environment, its own variables over the template's globals.
    fn environment(&self, function: &str) -> BTreeMap<String, Yaml> {
        let mut variables = BTreeMap::new();
        let own = self
            .resources
            .get(function)
            .map(|f| f["Properties"]["Environment"]["Variables"].clone());
        for source in [Some(self.globals["Environment"]["Variables"].clone()), own]
            .into_iter()
            .flatten()
        {
            if let Some(hash) = source.as_hash() {
                for (name, value) in hash {
                    if let Some(name) = name.as_str() {
                        variables.insert(name.to_owned(), value.clone());
                    }
                }
            }
        }
        variables
    }

    fn check_mapping(
        &self,
        subject: &str,
        mapping: &Yaml,
        stream: &Yaml,
        function: &str,
        source: Source,
        findings: &mut Vec<Finding>,
    ) {
        let gap = source.gap();
        let mut find = |severity, problem, fix: &str| {
            findings.push(Finding::new(subject, severity, problem, fix));
        };
        let reports = mapping["FunctionResponseTypes"]
            .as_vec()
            .is_some_and(|types| {
                types
                    .iter()
                    .any(|t| t.as_str() == Some("ReportBatchItemFailures"))
            });
        if !reports {
            find(
                Severity::Error,
                "FunctionResponseTypes does not contain ReportBatchItemFailures: Lambda reads the \
                 function's partial failure as full success, and the reported records are lost"
                    .to_owned(),
                "add `FunctionResponseTypes: [ReportBatchItemFailures]` to the mapping",
            );
        }
        if let Some(retries) = self.number(&mapping["MaximumRetryAttempts"])
            && retries != -1
        {
            find(
                Severity::Error,
                format!(
                    "MaximumRetryAttempts is {retries}: after that many retries Lambda discards \
                     the batch, payloads included, while the toolkit is still retrying a failing \
                     record or holding a child shard until its parents finish ({gap})"
                ),
                "set `MaximumRetryAttempts: -1`; the toolkit dead-letters poison records itself",
            );
        }
        if let Some(age) = self.number(&mapping["MaximumRecordAgeInSeconds"])
            && age != -1
        {
            find(
                Severity::Error,
                format!(
                    "MaximumRecordAgeInSeconds is {age}: older records are discarded by Lambda, \
                     payloads included, while the toolkit may still be holding or retrying them \
                     ({gap})"
                ),
                "set `MaximumRecordAgeInSeconds: -1` (records then live until the stream's retention)",
            );
        }
        if matches!(
            self.value(&mapping["BisectBatchOnFunctionError"]),
            Yaml::Boolean(true)
        ) || self.value(&mapping["BisectBatchOnFunctionError"]).as_str() == Some("true")
        {
            find(
                Severity::Warning,
                "BisectBatchOnFunctionError is on: the function reports the exact failed record, \
                 so halving the batch only redelivers records the checkpoint already skips"
                    .to_owned(),
                "set `BisectBatchOnFunctionError: false`",
            );
        }
        if !mapping["DestinationConfig"]["OnFailure"].is_badvalue() {
            find(
                Severity::Info,
                "an on-failure destination receives only the sequence number ranges of discarded \
                 batches, never their data"
                    .to_owned(),
                "rely on the toolkit's dead-letter queue for poison records (their payload is kept)",
            );
        }
        let environment = self.environment(function);
        self.check_event_source(subject, function, source, &environment, findings);
        match source {
            Source::Kinesis => {
                self.check_environment(subject, mapping, function, &environment, findings);
            }
            Source::DynamoDbStreams => {
                self.check_dynamodb_mapping(subject, mapping, function, &environment, findings);
            }
        }
        self.check_permissions(subject, function, stream, source, &environment, findings);
    }

    /// What the mapping `arn` (an `EventSourceArn`) reads, if a stream the toolkit reads.
    fn source(&self, arn: &Yaml) -> Option<Source> {
        let text = flatten(arn);
        let referenced: Vec<&str> = self
            .referenced_ids(arn)
            .iter()
            .filter_map(|id| self.resources[id]["Type"].as_str())
            .collect();
        if text.contains(":kinesis:") || referenced.contains(&"AWS::Kinesis::Stream") {
            Some(Source::Kinesis)
        } else if (text.contains(":dynamodb:") && text.contains("/stream/"))
            || referenced
                .iter()
                .any(|kind| matches!(*kind, "AWS::DynamoDB::Table" | "AWS::DynamoDB::GlobalTable"))
        {
            Some(Source::DynamoDbStreams)
        } else {
            None
        }
    }

    /// The ledger's `EVENT_SOURCE`, when the function has one, against what the mapping reads.
    fn check_event_source(
        &self,
        subject: &str,
        function: &str,
        source: Source,
        environment: &BTreeMap<String, Yaml>,
        findings: &mut Vec<Finding>,
    ) {
        let Some(value) = environment.get("EVENT_SOURCE").map(|v| self.value(v)) else {
            return;
        };
        let value = flatten(&value);
        if value == source.event_source() {
            return;
        }
        let expected = source.event_source();
        let problem = if ["kinesis", "dynamodb-streams"].contains(&value.as_str()) {
            format!(
                "{function}'s EVENT_SOURCE is '{value}' but this mapping reads a {}: the function \
                 cannot read its events, every invocation fails and the shard is blocked",
                match source {
                    Source::Kinesis => "Kinesis stream",
                    Source::DynamoDbStreams => "DynamoDB stream",
                }
            )
        } else {
            format!("{function}'s EVENT_SOURCE is '{value}', which the toolkit does not know")
        };
        findings.push(Finding::new(
            subject,
            Severity::Error,
            problem,
            &format!("set the function's environment variable `EVENT_SOURCE: {expected}`"),
        ));
    }

    /// The Kinesis mapping's settings and the function's that must agree with them: no tumbling
    /// window, the checkpoint mode with the `ParallelizationFactor`, the starting position.
    fn check_environment(
        &self,
        subject: &str,
        mapping: &Yaml,
        function: &str,
        environment: &BTreeMap<String, Yaml>,
        findings: &mut Vec<Finding>,
    ) {
        let mut find = |severity, problem, fix: &str| {
            findings.push(Finding::new(subject, severity, problem, fix));
        };
        if let Some(seconds) = self.number(&mapping["TumblingWindowInSeconds"])
            && seconds > 0
        {
            find(
                Severity::Error,
                format!(
                    "TumblingWindowInSeconds is {seconds} on a Kinesis mapping: Lambda fails every \
                     invocation whose answer has no `state`, and the Kinesis service answers none"
                ),
                "remove `TumblingWindowInSeconds` (only DynamoDB stream mappings need a window)",
            );
        }
        let parallel = self.number(&mapping["ParallelizationFactor"]).unwrap_or(1);
        let mode_value = environment.get("CHECKPOINT_MODE").map(|v| self.value(v));
        let mode = mode_value
            .as_ref()
            .and_then(Yaml::as_str)
            .unwrap_or("shard");
        if !MODES.contains(&mode) {
            find(
                Severity::Error,
                format!(
                    "{function}'s CHECKPOINT_MODE is '{mode}', which the toolkit does not know"
                ),
                "set CHECKPOINT_MODE to `shard` (the default) or `partition-key`",
            );
        } else if parallel > 1 && mode != "partition-key" {
            find(
                Severity::Error,
                format!(
                    "ParallelizationFactor is {parallel} but {function} checkpoints per shard \
                     (CHECKPOINT_MODE '{mode}'): concurrent batches of one shard fight over its \
                     lease and report each other's records"
                ),
                "set the function's environment variable `CHECKPOINT_MODE: partition-key`, or \
                 `ParallelizationFactor: 1`",
            );
        } else if parallel <= 1 && mode == "partition-key" {
            find(
                Severity::Info,
                format!(
                    "{function} checkpoints per partition key but ParallelizationFactor is \
                     {parallel}: the per-shard mode does the same with fewer requests"
                ),
                "keep it if you plan to raise ParallelizationFactor; otherwise remove CHECKPOINT_MODE",
            );
        }
        self.check_starting_position(subject, mapping, function, environment, findings);
    }

    /// The gate's starting position (`STARTING_POSITION`) against the mapping's.
    fn check_starting_position(
        &self,
        subject: &str,
        mapping: &Yaml,
        function: &str,
        environment: &BTreeMap<String, Yaml>,
        findings: &mut Vec<Finding>,
    ) {
        let starting = self.value(&mapping["StartingPosition"]);
        if let (Some(mapping_start), Some(function_start)) = (
            starting.as_str(),
            environment.get("STARTING_POSITION").map(|v| self.value(v)),
        ) && function_start.as_str().is_some_and(|s| s != mapping_start)
        {
            let problem = format!(
                "the mapping starts at {mapping_start} but {function}'s STARTING_POSITION is {}: \
                 the parent gate judges unseen parents by the wrong rule",
                function_start.as_str().unwrap_or_default()
            );
            findings.push(Finding::new(
                subject,
                Severity::Warning,
                problem,
                "give STARTING_POSITION the mapping's StartingPosition",
            ));
        }
    }
}
/// The findings for people, most severe first, and a closing count.
///
/// ```
/// let report = kinesis_checkpoint_cli::doctor::report(&[]);
/// assert!(report.contains("no problems found"));
/// ```
#[must_use]
pub fn report(findings: &[Finding]) -> String {
    let mut out = String::new();
    for finding in findings {
        out.push_str(&finding.to_string());
        out.push('\n');
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    let warnings = findings
        .iter()
        .filter(|f| f.severity == Severity::Warning)
        .count();
    if errors + warnings == 0 {
        out.push_str("no problems found\n");
    } else {
        let _ = writeln!(out, "{errors} errors, {warnings} warnings");
    }
    out
}
