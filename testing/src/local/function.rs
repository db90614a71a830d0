//! What a local event source invokes: a [`Function`] takes one batch and answers as a Lambda
//! function does. A [`Processor`] is one in the same process; [`RuntimeApi`] is a whole function
//! binary behind the Lambda invoke API (`cargo lambda watch`).

use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use lambda_runtime::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::Handler;
use kinesis_checkpoint::processor::{CheckpointMode, Processor};

/// Why an invocation did not answer with a response: to the event source, all mean that the
/// whole batch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvocationError {
    /// The function returned an error.
    #[error("the function failed: {0}")]
    Function(String),
    /// The function ran past its time-out and was stopped.
    #[error("the function timed out after {0:?}")]
    TimedOut(Duration),
    /// The function could not be reached, or its answer was not a batch response.
    #[error("could not invoke the function at {endpoint}: {error}")]
    Transport {
        /// Where it was invoked.
        endpoint: String,
        /// What went wrong.
        error: String,
    },
}

/// A Lambda function, as the event source sees it: one batch in, one response out.
///
/// ```
/// use std::sync::Arc;
/// use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
/// use kinesis_checkpoint_testing::local::Function;
///
/// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
/// let _function: Arc<dyn Function> = Arc::new(processor);
/// ```
pub trait Function: Send + Sync + 'static {
    /// Invokes the function on `event`; `context` carries the request id and deadline.
    fn invoke(
        &self,
        event: KinesisEvent,
        context: Context,
    ) -> BoxFuture<'_, Result<KinesisEventResponse, InvocationError>>;
}

impl<H: Handler, M: CheckpointMode> Function for Processor<H, M> {
    fn invoke(
        &self,
        event: KinesisEvent,
        context: Context,
    ) -> BoxFuture<'_, Result<KinesisEventResponse, InvocationError>> {
        Box::pin(async move {
            self.process(event, &context)
                .await
                .map_err(|error| InvocationError::Function(error.to_string()))
        })
    }
}

/// A function binary behind Lambda's invoke API, such as `cargo lambda watch` serves on
/// 127.0.0.1: `POST {endpoint}/2015-03-31/functions/{name}/invocations`.
///
/// ```
/// use kinesis_checkpoint_testing::local::RuntimeApi;
///
/// let function = RuntimeApi::new("http://127.0.0.1:9000", "ledger");
/// assert_eq!(function.url(), "http://127.0.0.1:9000/2015-03-31/functions/ledger/invocations");
/// ```
#[derive(Debug, Clone)]
pub struct RuntimeApi {
    endpoint: String,
    name: String,
}

impl RuntimeApi {
    /// The function `name` served at `endpoint` (`http://host:port`).
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::RuntimeApi;
    /// let _ = RuntimeApi::new("http://127.0.0.1:9000/", "_");
    /// ```
    #[must_use]
    pub fn new(endpoint: impl Into<String>, name: impl Into<String>) -> Self {
        let endpoint = endpoint.into().trim_end_matches('/').to_owned();
        Self {
            endpoint,
            name: name.into(),
        }
    }

    /// Where invocations are posted.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::RuntimeApi;
    /// assert!(RuntimeApi::new("http://127.0.0.1:9000", "_").url().ends_with("/functions/_/invocations"));
    /// ```
    #[must_use]
    pub fn url(&self) -> String {
        format!(
            "{}/2015-03-31/functions/{}/invocations",
            self.endpoint, self.name
        )
    }

    async fn post(&self, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let authority = self
            .endpoint
            .strip_prefix("http://")
            .ok_or("only http:// endpoints are supported")?;
        let path = format!("/2015-03-31/functions/{}/invocations", self.name);
        let mut stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| e.to_string())?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        stream.write_all(body).await.map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .map_err(|e| e.to_string())?;
        parse_response(&raw)
    }
}

impl Function for RuntimeApi {
    fn invoke(
        &self,
        event: KinesisEvent,
        _context: Context,
    ) -> BoxFuture<'_, Result<KinesisEventResponse, InvocationError>> {
        Box::pin(async move {
            let transport = |error: String| InvocationError::Transport {
                endpoint: self.url(),
                error,
            };
            let body = serde_json::to_vec(&event).map_err(|e| transport(e.to_string()))?;
            let (status, body) = self.post(&body).await.map_err(transport)?;
            let value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
                transport(format!(
                    "status {status}, a body that is not JSON ({e}): {}",
                    String::from_utf8_lossy(&body)
                ))
            })?;
            // A function error comes back as `{"errorType", "errorMessage"}`.
            if !(200..300).contains(&status) || value.get("errorType").is_some() {
                return Err(InvocationError::Function(value.to_string()));
            }
            serde_json::from_value(value).map_err(|e| transport(e.to_string()))
        })
    }
}

/// The status and body of a raw HTTP/1.1 response (plain or chunked).
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the response has no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {head}"))?;
    let body = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, body.to_vec()));
    }
    let mut rest = body;
    let mut out = Vec::new();
    while let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..line_end]).trim(), 16)
            .map_err(|e| format!("bad chunk size: {e}"))?;
        let start = line_end + 2;
        if size == 0 || rest.len() < start + size {
            break;
        }
        out.extend_from_slice(&rest[start..start + size]);
        rest = &rest[(start + size + 2).min(rest.len())..];
    }
    Ok((status, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_response_is_joined_and_a_plain_one_kept() {
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n3\r\n\":1\r\n1\r\n}\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).unwrap(),
            (200, b"{\"a\":1}".to_vec())
        );
        let plain = b"HTTP/1.1 500 Oops\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (500, b"{}".to_vec()));
        assert!(parse_response(b"garbage").is_err());
    }
}
