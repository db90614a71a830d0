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
        findings.push(Finding {
            severity: Severity::Error,
            subject: "template".to_owned(),
            problem: "no Kinesis or DynamoDB Streams event source mapping found".to_owned(),
            fix: "add a Kinesis or DynamoDB event to the function (SAM `Events: {Type: Kinesis}` \
                  or `{Type: DynamoDB}`) or an AWS::Lambda::EventSourceMapping"
                .to_owned(),
        });
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
        let mut find = |severity, problem: String, fix: &str| {
            findings.push(Finding {
                severity,
                subject: subject.to_owned(),
                problem,
                fix: fix.to_owned(),
            });
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
        findings.push(Finding {
            severity: Severity::Error,
            subject: subject.to_owned(),
            problem,
            fix: format!("set the function's environment variable `EVENT_SOURCE: {expected}`"),
        });
    }

    /// The function's settings that must agree with the mapping: the checkpoint mode with the
    /// `ParallelizationFactor`, and the gate's starting position with the mapping's.
    fn check_environment(
        &self,
        subject: &str,
        mapping: &Yaml,
        function: &str,
        environment: &BTreeMap<String, Yaml>,
        findings: &mut Vec<Finding>,
    ) {
        let mut find = |severity, problem: String, fix: &str| {
            findings.push(Finding {
                severity,
                subject: subject.to_owned(),
                problem,
                fix: fix.to_owned(),
            });
        };
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
            findings.push(Finding {
                severity: Severity::Warning,
                subject: subject.to_owned(),
                problem: format!(
                    "the mapping starts at {mapping_start} but {function}'s STARTING_POSITION is \
                     {}: the parent gate judges unseen parents by the wrong rule",
                    function_start.as_str().unwrap_or_default()
                ),
                fix: "give STARTING_POSITION the mapping's StartingPosition".to_owned(),
            });
        }
    }

    fn check_permissions(
        &self,
        subject: &str,
        function: &str,
        stream: &Yaml,
        source: Source,
        environment: &BTreeMap<String, Yaml>,
        findings: &mut Vec<Finding>,
    ) {
        let mut find = |severity, problem: String, fix: String| {
            findings.push(Finding {
                severity,
                subject: subject.to_owned(),
                problem,
                fix,
            });
        };
        let Some(statements) = self.statements(function) else {
            find(
                Severity::Warning,
                format!(
                    "{function}'s role is not in the template (or could not be read): its permissions cannot be checked"
                ),
                "check the role by hand for the permissions listed in the README".to_owned(),
            );
            return;
        };
        let mut needs: Vec<(&str, String, &str)> = Vec::new();
        match source {
            Source::Kinesis => {
                let stream_target = target(self, stream);
                for action in [
                    "kinesis:ListShards",
                    "kinesis:GetShardIterator",
                    "kinesis:GetRecords",
                    "kinesis:DescribeStreamSummary",
                ] {
                    needs.push((action, stream_target.clone(), "the stream"));
                }
            }
            Source::DynamoDbStreams => {
                let stream = self.stream_target(stream);
                for action in dynamodb::STREAM_ACTIONS {
                    if !statements
                        .iter()
                        .any(|statement| self.grants_on_stream(statement, action, &stream))
                    {
                        find(
                            Severity::Error,
                            format!(
                                "{function}'s role does not allow {action} on the table's stream ({})",
                                stream.name
                            ),
                            format!(
                                "allow `{action}` on `{}` in the function's role (a grant on \
                                 the table does not cover its stream)",
                                stream.reference()
                            ),
                        );
                    }
                }
            }
        }
        match environment.get("LEASE_TABLE") {
            Some(table) => {
                let table = target(self, table);
                for action in ["dynamodb:GetItem", "dynamodb:UpdateItem"] {
                    needs.push((action, table.clone(), "the lease table"));
                }
            }
            None => find(
                Severity::Warning,
                format!(
                    "{function} has no LEASE_TABLE variable: the lease table's permissions cannot be checked"
                ),
                "name the lease table in the function's environment as LEASE_TABLE".to_owned(),
            ),
        }
        if let Some(queue) = environment.get("DEAD_LETTER_QUEUE_URL") {
            needs.push((
                "sqs:SendMessage",
                target(self, queue),
                "the dead-letter queue",
            ));
        }
        for (action, resource, what) in needs {
            let granted = statements.iter().any(|statement| {
                statement
                    .actions
                    .iter()
                    .any(|pattern| matches(pattern, action))
                    && statement
                        .resources
                        .iter()
                        .any(|granted| covers(granted, &resource))
            });
            if !granted {
                find(
                    Severity::Error,
                    format!("{function}'s role does not allow {action} on {what} ({resource})"),
                    format!("allow `{action}` on `{resource}` in the function's role"),
                );
            }
        }
    }

    /// The Allow statements of the function's role, or `None` when the role is not in the
    /// template.
    fn statements(&self, function: &str) -> Option<Vec<Statement>> {
        let properties = &self.resources.get(function)?["Properties"];
        let mut statements = Vec::new();
        if let Some(policies) = properties["Policies"].as_vec() {
            for policy in policies {
                statements.extend(sam_policy(self, policy));
            }
        } else if !properties["Policies"].is_badvalue() {
            statements.extend(sam_policy(self, &properties["Policies"]));
        }
        let role = &properties["Role"];
        if role.is_badvalue() {
            // SAM makes a role from `Policies`.
            return Some(statements);
        }
        let role_id = self
            .referenced_ids(role)
            .into_iter()
            .find(|id| self.resources[id]["Type"].as_str() == Some("AWS::IAM::Role"))?;
        let role = &self.resources[&role_id];
        for policy in role["Properties"]["Policies"]
            .as_vec()
            .into_iter()
            .flatten()
        {
            statements.extend(document(self, &policy["PolicyDocument"]));
        }
        for resource in self.resources.values() {
            let kind = resource["Type"].as_str().unwrap_or_default();
            if matches!(kind, "AWS::IAM::Policy" | "AWS::IAM::ManagedPolicy")
                && self
                    .referenced_ids(&resource["Properties"]["Roles"])
                    .contains(&role_id)
            {
                statements.extend(document(self, &resource["Properties"]["PolicyDocument"]));
            }
        }
        Some(statements)
    }
}

