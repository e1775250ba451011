//! Dispatch: turns request slots into requests. It waits for work, asks the
//! limiter when the next slot is, takes a batch's worth from the batcher just
//! before it and hands it to a task that seals it, passes the last gate ahead of
//! the slot, and takes the slot (team-wide, in Redis by default) immediately
//! before it writes the request. Up to [`PREPARED_AHEAD`] batches are being
//! prepared at once, each aimed at a slot of its own: at a high rate a batch's
//! seal and gate (fsynced round trips) take longer than the time between two
//! slots, and the next batch must not wait for them. A batch is no longer
//! counted once its slot is taken, or once its gate is late (one partition's
//! trouble holds no other partition's slot).
//! It bounds the requests in flight, keeps the leases of what this instance
//! holds alive (the heartbeat), hands work back to Redis when sending pauses or
//! the daemon stops, holds it while the provider is down (but for the team's one
//! probe), and lets requests on the wire finish within a deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use crate::metrics::Metrics;
use crate::model::work::{DeliveryRef, Sealed, Work};
use crate::send::ctx::Ctx;
use crate::send::gate::{self, Gated};
use crate::send::limiter::Limiter;
use crate::send::queue::Batcher;
use crate::send::request::{PacingNews, Sender};
use crate::send::{release, seal, settle};
use crate::store::scripts;

/// Tells the dispatcher a batch was gated.
type Signal = tokio::sync::oneshot::Sender<()>;

/// A batch aimed at a slot it has not taken yet. It counts among the batches whose
/// slots lie ahead of the next one's until the limiter grants its slot (uncounted in the
/// same step, under the dispatcher's `book`) or it gives the slot up; dropped, it tells
/// the dispatcher. Counted until the dispatcher heard (a task's hop later, on a busy
/// machine milliseconds), a batch aimed just after the limiter granted another's slot
/// counted that slot twice, aimed an interval too late, missed its cadence by more than
/// the limiter's slack and restarted it: every batch then took two intervals (0.55 to 0.9
/// of the ceiling at 10 requests/s, in about half the runs). Uncounted as soon as it went
/// to take its slot, several batches waited at the limiter at once and the first to poll
/// won: a receipt's batch waited behind digest batches for over a second.
struct Aimed {
    _taken: Signal,
    mark: Arc<Mark>,
}

