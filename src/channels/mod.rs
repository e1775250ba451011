//! What the channels other than email share (the application channel, `app.rs`, and Web
//! Push, `push/`): one reader per partition of the channel's own stream, which claims each
//! delivery (claim.lua), checks the subscriber still wants it, fixes its message in the
//! record before the first request (first writer wins, waited for by the replicas), and
//! hands it to the channel's [`ChannelSender`] to send and settle (decide.lua) or put off
//! (defer.lua, into the channel's due set); it takes over the channel's expired leases
//! itself. Nothing here touches an email's stream, batch or limiter, so a channel that is
//! down holds no email, and an email outage holds no other channel.

pub mod app;
pub mod push;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::audience::subscribers::{self, Resolved};
use crate::model::outcome::{Outcome, Reason};
use crate::model::work::{Channel, DeliveryRef, Lane, TRANSACTIONAL};
use crate::send::ctx::Ctx;
use crate::send::read::{self, Claimed, ClaimedRead, NotSent, OverClaimed};
use crate::store::conn::Conn;
use crate::store::records::{self, SubscriberRead};
use crate::store::scripts::{self, Backoff, Decision, Deferred};
use crate::store::streams::{self, StreamEntry};

/// A channel's sending: what its message is, and one delivery's requests.
pub(crate) trait ChannelSender: Send + Sync + Sized + 'static {
    const CHANNEL: Channel;
    /// The record field holding the message, fixed before its first request.
    const BODY_FIELD: &'static str;
    /// The record field set when a request of it got no answer (it may have been taken).
    const MAYBE_TAKEN_FIELD: &'static str;
    /// Why a delivery that was never taken before its deadline failed.
    const UNAVAILABLE: Reason;
    /// The names its Redis errors are counted under: (reading, settling).
    const OPS: (&'static str, &'static str);

    fn ctx(&self) -> &Arc<Ctx>;
    fn slots(&self) -> &Slots;
    /// The message of a delivery still wanted, from its template and data (the subscriber
    /// record's, or a transactional item's); `Err` fails the delivery for that reason.
    fn body(&self, d: &DeliveryRef, template: &str, data: &serde_json::Value) -> Result<String, Reason>;
    /// Sends one claimed delivery's message, then settles it or puts it off.
    fn send(self: Arc<Self>, p: u16, item: Claimed, body: String) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// The longest a far end's `Retry-After` is obeyed for: a longer one is read as this (the
/// delivery deadline still ends it).
pub const MAX_RETRY_AFTER_SECONDS: u64 = 3600;

/// A 429's `Retry-After` (delta-seconds; an HTTP-date or garbage is read as none), in ms,
/// capped at [`MAX_RETRY_AFTER_SECONDS`].
pub fn retry_after_ms(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let seconds: u64 = headers.get("retry-after")?.to_str().ok()?.trim().parse().ok()?;
    Some(seconds.min(MAX_RETRY_AFTER_SECONDS) * 1000)
}

/// How a delivery that will not be sent again ends: `failed`, or `outcome_unknown` when a
/// request of it may have been taken.
pub(crate) fn fails(maybe_taken: bool) -> Outcome {
    if maybe_taken { Outcome::OutcomeUnknown } else { Outcome::Failed }
}

/// What becomes of a delivery no longer wanted when it is claimed: skipped if no request
/// of it has left (no body written yet), else `outcome_unknown` (one may have been taken).
pub fn unwanted_outcome(body_written: bool) -> Outcome {
    if body_written { Outcome::OutcomeUnknown } else { Outcome::Skipped }
}

/// Per partition reader, its requests in flight (the channel's `concurrency` shared
/// out). A reader takes a slot for each delivery before it reads it, so its request
/// leaves as soon as it is claimed, well within its lease.
pub(crate) struct Slots {
    partitions: Vec<Arc<Semaphore>>,
    per: usize,
    read_count: usize,
}

impl Slots {
    pub fn new(ctx: &Ctx, concurrency: usize) -> Slots {
        let partitions = usize::from(ctx.config.redis.partitions);
        let per = concurrency.div_ceil(partitions).max(1);
        Slots {
            partitions: (0..partitions).map(|_| Arc::new(Semaphore::new(per))).collect(),
            per,
            read_count: ctx.config.delivery.read_count,
        }
    }

