//! Conformance: seeded random walks of the model, each step executed for real against a
//! `redis-server` with the real Lua scripts. The send path's steps run the daemon's own
//! code (`mailstream::send::steps`: seal.rs, gate.rs, request.rs with its fallback and
//! settlement, the reclaimer's take), one holder each, against a provider stand-in on
//! loopback (`provider.rs`) that answers as the model chose; claiming, the channels and
//! the operators' acts call the typed scripts as their code does (`scripts::claim`,
//! `decide`, `defer`, `subscribers::upsert`, `suppression::apply`, the quota pause).
//! After every step Redis is read back, projected onto the model's state, and must equal
//! it; and what each holder's send path holds next (its batch, key, members, and whether
//! a request of it may have been processed: what its next step goes from) must equal the
//! model's hand, so a script's reply and what the Rust makes of it are checked too.
//!
//! The walk plays time the least intrusive way: the scripts compare times they stored
//! with Redis `TIME`, so a lease that runs out is a stored `lease_until` moved into the
//! past, a batch that is due is its score in `batches` moved there, and a key past its
//! resend window is its batch's `sealed_ms` moved there. The production scripts are run
//! unchanged. `WAIT`, failovers and lost writes need more than one server: they stay
//! model-only here (an acknowledged `WAIT` is the model's read-back, applied to the
//! holder's memory). The projection reads only what the model holds: counts, `sends` and
//! the delivery log's `recent` index are written by the scripts as in production and left
//! unread; a delivery settled sent or skipped is read from its period's settled history,
//! where the scripts keep it instead of its record (its entry's request count, left out
//! when 1, is checked against what each settling script writes).

use std::collections::BTreeMap;

use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::audience::suppression::{self, Act};
use mailstream::config::{Config, Secret};
use mailstream::model::outcome::Why;
use mailstream::model::outcome::{Outcome, Reason};
use mailstream::model::work::Sealed;
use mailstream::model::work::{Channel, DeliveryRef, Lane as WorkLane, Ready};
use mailstream::send::steps::{Gated, Steps};
use mailstream::store::Store;
use mailstream::store::records::{self, SubscriberRead};
use mailstream::store::redis_server::RedisServer;
use mailstream::store::scripts::{self, Claim, Decision};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use stateright::Model;

use crate::protocol::Outcome as Provides;
use crate::protocol::{Action, Answer, AppAnswer, Batch, BatchState, Data, Lane, Phase, Protocol, Rec, State};
use crate::provider::{Provider, Reply};

const GROUP: &str = "mailstream";
const LEASE_MS: u64 = 3_600_000;
const RETENTION: u64 = 3600;
const CAMPAIGN: &str = "weekly_digest";

/// How the walk names the model's things in Redis.
struct Names {
    /// Per model delivery: its reference, subscriber (digest) and address.
    deliveries: Vec<DeliveryRef>,
    subscribers: Vec<Option<Subscriber>>,
    addresses: Vec<String>,
    /// Per model address: its hash.
    hashes: Vec<String>,
}

fn owner(h: u8) -> String {
    format!("holder-{}", (b'A' + h) as char)
}