/// Whether an aimed batch still counts: shared by its task and the watch on its gate.
struct Mark {
    counted: AtomicBool,
    /// Its slot was granted, or its giving back counted: nothing more is counted.
    done: AtomicBool,
    aiming: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl Mark {
    /// No longer ahead of the next batch's slot (granted, late, or given up).
    fn uncount(&self) {
        if self.counted.swap(false, Ordering::SeqCst) {
            self.aiming.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// It will use no slot, for `reason` (counted once, unless a slot was granted).
    fn give_back(&self, reason: &'static str) {
        self.uncount();
        if !self.done.swap(true, Ordering::SeqCst) {
            self.metrics.slot_given_back(reason);
        }
    }
}

impl Aimed {
    fn new(taken: Signal, aiming: &Arc<AtomicUsize>, metrics: &Arc<Metrics>) -> Aimed {
        aiming.fetch_add(1, Ordering::SeqCst);
        let mark = Mark {
            counted: AtomicBool::new(true),
            done: AtomicBool::new(false),
            aiming: aiming.clone(),
            metrics: metrics.clone(),
        };
        Aimed { _taken: taken, mark: Arc::new(mark) }
    }

    /// Its slot is granted: no longer ahead of the next batch's.
    fn granted(&mut self) {
        self.mark.done.store(true, Ordering::SeqCst);
        self.mark.uncount();
    }

    /// Its slot goes unused, for `reason`.
    fn give_back(self, reason: &'static str) {
        self.mark.give_back(reason);
    }
}

impl Drop for Aimed {
    fn drop(&mut self) {
        self.mark.give_back("other");
    }
}

/// How long before its slot a batch is taken, sealed and passed through the last
/// gate: two Redis round trips (each fsynced with `appendfsync always`), done
/// ahead so the request itself leaves right at the slot and the gate's latency
/// never stretches the pacing.
const SEAL_LEAD: Duration = Duration::from_millis(25);

/// How many batches may be between being taken from the batcher and taking their
/// slots at once. At 10 requests/s one is enough (a batch is sealed and gated within a
/// few milliseconds, well inside the 100 ms between slots); at 100 or more, under the
/// load those requests bring, sealing and gating one batch takes longer than a slot's
/// interval. The batcher still lets one batch of a partition at its gate at a time, so
/// the partitions bound this too.
const PREPARED_AHEAD: usize = 4;

/// How long after its slot a batch may still be sealing and passing its gate before
/// the next batch is prepared without it: its partition's Redis is slow (a `WAIT` no
/// replica answers holds up to a second), and the other partitions' slots go on.
const GATE_PATIENCE: Duration = Duration::from_millis(100);

/// A gate passed longer ago than this (the slot moved: a `retry-after`) is passed
/// again before the request leaves.
const GATE_FRESHNESS: Duration = Duration::from_millis(500);

/// How long a second look at the gate may take: a script and a `WAIT` of at most a
/// second, with room for a loaded machine. Longer, and the partition's Redis is taken
/// to be gone (the batch stays sealed, its partition held until the heartbeat reaches it).
const REGATE_PATIENCE: Duration = Duration::from_millis(2500);

/// How often a dispatcher holding work asks whether it may probe a provider that is
/// down (or whether it is back): well inside `probe_interval_seconds`.
const PROBE_POLL: Duration = Duration::from_millis(250);

/// A slot further away than this (a long `retry-after`) is not waited for holding
/// a batch: it is put back in Redis, due then, for whoever is free.
const SLOT_PATIENCE: Duration = Duration::from_secs(30);

/// The sending side of a daemon: queues in, paced requests out.
pub(crate) struct Dispatcher {
    limiter: Limiter,
    batcher: Arc<Batcher>,
    sender: Sender,
    gates: gate::GateConns,
    /// Held over a look at the next slot with the count of batches aimed ahead of it,
    /// and over each grant with its uncounting, so a look never sees a slot granted but
    /// its batch still counted.
    book: tokio::sync::Mutex<()>,
    /// How long requests on the wire may take to finish at shutdown.
    drain: Duration,
    /// Whether the provider's `ratelimit-limit` has been logged (once a process).
    limit_told: std::sync::atomic::AtomicBool,
}

impl Dispatcher {
    pub fn new(ctx: &Ctx, batcher: Arc<Batcher>, sender: Sender) -> Dispatcher {
        let limiter = Limiter::from_config(&ctx.config, &ctx.store).counted_as(&ctx.owner, &ctx.metrics);
        let gates = gate::GateConns::new(&ctx.config);
        Dispatcher {
            limiter,
            batcher,
            sender,
            gates,
            book: tokio::sync::Mutex::new(()),
            drain: Duration::from_secs(ctx.config.resend.timeout_seconds + 5),
            limit_told: Default::default(),
        }
    }

    /// Grants request slots to work until shutdown, then hands back what is queued and
    /// lets in-flight requests finish within the drain time; what does not finish
    /// stays sealed for recovery.
    pub async fn run(self: Arc<Self>, ctx: Arc<Ctx>) {
        // In a JoinSet, so the heartbeat dies with this task if it is aborted: a heartbeat
        // outliving its holder would keep a dead instance's leases alive.
        let mut heartbeat = JoinSet::new();
        heartbeat.spawn(keep_alive(ctx.clone(), self.clone()));
        let (me, beat) = (self.clone(), ctx.config.heartbeat());
        // The limiter's hellos, on their own: a heartbeat step waits on the slowest node.
        heartbeat.spawn(async move {
            loop {
                let next = me.limiter.hello(beat).await;
                tokio::time::sleep(next).await;
            }
        });
        let mut shutdown = ctx.shutdown.clone();
        let in_flight = Arc::new(Semaphore::new(ctx.config.resend.max_in_flight));
        let preparing = Arc::new(Semaphore::new(PREPARED_AHEAD));
        let aiming = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                _ = shutdown.wait() => break,
                p = in_flight.clone().acquire_owned() => p.expect("never closed"),
            };
            let prepared = tokio::select! {
                _ = shutdown.wait() => break,
                p = preparing.clone().acquire_owned() => p.expect("never closed"),
            };
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = self.batcher.wait_for_work() => {}
            }
            if ctx.pause.is_paused() {
                // Nothing rendered waits in memory across a pause.
                hand_back_all(&ctx, &self.batcher).await;
                shutdown.sleep(Duration::from_secs(1)).await;
                continue;
            }
            if !self.may_send(&ctx).await {
                // The provider is down and another request probes it: what is queued waits
                // here, leases renewed, to go the moment it is back.
                shutdown.sleep(PROBE_POLL).await;
                continue;
            }
            let asked = Instant::now();
            // The batches still being prepared take the slots before this one's.
            let (next, ahead) = {
                let _booked = self.book.lock().await;
                (self.limiter.next_slot().await, aiming.load(Ordering::SeqCst))
            };
            let slot = next + self.limiter.interval() * ahead as u32;
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = tokio::time::sleep_until(slot.checked_sub(SEAL_LEAD).unwrap_or(slot)) => {}
            }
            let Some(work) = self.batcher.take() else { continue };
            // The task seals the batch, passes its last gate and takes the slot right before
            // it writes; it counts as being prepared until its slot is taken (or given up).
            // Its partition's Redis holds nobody else's slot: a gate not passed soon after
            // the slot (a WAIT no replica answers) no longer holds the next batches back.
            let (gated_tx, gated_rx) = tokio::sync::oneshot::channel::<()>();
            let (taken_tx, taken_rx) = tokio::sync::oneshot::channel::<()>();
            let taken_tx = Aimed::new(taken_tx, &aiming, &ctx.metrics);
            let mark = taken_tx.mark.clone();
            let (me, ctx) = (self.clone(), ctx.clone());
            tasks.spawn(async move {
                let counted = async move {
                    if tokio::time::timeout_at(slot + GATE_PATIENCE, gated_rx).await.is_ok() {
                        let _ = taken_rx.await;
                    } else {
                        // Its slot passes without it: the next batches are aimed without it
                        // (it takes a later one if its gate passes).
                        mark.uncount();
                    }
                    drop(prepared);
                };
                tokio::join!(me.prepare_and_send(&ctx, work, asked, (gated_tx, taken_tx)), counted);
                drop(permit);
            });
        }
        // Stop: nothing more is queued, and what is queued goes back to Redis at once.
        self.batcher.close();
        hand_back_all(&ctx, &self.batcher).await;
        let deadline = Instant::now() + self.drain;
        while !tasks.is_empty() {
            if tokio::time::timeout_at(deadline, tasks.join_next()).await.is_err() {
                tracing::warn!(
                    requests = tasks.len(),
                    "drain deadline passed; unfinished batches stay sealed for recovery"
                );
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
        }
        heartbeat.shutdown().await;
    }