    /// Slots of partition `p`'s reader: at least one (waiting for it with `wait`), and as
    /// many more as are free, up to a read's worth.
    async fn take(&self, p: u16, wait: bool) -> Vec<OwnedSemaphorePermit> {
        let slots = &self.partitions[usize::from(p)];
        let mut out = Vec::new();
        if wait {
            out.push(slots.clone().acquire_owned().await.expect("the semaphore is never closed"));
        }
        while out.len() < self.read_count {
            match slots.clone().try_acquire_owned() {
                Ok(permit) => out.push(permit),
                Err(_) => break,
            }
        }
        out
    }

    /// Waits until partition `p`'s requests in flight have ended.
    async fn drain(&self, p: u16) {
        let _ = self.partitions[usize::from(p)].acquire_many(self.per as u32).await;
    }
}

/// Writes each message into its record unless one is there (first writer wins), waits
/// until replicas have it (`Store::durable`), then reads back the message that is: every
/// request of a delivery, by anyone and after a failover, carries that message. Read
/// after the WAIT, so a failover just before it (a new primary acknowledging without the
/// write) shows as no message, and nothing is sent: the lease runs out, and whoever
/// claims it next writes and sends the one message that then survives.
pub async fn fix_bodies(
    conn: &mut Conn,
    store: &crate::store::Store,
    (p, lane, field): (u16, Lane, &str),
    items: &[(&DeliveryRef, String)],
) -> anyhow::Result<Vec<Option<String>>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let write: Vec<(String, &str)> =
        items.iter().map(|(d, body)| (store.keys.delivery(p, &d.id()), body.as_str())).collect();
    // Never onto a record settled (and gone) meanwhile: that delivery is not sent again.
    scripts::note(conn, field, &write).await?;
    store.durable(conn, &store.keys.lane_stream(p, lane)).await?;
    let ids: Vec<String> = items.iter().map(|(d, _)| d.id()).collect();
    records::deliveries_field(conn, &store.keys, p, &ids, field).await
}

/// Reads partition `p`'s stream of `S`'s channel until shutdown, taking over its expired
/// leases every half lease.
pub(crate) async fn read_partition<S: ChannelSender>(sender: Arc<S>, p: u16) {
    let ctx = sender.ctx().clone();
    let lane = Lane::of("", S::CHANNEL);
    let mut shutdown = ctx.shutdown.clone();
    let stream = ctx.store.keys.lane_stream(p, lane);
    let group = ctx.config.redis.group.clone();
    let mut failures = 0u32;
    let mut reader: Option<Conn> = None;
    let mut last_takeover = tokio::time::Instant::now();
    while !shutdown.is_triggered() {
        let result = async {
            if reader.is_none() {
                reader = Some(ctx.store.dedicated().await?);
            }
            let conn = reader.as_mut().expect("just connected");
            if last_takeover.elapsed() >= ctx.config.lease() / 2 {
                last_takeover = tokio::time::Instant::now();
                take_over(&sender, p, conn).await?;
            }
            // Read only what there are request slots for: the rest waits in the stream,
            // unclaimed, for whichever instance has room.
            let permits = sender.slots().take(p, true).await;
            let from = (stream.as_str(), group.as_str(), ctx.consumer.as_str());
            let entries = streams::read_new(conn, from, permits.len(), ctx.config.delivery.block_ms).await?;
            process(sender.clone(), p, conn, entries, permits).await
        }
        .await;
        match result {
            Ok(()) => failures = 0,
            Err(e) => {
                reader = None;
                failures += 1;
                ctx.metrics.redis_error(S::OPS.0, &e);
                shutdown.sleep(Duration::from_millis(200 * u64::from(failures.min(25)))).await;
            }
        }
    }
    // Let the requests in flight settle (each ends within its timeout).
    sender.slots().drain(p).await;
}

/// XAUTOCLAIMs entries of partition `p`'s stream idle longer than a lease and processes
/// them like new ones (claim.lua decides whether the lease really expired).
async fn take_over<S: ChannelSender>(sender: &Arc<S>, p: u16, conn: &mut Conn) -> anyhow::Result<()> {
    let ctx = sender.ctx();
    let permits = sender.slots().take(p, false).await;
    if permits.is_empty() {
        return Ok(());
    }
    let stream = ctx.store.keys.lane_stream(p, Lane::of("", S::CHANNEL));
    let from = (stream.as_str(), ctx.config.redis.group.as_str(), ctx.consumer.as_str());
    let lease_ms = crate::model::ms(ctx.config.lease());
    let entries = streams::take_over_idle(conn, from, lease_ms, "0-0", permits.len()).await?.entries;
    if !entries.is_empty() {
        tracing::info!(
            partition = p,
            channel = S::CHANNEL.as_str(),
            entries = entries.len(),
            "taking over deliveries whose lease expired"
        );
    }
    process(sender.clone(), p, conn, entries, permits).await
}