/// A member's email object, as sealed, from `from`.
fn email(from: &str, to: &str) -> String {
    format!(r#"{{"from":"{from}","to":["{to}"],"subject":"s","text":"t"}}"#)
}

/// A mismatch between the model and the code after a step: what Redis holds, or what
/// the daemon's step did (and so will do next).
pub struct Mismatch {
    pub seed: u64,
    pub steps: Vec<String>,
    pub partition: usize,
    pub model: String,
    pub code: String,
}

/// The holder whose send path `action` is a step of.
fn holder_of(action: Action) -> usize {
    match action {
        Action::Seal(h, _) | Action::Gate(h) | Action::Record(h) | Action::Take(h, ..) => usize::from(h),
        _ => 0,
    }
}

/// Walks run against one private `redis-server`, each on a fresh database.
pub struct Walker {
    _server: RedisServer,
    store: Store,
    config: Config,
    model: Protocol,
    names: Names,
    /// The kick window of the walk's period (open: the walk kicks it at any step).
    window: scripts::KickWindow,
    /// Per delivery, the first event body this walk saw in its record: one that differs
    /// later is projected as a second body.
    first_body: std::sync::Mutex<Vec<Option<String>>>,
    /// Each holder's send path: the daemon's own code, one step at a time.
    steps: Vec<Steps>,
    /// Where their requests go.
    provider: Provider,
    /// What each holder's send path holds: the batch it sealed, gated or took (its own
    /// memory, from which its next step goes, never rebuilt from the model's).
    hands: std::sync::Mutex<[Option<Sealed>; 2]>,
    /// The provider's answer the model chose for a holder's request, until it is sent.
    outcomes: std::sync::Mutex<[Option<Provides>; 2]>,
    /// The model's names of the batches and keys the code made this walk.
    batches: std::sync::Mutex<Known>,
}

/// Batch ids and Idempotency-Keys as the code drew them, by the model's names for them.
#[derive(Default)]
struct Known {
    /// Batch id → the model's batch.
    ids: BTreeMap<String, u8>,
    /// Key → the model's (batch, version).
    keys: BTreeMap<String, (u8, u8)>,
}

/// How long a holder's request waits for an answer (a `Hang` costs this much).
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(300);

impl Walker {
    pub async fn start(model: Protocol) -> anyhow::Result<Walker> {
        let server = RedisServer::start(Default::default()).await?;
        let mut config = Config::example();
        config.redis.url = Secret::new(server.url());
        config.redis.partitions = u16::from(model.partitions);
        config.redis.durability = mailstream::config::Durability::Relaxed;
        config.delivery.retention_days = 35;
        // Leases run out when the walk says so (a stored expiry moved into the past).
        config.delivery.lease_seconds = LEASE_MS / 1000;
        let provider = Provider::start().await?;
        config.resend.base_url = provider.url.clone();
        config.resend.api_key = Some(Secret::new("re_walk"));
        let store = Store::connect(&config).await?;
        // The current week (Redis's clock): its kick window, the retention from its start, is open.
        let campaign = config.campaign(CAMPAIGN).expect("the example campaign").clone();
        let period = mailstream::audience::kick::period_for(&store, &campaign, None, Default::default()).await?;
        let window = mailstream::audience::kick::window_of(&campaign, &period, config.retention().as_secs())?;
        let keys = &store.keys;
        // Subscribers and idempotency keys chosen to land in the model's partitions.
        let mut names =
            Names { deliveries: Vec::new(), subscribers: Vec::new(), addresses: Vec::new(), hashes: Vec::new() };
        let mut next = 0u32;
        let mut find = |partition: u8, prefix: &str| loop {
            next += 1;
            let id = format!("{prefix}{next}");
            if keys.partition_of(&id) == u16::from(partition) {
                return id;
            }
        };
        let mut addresses: BTreeMap<u8, String> = BTreeMap::new();
        for spec in &model.deliveries {
            let address = format!("delivered+a{}@resend.dev", spec.address);
            addresses.insert(spec.address, address.clone());
            match spec.lane {
                Lane::Digest | Lane::App | Lane::Push => {
                    let id = find(spec.partition, "user-");
                    // Its registry address is the one its email goes to, or another (the
                    // render hook's address is then the one in the body).
                    let email = if spec.registry { address.clone() } else { format!("delivered+{id}@resend.dev") };
                    let subscriber = Subscriber { email, ..Subscriber::synthetic(0) };
                    let subscriber = Subscriber { id: id.clone(), targets: vec!["t".into()], ..subscriber };
                    let channel = match spec.lane {
                        Lane::App => Channel::App,
                        Lane::Push => Channel::Push,
                        _ => Channel::Email,
                    };
                    names.deliveries.push(DeliveryRef::new(CAMPAIGN, &period, &id, "t").on(channel));
                    names.subscribers.push(Some(subscriber));
                }
                Lane::Transactional => {
                    if spec.operator {
                        // Operator mail goes to `[operators] to`: its template may fall back.
                        config.operators.to.push(address.clone());
                    }
                    let key = find(spec.partition, "rx-");
                    names.deliveries.push(DeliveryRef::new(
                        mailstream::model::work::TRANSACTIONAL,
                        "2026-12-01",
                        "-",
                        &key,
                    ));
                    names.subscribers.push(None);
                }
            }
            names.addresses.push(address);
        }
        let max = addresses.keys().max().copied().unwrap_or(0);
        names.hashes = (0..=max).map(|a| addresses.get(&a).map(|e| keys.address(e).hash).unwrap_or_default()).collect();
        let first_body = std::sync::Mutex::new(vec![None; model.deliveries.len()]);
        let steps = (0..2u8)
            .map(|h| Steps::new(config.clone(), store.clone(), &owner(h), REQUEST_TIMEOUT))
            .collect::<anyhow::Result<_>>()?;
        Ok(Walker {
            _server: server,
            store,
            config,
            model,
            names,
            window,
            first_body,
            steps,
            provider,
            hands: Default::default(),
            outcomes: Default::default(),
            batches: Default::default(),
        })
    }

    /// One walk of at most `length` steps from `seed`; the steps taken, or the mismatch.
    pub async fn walk(&self, seed: u64, length: usize) -> anyhow::Result<Result<usize, Mismatch>> {
        let mut conn = self.store.conn().await?;
        let _: () = redis::cmd("FLUSHDB").query_async(&mut conn).await?;
        self.store.ensure_groups(GROUP).await?;
        let registry: Vec<Subscriber> = self.names.subscribers.iter().flatten().cloned().collect();
        subscribers::upsert(&self.store, &registry).await?;
        // Each Web Push delivery's subscriber has its browsers (`b<n>`, the model's bits).
        for (d, spec) in self.model.deliveries.iter().enumerate().filter(|(_, s)| s.lane == Lane::Push) {
            let subscriber = &self.names.deliveries[d].subscriber;
            let key = self.store.keys.push_subscriptions(u16::from(spec.partition), subscriber);
            for b in (0..8u8).filter(|&b| crate::protocol::BROWSERS & (1 << b) != 0) {
                let _: () = redis::cmd("HSET").arg(&key).arg(format!("b{b}")).arg("{}").query_async(&mut conn).await?;
            }
        }
        self.first_body.lock().expect("first bodies").iter_mut().for_each(|b| *b = None);
        *self.hands.lock().expect("the hands") = Default::default();
        *self.outcomes.lock().expect("the outcomes") = Default::default();
        *self.batches.lock().expect("the batches") = Known::default();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut state = self.model.init_states().into_iter().next().expect("an initial state");
        let mut steps = Vec::new();
        for _ in 0..length {
            let mut actions = Vec::new();
            self.model.actions(&state, &mut actions);
            // What one server can do: no lag, failover or WAIT refusal.
            actions.retain(|a| !matches!(a, Action::Lag(_) | Action::Failover(_) | Action::Wait(_, false)));
            let Some(&action) = actions.choose(&mut rng) else { break };
            steps.push(self.model.format_action(&action));
            let next = self.model.next_state(&state, action).expect("a next state");
            if let Some(code) = self.execute(&mut conn, &state, &next, action).await? {
                let hand = &next.holders[holder_of(action)].hand;
                let partition = hand.as_ref().map_or(0, |x| usize::from(x.partition));
                let model = format!("the holder's hand next: {hand:?}");
                return Ok(Err(Mismatch { seed, steps, partition, model, code }));
            }
            state = next;
            for p in 0..usize::from(self.model.partitions) {
                let redis = self.project(&mut conn, p as u16).await?;
                let model = &state.nodes[p].live;
                if redis != *model {
                    if std::env::var("WALK_DEBUG").is_ok() {
                        for lane in WorkLane::ALL {
                            let stream = self.store.keys.lane_stream(p as u16, lane);
                            let r: redis::Value =
                                redis::cmd("XRANGE").arg(&stream).arg("-").arg("+").query_async(&mut conn).await?;
                            let x: redis::Value = redis::cmd("XPENDING")
                                .arg(&stream)
                                .arg(GROUP)
                                .arg("-")
                                .arg("+")
                                .arg(100)
                                .query_async(&mut conn)
                                .await?;
                            let g: redis::Value =
                                redis::cmd("XINFO").arg("GROUPS").arg(&stream).query_async(&mut conn).await?;
                            eprintln!("{stream}: {r:?}\n  pending {x:?}\n  groups {g:?}");
                        }
                    }
                    return Ok(Err(Mismatch {
                        seed,
                        steps,
                        partition: p,
                        model: format!("{model:?}"),
                        code: format!("{redis:?}"),
                    }));
                }
            }
        }
        Ok(Ok(steps.len()))
    }

    fn refs(&self, body: &[(u8, u8)]) -> Vec<DeliveryRef> {
        body.iter().map(|&(d, _)| self.names.deliveries[usize::from(d)].clone()).collect()
    }

    /// The batch holder `h`'s send path holds (the model says it holds one).
    fn hand(&self, h: u8) -> anyhow::Result<Sealed> {
        let taken = self.hands.lock().expect("the hands")[usize::from(h)].take();
        taken.ok_or_else(|| anyhow::anyhow!("holder {h}'s send path holds no batch where the model's holder does"))
    }

    /// Keeps `b` as what holder `h`'s send path holds next, and says how it differs from
    /// the model's hand in `next`: the same batch, key, members and knowledge of an
    /// earlier request, or nothing held on both sides.
    fn holds(&self, h: u8, b: Option<Sealed>, next: &State) -> Option<String> {
        let model = next.holders[usize::from(h)].hand.as_ref();
        let differs = match (&b, model) {
            (None, None) => None,
            (Some(b), Some(hand)) => {
                let known = self.batches.lock().expect("the batches");
                let same = known.ids.get(&b.id) == Some(&hand.batch)
                    && known.keys.get(&b.key) == Some(&(hand.batch, hand.version))
                    && b.partition == u16::from(hand.partition)
                    && b.members == self.refs(&hand.body)
                    && b.maybe_sent == hand.maybe_sent;
                (!same).then(|| format!("the daemon holds {}", self.sealed(&known, b)))
            }
            (Some(b), None) => {
                let known = self.batches.lock().expect("the batches");
                Some(format!("the daemon holds {}", self.sealed(&known, b)))
            }
            (None, Some(_)) => Some("the daemon holds no batch".to_string()),
        };
        self.hands.lock().expect("the hands")[usize::from(h)] = b;
        differs
    }

    /// A key the code drew for the model's `hand` (a reseal, a fallback) is its version.
    fn new_key(&self, key: &str, hand: &crate::protocol::Hand) {
        let mut known = self.batches.lock().expect("the batches");
        known.keys.entry(key.to_string()).or_insert((hand.batch, hand.version));
    }

    /// `b` in the model's names.
    fn sealed(&self, known: &Known, b: &Sealed) -> String {
        let members: Vec<Option<usize>> =
            b.members.iter().map(|m| self.names.deliveries.iter().position(|d| d == m)).collect();
        format!(
            "batch {:?} key {:?} in partition {}, members {members:?}, maybe_sent {}",
            known.ids.get(&b.id),
            known.keys.get(&b.key),
            b.partition,
            b.maybe_sent
        )
    }

    /// The code's id of the model's batch `id` (one never made names nothing).
    fn batch_name(&self, id: u8) -> String {
        let known = self.batches.lock().expect("the batches");
        known.ids.iter().find(|&(_, &i)| i == id).map_or_else(|| format!("never-made-{id}"), |(name, _)| name.clone())
    }

    /// The code's key for the model's `version` of batch `id`.
    fn key_name(&self, id: u8, version: u8) -> Option<String> {
        let known = self.batches.lock().expect("the batches");
        known.keys.iter().find(|&(_, &k)| k == (id, version)).map(|(key, _)| key.clone())
    }

    /// Runs `action` against Redis as the daemon would, from the model's state before it
    /// (`s`); `next` is the model's after it. `Some` says how the daemon's own step (seal,
    /// gate, request, take) did otherwise than the model: what it holds next, and so what
    /// it does next.
    async fn execute(
        &self,
        conn: &mut mailstream::store::Conn,
        s: &State,
        next: &State,
        action: Action,
    ) -> anyhow::Result<Option<String>> {
        let keys = &self.store.keys;
        match action {
            Action::Kick(d) => {
                let spec = self.model.deliveries[usize::from(d)];
                let dref = &self.names.deliveries[usize::from(d)];
                let p = u16::from(spec.partition);
                match spec.lane {
                    Lane::Digest | Lane::App | Lane::Push => {
                        let mut both = vec![dref.clone()];
                        both.extend(spec.sibling.map(|s| self.names.deliveries[usize::from(s)].clone()));
                        match scripts::enqueue(conn, keys, p, &both, RETENTION, self.window).await? {
                            scripts::Enqueued::Added(_) => {}
                            closed => anyhow::bail!("the walk's kick was refused: {closed:?}"),
                        }
                    }
                    Lane::Transactional => {
                        // Operator mail names its template (its fallback sender is looked up).
                        let to = &self.names.addresses[usize::from(d)];
                        let request = if spec.operator {
                            format!(r#"{{"to":"{to}","template":"new_lead"}}"#)
                        } else {
                            "{}".to_string()
                        };
                        let item = scripts::IngestItem {
                            delivery: dref,
                            hash: "h",
                            request: &request,
                            event: None,
                            attachments: None,
                        };
                        scripts::ingest(conn, keys, p, &[item], (RETENTION, u64::MAX)).await?;
                    }
                }
            }
            Action::Claim(h, p) => {
                // The reader's XREADGROUP: what was not read yet enters the pending list.
                for lane in WorkLane::ALL {
                    let _: redis::Value = redis::cmd("XREADGROUP")
                        .arg("GROUP")
                        .arg(GROUP)
                        .arg(owner(h))
                        .arg("COUNT")
                        .arg(100)
                        .arg("STREAMS")
                        .arg(keys.lane_stream(u16::from(p), lane))
                        .arg(">")
                        .query_async(conn)
                        .await?;
                }
                let claimable = self.model.claimable(s, h, p);
                let live = &s.nodes[usize::from(p)].live;
                let mut ids = Vec::new();
                for d in (0..self.model.deliveries.len() as u8).filter(|&d| claimable & (1 << d) != 0) {
                    let dref = &self.names.deliveries[usize::from(d)];
                    if let Rec::Processing(_) = live.recs[usize::from(d)] {
                        // Its holder stopped renewing it: the lease has run out.
                        let _: () = redis::cmd("HSET")
                            .arg(keys.delivery(u16::from(p), &dref.id()))
                            .arg("lease_until")
                            .arg(0)
                            .query_async(conn)
                            .await?;
                    }
                    ids.push(dref.id());
                }
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                let claims = scripts::claim(conn, keys, u16::from(p), &ids, &owner(h), LEASE_MS).await?;
                // Resolved as the consumer does: the subscriber record, or the address.
                let mut decisions = Vec::new();
                let claimed: Vec<(u8, &DeliveryRef)> = (0..self.model.deliveries.len() as u8)
                    .filter(|&d| claimable & (1 << d) != 0)
                    .map(|d| (d, &self.names.deliveries[usize::from(d)]))
                    .collect();
                for ((d, dref), claim) in claimed.iter().zip(claims) {
                    if !matches!(claim, Claim::Claimed { .. }) {
                        continue;
                    }
                    let lane = self.model.deliveries[usize::from(*d)].lane;
                    let skip = match lane {
                        Lane::Digest | Lane::App | Lane::Push => {
                            let opted_out = subscribers::field::channel_opted_out(CAMPAIGN, dref.channel);
                            let read = SubscriberRead { partition: u16::from(p), id: &dref.subscriber, opted_out };
                            let rows = records::subscriber_rows(conn, keys, &[read]).await?;
                            let row = rows.into_iter().next().expect("one row");
                            // The real resolve: the one rule, and the address rule (see
                            // `Data::unsubscribed` for why the model needs no state for it).
                            match subscribers::resolve(row) {
                                subscribers::Resolved::Skip(reason) => Some(reason),
                                _ => None,
                            }
                        }
                        Lane::Transactional => {
                            let hash = &self.names.hashes[usize::from(self.model.deliveries[usize::from(*d)].address)];
                            let suppressed: bool = redis::cmd("HEXISTS")
                                .arg(keys.suppressed(u16::from(p)))
                                .arg(hash)
                                .query_async(conn)
                                .await?;
                            suppressed.then_some(Reason::Suppressed)
                        }
                    };
                    // app.rs: an event no longer wanted whose body is written may have been
                    // taken; one still wanted gets its body fixed before any request.
                    let field = if lane == Lane::Push { mailstream::channels::push::BODY_FIELD } else { "app_body" };
                    let written: bool = redis::cmd("HEXISTS")
                        .arg(keys.delivery(u16::from(p), &dref.id()))
                        .arg(field)
                        .query_async(conn)
                        .await?;
                    match skip {
                        Some(reason) => {
                            let outcome = if matches!(lane, Lane::App | Lane::Push) {
                                mailstream::channels::unwanted_outcome(written)
                            } else {
                                Outcome::Skipped
                            };
                            decisions.push((*dref, outcome, reason));
                        }
                        None if lane == Lane::App => {
                            // Each holder's body differs, so one written over another shows.
                            let body = mailstream::channels::app::event_body(dref, &format!("walk-{h}"), &[]);
                            mailstream::channels::fix_bodies(
                                conn,
                                &self.store,
                                (u16::from(p), WorkLane::App, mailstream::channels::app::BODY_FIELD),
                                &[(dref, body)],
                            )
                            .await?;
                        }
                        None if lane == Lane::Push => {
                            let body = format!(r#"{{"title":"t","body":"walk-{h}","tag":"x"}}"#);
                            mailstream::channels::fix_bodies(
                                conn,
                                &self.store,
                                (u16::from(p), WorkLane::Push, mailstream::channels::push::BODY_FIELD),
                                &[(dref, body)],
                            )
                            .await?;
                        }
                        None => {}
                    }
                }
                let entries = self.entries(conn, u16::from(p)).await?;
                let decisions: Vec<Decision<'_>> = decisions
                    .iter()
                    .map(|(dref, outcome, reason)| Decision {
                        entry: entries.get(&dref.id()).map(String::as_str).unwrap_or("0-0"),
                        delivery: dref,
                        outcome: *outcome,
                        reason: reason.clone(),
                        lost: false,
                    })
                    .collect();
                for lane in WorkLane::ALL {
                    let mine: Vec<Decision<'_>> =
                        decisions.iter().filter(|x| x.delivery.lane() == lane).cloned().collect();
                    scripts::decide(conn, keys, u16::from(p), GROUP, &owner(h), &mine, RETENTION).await?;
                }
            }
            Action::Seal(h, p) => {
                let holder = &s.holders[usize::from(h)];
                let entries = self.entries(conn, u16::from(p)).await?;
                let (sealable, _) = self.model.sealable(&holder.claimed, p);
                let items: Vec<Ready> = sealable
                    .iter()
                    .map(|&(d, _)| {
                        let dref = self.names.deliveries[usize::from(d)].clone();
                        let to = &self.names.addresses[usize::from(d)];
                        Ready {
                            entry: entries.get(&dref.id()).cloned().unwrap_or_default(),
                            json: email("a@acme.example", to),
                            delivery: dref,
                            variant: None,
                            audience: Default::default(),
                        }
                    })
                    .collect();
                let sealed = self.steps[usize::from(h)].seal(u16::from(p), items).await?;
                if let Some(b) = &sealed {
                    let mut known = self.batches.lock().expect("the batches");
                    known.ids.insert(b.id.clone(), s.next_batch);
                    known.keys.insert(b.key.clone(), (s.next_batch, 0));
                }
                return Ok(self.holds(h, sealed, next));
            }
            Action::Gate(h) => {
                let mut b = self.hand(h)?;
                let gated = self.steps[usize::from(h)].gate(&mut b).await;
                let after = next.holders[usize::from(h)].hand.as_ref();
                return Ok(match (gated, after) {
                    // A reseal made a new key: the model's next version.
                    (Gated::Go, Some(hand)) => {
                        self.new_key(&b.key, hand);
                        self.holds(h, Some(b), next)
                    }
                    (Gated::Stop, None) => None,
                    (gated, _) => {
                        let known = self.batches.lock().expect("the batches");
                        Some(format!("the daemon's gate said {gated:?}, with {}", self.sealed(&known, &b)))
                    }
                });
            }
            Action::Wait(h, true) => {
                // No WAIT on one server (`wait_replicas = 0`): the model's read-back, on the
                // daemon's memory (a batch taken over since its gate is let go).
                if next.holders[usize::from(h)].hand.is_none() {
                    self.hands.lock().expect("the hands")[usize::from(h)] = None;
                }
            }
            Action::Send(h, outcome) => {
                // The request leaves at `Record`, where the daemon's own call sends it and
                // records the answer in one go; the model's choice waits until then.
                self.outcomes.lock().expect("the outcomes")[usize::from(h)] = Some(outcome);
            }
            Action::Record(h) => {
                let hand = s.holders[usize::from(h)].hand.as_ref().expect("a hand");
                let Phase::Answered(answer) = hand.phase else { anyhow::bail!("recorded before an answer") };
                let outcome = self.outcomes.lock().expect("the outcomes")[usize::from(h)].take();
                self.provider.set(match answer {
                    Answer::Accepted => Reply::Accept,
                    Answer::Timeout if outcome == Some(Provides::TimedOut) => Reply::Hang,
                    Answer::Timeout => Reply::Close,
                    Answer::Retry => Reply::RateLimited,
                    Answer::Refused => Reply::SenderRefused,
                    Answer::Fatal => Reply::KeyReused,
                });
                let b = self.hand(h)?;
                let again = self.steps[usize::from(h)].attempt(b).await;
                if let (Some(b), Some(hand)) = (&again, &next.holders[usize::from(h)].hand) {
                    self.new_key(&b.key, hand);
                }
                return Ok(self.holds(h, again, next));
            }
            Action::Take(h, p, id) => {
                let p16 = u16::from(p);
                let batch = self.batch_name(id);
                // Its retry is due, or its holder's lease ran out.
                let _: () = redis::cmd("ZADD").arg(keys.batches(p16)).arg(0).arg(&batch).query_async(conn).await?;
                let taken = self.steps[usize::from(h)].take(p16, &batch).await?;
                return Ok(self.holds(h, taken, next));
            }
            Action::Unsubscribe(d) if matches!(self.model.deliveries[usize::from(d)].lane, Lane::App | Lane::Push) => {
                // The channel turned off (`off:<campaign>:<channel>`), email left on.
                let dref = &self.names.deliveries[usize::from(d)];
                scripts::opt_out(conn, keys, &dref.subscriber, CAMPAIGN, dref.channel).await?;
            }
            Action::PushSend(h, d) => {
                // renew.lua: the lease still held, extended; the requests leave.
                let dref = &self.names.deliveries[usize::from(d)];
                let p = u16::from(self.model.deliveries[usize::from(d)].partition);
                let (held, _) = scripts::renew(conn, keys, p, &owner(h), LEASE_MS, &[dref], &[]).await?;
                anyhow::ensure!(held == 1, "the model let a holder send without its lease");
                let record = keys.delivery(p, &dref.id());
                scripts::note(conn, &mailstream::channels::push::inflight_field(&owner(h)), &[(record, "1")]).await?;
            }
            Action::PushPost(_, d, b, answer) => {
                // push/mod.rs `record`: this browser's answer, written as it arrives.
                let dref = &self.names.deliveries[usize::from(d)];
                let p = u16::from(self.model.deliveries[usize::from(d)].partition);
                let record = keys.delivery(p, &dref.id());
                match answer {
                    AppAnswer::Taken => {
                        scripts::note(
                            conn,
                            &mailstream::channels::push::sent_field(&format!("b{b}")),
                            &[(record, "1")],
                        )
                        .await?;
                    }
                    AppAnswer::Gone => {
                        let key = keys.push_subscriptions(p, &dref.subscriber);
                        let _: () = redis::cmd("HDEL").arg(key).arg(format!("b{b}")).query_async(conn).await?;
                    }
                    AppAnswer::TakenAnswerLost => {
                        scripts::note(conn, "push_maybe_taken", &[(record, "1")]).await?;
                    }
                    AppAnswer::Again => {}
                }
            }
            Action::PushSettle(h, d) => {
                // push/mod.rs: every answer recorded (PushPost), its flag cleared, then
                // decide.lua or defer.lua.
                let holder = &s.holders[usize::from(h)];
                let x = *holder.pushing.iter().find(|x| x.delivery == d).expect("pushing it");
                if !x.sent {
                    // Its lease ran out before the requests: the sender writes nothing.
                    return Ok(None);
                }
                let dref = &self.names.deliveries[usize::from(d)];
                let p = u16::from(self.model.deliveries[usize::from(d)].partition);
                let record = keys.delivery(p, &dref.id());
                let mine = mailstream::channels::push::inflight_field(&owner(h));
                let _: () = redis::cmd("HDEL").arg(&record).arg(&mine).query_async(conn).await?;
                let fields: Vec<String> = redis::cmd("HKEYS").arg(&record).query_async(conn).await?;
                let marked = fields.iter().any(|f| f.starts_with("push_sent:"));
                let maybe = fields.iter().any(|f| f == "push_maybe_taken" || f.starts_with("push_inflight:"));
                let entries = self.entries(conn, p).await?;
                let entry = entries.get(&dref.id()).map(String::as_str).unwrap_or("0-0");
                let decide = |outcome, reason| Decision { entry, delivery: dref, outcome, reason, lost: false };
                if x.again != 0 {
                    let backoff = scripts::Backoff {
                        base_ms: 1000,
                        max_ms: 60_000,
                        deadline_ms: 48 * 3_600_000,
                        jitter_percent: 0,
                    };
                    scripts::defer(conn, keys, p, GROUP, &owner(h), backoff, &[(entry, dref)]).await?;
                    scripts::release_due(conn, keys, p, WorkLane::Push, u64::MAX / 2, 100).await?;
                } else {
                    let d = match (marked, maybe) {
                        (true, _) => decide(Outcome::Sent, Reason::Accepted),
                        (false, true) => decide(Outcome::OutcomeUnknown, Reason::NoSubscription),
                        (false, false) => decide(Outcome::Skipped, Reason::NoSubscription),
                    };
                    scripts::decide(conn, keys, p, GROUP, &owner(h), &[d], RETENTION).await?;
                }
            }
            Action::Unsubscribe(d) => {
                let subscriber = self.names.subscribers[usize::from(d)].clone().expect("a digest's subscriber");
                subscribers::upsert(&self.store, &[Subscriber { subscribed: false, ..subscriber }]).await?;
            }
            Action::Decide(h, d) => {
                let holder = &s.holders[usize::from(h)];
                let answer = holder.posting.iter().find(|&&(c, ..)| c == d).and_then(|&(.., a)| a).expect("answered");
                let dref = &self.names.deliveries[usize::from(d)];
                let p = u16::from(self.model.deliveries[usize::from(d)].partition);
                let entries = self.entries(conn, p).await?;
                let entry = entries.get(&dref.id()).map(String::as_str).unwrap_or("0-0");
                let decide = |outcome, reason| Decision { entry, delivery: dref, outcome, reason, lost: false };
                match answer {
                    AppAnswer::Taken => {
                        let d = [decide(Outcome::Sent, Reason::Accepted)];
                        scripts::decide(conn, keys, p, GROUP, &owner(h), &d, RETENTION).await?;
                    }
                    AppAnswer::Gone => {
                        let d = [decide(Outcome::Failed, Reason::AppGone)];
                        scripts::decide(conn, keys, p, GROUP, &owner(h), &d, RETENTION).await?;
                    }
                    AppAnswer::Again | AppAnswer::TakenAnswerLost => {
                        let backoff = scripts::Backoff {
                            base_ms: 1000,
                            max_ms: 60_000,
                            deadline_ms: 48 * 3_600_000,
                            jitter_percent: 0,
                        };
                        let items = [(entry, dref)];
                        scripts::defer(conn, keys, p, GROUP, &owner(h), backoff, &items).await?;
                        // Its time comes (the reclaimer's due.lua): a fresh entry, unread.
                        scripts::release_due(conn, keys, p, WorkLane::App, u64::MAX / 2, 100).await?;
                    }
                }
            }
            Action::Suppress(a) => {
                let spec = self.model.deliveries.iter().position(|x| x.address == a).expect("an address");
                let event = format!("evt-{a}");
                let address = &self.names.addresses[spec];
                suppression::apply(&self.store, &self.config, address, Act::Suppress(Why::Bounced), Some(&event))
                    .await?;
            }
            Action::Pause => {
                let until = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
                mailstream::send::pause::Pause::default().begin(&self.store, until, "daily_quota_exceeded").await?;
            }
            Action::Unpause => {
                mailstream::send::pause::Pause::resume(&self.store).await?;
            }
            Action::WindowPasses(id, version) => {
                // Only the batch still holding that key is past its window (a reseal made a
                // new key and a new `sealed_ms`).
                self.age_batch(conn, id, Some(version), "sealed_ms", 0).await?;
            }
            Action::DeadlinePasses(id) => {
                // First sealed longer ago than the delivery deadline (gate.lua reads
                // `first_sealed_ms`, which no reseal moves).
                self.age_batch(conn, id, None, "first_sealed_ms", 0).await?;
            }
            Action::UnsurePasses(id, version) => {
                // That key sealed longer ago than the maybe-sent deadline, and not the
                // resend window: between the two.
                let d = &self.config.delivery;
                let ago = (d.maybe_sent_deadline_hours + d.resend_window_hours) * 3_600_000 / 2;
                let now = mailstream::store::records::now_ms(conn).await?;
                self.age_batch(conn, id, Some(version), "sealed_ms", now - ago).await?;
            }
            // The dispatcher's second look: the holder's next step is its gate again (the
            // model's hand goes back before it); nothing in Redis until then.
            Action::Stale(_) => {}
            Action::Crash(h) => {
                // Its memory is gone with it.
                self.hands.lock().expect("the hands")[usize::from(h)] = None;
                self.outcomes.lock().expect("the outcomes")[usize::from(h)] = None;
            }
            Action::Wait(_, false) => anyhow::bail!("no WAIT refusal on one server"),
            // The walk plays the application, and a holder's pause: no Redis step.
            Action::Post(..) | Action::Stall(_) | Action::Resume(_) => {}
            Action::Lag(_) | Action::Failover(_) => anyhow::bail!("not on one server"),
            // The walks' bound has no ticks: the ages are checked on Redis's own clock, moved
            // for real, by tests/dedup_age.rs.
            Action::Tick => anyhow::bail!("the walks do not move Redis's clock"),
        }
        Ok(None)
    }

    /// Moves a stored time of the model's batch `id` into the past (`field` set to
    /// `value`), in whichever partition holds its record; with `version`, only while the
    /// record still holds that version's key.
    async fn age_batch(
        &self,
        conn: &mut mailstream::store::Conn,
        id: u8,
        version: Option<u8>,
        field: &str,
        value: u64,
    ) -> anyhow::Result<()> {
        let batch = self.batch_name(id);
        let key = version.map(|v| self.key_name(id, v));
        for p in 0..self.model.partitions {
            let record = self.store.keys.batch(u16::from(p), &batch);
            let (stored,): (Option<String>,) = redis::cmd("HMGET").arg(&record).arg("key").query_async(conn).await?;
            if stored.is_some() && key.as_ref().is_none_or(|k| *k == stored) {
                let _: () = redis::cmd("HSET").arg(&record).arg(field).arg(value).query_async(conn).await?;
            }
        }
        Ok(())
    }

    /// Delivery id → its stream entry id, in both lanes of partition `p`.
    async fn entries(&self, conn: &mut mailstream::store::Conn, p: u16) -> anyhow::Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for lane in WorkLane::ALL {
            let rows: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XRANGE")
                .arg(self.store.keys.lane_stream(p, lane))
                .arg("-")
                .arg("+")
                .query_async(conn)
                .await?;
            for (id, fields) in rows {
                if let Some(d) = fields.get("delivery") {
                    out.insert(d.clone(), id);
                }
            }
        }
        Ok(out)
    }

    /// Redis's state of partition `p`, as the model sees a partition (two round trips).
    async fn project(&self, conn: &mut mailstream::store::Conn, p: u16) -> anyhow::Result<Data> {
        use redis::{Value, from_redis_value_ref as read};
        let keys = &self.store.keys;
        let n = self.model.deliveries.len();
        let mine: Vec<usize> = (0..n).filter(|&d| self.model.partition(d as u8) == usize::from(p)).collect();
        let mut pipe = redis::pipe();
        for lane in WorkLane::ALL {
            let stream = keys.lane_stream(p, lane);
            pipe.cmd("XRANGE").arg(&stream).arg("-").arg("+");
            pipe.cmd("XPENDING").arg(&stream).arg(GROUP).arg("-").arg("+").arg(100);
            pipe.cmd("XINFO").arg("GROUPS").arg(&stream);
        }
        for &d in &mine {
            pipe.cmd("HGETALL").arg(keys.delivery(p, &self.names.deliveries[d].id()));
            let subscriber = self.names.subscribers[d].as_ref().map_or("-", |s| s.id.as_str());
            pipe.cmd("HMGET")
                .arg(keys.subscriber(p, subscriber))
                .arg("subscribed")
                .arg("suppressed")
                .arg(subscribers::field::channel_opted_out(CAMPAIGN, self.names.deliveries[d].channel));
            pipe.cmd("HKEYS").arg(keys.push_subscriptions(p, subscriber));
        }
        for hash in &self.names.hashes {
            pipe.cmd("HEXISTS").arg(keys.suppressed(p)).arg(hash);
        }
        pipe.cmd("EXISTS").arg(keys.paused(p));
        pipe.cmd("ZRANGE").arg(keys.batches(p)).arg(0).arg(-1);
        pipe.cmd("KEYS").arg(keys.batch(p, "*"));
        let replies: Vec<Value> = pipe.query_async(conn).await?;
        let mut replies = replies.iter();
        let mut next = || replies.next().expect("a reply per command");

        let mut data = Data {
            recs: vec![Rec::Absent; n],
            unacked: 0,
            batches: Vec::new(),
            unsubscribed: 0,
            subscriber_suppressed: 0,
            suppressed: 0,
            paused: false,
            app_body: vec![0; n],
            push_marks: vec![0; n],
            push_subs: vec![0; n],
            maybe_taken: 0,
            push_inflight: vec![0; n],
            expires: [0; crate::protocol::MAX_DELIVERIES],
        };
        // Unacknowledged: not yet read, or read and pending.
        let (mut entries, mut unacked) = (BTreeMap::new(), std::collections::BTreeSet::new());
        for lane in WorkLane::ALL {
            let rows: Vec<(String, BTreeMap<String, String>)> = read(next())?;
            let pending: Vec<(String, String, u64, u64)> = read(next())?;
            let groups: Vec<BTreeMap<String, Value>> = read(next())?;
            let last = groups
                .iter()
                .find_map(|g| g.get("last-delivered-id").and_then(|v| read::<String>(v).ok()))
                .and_then(|id| mailstream::store::streams::parse_id(&id))
                .unwrap_or((0, 0));
            // An entry id is unique within its stream only: each lane's ids apart.
            unacked.extend(pending.into_iter().map(|(id, ..)| (lane, id)));
            for (id, fields) in rows {
                if mailstream::store::streams::parse_id(&id).is_some_and(|at| at > last) {
                    unacked.insert((lane, id.clone()));
                }
                if let Some(d) = fields.get("delivery") {
                    entries.insert(d.clone(), (lane, id));
                }
            }
        }
        let holder = |name: &str| (0..2u8).find(|&h| owner(h) == name);
        let delivery = |id: &str| self.names.deliveries.iter().position(|d| d.id() == id).map(|d| d as u8);
        for &d in &mine {
            if entries.get(&self.names.deliveries[d].id()).is_some_and(|e| unacked.contains(e)) {
                data.unacked |= 1 << d;
            }
            let fields: BTreeMap<String, String> = read(next())?;
            data.recs[d] = match fields.get("state").map(String::as_str) {
                None => Rec::Absent,
                Some("pending") => Rec::Pending,
                Some("processing") => {
                    Rec::Processing(fields.get("lease_owner").and_then(|o| holder(o)).unwrap_or(u8::MAX))
                }
                Some("sealed") => {
                    let known = self.batches.lock().expect("the batches");
                    Rec::Sealed(fields.get("batch").and_then(|b| known.ids.get(b)).copied().unwrap_or(u8::MAX))
                }
                Some("sent") => Rec::Sent,
                Some("failed") => Rec::Failed,
                Some("skipped") => Rec::Skipped,
                Some("outcome_unknown") => Rec::Unknown,
                Some(other) => anyhow::bail!("a state the model does not know: {other}"),
            };
            let browser = |name: &str| name.strip_prefix('b').and_then(|b| b.parse::<u8>().ok()).map(|b| 1u8 << b);
            for f in fields.keys() {
                if let Some(bit) = f.strip_prefix("push_sent:").and_then(browser) {
                    data.push_marks[d] |= bit;
                }
            }
            if fields.contains_key("push_maybe_taken") {
                data.maybe_taken |= 1 << d;
            }
            for f in fields.keys() {
                if let Some(h) = f.strip_prefix("push_inflight:").and_then(holder) {
                    data.push_inflight[d] |= 1 << h;
                }
            }
            if let Some(body) = fields.get("app_body").or(fields.get(mailstream::channels::push::BODY_FIELD)) {
                let mut first = self.first_body.lock().expect("first bodies");
                let first = first[d].get_or_insert_with(|| body.clone());
                data.app_body[d] = if first == body { 1 } else { 2 };
            }
            let (subscribed, suppressed, off): (Option<String>, Option<String>, Option<String>) = read(next())?;
            let browsers: Vec<String> = read(next())?;
            if self.model.deliveries[d].lane == Lane::Push {
                data.push_subs[d] = browsers.iter().filter_map(|b| browser(b)).fold(0, |all, b| all | b);
            }
            if self.names.subscribers[d].is_some() {
                if subscribed.as_deref() != Some("1") || off.is_some() {
                    data.unsubscribed |= 1 << d;
                }
                if suppressed.is_some() {
                    data.subscriber_suppressed |= 1 << d;
                }
            }
        }
        for a in 0..self.names.hashes.len() {
            if read::<bool>(next())? {
                data.suppressed |= 1 << a;
            }
        }
        data.paused = read(next())?;
        let mut names: Vec<String> = read(next())?;
        let records: Vec<String> = read(next())?;
        for key in records {
            let name = key.rsplit(':').next().unwrap_or_default().to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("HGETALL").arg(keys.batch(p, name));
        }
        let batches: Vec<BTreeMap<String, String>> =
            if names.is_empty() { Vec::new() } else { pipe.query_async(conn).await? };
        for (name, fields) in names.iter().zip(batches) {
            let known = self.batches.lock().expect("the batches");
            let id: u8 = known.ids.get(name).copied().unwrap_or(u8::MAX);
            if fields.is_empty() {
                // A zset entry with no record: the model has no such thing.
                data.batches.push(Batch {
                    id,
                    version: u8::MAX,
                    body: Vec::new(),
                    state: BatchState::Retry,
                    owner: u8::MAX,
                    maybe_sent: false,
                    fallback: false,
                });
                continue;
            }
            let version = fields.get("key").and_then(|k| known.keys.get(k)).map_or(u8::MAX, |&(_, v)| v);
            drop(known);
            let members: Vec<u8> =
                fields.get("members").map(|m| m.split(' ').filter_map(delivery).collect()).unwrap_or_default();
            let addresses: Vec<u8> = fields
                .get("addresses")
                .map(|a| {
                    a.split(' ')
                        .map(|h| self.names.hashes.iter().position(|x| x == h).map_or(u8::MAX, |i| i as u8))
                        .collect()
                })
                .unwrap_or_default();
            let state = match fields.get("state").map(String::as_str) {
                Some("sealed") => BatchState::Sealed,
                Some("sending") => BatchState::Sending,
                Some("retry") => BatchState::Retry,
                other => anyhow::bail!("a batch state the model does not know: {other:?}"),
            };
            data.batches.push(Batch {
                id,
                version,
                body: members.into_iter().zip(addresses).collect(),
                state,
                owner: fields.get("owner").and_then(|o| holder(o)).unwrap_or(u8::MAX),
                maybe_sent: fields.get("maybe_sent").map(String::as_str) == Some("1"),
                fallback: fields.contains_key("fallback_error"),
            });
        }
        data.batches.sort_by_key(|b| b.id);
        // A delivery without a record may be settled compactly: its period's settled history.
        let recordless: Vec<usize> = mine.iter().copied().filter(|&d| data.recs[d] == Rec::Absent).collect();
        let refs: Vec<DeliveryRef> = recordless.iter().map(|&d| self.names.deliveries[d].clone()).collect();
        let kept = mailstream::store::history::lookup(conn, keys, p, &refs).await?;
        for (d, entry) in recordless.into_iter().zip(kept) {
            // The entry's request count (left out when 1) as the scripts write it: a
            // skipped delivery's is 0; one sent through the provider made at least one
            // (an application event taken, `accepted`, made none through it).
            if let Some(e) = &entry {
                let provider_sent = e.state == "sent" && e.detail.as_deref() != Some("accepted");
                anyhow::ensure!(
                    (e.state != "skipped" || e.sends == 0) && (!provider_sent || e.sends >= 1),
                    "a compact entry's request count the scripts do not write: {e:?}"
                );
            }
            data.recs[d] = match entry.as_ref().map(|e| e.state.as_str()) {
                None => Rec::Absent,
                Some("sent") => Rec::Sent,
                Some("skipped") => Rec::Skipped,
                Some(other) => anyhow::bail!("a compact entry in a state the model does not keep so: {other}"),
            };
        }
        Ok(data)
    }
}