    /// Whether a request may go now: always while the provider is up; while it is down,
    /// only as the team's one probe of the interval.
    async fn may_send(&self, ctx: &Ctx) -> bool {
        if !ctx.health.is_down() {
            return true;
        }
        let may = ctx.health.may_probe(&ctx.store).await;
        ctx.metrics.set_provider_down(ctx.health.is_down());
        may.unwrap_or_else(|e| {
            ctx.metrics.redis_error("health", &e);
            false
        })
    }

    /// Seals `work` (unless it is a sealed resend), passes its last gate, then takes its
    /// slot and sends it; the dispatcher is told once it is gated and once its slot is
    /// taken (a signal dropped unsent says it went no further).
    async fn prepare_and_send(&self, ctx: &Ctx, work: Work, asked: Instant, (gated, taken): (Signal, Aimed)) {
        let (p, sealed) = match work {
            Work::Resend(sealed) => (sealed.partition, Ok(Some(sealed))),
            Work::Fresh(p, items) => (p, seal::seal(ctx, p, items).await),
        };
        let mut sealed = match sealed {
            Ok(Some(sealed)) => sealed,
            Ok(None) => {
                self.batcher.gate_done(p);
                taken.give_back("nothing_sealed");
                return;
            }
            Err(_) => {
                self.unreached(p);
                self.batcher.gate_done(p);
                taken.give_back("partition_unreached");
                return;
            }
        };
        // In hand (whatever its gate leaves of it) until it is sent or given up: its lease
        // is renewed, and the reclaimer leaves it alone.
        let held = self.batcher.hold(&sealed.id, p);
        let span = sealed.span();
        let fallback = async {
            // Stopping: back to Redis unsent, before its gate makes it look maybe sent.
            if ctx.shutdown.is_triggered() {
                settle::put_back(ctx, &sealed, Duration::ZERO).await;
                self.batcher.gate_done(p);
                taken.give_back("stopping");
                return None;
            }
            let passed = self.through_gate(ctx, &mut sealed, None).await;
            // The partition's next batch may go to its gate (a hold that began stays).
            self.batcher.gate_done(p);
            if let Err(reason) = passed {
                taken.give_back(reason);
                return None;
            }
            let _ = gated.send(());
            self.send(ctx, sealed, Instant::now(), asked, taken).await
        }
        .instrument(span.clone())
        .await;
        // Sealed again from its fallback sender: the next resend, in hand again once this
        // task's hold has ended (the hold is by batch id), lease fresh from fallback.lua.
        drop(held);
        if let Some(again) = fallback
            && let Err(again) = self.batcher.push_resend(again)
        {
            settle::put_back(ctx, &again, Duration::ZERO).instrument(span).await;
        }
    }

