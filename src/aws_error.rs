//! AWS SDK errors as one short line, for logs and for the errors this crate returns.
//!
//! An SDK error's `Display` says only "service error" or "dispatch failure", and the SDK's
//! `DisplayErrorContext` appends the whole error's `Debug` to its chain: several hundred
//! characters of nested structs, request ids and raw responses, over many lines once a log
//! pretty-prints it. An operator needs what was being done (the caller says it: the request,
//! the table or stream, the shard, the sequence number) and why it failed: the service's error
//! code and message when the service answered, and the chain of causes when it did not
//! (a refused connection, a time-out, a request that could not be built). [`cause`] gives that.

use std::error::Error;

use aws_smithy_types::error::metadata::ProvideErrorMetadata;

/// Why an AWS request failed, in one line: `Code: message` when the service answered with an
/// error (`ResourceNotFoundException: Requested resource not found`), otherwise the chain of
/// causes joined with `": "` (`dispatch failure: io error: ...: Connection refused (os error
/// 111)`). Line breaks inside a message become spaces.
///
/// It takes any SDK error: an `SdkError<OperationError, _>` as `send()` returns it, or an
/// operation error on its own.
///
/// ```
/// use aws_sdk_kinesis::error::ErrorMetadata;
/// use aws_sdk_kinesis::operation::list_shards::ListShardsError;
/// use kinesis_checkpoint::aws_error::cause;
///
/// let error = ListShardsError::generic(
///     ErrorMetadata::builder()
///         .code("ResourceNotFoundException")
///         .message("Stream orders under account 123456789012 not found.")
///         .build(),
/// );
/// assert_eq!(
///     cause(&error),
///     "ResourceNotFoundException: Stream orders under account 123456789012 not found."
/// );
/// ```
#[must_use]
pub fn cause<E>(error: &E) -> String
where
    E: ProvideErrorMetadata + Error + 'static,
{
    match (error.code(), error.message()) {
        (Some(code), Some(message)) if !message.trim().is_empty() => {
            one_line(&format!("{code}: {message}"))
        }
        (Some(code), _) => one_line(code),
        (None, _) => chain(error),
    }
}

/// An error and its sources, each by its `Display`, joined with `": "` on one line. A source
/// whose text its parent already shows is left out, so nothing is said twice.
///
/// ```
/// use kinesis_checkpoint::aws_error::chain;
///
/// #[derive(Debug)]
/// struct Outer(std::io::Error);
/// impl std::fmt::Display for Outer {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("dispatch failure")
///     }
/// }
/// impl std::error::Error for Outer {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
///
/// let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection\nrefused");
/// assert_eq!(chain(&Outer(refused)), "dispatch failure: connection refused");
/// ```
#[must_use]
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(error) = next {
        let text = one_line(&error.to_string());
        if !text.is_empty() && !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        next = error.source();
    }
    parts.join(": ")
}

/// `text` with every run of whitespace (line breaks included) made one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(all(test, feature = "dynamodb"))]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::operation::get_item::GetItemError;

    #[test]
    fn a_service_error_is_its_code_and_message_on_one_line() {
        let error = GetItemError::generic(
            ErrorMetadata::builder()
                .code("ResourceNotFoundException")
                .message("Requested resource\nnot found")
                .build(),
        );
        assert_eq!(
            cause(&error),
            "ResourceNotFoundException: Requested resource not found"
        );
    }

    #[test]
    fn a_service_error_without_a_message_is_its_code() {
        let error =
            GetItemError::generic(ErrorMetadata::builder().code("ThrottlingException").build());
        assert_eq!(cause(&error), "ThrottlingException");
    }

    #[test]
    fn an_error_without_a_code_is_its_chain_without_repetition() {
        #[derive(Debug)]
        struct Wrap(&'static str, Option<Box<Wrap>>);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl Error for Wrap {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let error = Wrap(
            "io error",
            Some(Box::new(Wrap(
                "tcp connect error: refused",
                Some(Box::new(Wrap("refused", None))),
            ))),
        );
        assert_eq!(chain(&error), "io error: tcp connect error: refused");
    }
}
