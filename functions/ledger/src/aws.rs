//! The AWS SDK configuration every client of the function shares, and the root certificates its
//! HTTPS client trusts.
//!
//! By default the SDK's HTTPS client trusts the system's roots: `rustls-native-certs` reads the
//! certificate bundle and then every file of the certificate directory, once per process, and
//! each SDK client then parses them all into its own TLS configuration (the SDK does that when
//! the client is built). On this machine that is 292 files and about 3 of the 5.5 ms the ledger
//! took to start (BENCHMARKS.md, "Cold start"). Every endpoint the ledger calls (`DynamoDB`,
//! Kinesis, SQS) presents a certificate that chains to Amazon Trust Services, so the function
//! trusts those five roots, compiled in (`certs/amazon-trust-services.pem`, from Mozilla's list as
//! Debian ships it): nothing to read, five certificates to parse.
//!
//! When the environment says something else, the SDK's own client is used as it is: roots named
//! by `SSL_CERT_FILE` or `SSL_CERT_DIR` (a proxy that re-signs TLS, a private endpoint with its
//! own authority), or a proxy (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, which only the SDK's
//! client reads).

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore, rustls_provider::CryptoMode};

/// The roots AWS endpoints chain to: Amazon Root CA 1 to 4 and Starfield Services Root
/// Certificate Authority - G2, in PEM.
pub const AMAZON_TRUST_SERVICES: &[u8] = include_bytes!("../certs/amazon-trust-services.pem");

/// The variables after which the SDK's own HTTPS client is used (see the module's doc).
const DEFER_TO_SDK: [&str; 8] = [
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Which roots the function's HTTPS client trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Roots {
    /// The Amazon Trust Services roots, compiled in.
    AmazonTrustServices,
    /// The SDK's default: the system's roots (and its proxy settings).
    System,
}

impl Roots {
    /// What the environment asks for: [`Roots::System`] when any of `SSL_CERT_FILE`,
    /// `SSL_CERT_DIR` or a proxy variable is set, [`Roots::AmazonTrustServices`] otherwise.
    ///
    /// ```
    /// # use ledger::aws::Roots;
    /// let roots = Roots::from_env();
    /// assert!(matches!(roots, Roots::System | Roots::AmazonTrustServices));
    /// ```
    #[must_use]
    pub fn from_env() -> Self {
        if DEFER_TO_SDK
            .iter()
            .any(|name| std::env::var_os(name).is_some())
        {
            Self::System
        } else {
            Self::AmazonTrustServices
        }
    }
}

/// The configuration of every client, from the environment as `aws_config::load_from_env`
/// reads it, with an HTTPS client that trusts `roots`. Loading it sends no request; the clients
/// built from it share one HTTPS client, so one connection pool.
///
/// ```no_run
/// # async fn run() {
/// let config = ledger::aws::sdk_config(ledger::aws::Roots::from_env()).await;
/// # }
/// ```
pub async fn sdk_config(roots: Roots) -> SdkConfig {
    let loader = aws_config::defaults(BehaviorVersion::latest());
    match roots {
        Roots::System => loader.load().await,
        Roots::AmazonTrustServices => {
            let trust = TrustStore::empty().with_pem_certificate(AMAZON_TRUST_SERVICES);
            let context = TlsContext::builder()
                .with_trust_store(trust)
                .build()
                .expect("a trust store of PEM certificates makes a TLS context");
            let client = aws_smithy_http_client::Builder::new()
                .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
                .tls_context(context)
                .build_https();
            loader.http_client(client).load().await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_compiled_in_roots_are_the_five_certificates_and_a_client_takes_them() {
        let text = std::str::from_utf8(AMAZON_TRUST_SERVICES).expect("PEM is text");
        assert_eq!(text.matches("-----BEGIN CERTIFICATE-----").count(), 5);
        // Building a client builds its TLS configuration, which panics on a certificate it
        // cannot parse.
        let config = sdk_config(Roots::AmazonTrustServices).await;
        let _ = aws_sdk_dynamodb::Client::new(&config);
    }
}
