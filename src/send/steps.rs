//! The send path one step at a time, run by the daemon's own code: sealing (`seal.rs`),
//! the last gate (`gate.rs`), a request and what follows its answer (`request.rs`, with
//! `fallback.rs` and `settle.rs`), and the reclaimer's take. The protocol model's
//! conformance walks (tests/model/walk.rs) choose each step and the provider's answer,
//! run it here, and hold what the code did and says it does next to the model's. No
//! daemon uses it: a daemon runs the same functions from its dispatcher and reclaimer.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::model::work::{Ready, Sealed};
use crate::send::ctx::{Ctx, Failpoints};
use crate::send::gate::{self, GateConns};
use crate::send::request::Sender;
use crate::send::{reclaim, seal};
use crate::shutdown::Shutdown;
use crate::store::Store;

pub use crate::send::gate::Gated;

/// One holder of leases and batches (a daemon's send path, without its loops).
pub struct Steps {
    ctx: Ctx,
    sender: Sender,
    gates: GateConns,
}

impl Steps {
    /// A holder named `owner` (its leases and batches say so) on `store`, whose requests
    /// go to `config.resend.base_url` and give up after `timeout`.
    pub fn new(config: Config, store: Store, owner: &str, timeout: Duration) -> anyhow::Result<Steps> {
        let sender = Sender::with_timeout(&config, Some(0), timeout)?;
        let gates = GateConns::new(&config);
        let metrics = Arc::default();
        let mut ctx = Ctx::new(config, store, owner.to_string(), metrics, Failpoints::default(), &Shutdown::never());
        ctx.owner = owner.to_string();
        Ok(Steps { ctx, sender, gates })
    }

    /// Seals what this holder claimed of partition `p` (seal.lua); `None` when none of it
    /// was still this holder's.
    pub async fn seal(&self, p: u16, items: Vec<Ready>) -> anyhow::Result<Option<Sealed>> {
        seal::seal(&self.ctx, p, items).await
    }

    /// The last gate for `b`, and what it did: `b` is updated when members were left out.
    pub async fn gate(&self, b: &mut Sealed) -> Gated {
        gate::pass(&self.ctx, &self.gates, b, None).await
    }

    /// Sends `b` (past its gate) and records what the provider answered; the batch sealed
    /// again from its fallback sender when it was refused and falls back.
    pub async fn attempt(&self, b: Sealed) -> Option<Sealed> {
        let (on_wire, _) = tokio::sync::oneshot::channel();
        self.sender.attempt(&self.ctx, b, on_wire).await.1
    }

    /// Takes over `batch` of partition `p` (its retry due, or its holder's lease run out):
    /// the batch to resend, or `None` when there is none (settled here, or not takeable).
    pub async fn take(&self, p: u16, batch: &str) -> anyhow::Result<Option<Sealed>> {
        let mut conn = self.ctx.store.conn().await?;
        reclaim::take(&self.ctx, &mut conn, p, batch).await
    }
}