/// Claims `entries`, settles what will not be sent, and starts a request for each of the
/// rest (with a slot taken for it).
async fn process<S: ChannelSender>(
    sender: Arc<S>,
    p: u16,
    conn: &mut Conn,
    entries: Vec<StreamEntry>,
    mut permits: Vec<OwnedSemaphorePermit>,
) -> anyhow::Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let ctx = sender.ctx().clone();
    let lane = Lane::of("", S::CHANNEL);
    // Claimed too often: a request of it may have been taken once its message is written.
    let over = OverClaimed::UnknownIfWritten(S::BODY_FIELD);
    let ClaimedRead { items: wellformed, live, mut decided } =
        read::claim_read(&ctx, (p, lane), conn, entries, over).await?;
    let send = messages(&*sender, p, conn, &wellformed, live, &mut decided).await?;
    read::settle_decided(&ctx, conn, p, &wellformed, &decided).await?;
    // The message is fixed before the first request: a retry, by anyone, sends the same.
    let items: Vec<(&DeliveryRef, String)> =
        send.iter().map(|(i, body)| (&wellformed[*i].delivery, body.clone())).collect();
    let bodies = fix_bodies(conn, &ctx.store, (p, lane, S::BODY_FIELD), &items).await?;
    let mut claimed: Vec<Option<Claimed>> = wellformed.into_iter().map(Some).collect();
    for ((i, _), body) in send.iter().zip(bodies) {
        let item = claimed[*i].take().expect("each delivery once");
        let Some(body) = body else { continue };
        // A slot was taken for each entry read: one is there.
        let Some(permit) = permits.pop() else { break };
        let sender = sender.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let ctx = sender.ctx().clone();
            if let Err(e) = sender.send(p, item, body).await {
                ctx.metrics.redis_error(S::OPS.1, &e);
            }
        });
    }
    Ok(())
}

/// The message each live delivery (of `wellformed`, by index) is to carry: from the
/// request its record keeps (a transactional one) or from its subscriber's record, if
/// still wanted; what will not be sent goes to `decisions`.
async fn messages<S: ChannelSender>(
    sender: &S,
    p: u16,
    conn: &mut Conn,
    wellformed: &[Claimed],
    live: Vec<usize>,
    decided: &mut Vec<NotSent>,
) -> anyhow::Result<Vec<(usize, String)>> {
    let ctx = sender.ctx();
    let keys = &ctx.store.keys;
    // A transactional delivery: what its record keeps of the request (no subscription
    // applies to a receipt, and it has no address of its own); one ingested by an earlier
    // version reads its email's record.
    let (transactional, live): (Vec<usize>, Vec<usize>) =
        live.into_iter().partition(|&i| wellformed[i].delivery.campaign == TRANSACTIONAL);
    let mut send: Vec<(usize, String)> = Vec::new();
    let mut body_of = |i: usize, template: &str, data: &serde_json::Value, decided: &mut Vec<NotSent>| match sender
        .body(&wellformed[i].delivery, template, data)
    {
        Ok(body) => send.push((i, body)),
        Err(reason) => decided.push(NotSent::new(i, Outcome::Failed, reason)),
    };
    // Its own record's request, else its email's (two ids per delivery, in that order).
    let ids: Vec<String> = transactional
        .iter()
        .flat_map(|&i| {
            let d = &wellformed[i].delivery;
            [d.id(), d.clone().on(Channel::Email).id()]
        })
        .collect();
    let requests = records::stored_requests(conn, keys, p, &ids).await?;
    for (&i, pair) in transactional.iter().zip(requests.chunks(2)) {
        let request = pair.iter().flatten().next().map(String::as_str);
        match request.and_then(crate::audience::ingest::Request::from_stored) {
            Some(r) => {
                let data: serde_json::Map<String, serde_json::Value> = r.data.into_iter().flatten().collect();
                body_of(i, &r.template.unwrap_or_default(), &serde_json::Value::Object(data), decided);
            }
            None => decided.push(NotSent::new(i, Outcome::Failed, Reason::RecordLost)),
        }
    }
    // Still wanted? The subscriber's record, with this channel's opt-out.
    let reads: Vec<SubscriberRead<'_>> = live
        .iter()
        .map(|&i| {
            let d = &wellformed[i].delivery;
            let opted_out = subscribers::field::channel_opted_out(&d.campaign, S::CHANNEL);
            SubscriberRead { partition: p, id: &d.subscriber, opted_out }
        })
        .collect();
    let rows = records::subscriber_rows(conn, keys, &reads).await?;
    let mut unwanted: Vec<(usize, Reason)> = Vec::new();
    for (&i, row) in live.iter().zip(rows) {
        let d = &wellformed[i].delivery;
        let Some(campaign) = ctx.config.campaign(&d.campaign) else {
            decided.push(NotSent::new(i, Outcome::Failed, Reason::UnknownCampaign));
            continue;
        };
        match subscribers::resolve(row) {
            Resolved::Send { data, .. } => body_of(i, &campaign.template, &data, decided),
            Resolved::Skip(reason) => unwanted.push((i, reason)),
            Resolved::Fail(reason) => decided.push(NotSent::new(i, Outcome::Failed, reason)),
        }
    }
    // Whether a request of one no longer wanted may have left already (its message is
    // written): read for those only, the rare case.
    let ids: Vec<String> = unwanted.iter().map(|(i, _)| wellformed[*i].delivery.id()).collect();
    let written = records::deliveries_marked(conn, keys, p, &ids, S::BODY_FIELD).await?;
    for ((i, reason), written) in unwanted.into_iter().zip(written) {
        decided.push(NotSent::new(i, unwanted_outcome(written), reason));
    }
    Ok(send)
}

