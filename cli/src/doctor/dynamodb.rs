//! The checks only a `DynamoDB` stream's mapping needs.
//!
//! The toolkit reads a `DynamoDB` stream per shard, through tumbling windows: only a window event
//! names its shard (`shardId`). So the mapping must set `TumblingWindowInSeconds`, run one batch
//! per shard at a time (`ParallelizationFactor: 1`, no partition-key mode), and start at
//! `TRIM_HORIZON`. Its role reads the table's stream, which a grant on the table does not cover:
//! a stream's ARN is the table's followed by `/stream/<label>`.

use std::collections::BTreeMap;

use yaml_rust2::Yaml;

use super::iam::{flatten, matches, tokens, wildcard};
use super::{Finding, LONGEST_WINDOW, Severity, Statement, Template};

/// What the mapping and the parent gate call on the stream: the mapping reads it with all four,
/// the gate's topology reads `ParentShardId`s with `DescribeStream`.
pub(super) const STREAM_ACTIONS: [&str; 4] = [
    "dynamodb:DescribeStream",
    "dynamodb:GetShardIterator",
    "dynamodb:GetRecords",
    "dynamodb:ListStreams",
];

/// A stream label of the shape `DynamoDB` gives (`2019-11-14T00:04:06.388`), for a stream whose
/// ARN the template cannot know before it is deployed.
const SOME_LABEL: &str = "2000-01-01T00:00:00.000";

/// The stream a mapping reads, as the permission checks need it.
pub(super) struct StreamTarget {
    /// How findings name it: `OrdersTable.StreamArn`, or the stream's ARN.
    pub(super) name: String,
    /// The template's table whose stream it is.
    table: Option<String>,
    /// The stream's ARN, or one like it made from the table's name (`made_up`).
    arn: Option<String>,
    /// Whether `arn` was made up: its region, account and label are then unknown.
    made_up: bool,
}

impl StreamTarget {
    /// How a fix names it: `!GetAtt OrdersTable.StreamArn`, or the stream's ARN.
    pub(super) fn reference(&self) -> String {
        match &self.table {
            Some(_) => format!("!GetAtt {}", self.name),
            None => self.name.clone(),
        }
    }
}

impl Template {
    /// The stream `value` (a mapping's `Stream` or `EventSourceArn`) names.
    pub(super) fn stream_target(&self, value: &Yaml) -> StreamTarget {
        let table = self.referenced_ids(value).into_iter().find(|id| {
            matches!(
                self.resources[id]["Type"].as_str(),
                Some("AWS::DynamoDB::Table" | "AWS::DynamoDB::GlobalTable")
            )
        });
        if let Some(table) = table {
            let name = self.value(&self.resources[&table]["Properties"]["TableName"]);
            StreamTarget {
                name: format!("{table}.StreamArn"),
                arn: name
                    .as_str()
                    .map(|name| format!("arn:aws:dynamodb:*:*:table/{name}/stream/{SOME_LABEL}")),
                table: Some(table),
                made_up: true,
            }
        } else {
            let text = flatten(&self.value(value));
            StreamTarget {
                arn: text.starts_with("arn:").then(|| text.clone()),
                name: text,
                table: None,
                made_up: false,
            }
        }
    }

    /// Whether `statement` allows `action` on `stream`.
    pub(super) fn grants_on_stream(
        &self,
        statement: &Statement,
        action: &str,
        stream: &StreamTarget,
    ) -> bool {
        statement
            .actions
            .iter()
            .any(|pattern| matches(pattern, action))
            && statement
                .resources
                .iter()
                .any(|granted| self.covers_stream(granted, stream))
    }

    /// Whether a statement's resource covers the stream. A grant on the table alone does not:
    /// IAM matches the whole ARN, and the stream's goes on with `/stream/<label>`.
    fn covers_stream(&self, granted: &str, stream: &StreamTarget) -> bool {
        let granted = self.substitute(granted);
        if granted == "*" || granted == stream.name {
            return true;
        }
        // `!GetAtt OrdersTable.StreamArn`, or `!Sub "${OrdersTable.Arn}/stream/*"`.
        if let Some(table) = &stream.table {
            let words = tokens(&granted);
            if words.contains(&table.as_str())
                && (words.contains(&"StreamArn") || granted.contains("/stream/"))
            {
                return true;
            }
        }
        let Some(arn) = &stream.arn else {
            return false;
        };
        if !stream.made_up {
            return wildcard(&granted, arn);
        }
        // The region, account and label are unknown: compare what follows `table/`.
        match (granted.split_once(":table/"), arn.split_once(":table/")) {
            (Some((_, granted)), Some((_, arn))) => wildcard(granted, arn),
            _ => false,
        }
    }

