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
//!
//! The region and the credentials: Lambda gives both in the environment (`AWS_REGION`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), and the SDK's default
//! chains would find them there first. But `aws_config` builds each chain whole before asking
//! it: the credentials chain builds its profile, web-identity, container and instance-metadata
//! providers (the last with a client of its own), and resolves the region a second time for
//! them. So when the environment's providers have an answer, the loader is handed those
//! providers themselves, the first links of the default chains, and the rest is never built;
//! without one (a laptop's profile, a container's endpoint, an instance's metadata), the
//! default chain is built as before. Everything else (endpoints, retries, timeouts, profile
//! settings) is still read by `aws_config`.

use aws_config::environment::{
    EnvironmentVariableCredentialsProvider, EnvironmentVariableRegionProvider,
};
use aws_config::meta::region::ProvideRegion;
use aws_config::{BehaviorVersion, ConfigLoader, SdkConfig};
use aws_sdk_dynamodb::config::ProvideCredentials;
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
/// built from it share one HTTPS client, so one connection pool. The region and credentials
/// the environment gives are taken from it without building the rest of the default chains
/// (see the module's doc).
///
/// ```no_run
/// # async fn run() {
/// let config = ledger::aws::sdk_config(ledger::aws::Roots::from_env()).await;
/// # }
/// ```
pub async fn sdk_config(roots: Roots) -> SdkConfig {
    let loader = from_environment(aws_config::defaults(BehaviorVersion::latest())).await;
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

/// `loader` given the environment's region provider and credentials provider, each only when
/// it has an answer: the first link of the default chain, which would have answered the same,
/// without the rest of the chain built behind it.
async fn from_environment(mut loader: ConfigLoader) -> ConfigLoader {
    let region = EnvironmentVariableRegionProvider::new();
    if region.region().await.is_some() {
        loader = loader.region(region);
    }
    let credentials = EnvironmentVariableCredentialsProvider::new();
    if credentials.provide_credentials().await.is_ok() {
        loader = loader.credentials_provider(credentials);
    }
    loader
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

    /// Runs the ignored test `name` of this binary alone, in a child process whose environment
    /// is `env` only (a test cannot change its own process's environment soundly), and says
    /// whether it passed.
    fn passes_in_a_child_with(name: &str, env: &[(&str, &str)]) -> bool {
        let child = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args([name, "--exact", "--ignored", "--test-threads=1"])
            .env_clear()
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .envs(env.iter().copied())
            .output()
            .expect("the test binary runs");
        if !child.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&child.stdout));
        }
        child.status.success()
    }

    /// What a child process checks: the configuration's region and access key are the ones
    /// `EXPECT_REGION` and `EXPECT_KEY` name.
    #[tokio::test]
    #[ignore = "run in a child process, with the environment of its caller"]
    async fn child_region_and_credentials_are_the_expected_ones() {
        let config = sdk_config(Roots::AmazonTrustServices).await;
        let expected = |name| std::env::var(name).expect("the caller names what to expect");
        assert_eq!(
            config.region().map(ToString::to_string),
            Some(expected("EXPECT_REGION"))
        );
        let credentials = config
            .credentials_provider()
            .expect("a credentials provider")
            .provide_credentials()
            .await
            .expect("credentials");
        assert_eq!(credentials.access_key_id(), expected("EXPECT_KEY"));
    }

    #[test]
    fn region_and_credentials_come_from_the_environment_when_it_has_them() {
        assert!(passes_in_a_child_with(
            "aws::tests::child_region_and_credentials_are_the_expected_ones",
            &[
                ("AWS_REGION", "eu-west-3"),
                ("AWS_ACCESS_KEY_ID", "AKIDFROMENV"),
                ("AWS_SECRET_ACCESS_KEY", "secret"),
                ("AWS_SESSION_TOKEN", "token"),
                ("EXPECT_REGION", "eu-west-3"),
                ("EXPECT_KEY", "AKIDFROMENV"),
            ],
        ));
    }

    #[test]
    fn without_them_the_default_chains_read_the_profile_files() {
        let dir = std::env::temp_dir().join(format!("ledger-aws-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (config, credentials) = (dir.join("config"), dir.join("credentials"));
        std::fs::write(&config, "[default]\nregion = eu-north-1\n").unwrap();
        std::fs::write(
            &credentials,
            "[default]\naws_access_key_id = AKIDFROMPROFILE\naws_secret_access_key = secret\n",
        )
        .unwrap();
        let passed = passes_in_a_child_with(
            "aws::tests::child_region_and_credentials_are_the_expected_ones",
            &[
                ("AWS_CONFIG_FILE", config.to_str().unwrap()),
                ("AWS_SHARED_CREDENTIALS_FILE", credentials.to_str().unwrap()),
                ("EXPECT_REGION", "eu-north-1"),
                ("EXPECT_KEY", "AKIDFROMPROFILE"),
            ],
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(passed);
    }
}