/// What a value refers to: the logical id of a resource of the template when it names one,
/// else its text (a literal name or ARN; of a queue URL, the queue's name, which its ARN ends
/// with).
fn target(template: &Template, value: &Yaml) -> String {
    template
        .referenced_ids(value)
        .into_iter()
        .next()
        .unwrap_or_else(|| {
            let text = flatten(&template.value(value));
            match text
                .strip_prefix("https://")
                .or(text.strip_prefix("http://"))
            {
                Some(url) => url.rsplit('/').next().unwrap_or(url).to_owned(),
                None => text,
            }
        })
}

/// Whether a statement's resource (`*`, an ARN, an ARN with wildcards, or a reference) covers
/// `target` (a logical id, a name or an ARN).
fn covers(granted: &str, target: &str) -> bool {
    // The resource's own name: `arn:aws:dynamodb:*:*:table/leases*` names `leases*`.
    let name = granted.rsplit(['/', ':']).next().unwrap_or(granted);
    granted == "*"
        || tokens(granted).contains(&target)
        || granted.contains(target)
        || wildcard(granted, target)
        || wildcard(name, target)
}

/// IAM's wildcards: `*` any run of characters, `?` any one.
fn wildcard(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => {
            pattern.len() == text.len()
                && pattern
                    .chars()
                    .zip(text.chars())
                    .all(|(p, t)| p == '?' || p == t)
        }
        Some((head, rest)) => {
            text.is_char_boundary(head.len())
                && wildcard(head, &text[..head.len()])
                && (head.len()..=text.len())
                    .filter(|&at| text.is_char_boundary(at))
                    .any(|at| wildcard(rest, &text[at..]))
        }
    }
}

/// The Allow statements of a policy document.
fn document(template: &Template, document: &Yaml) -> Vec<Statement> {
    let statements = match &document["Statement"] {
        Yaml::Array(list) => list.clone(),
        single @ Yaml::Hash(_) => vec![single.clone()],
        _ => Vec::new(),
    };
    statements
        .iter()
        .filter(|s| s["Effect"].as_str() == Some("Allow"))
        .map(|s| Statement {
            actions: strings(&s["Action"]),
            resources: match &s["Resource"] {
                Yaml::Array(list) => list.iter().map(|r| flatten(&template.value(r))).collect(),
                other => vec![flatten(&template.value(other))],
            },
        })
        .collect()
}

