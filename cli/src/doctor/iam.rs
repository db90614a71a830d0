//! What the function's role allows: the statements of its policies (inline, SAM policy
//! templates, managed policies of the template) and whether they cover an action on a resource.

use std::collections::BTreeMap;

use super::{Finding, Severity, Source, Statement, Template, Yaml, dynamodb};

impl Template {
    pub(super) fn check_permissions(
        &self,
        subject: &str,
        function: &str,
        stream: &Yaml,
        source: Source,
        environment: &BTreeMap<String, Yaml>,
        findings: &mut Vec<Finding>,
    ) {
        let mut find = |severity, problem, fix: &str| {
            findings.push(Finding::new(subject, severity, problem, fix));
        };
        let Some(statements) = self.statements(function) else {
            find(
                Severity::Warning,
                format!(
                    "{function}'s role is not in the template (or could not be read): its permissions cannot be checked"
                ),
                "check the role by hand for the permissions listed in the README",
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
                            &format!(
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
                "name the lease table in the function's environment as LEASE_TABLE",
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
                    &format!("allow `{action}` on `{resource}` in the function's role"),
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
pub(super) fn target(template: &Template, value: &Yaml) -> String {
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
pub(super) fn covers(granted: &str, target: &str) -> bool {
    // The resource's own name: `arn:aws:dynamodb:*:*:table/leases*` names `leases*`.
    let name = granted.rsplit(['/', ':']).next().unwrap_or(granted);
    granted == "*"
        || tokens(granted).contains(&target)
        || granted.contains(target)
        || wildcard(granted, target)
        || wildcard(name, target)
}

/// IAM's wildcards: `*` any run of characters, `?` any one.
pub(super) fn wildcard(pattern: &str, text: &str) -> bool {
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
pub(super) fn document(template: &Template, document: &Yaml) -> Vec<Statement> {
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
pub(super) fn sam_policy(template: &Template, policy: &Yaml) -> Vec<Statement> {
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
pub(super) fn matches(pattern: &str, action: &str) -> bool {
    let (pattern, action) = (pattern.to_ascii_lowercase(), action.to_ascii_lowercase());
    match pattern.strip_suffix('*') {
        Some(prefix) => action.starts_with(prefix),
        None => pattern == action,
    }
}

pub(super) fn strings(value: &Yaml) -> Vec<String> {
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
pub(super) fn flatten(value: &Yaml) -> String {
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
pub(super) fn tokens(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|t| !t.is_empty())
        .collect()
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
