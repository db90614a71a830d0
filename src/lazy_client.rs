//! AWS SDK clients built when first used, not when the function starts.
//!
//! Building an SDK client builds its HTTPS connector: the TLS configuration, and the root
//! certificates loaded and parsed (the SDK does it in the client's constructor, on purpose, so
//! that the first request does not pay it). A Lambda function that builds its clients in `main`
//! pays that for each of them before Lambda can hand it the first event, and pays it for a
//! client it may never use: Kinesis, when every shard's row knows its parents; SQS, when no
//! record is dead-lettered. So [`DynamoLeaseStore`](crate::DynamoLeaseStore),
//! [`KinesisTopology`](crate::KinesisTopology) and [`SqsDeadLetters`](crate::SqsDeadLetters)
//! keep the configuration and build their client on their first request (the `coldstart`
//! bench).

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use aws_config::SdkConfig;

/// A client of type `C`, built from a configuration the first time it is asked for. Clones share
/// it: however many clones, one client is built.
pub(crate) struct LazyClient<C> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    client: OnceLock<C>,
    /// How to build it, until it is; `None` for a client given ready.
    recipe: Option<Recipe<C>>,
}

/// A configuration, and the constructor that makes the client of it.
type Recipe<C> = (SdkConfig, fn(&SdkConfig) -> C);

impl<C> LazyClient<C> {
    /// A client `build` makes from `config` when it is first asked for.
    pub(crate) fn new(config: &SdkConfig, build: fn(&SdkConfig) -> C) -> Self {
        Self {
            inner: Arc::new(Inner {
                client: OnceLock::new(),
                recipe: Some((config.clone(), build)),
            }),
        }
    }

    /// A client built already, by the caller.
    pub(crate) fn ready(client: C) -> Self {
        Self {
            inner: Arc::new(Inner {
                client: OnceLock::from(client),
                recipe: None,
            }),
        }
    }

    /// The client, built now if it was not yet.
    pub(crate) fn get(&self) -> &C {
        self.inner.client.get_or_init(|| {
            // Only a client given ready has no recipe, and its cell was filled when it was.
            let (config, build) = self
                .inner
                .recipe
                .as_ref()
                .expect("a lazy client has its recipe until it is built");
            build(config)
        })
    }
}

/// As `LazyLock`: the client's methods are called on the lazy client, which builds it first.
impl<C> Deref for LazyClient<C> {
    type Target = C;

    fn deref(&self) -> &C {
        self.get()
    }
}

impl<C> Clone for LazyClient<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: fmt::Debug> fmt::Debug for LazyClient<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.inner.client.get() {
            Some(client) => client.fmt(f),
            None => f.write_str("(built on first use)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static BUILT: AtomicUsize = AtomicUsize::new(0);

    fn count(_: &SdkConfig) -> usize {
        BUILT.fetch_add(1, Ordering::SeqCst) + 1
    }

    #[test]
    fn a_client_is_built_on_first_use_once_for_every_clone() {
        let config = SdkConfig::builder().build();
        let lazy = LazyClient::new(&config, count);
        let clone = lazy.clone();
        assert_eq!(BUILT.load(Ordering::SeqCst), 0, "nothing built up front");
        assert_eq!(*clone.get(), 1);
        assert_eq!(*lazy.get(), 1, "the clone's client");
        assert_eq!(BUILT.load(Ordering::SeqCst), 1);
        assert_eq!(*LazyClient::ready(7).get(), 7);
    }
}