/// A SAM `Policies` entry: an inline document, or one of the policy templates that grant what
/// the toolkit needs.
fn sam_policy(template: &Template, policy: &Yaml) -> Vec<Statement> {
    if !policy["Statement"].is_badvalue() {
        return document(template, policy);
    }
    let grant = |actions: &[&str], resource: &Yaml| Statement {
        actions: actions.iter().map(|a| (*a).to_owned()).collect(),
        resources: vec![flatten(&template.value(resource))],
    };
    let mut statements = Vec::new();
    for (name, parameters) in [
        ("DynamoDBCrudPolicy", "TableName"),
        ("SQSSendMessagePolicy", "QueueName"),
        ("KinesisStreamReadPolicy", "StreamName"),
        ("DynamoDBStreamReadPolicy", "TableName"),
    ] {
        let resource = &policy[name][parameters];
        if resource.is_badvalue() {
            continue;
        }
        statements.push(match name {
            // Every stream of the table: the template's StreamName (a stream label, often cut
            // out of the table's StreamArn) is not read.
            "DynamoDBStreamReadPolicy" => Statement {
                actions: dynamodb::STREAM_ACTIONS
                    .iter()
                    .map(|a| (*a).to_owned())
                    .collect(),
                resources: vec![format!(
                    "arn:aws:dynamodb:*:*:table/{}/stream/*",
                    flatten(&template.value(resource))
                )],
            },
            "DynamoDBCrudPolicy" => grant(
                &[
                    "dynamodb:GetItem",
                    "dynamodb:PutItem",
                    "dynamodb:UpdateItem",
                    "dynamodb:DeleteItem",
                    "dynamodb:Query",
                    "dynamodb:Scan",
                ],
                resource,
            ),
            "SQSSendMessagePolicy" => grant(&["sqs:SendMessage"], resource),
            _ => grant(
                &[
                    "kinesis:ListShards",
                    "kinesis:GetShardIterator",
                    "kinesis:GetRecords",
                    "kinesis:DescribeStream",
                    "kinesis:DescribeStreamSummary",
                    "kinesis:ListStreams",
                ],
                resource,
            ),
        });
    }
    statements
}

/// Whether an IAM action pattern (`*`, `service:*`, `service:Get*`) grants `action`.
fn matches(pattern: &str, action: &str) -> bool {
    let (pattern, action) = (pattern.to_ascii_lowercase(), action.to_ascii_lowercase());
    match pattern.strip_suffix('*') {
        Some(prefix) => action.starts_with(prefix),
        None => pattern == action,
    }
}

fn strings(value: &Yaml) -> Vec<String> {
    match value {
        Yaml::Array(list) => list
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Yaml::String(s) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// Every scalar of `value`, joined by spaces: `!GetAtt X.Arn` (read as `X.Arn`),
/// `{Fn::GetAtt: [X, Arn]}` and `!Sub "${X.Arn}"` all contain `X`.
fn flatten(value: &Yaml) -> String {
    match value {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(n) => n.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Array(list) => list.iter().map(flatten).collect::<Vec<_>>().join(" "),
        Yaml::Hash(hash) => hash
            .iter()
            .flat_map(|(k, v)| [flatten(k), flatten(v)])
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// The identifier-like words of `text`.
fn tokens(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|t| !t.is_empty())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_resource_covers_the_names_and_arns_it_matches_and_no_other() {
        assert!(covers("*", "leases"));
        assert!(covers("arn:aws:dynamodb:*:*:table/lease*", "leases"));
        assert!(covers(
            "arn:aws:kinesis:us-east-1:1:stream/ord?rs",
            "orders"
        ));
        assert!(covers(
            "arn:aws:kinesis:*:*:stream/*",
            "arn:aws:kinesis:us-east-1:1:stream/orders"
        ));
        assert!(covers(
            "arn:aws:sqs:us-east-1:1:dead-letters",
            "dead-letters"
        ));
        assert!(!covers("arn:aws:dynamodb:*:*:table/ledger", "leases"));
        assert!(!covers("arn:aws:kinesis:*:*:stream/payments*", "orders"));
    }
}