    /// `!Sub` text with its variables replaced where the template tells them: a pseudo
    /// parameter (`${AWS::Region}`) by `*`, a parameter by its default, a table's `Ref` by its
    /// name.
    fn substitute(&self, text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            let Some(length) = rest[start..].find('}') else {
                break;
            };
            let name = &rest[start + 2..start + length];
            out.push_str(&rest[..start]);
            let table_name = self
                .resources
                .get(name)
                .map(|table| self.value(&table["Properties"]["TableName"]));
            let parameter = self.value(&Yaml::String(name.to_owned()));
            match (
                name,
                parameter.as_str(),
                table_name.as_ref().and_then(Yaml::as_str),
            ) {
                (pseudo, ..) if pseudo.starts_with("AWS::") => out.push('*'),
                (_, _, Some(table)) => out.push_str(table),
                (_, Some(value), _) if value != name => out.push_str(value),
                _ => out.push_str(&rest[start..=start + length]),
            }
            rest = &rest[start + length + 1..];
        }
        out.push_str(rest);
        out
    }

    /// The mapping's settings that only a `DynamoDB` stream needs, and the function's that must
    /// agree with them.
    pub(super) fn check_dynamodb_mapping(
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
        let window = self.number(&mapping["TumblingWindowInSeconds"]);
        match window {
            None | Some(0) => find(
                Severity::Error,
                format!(
                    "TumblingWindowInSeconds is {}: without a tumbling window Lambda's DynamoDB \
                     event names no shard (a record carries only its eventID), so no lease or \
                     checkpoint can be kept per shard; the toolkit refuses every such batch, and \
                     the shard is blocked until its records expire (24 hours)",
                    if window.is_none() { "not set" } else { "0" }
                ),
                "set `TumblingWindowInSeconds: 900` on the mapping (each event then names its \
                 shard; the function answers a `state` with every batch)",
            ),
            Some(seconds) if !(1..=LONGEST_WINDOW).contains(&seconds) => find(
                Severity::Error,
                format!(
                    "TumblingWindowInSeconds is {seconds}: Lambda accepts 0 to {LONGEST_WINDOW} \
                     seconds"
                ),
                "set `TumblingWindowInSeconds: 900`",
            ),
            Some(seconds) if seconds < LONGEST_WINDOW => find(
                Severity::Info,
                format!(
                    "TumblingWindowInSeconds is {seconds}: a window's end costs one more \
                     invocation per shard and cuts the batches, every {seconds} s instead of \
                     every {LONGEST_WINDOW} s"
                ),
                "set `TumblingWindowInSeconds: 900` for the fewest invocations; the toolkit \
                 keeps nothing across windows",
            ),
            Some(_) => {}
        }
        let parallel = self.number(&mapping["ParallelizationFactor"]).unwrap_or(1);
        if parallel > 1 {
            find(
                Severity::Error,
                format!(
                    "ParallelizationFactor is {parallel}: the toolkit reads a DynamoDB stream \
                     with one lease and one checkpoint per shard (it has no per-item mode), so \
                     concurrent batches of one shard fight over its lease and report each \
                     other's records"
                ),
                "set `ParallelizationFactor: 1`",
            );
        }
        let mode = environment
            .get("CHECKPOINT_MODE")
            .map(|v| flatten(&self.value(v)));
        match mode.as_deref() {
            None | Some("shard") => {}
            Some("partition-key") => find(
                Severity::Error,
                format!(
                    "{function}'s CHECKPOINT_MODE is 'partition-key', which the toolkit does not \
                     offer for a DynamoDB stream: it keeps one checkpoint per shard"
                ),
                "set CHECKPOINT_MODE to `shard` (the default), or remove it",
            ),
            Some(mode) => find(
                Severity::Error,
                format!(
                    "{function}'s CHECKPOINT_MODE is '{mode}', which the toolkit does not know"
                ),
                "set CHECKPOINT_MODE to `shard` (the default), the only mode for a DynamoDB \
                 stream",
            ),
        }
        let starting = self.value(&mapping["StartingPosition"]);
        if let Some(position) = starting.as_str()
            && position != "TRIM_HORIZON"
        {
            find(
                Severity::Error,
                format!(
                    "StartingPosition is {position}: the toolkit reads a DynamoDB stream from \
                     TRIM_HORIZON only; {position} skips the records written before the mapping \
                     starts, and the parent gate expects every shard read from its start"
                ),
                "set `StartingPosition: TRIM_HORIZON` (and the function's STARTING_POSITION \
                 with it)",
            );
        }
        self.check_starting_position(subject, mapping, function, environment, findings);
    }
}