    /// Runs the last gate; `Ok` when the request may leave, else why not. A batch its
    /// replicas did not acknowledge goes back to Redis, and its partition waits until the
    /// heartbeat's probe finds them acknowledging, while the others keep the pace; a
    /// partition whose Redis did not answer (within `patience`, when given) waits until the
    /// heartbeat reaches it.
    async fn through_gate(
        &self,
        ctx: &Ctx,
        sealed: &mut Sealed,
        patience: Option<Duration>,
    ) -> Result<(), &'static str> {
        let p = sealed.partition;
        match gate::pass(ctx, &self.gates, sealed, patience).await {
            Gated::Go => {
                if self.batcher.replicas_acknowledged(p) {
                    tracing::info!(partition = p, "replicas acknowledge again; the partition's batches go");
                }
                Ok(())
            }
            Gated::Stop => Err("gate_refused"),
            Gated::Unreached => {
                self.unreached(p);
                Err("partition_unreached")
            }
            Gated::Unreplicated => {
                let (backoff, began) = self.batcher.replicas_failed(p);
                ctx.metrics.unreplicated(p);
                if began {
                    tracing::warn!(
                        partition = p,
                        "replicas did not acknowledge the batch; the partition's batches wait until the heartbeat \
                         finds them acknowledging, and the other partitions keep the pace"
                    );
                }
                settle::put_back(ctx, sealed, backoff).await;
                Err("unreplicated")
            }
        }
    }

    /// Partition `p`'s Redis did not answer: none of its work is aimed at a slot until the
    /// heartbeat reaches it again.
    fn unreached(&self, p: u16) {
        if self.batcher.reachable(p, false) {
            tracing::warn!(
                partition = p,
                "the partition's Redis did not answer; its work waits until the heartbeat reaches it, and the \
                 other partitions keep the pace"
            );
        }
    }

    /// Takes the slot for a gated batch and sends it; `taken` is told once the slot is
    /// taken or given up. Returns the batch sealed again from its fallback sender, if the
    /// provider refused its sender and it fell back.
    async fn send(
        &self,
        ctx: &Ctx,
        mut sealed: Sealed,
        gated: Instant,
        asked: Instant,
        mut taken: Aimed,
    ) -> Option<Sealed> {
        let mut shutdown = ctx.shutdown.clone();
        let slot = match self.limiter.take(SLOT_PATIENCE, &mut shutdown, &self.book, || taken.granted()).await {
            Ok(slot) => slot,
            Err(delay) => {
                // Unsent, back to Redis: due when the slot is (at once when stopping).
                taken.give_back(if delay.is_zero() { "stopping" } else { "slot_too_far" });
                settle::put_back(ctx, &sealed, delay).await;
                return None;
            }
        };
        drop(taken);
        // Its partition's Redis stopped answering while it waited (its primary died): the
        // slot goes to a batch that can go (taken back when this instance paces alone), as
        // when the second look below goes unanswered, without waiting for that.
        if self.batcher.unreached(sealed.partition) {
            self.limiter.unused(slot);
            return None;
        }
        // The slot moved while the batch waited: look again right before it leaves. A look
        // its partition's Redis does not answer in time (its primary died while the batch
        // waited) gives the slot up, as the first gate's error does, without holding it
        // (nor an instance pacing alone) for the client's response timeout.
        if gated.elapsed() > GATE_FRESHNESS && self.through_gate(ctx, &mut sealed, Some(REGATE_PATIENCE)).await.is_err()
        {
            self.limiter.unused(slot);
            return None;
        }
        ctx.metrics.limiter_waited(asked.elapsed());
        // The departure is recorded once the request's bytes can go out on a ready
        // connection (a new one's set-up never shortens the spacing at the provider), or
        // once the attempt ended without that. A request that was the first on its
        // connection may have waited at the far end too: its departure is recorded again
        // when its answer comes, an upper bound of its arrival.
        let (on_wire, wired) = tokio::sync::oneshot::channel();
        let departed = async {
            let _ = wired.await;
            self.limiter.departed(slot).await;
        };
        let ((news, fallback), ()) = tokio::join!(self.sender.attempt(ctx, sealed, on_wire), departed);
        self.limiter.ended(slot, news.late_arrival).await;
        self.obey(&news).await;
        fallback
    }

    /// Applies what the provider said about pacing, team-wide.
    async fn obey(&self, news: &PacingNews) {
        if let Some(limit) = news.rate.limit
            && !self.limit_told.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            // The team's real limit, once: what a raised (or not raised) account says.
            tracing::info!(
                ratelimit_limit = limit,
                configured = self.limiter.configured(),
                "the provider's rate limit, first seen"
            );
        }
        if let Some(after) = news.pause {
            self.limiter.pause_for(after).await;
        }
        if let Some(rps) = self.limiter.observe(&news.rate).await {
            tracing::warn!(requests_per_second = rps, "provider declares a lower rate limit; pacing lowered team-wide");
        }
    }
}

