//! The push client's resolver: a push endpoint's host is looked up once, and only the
//! addresses outside the forbidden ranges (`model::push_endpoint`) are handed to the
//! connector, so a name that rebinds between the check and the connection cannot slip
//! past it.

use std::net::SocketAddr;

use crate::model::push_endpoint::{AllowedHosts, forbidden};

/// The push client's resolver: the one DNS lookup of a send, keeping only addresses outside
/// the forbidden ranges (all of them for a host listed with its exact port), so the
/// connection goes to an address that was checked. A name with none left fails with
/// [`Forbidden`], which the sender finds in the request's error.
#[derive(Debug, Clone)]
pub struct CheckedResolver {
    allowed: std::sync::Arc<AllowedHosts>,
}

impl CheckedResolver {
    pub fn new(allowed: std::sync::Arc<AllowedHosts>) -> CheckedResolver {
        CheckedResolver { allowed }
    }
}

/// Every address a push endpoint's host resolved to is forbidden.
#[derive(Debug, thiserror::Error)]
#[error("every address of the push service's host is forbidden")]
pub struct Forbidden;

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowed = self.allowed.clone();
        let host = name.as_str().trim_end_matches('.').to_ascii_lowercase();
        Box::pin(async move {
            // The port is the connector's to set; 0 here, as reqwest expects.
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            // A host listed with its exact port is the operator's own (an emulator on loopback).
            let listed = allowed.lists_with_port(&host);
            let kept: Vec<SocketAddr> = found.into_iter().filter(|a| listed || !forbidden(a.ip())).collect();
            if kept.is_empty() {
                return Err(Box::new(Forbidden) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether a request failed because every address of its host is forbidden.
pub fn refused_by_resolver(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<Forbidden>() {
            return true;
        }
        source = err.source();
    }
    false
}