#[cfg(test)]
mod tests {
    use crate::doctor::{Severity, check_template};

    /// A function reading the stream of the table `Orders`, its role granting the stream's
    /// actions on `resource`; the stream-permission findings.
    fn missing_with(resource: &str) -> Vec<String> {
        let template = format!(
            r#"
Parameters:
  OrdersName:
    Type: String
    Default: orders-table
Resources:
  Orders:
    Type: AWS::DynamoDB::Table
    Properties:
      TableName: !Ref OrdersName
      StreamSpecification:
        StreamViewType: NEW_IMAGE
  Role:
    Type: AWS::IAM::Role
    Properties:
      Policies:
        - PolicyDocument:
            Statement:
              - Effect: Allow
                Action: ["dynamodb:DescribeStream", "dynamodb:GetShardIterator", "dynamodb:GetRecords", "dynamodb:ListStreams"]
                Resource: {resource}
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      Role: !GetAtt Role.Arn
      Events:
        Changes:
          Type: DynamoDB
          Properties:
            Stream: !GetAtt Orders.StreamArn
            StartingPosition: TRIM_HORIZON
            TumblingWindowInSeconds: 900
            FunctionResponseTypes: [ReportBatchItemFailures]
"#
        );
        check_template(&template)
            .unwrap()
            .into_iter()
            .filter(|f| f.severity == Severity::Error && f.problem.contains("table's stream"))
            .map(|f| f.problem)
            .collect()
    }

    #[test]
    fn a_grant_on_the_stream_in_any_usual_form_covers_it() {
        for resource in [
            "!GetAtt Orders.StreamArn",
            "{\"Fn::GetAtt\": [Orders, StreamArn]}",
            "!Sub \"${Orders.Arn}/stream/*\"",
            "!Sub \"arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${OrdersName}/stream/*\"",
            "!Sub \"arn:aws:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${Orders}/stream/*\"",
            "arn:aws:dynamodb:*:*:table/orders-table/stream/*",
            "arn:aws:dynamodb:us-east-1:123456789012:table/orders-*",
            "arn:aws:dynamodb:*:*:table/*",
            "\"*\"",
        ] {
            assert_eq!(missing_with(resource), Vec::<String>::new(), "{resource}");
        }
    }

    #[test]
    fn a_grant_on_the_table_or_another_stream_does_not_cover_it() {
        for resource in [
            "!GetAtt Orders.Arn",
            "arn:aws:dynamodb:*:*:table/orders-table",
            "arn:aws:dynamodb:*:*:table/payments/stream/*",
            "!Sub \"arn:aws:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${OrdersName}\"",
        ] {
            assert_eq!(missing_with(resource).len(), 4, "{resource}");
        }
    }

    #[test]
    fn a_deployed_stream_arn_is_matched_whole() {
        let template = |resource: &str| {
            format!(
                r#"
Resources:
  Role:
    Type: AWS::IAM::Role
    Properties:
      Policies:
        - PolicyDocument:
            Statement:
              - Effect: Allow
                Action: "dynamodb:*"
                Resource: "{resource}"
  mapping:
    Type: AWS::Lambda::EventSourceMapping
    Properties:
      EventSourceArn: arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-12-07T00:45:33.175
      FunctionName: Fn
      StartingPosition: TRIM_HORIZON
      TumblingWindowInSeconds: 900
      FunctionResponseTypes: [ReportBatchItemFailures]
  Fn:
    Type: AWS::Lambda::Function
    Properties:
      Role: Role
"#
            )
        };
        let missing = |resource: &str| {
            check_template(&template(resource))
                .unwrap()
                .into_iter()
                .filter(|f| f.problem.contains("table's stream"))
                .count()
        };
        assert_eq!(missing("arn:aws:dynamodb:*:*:table/orders/stream/*"), 0);
        assert_eq!(
            missing("arn:aws:dynamodb:us-east-1:123456789012:table/ord*"),
            0
        );
        assert_eq!(
            missing("arn:aws:dynamodb:us-east-1:123456789012:table/orders"),
            4
        );
        assert_eq!(
            missing("arn:aws:dynamodb:us-west-2:123456789012:table/orders/stream/*"),
            4
        );
        assert_eq!(missing("arn:aws:dynamodb:*:*:table/payments/stream/*"), 4);
    }
}