/// Hands everything queued back to Redis: claimed emails become pending again (any
/// instance reads them at once), queued resends are put back unsent.
async fn hand_back_all(ctx: &Ctx, batcher: &Batcher) {
    let drained = batcher.drain();
    for (p, items) in &drained.fresh {
        release::hand_back(ctx, *p, items).await;
    }
    for sealed in &drained.resend {
        settle::put_back(ctx, sealed, Duration::ZERO).instrument(sealed.span()).await;
    }
}

/// The heartbeat: every `config.heartbeat()`, rereads the shared pause and the
/// provider's health and renews the leases of everything this instance holds (claimed
/// emails in the queues, batches in hand), in Redis time. A task of its own, so no slow
/// step elsewhere stops it; and each of its steps runs on its own, bounded by the beat,
/// so a node that does not answer (a primary that died, until its replica is
/// promoted) delays no other partition's renewal.
async fn keep_alive(ctx: Arc<Ctx>, dispatcher: Arc<Dispatcher>) {
    let beat = ctx.config.heartbeat();
    loop {
        let mut steps = JoinSet::new();
        let c = ctx.clone();
        steps.spawn(async move {
            match c.pause.refresh(&c.store).await {
                Ok(()) => c.metrics.set_paused(c.pause.is_paused()),
                Err(e) => c.metrics.redis_error("pause", &e),
            }
        });
        let c = ctx.clone();
        steps.spawn(async move {
            match c.health.refresh(&c.store).await {
                Ok(()) => c.metrics.set_provider_down(c.health.is_down()),
                Err(e) => c.metrics.redis_error("health", &e),
            }
        });
        for p in 0..ctx.store.keys.partitions() {
            steps.spawn(renew(ctx.clone(), dispatcher.clone(), p));
        }
        if tokio::time::timeout(beat, async { while steps.join_next().await.is_some() {} }).await.is_err() {
            let late = anyhow::anyhow!("{} heartbeat calls not answered within {beat:?}", steps.len());
            ctx.metrics.redis_error("heartbeat", &late);
        }
        // Dropping the steps that did not finish abandons them.
        drop(steps);
        tokio::time::sleep(beat).await;
    }
}