/// Marks that a request of `item` got no answer: the far end may have taken it. Marked
/// before it is put off, so an outcome given later does not say it was never sent.
pub(crate) async fn maybe_taken<S: ChannelSender>(
    sender: &S,
    conn: &mut Conn,
    p: u16,
    item: &Claimed,
) -> anyhow::Result<()> {
    let key = sender.ctx().store.keys.delivery(p, &item.delivery.id());
    scripts::note(conn, S::MAYBE_TAKEN_FIELD, &[(key, "1")]).await?;
    Ok(())
}

/// Puts `item` off to be asked again (not before `at_least_ms`, a `Retry-After`), or,
/// past the delivery deadline, settles it: `outcome_unknown` after a lost answer, else
/// `failed`, or `past_deadline` when the caller has an outcome for that (something of
/// it was taken).
pub(crate) async fn put_off<S: ChannelSender>(
    sender: &S,
    conn: &mut Conn,
    p: u16,
    item: &Claimed,
    at_least_ms: u64,
    past_deadline: Option<(Outcome, Reason)>,
) -> anyhow::Result<()> {
    let ctx = sender.ctx();
    let d = &ctx.config.delivery;
    let backoff = Backoff {
        base_ms: d.retry_base_ms.max(at_least_ms),
        max_ms: d.retry_max_ms.max(at_least_ms),
        deadline_ms: crate::model::ms(d.deadline()),
        jitter_percent: if at_least_ms > 0 { 0 } else { rand::random_range(0..=20) },
    };
    let group = &ctx.config.redis.group;
    let items = [(item.entry.as_str(), &item.delivery)];
    let deferred = scripts::defer(conn, &ctx.store.keys, p, group, &ctx.owner, backoff, &items).await?;
    match deferred.first() {
        Some(Deferred::Expired) => {
            let (outcome, reason) = match past_deadline {
                Some(given) => given,
                None => {
                    let id = [item.delivery.id()];
                    let maybe = records::deliveries_marked(conn, &ctx.store.keys, p, &id, S::MAYBE_TAKEN_FIELD).await?;
                    (fails(maybe[0]), S::UNAVAILABLE)
                }
            };
            let decision = Decision { entry: &item.entry, delivery: &item.delivery, outcome, reason, lost: false };
            read::decide(ctx, conn, p, &[decision]).await
        }
        Some(Deferred::For(ms)) => {
            tracing::debug!(partition = p, channel = S::CHANNEL.as_str(), delay_ms = ms, "delivery put off");
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_after_is_read_in_seconds_and_capped_at_an_hour() {
        let with = |v: &str| {
            let mut h = reqwest::header::HeaderMap::new();
            h.insert("retry-after", v.parse().unwrap());
            retry_after_ms(&h)
        };
        assert_eq!(with("4"), Some(4000));
        assert_eq!(with(" 30 "), Some(30_000));
        assert_eq!(with("108000"), Some(MAX_RETRY_AFTER_SECONDS * 1000));
        assert_eq!(with("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(with("-1"), None);
        assert_eq!(retry_after_ms(&reqwest::header::HeaderMap::new()), None);
    }
}
