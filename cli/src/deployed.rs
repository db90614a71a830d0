//! `kinesis-checkpoint doctor --function NAME`: the doctor's checks on a deployed function.
//!
//! A template says what was meant; the Lambda API says what runs. This module reads a deployed
//! function's Kinesis and `DynamoDB` Streams event source mappings and environment (Lambda
//! API) and its role's inline and attached policies (IAM API), lays them out as the template
//! they would come from, and runs [`doctor::check_template`] on it: one set of checks, two
//! sources.

use kinesis_checkpoint::aws_error::cause;
use serde_json::{Map, Value, json};

use crate::Error;
use crate::doctor::{self, Finding, Severity};

/// The logical id the execution role gets in the laid-out template.
const ROLE_ID: &str = "ExecutionRole";

/// Checks every Kinesis and `DynamoDB` Streams event source mapping of the deployed function
/// `function` (a name or ARN), with the function's environment and its role's permissions.
///
/// # Errors
///
/// The function or its mappings cannot be read (not found, no permission, no endpoint). A role
/// whose policies cannot be read is a warning among the findings, not an error.
///
/// ```no_run
/// # async fn run() -> Result<(), kinesis_checkpoint_cli::Error> {
/// let config = kinesis_checkpoint_cli::aws_config(None).await;
/// let findings = kinesis_checkpoint_cli::deployed::check_function(&config, "ledger").await?;
/// print!("{}", kinesis_checkpoint_cli::doctor::report(&findings));
/// # Ok(())
/// # }
/// ```
pub async fn check_function(
    config: &aws_config::SdkConfig,
    function: &str,
) -> Result<Vec<Finding>, Error> {
    let (template, mut findings) = describe(config, function).await?;
    findings.extend(doctor::check_template(&template.to_string())?);
    findings.sort_by_key(|finding| std::cmp::Reverse(finding.severity));
    Ok(findings)
}

/// The deployed function as a template (its stream mappings, itself with its environment, its
/// role with its policies), and what could not be read on the way.
async fn describe(
    config: &aws_config::SdkConfig,
    function: &str,
) -> Result<(Value, Vec<Finding>), Error> {
    let lambda = aws_sdk_lambda::Client::new(config);
    let configuration = lambda
        .get_function_configuration()
        .function_name(function)
        .send()
        .await
        .map_err(|error| format!("cannot read the function {function}: {}", cause(&error)))?;
    // Function names are letters, digits, hyphens and underscores: a logical id as they are.
    let id = configuration.function_name().unwrap_or(function).to_owned();
    let mut resources = Map::new();
    let mut marker = None;
    loop {
        let page = lambda
            .list_event_source_mappings()
            .function_name(function)
            .set_marker(marker)
            .send()
            .await
            .map_err(|error| {
                format!(
                    "cannot list the event source mappings of {function}: {}",
                    cause(&error)
                )
            })?;
        for mapping in page.event_source_mappings() {
            if let Some(properties) = mapping_properties(mapping, &id) {
                let uuid = mapping.uuid().unwrap_or("?");
                resources.insert(
                    format!("mapping {uuid}"),
                    json!({ "Type": "AWS::Lambda::EventSourceMapping", "Properties": properties }),
                );
            }
        }
        marker = page.next_marker().map(str::to_owned);
        if marker.is_none() {
            break;
        }
    }

    let mut findings = Vec::new();
    let role_arn = configuration.role().unwrap_or_default();
    let role = match role_policies(config, role_arn).await {
        Ok(policies) => {
            resources.insert(
                ROLE_ID.to_owned(),
                json!({ "Type": "AWS::IAM::Role", "Properties": { "Policies": policies } }),
            );
            Value::from(ROLE_ID)
        }
        Err(error) => {
            findings.push(Finding::new(
                &id,
                Severity::Warning,
                format!("the policies of the role {role_arn} cannot be read: {error}"),
                "run the doctor with iam:ListRolePolicies, iam:GetRolePolicy, \
                 iam:ListAttachedRolePolicies, iam:GetPolicy and iam:GetPolicyVersion",
            ));
            // Not a resource of the template: the checks say the role cannot be checked.
            Value::from(role_arn)
        }
    };
    let variables: Map<String, Value> = configuration
        .environment()
        .and_then(|environment| environment.variables())
        .into_iter()
        .flatten()
        .map(|(name, value)| (name.clone(), Value::from(value.as_str())))
        .collect();
    resources.insert(
        id,
        json!({
            "Type": "AWS::Lambda::Function",
            "Properties": { "Role": role, "Environment": { "Variables": variables } },
        }),
    );
    Ok((json!({ "Resources": resources }), findings))
}