/// Renews the leases of what this instance holds in partition `p`, and says whether
/// the partition is held for replicas that did not acknowledge; a partition whose Redis
/// did not answer is opened again once this reaches it.
async fn renew(ctx: Arc<Ctx>, dispatcher: Arc<Dispatcher>, p: u16) {
    ctx.metrics.set_unreplicated(p, dispatcher.batcher.unreplicated(p));
    let lease_ms = crate::model::ms(ctx.config.lease());
    let claimed: Vec<DeliveryRef> = dispatcher.batcher.claimed(p);
    let batches: Vec<String> = dispatcher.batcher.in_hand(p);
    let unreached = dispatcher.batcher.unreached(p);
    let result = async {
        // A connection that says at once that a primary died (rather than after the
        // heartbeat's patience), so its partition's waiting batches leave no slot unused.
        let mut conn = ctx.store.brief().await?;
        if unreached && claimed.is_empty() && batches.is_empty() {
            // Nothing to renew: asked only whether the partition's Redis answers.
            return ctx.store.reach(&mut conn, p).await;
        }
        let claimed: Vec<&DeliveryRef> = claimed.iter().collect();
        let batches: Vec<&str> = batches.iter().map(String::as_str).collect();
        scripts::renew(&mut conn, &ctx.store.keys, p, &ctx.owner, lease_ms, &claimed, &batches).await?;
        anyhow::Ok(())
    };
    let result = tokio::time::timeout(ctx.config.heartbeat() * 9 / 10, result)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("partition {p}'s Redis did not answer within a heartbeat")));
    match result {
        Ok(()) => {
            if dispatcher.batcher.reachable(p, true) {
                tracing::info!(partition = p, "the partition's Redis answers again; its work goes");
            }
            if dispatcher.batcher.unreplicated(p) {
                probe_replicas(&ctx, &dispatcher, p).await;
            }
        }
        Err(e) => {
            ctx.metrics.redis_error("renew", &e);
            dispatcher.unreached(p);
        }
    }
}

/// A partition held for replicas that did not acknowledge: a write and `WAIT` (within half
/// a heartbeat) say whether they do again; then its work goes. No batch is aimed at a
/// request slot to find out.
async fn probe_replicas(ctx: &Ctx, dispatcher: &Dispatcher, p: u16) {
    match gate::probe_replicas(ctx, &dispatcher.gates, p).await {
        Ok(true) => {
            if dispatcher.batcher.replicas_acknowledged(p) {
                tracing::info!(partition = p, "replicas acknowledge again; the partition's batches go");
            }
        }
        Ok(false) => {}
        Err(e) => ctx.metrics.redis_error("replicas", &e),
    }
}
