//! Giving claimed work back: emails claimed and rendered but never sealed go back
//! to Redis, pending again and readable by any instance at once (at a stop, a
//! pause, or when a queue has no room). Used by the consumer, the reclaimer and
//! dispatch.

use crate::model::work::{DeliveryRef, Ready};
use crate::send::ctx::Ctx;
use crate::store::scripts;

/// Hands claimed emails of partition `p` back to Redis (pending again, readable by
/// any instance at once): at a stop, a pause, or when a queue has no room.
pub(crate) async fn hand_back(ctx: &Ctx, p: u16, items: &[Ready]) {
    if items.is_empty() {
        return;
    }
    let result = async {
        let mut conn = ctx.store.conn().await?;
        let refs: Vec<(&str, &DeliveryRef)> = items.iter().map(|r| (r.entry.as_str(), &r.delivery)).collect();
        let (keys, group) = (&ctx.store.keys, &ctx.config.redis.group);
        anyhow::Ok(scripts::release(&mut conn, keys, p, group, &ctx.owner, &refs).await?)
    };
    match result.await {
        Ok(n) => tracing::debug!(partition = p, released = n, "claimed deliveries handed back"),
        // They stay claimed and are taken over when their lease expires.
        Err(err) => ctx.metrics.redis_error("release", &err),
    }
}
