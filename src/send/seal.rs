//! Sealing: the emails of one partition become a batch record holding the exact
//! request body and its Idempotency-Key (seal.lua), before any request leaves, so
//! whoever sends it, now or after a crash, sends the same bytes under the same key.

use bytes::Bytes;

use crate::model::id::new_id;
use crate::model::outcome::Failpoint;
use crate::model::work::{Ready, Sealed};
use crate::send::ctx::Ctx;
use crate::store::scripts::{self, SealRequest};

/// The Idempotency-Key of a batch: unique per batch, fixed once sealed.
pub fn idempotency_key(prefix: &str, batch: &str) -> String {
    format!("{prefix}-{batch}")
}

/// Seals the emails of partition `p` into a new batch (those still held by this
/// instance); `Ok(None)` when nothing was sealed, an error when Redis did not answer.
pub(crate) async fn seal(ctx: &Ctx, p: u16, items: Vec<Ready>) -> anyhow::Result<Option<Sealed>> {
    match seal_batch(ctx, p, items).await {
        Ok(sealed) => {
            ctx.failpoints.at(Failpoint::Sealed).await;
            Ok(sealed)
        }
        Err(e) => {
            // What was sealed is recovered from its records; the rest stays claimed and is
            // reclaimed after its lease.
            ctx.metrics.redis_error("seal", &e);
            Err(e)
        }
    }
}

async fn seal_batch(ctx: &Ctx, p: u16, items: Vec<Ready>) -> anyhow::Result<Option<Sealed>> {
    let batch = new_id();
    let key = idempotency_key(&ctx.config.redis.prefix, &batch);
    let request = SealRequest {
        partition: p,
        batch: &batch,
        idempotency_key: &key,
        owner: &ctx.owner,
        group: &ctx.config.redis.group,
        lease_ms: crate::model::ms(ctx.config.lease()),
    };
    let mut conn = ctx.store.conn().await?;
    let positions = scripts::seal(&mut conn, &ctx.store.keys, &request, &items).await?;
    if positions.len() < items.len() {
        tracing::info!(
            partition = p,
            dropped = items.len() - positions.len(),
            "deliveries taken over by another holder were left out of the batch"
        );
    }
    if positions.is_empty() {
        return Ok(None);
    }
    // The same body seal.lua stored: the sealed members' JSON, in order.
    let mut body = String::with_capacity(positions.iter().map(|&i| items[i].json.len() + 1).sum::<usize>() + 2);
    body.push('[');
    for (n, &i) in positions.iter().enumerate() {
        if n > 0 {
            body.push(',');
        }
        body.push_str(&items[i].json);
    }
    body.push(']');
    let mut items: Vec<Option<Ready>> = items.into_iter().map(Some).collect();
    let members = positions.iter().filter_map(|&i| items[i].take()).map(|r| r.delivery).collect();
    Ok(Some(Sealed::new(p, batch, key, Bytes::from(body), members)))
}