/// A Kinesis or `DynamoDB` stream mapping's settings under their template names; `None` for
/// other sources (SQS, Kafka, ...).
fn mapping_properties(
    mapping: &aws_sdk_lambda::types::EventSourceMappingConfiguration,
    function_id: &str,
) -> Option<Map<String, Value>> {
    let source = mapping.event_source_arn()?;
    // `arn:aws:dynamodb:<region>:<account>:table/<name>/stream/<label>`: a table's stream.
    let dynamodb_stream = source.contains(":dynamodb:") && source.contains("/stream/");
    if !(source.contains(":kinesis:") || dynamodb_stream) {
        return None;
    }
    let mut properties = Map::new();
    properties.insert("EventSourceArn".into(), source.into());
    properties.insert("FunctionName".into(), function_id.into());
    properties.insert(
        "FunctionResponseTypes".into(),
        mapping
            .function_response_types()
            .iter()
            .map(|kind| Value::from(kind.as_str()))
            .collect(),
    );
    let numbers = [
        ("MaximumRetryAttempts", mapping.maximum_retry_attempts()),
        (
            "MaximumRecordAgeInSeconds",
            mapping.maximum_record_age_in_seconds(),
        ),
        ("ParallelizationFactor", mapping.parallelization_factor()),
        (
            "TumblingWindowInSeconds",
            mapping.tumbling_window_in_seconds(),
        ),
    ];
    for (name, value) in numbers {
        if let Some(value) = value {
            properties.insert(name.into(), value.into());
        }
    }
    if let Some(bisect) = mapping.bisect_batch_on_function_error() {
        properties.insert("BisectBatchOnFunctionError".into(), bisect.into());
    }
    if let Some(position) = mapping.starting_position() {
        properties.insert("StartingPosition".into(), position.as_str().into());
    }
    if let Some(destination) = mapping
        .destination_config()
        .and_then(|config| config.on_failure())
        .and_then(|on_failure| on_failure.destination())
    {
        properties.insert(
            "DestinationConfig".into(),
            json!({ "OnFailure": { "Destination": destination } }),
        );
    }
    Some(properties)
}

/// The role's inline and attached policies, as a template's `Policies` entries.
async fn role_policies(config: &aws_config::SdkConfig, role_arn: &str) -> Result<Value, Error> {
    // `arn:aws:iam::123456789012:role/path/name`: the name is the last part.
    let role = role_arn.rsplit('/').next().unwrap_or(role_arn);
    let iam = aws_sdk_iam::Client::new(config);
    let mut policies = Vec::new();
    let inline = iam
        .list_role_policies()
        .role_name(role)
        .max_items(1000)
        .send()
        .await
        .map_err(|error| failed("ListRolePolicies", &error))?;
    for name in inline.policy_names() {
        let policy = iam
            .get_role_policy()
            .role_name(role)
            .policy_name(name)
            .send()
            .await
            .map_err(|error| failed("GetRolePolicy", &error))?;
        policies.push(json!({ "PolicyDocument": document(policy.policy_document())? }));
    }
    let attached = iam
        .list_attached_role_policies()
        .role_name(role)
        .max_items(1000)
        .send()
        .await
        .map_err(|error| failed("ListAttachedRolePolicies", &error))?;
    for policy in attached.attached_policies() {
        let arn = policy.policy_arn().unwrap_or_default();
        let version = iam
            .get_policy()
            .policy_arn(arn)
            .send()
            .await
            .map_err(|error| failed("GetPolicy", &error))?
            .policy()
            .and_then(|policy| policy.default_version_id().map(str::to_owned))
            .unwrap_or_default();
        let text = iam
            .get_policy_version()
            .policy_arn(arn)
            .version_id(version)
            .send()
            .await
            .map_err(|error| failed("GetPolicyVersion", &error))?
            .policy_version()
            .and_then(|version| version.document().map(str::to_owned))
            .unwrap_or_default();
        policies.push(json!({ "PolicyDocument": document(&text)? }));
    }
    Ok(Value::Array(policies))
}

/// An IAM request's error, named by the request.
fn failed(
    request: &str,
    error: &(impl aws_sdk_iam::error::ProvideErrorMetadata + std::error::Error + 'static),
) -> Error {
    format!("{request}: {}", cause(error)).into()
}

/// A policy document as IAM returns it: JSON, percent-encoded.
fn document(text: &str) -> Result<Value, Error> {
    let decoded = percent_decode(text);
    serde_json::from_str(&decoded)
        .map_err(|error| format!("a policy document is not JSON ({error}): {decoded}").into())
}

/// `%7B%22Version%22` → `{"Version"`; text without escapes is returned as it is.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        if let Some(byte) = escaped {
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percent_encoded_policy_document_reads_as_json() {
        let document = document("%7B%22Version%22%3A%222012-10-17%22%7D").unwrap();
        assert_eq!(document["Version"], "2012-10-17");
        assert_eq!(percent_decode("plain {\"a\": 1}"), "plain {\"a\": 1}");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
