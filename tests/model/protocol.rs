//! The send protocol as a `stateright` model: what the Lua scripts and the send path do
//! to Redis, step by step, with the provider, crashes, stalls, failovers and the people
//! who change their minds in between. Each action is named after the script or step of
//! the code it stands for (`claim.lua`, `seal.lua`, `gate.lua`, `WAIT`, the request,
//! `settle.lua`/`reschedule.lua`, `take.lua`); each mutant switches one guard of the
//! real code off, and the checker must find what that guard prevents.
//!
//! Redis is one primary per partition with a copy of what survives it (`safe`: its
//! replica, or with one server its fsynced file). Writes land on the primary; a
//! replication (or fsync) copies it whole at any moment, so the copy is always a prefix
//! of the primary's history; `WAIT` is that copy made before the request leaves; a
//! failover (or a restart that loses what was not fsynced) puts the copy back.
//! Time appears only where the protocol reads it: a lease runs out for a holder that
//! does not renew it (stalled, crashed, or no longer holding that work), a batch is
//! due for a retry, and a key may pass the resend window (`old`), after which the
//! provider has forgotten it. The ages that guard a period's dedup are logical time (a
//! bound with `ticks`): Redis's clock (`State::clock`) moves on in steps; the period
//! starts at [`PERIOD_START`], a kick is accepted while the clock is before its window's
//! end ([`PERIOD_START`] + [`RETENTION`], enqueue.lua), so a kick at 0 is an early one (the
//! period kicked as "the next one") and one at 2 a late one; a delivery's trace (its
//! compact entry, or its failed / outcome_unknown record) is stamped with an expiry when it
//! settles (prelude.lua, `keep_until`) and is gone once the clock reaches it.
//! Left out on purpose: which endpoint a request goes to (a batch, or one email with
//! attachments through `POST /emails`: the same keyed request of a sealed body, replayed
//! alike), and record fields no step reads (a receipt's attachments, deleted when it
//! settles; the partition's pending attachment bytes, which only refuse an ingest); a
//! suppression lifted (an operator's lift, or Resend's `suppression.removed`, which
//! suppress.lua's `provider_remove` applies only to Resend's own suppression): a lift only
//! lets mail reach an address again, and the model's guarantees hold for whatever the
//! gate reads; and the tallies of what Resend said after accepting an email (event.lua's
//! `provider_failed`, `provider_failed:<reason>`, `delivery_delayed`): counters no step
//! reads; nor the settlements per minute that settle.lua, decide.lua and gate.lua add to
//! (`per_minute`, prelude.lua's `tally_minute`, the overview's chart), nor the address index
//! ingest.lua adds to (`by_address`, the admin search's), nor a delivery's history (the
//! batch's `attempts`, reschedule.lua; the record's `history`, settle.lua and requeue.lua):
//! each is written in the same step as before and read by no step of the protocol; nor
//! when Resend counts as down (health.lua: how many failures, over what span): it only makes
//! a sealed batch wait or go as a probe, and its request, its key and its settlement are
//! those of any retry, which the model has. The admin pages add no step: they read,
//! and their retries call the same `dead-letters retry` (requeue.lua, unchanged) as the
//! command line.
//! Nor the pacing of requests (limiter.lua: when a request may leave, whether an instance
//! paces alone at its share while the limiter's node is gone): it decides when a gated
//! batch's request leaves, never whether or under which key; nor which partition's work
//! the dispatcher aims at a slot (a partition held while its Redis does not answer or its
//! replicas do not acknowledge, reopened by the heartbeat's probe): a batch not taken
//! stays as it was, and one that is goes through the same seal, gate and `WAIT`; a gated
//! batch whose partition is held by the time its slot comes is let go without a request,
//! as when its second look goes unanswered: its lease runs out as for a holder no longer
//! holding that work.

use std::fmt;

use stateright::{Model, Property};

/// Holders (daemon instances).
pub const HOLDERS: usize = 2;

/// A member of a batch: (delivery, the address its email is sent to).
pub type Member = (u8, u8);

/// An Idempotency-Key: (batch id, version; the gate's reseal makes a new version).
pub type Key = (u8, u8);

/// The line a delivery waits in: the last gate checks a campaign member's subscriber
/// record too; a transactional member has only its addresses to check. `App` is a
/// campaign delivery of the application channel (app.rs): claimed like any (claim.lua),
/// its event body fixed in its record (HSETNX, then WAIT) before the first request,
/// posted, and decided (decide.lua) or put off (defer.lua); never sealed into a batch.
/// `Push` is a campaign delivery of the Web Push channel (push/): claimed and its payload
/// fixed the same way, then posted to each of its subscriber's browsers ([`BROWSERS`],
/// one of them gone: [`GONE`]); what they answered is written (a mark per browser that
/// took it, note.lua; a gone one removed from the registry) and WAITed for, then it is
/// decided or put off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    Digest,
    Transactional,
    App,
    Push,
}

/// The browsers a Web Push delivery's subscriber has subscribed at first (bits).
pub const BROWSERS: u8 = 0b11;
/// The browsers whose push service answers 410 Gone (always: a subscription that is gone
/// stays gone).
pub const GONE: u8 = 0b10;

/// One delivery of the bound: its partition, lane, the address its email is sent to
/// (the registry's, an inline recipient, or the render hook's), whether that is its
/// subscriber's registry address (a suppression cascades to the subscriber record then),
/// and whether it is operator mail (transactional, always in a request of its own, and
/// sealed again once from a fallback sender when Resend refuses its sender).
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    pub partition: u8,
    pub lane: Lane,
    pub address: u8,
    pub registry: bool,
    pub operator: bool,
    /// The other channel's delivery of the same natural key: enqueue.lua (ingest.lua for
    /// a receipt) enqueues both in the one step that kicks either.
    pub sibling: Option<u8>,
}

/// The most deliveries a bound may have.
pub const MAX_DELIVERIES: usize = 8;

/// When the period of every delivery of the bound starts, in logical time.
pub const PERIOD_START: u8 = 1;
/// The retention, in logical time: a trace lives this long after it was written.
pub const RETENTION: u8 = 2;

/// How much of each kind of trouble a path may meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Budget {
    /// Kicks per delivery (the second one, concurrent or late, must add nothing).
    pub kicks: u8,
    pub crashes: u8,
    pub stalls: u8,
    pub failovers: u8,
    pub unsubscribes: u8,
    pub suppressions: u8,
    /// Provider answers other than an acceptance (a timeout, a 429, a refusal).
    pub failures: u8,
    pub wait_failures: u8,
    pub windows: u8,
    pub pauses: u8,
    /// Steps of Redis's clock (0: time does not pass for the dedup's ages).
    pub ticks: u8,
    /// Passings of a batch's deadline: its delivery deadline (since it was first sealed),
    /// or its key's maybe-sent deadline (since that key was sealed).
    pub deadlines: u8,
    /// Slots that moved past a holder's gate's freshness (the limiter's wait).
    pub stales: u8,
}

/// Where Redis may lose writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Env {
    /// A primary with a replica per partition and `wait_replicas = 1`: a failover loses
    /// what was not replicated; the gate's write is WAITed for.
    Replicated,
    /// One server whose restart loses what was not fsynced (`durability = "relaxed"`):
    /// no WAIT, and nothing written can be counted on in general (a lost settle sends
    /// again). What the code still claims is checked: one instance, which neither crashes
    /// nor stalls, the provider always answers, nobody changes their mind, and the restart
    /// comes while an answer is on its way; that answer is recorded on the deliveries of
    /// the batch whose record was lost, so none of them is sent again.
    LostWrites,
}

/// A guard of the real code switched off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// settle.lua: an answer for a batch whose record is gone is read as settled and
    /// recorded on nobody.
    MissingBatchReadAsSettled,
    /// The request leaves right after the gate, before replicas acknowledged its write.
    CommitBeforeReplicas,
    /// gate.lua: the transactional lane's addresses are not checked for suppression.
    LaneSkipsSuppression,
    /// gate.lua: suppression is read from the subscriber record only, not from the
    /// addresses in the body (a render hook's address goes unchecked).
    GateReadsSubscriberOnly,
    /// take.lua: a batch its dead holder marked 'sending' is taken as never sent.
    TakeIgnoresSending,
    /// gate.lua: a maybe-sent batch is resealed without the members who left.
    ResealMaybeSent,
    /// gate.lua and take.lua: a maybe-sent batch past the resend window is resent.
    NoResendWindow,
    /// claim.lua: a live lease is taken over.
    ClaimIgnoresLease,
    /// A kick, an ingested receipt, an unsubscribe or a suppression is acknowledged
    /// before replicas (or the disk) have it.
    AcknowledgedWritesNotWaited,
    /// After WAIT, the holder does not check that its gate's write is still there.
    WaitWithoutRecheck,
    /// WAIT is answered by a node that does not hold the partition (the cluster
    /// client's fallback just after a failover): it counts nothing written there and
    /// acknowledges, while the gate's write is on no replica. The code sends WAIT in one
    /// pipeline with EXISTS of the key, which only the partition's node answers.
    WaitAnsweredElsewhere,
    /// settle.lua: a verdict is recorded by a holder that no longer holds the batch.
    VerdictWithoutHolder,
    /// gate.lua and reschedule.lua read "may have been sent" from the record only, not
    /// from the holder that took the batch knowing it (a failover may have taken the
    /// record's mark back).
    GateForgetsWhatTheHolderKnows,
    /// The sender fallback (send/fallback.rs and fallback.lua) seals operator mail again under a
    /// new key though an earlier request of it may have been processed: a refusal now
    /// (an API key rotated, refused before the idempotency store) does not prove that one
    /// was refused too.
    FallbackAfterMaybeSent,
    /// app.rs: each claim writes the event's body anew (HSET, not HSETNX), so a retry by
    /// another holder may post the same id with another body.
    AppBodyRewritten,
    /// app.rs: the event's body is not WAITed for before the request, so a failover may
    /// take it back and the next holder post the id with another body.
    AppBodyNotWaited,
    /// push/: the marks of the browsers that took a notification are not WAITed for,
    /// neither as each answer is recorded nor before the delivery is decided, so a
    /// failover may take them back and the next holder post to a browser whose 201 was
    /// recorded.
    PushMarksNotWaited,
    /// enqueue.lua: the dedup reads the delivery's record only, not its period's settled
    /// history, so a kick after a delivery was settled sent (its record gone for its
    /// compact entry) enqueues it again.
    KickForgetsSettledHistory,
    /// prelude.lua `keep_until`: a trace of the dedup expires the retention after it was
    /// written, not before its period's kick window ends (key layout 7): a period kicked
    /// early and settled before it started can be kicked again once its traces are gone.
    ExpiryFromSettlement,
    /// gate.lua: a batch never sent is let through past its delivery deadline.
    GateSkipsDeadline,
    /// gate.lua's 'deadline' as the sender reads it: a batch past its maybe-sent deadline
    /// is settled failed, though a request of it may have been processed.
    DeadlineFailsMaybeSent,
    /// dispatch.rs: a request leaves on its gate's look however long its slot made it
    /// wait (no second look once the gate is older than its freshness).
    SendsOnStaleGate,
}

impl Mutant {
    pub const ALL: [Mutant; 22] = [
        Mutant::MissingBatchReadAsSettled,
        Mutant::CommitBeforeReplicas,
        Mutant::LaneSkipsSuppression,
        Mutant::GateReadsSubscriberOnly,
        Mutant::TakeIgnoresSending,
        Mutant::ResealMaybeSent,
        Mutant::NoResendWindow,
        Mutant::ClaimIgnoresLease,
        Mutant::AcknowledgedWritesNotWaited,
        Mutant::WaitWithoutRecheck,
        Mutant::WaitAnsweredElsewhere,
        Mutant::VerdictWithoutHolder,
        Mutant::GateForgetsWhatTheHolderKnows,
        Mutant::FallbackAfterMaybeSent,
        Mutant::AppBodyRewritten,
        Mutant::AppBodyNotWaited,
        Mutant::PushMarksNotWaited,
        Mutant::KickForgetsSettledHistory,
        Mutant::ExpiryFromSettlement,
        Mutant::GateSkipsDeadline,
        Mutant::DeadlineFailsMaybeSent,
        Mutant::SendsOnStaleGate,
    ];

    /// Whether it is about the application channel (checked on the channel's bound).
    pub fn is_channel(self) -> bool {
        matches!(self, Mutant::AppBodyRewritten | Mutant::AppBodyNotWaited)
    }

    /// Whether it is about time at the gate (checked on the time bound).
    pub fn is_time(self) -> bool {
        matches!(self, Mutant::GateSkipsDeadline | Mutant::DeadlineFailsMaybeSent | Mutant::SendsOnStaleGate)
    }

    /// Whether it is about the Web Push channel (checked on its bound).
    pub fn is_push(self) -> bool {
        matches!(self, Mutant::PushMarksNotWaited)
    }

    pub fn name(self) -> &'static str {
        match self {
            Mutant::MissingBatchReadAsSettled => "missing_batch_read_as_settled",
            Mutant::CommitBeforeReplicas => "commit_before_replicas_acknowledged",
            Mutant::LaneSkipsSuppression => "transactional_gate_skips_suppression",
            Mutant::GateReadsSubscriberOnly => "gate_reads_subscriber_record_only",
            Mutant::TakeIgnoresSending => "take_ignores_sending",
            Mutant::ResealMaybeSent => "reseal_maybe_sent",
            Mutant::NoResendWindow => "no_resend_window",
            Mutant::ClaimIgnoresLease => "claim_ignores_live_lease",
            Mutant::AcknowledgedWritesNotWaited => "acknowledged_writes_not_waited_for",
            Mutant::WaitWithoutRecheck => "wait_without_recheck",
            Mutant::WaitAnsweredElsewhere => "wait_answered_elsewhere",
            Mutant::VerdictWithoutHolder => "verdict_without_holder",
            Mutant::GateForgetsWhatTheHolderKnows => "gate_forgets_what_the_holder_knows",
            Mutant::FallbackAfterMaybeSent => "fallback_after_maybe_sent",
            Mutant::AppBodyRewritten => "app_body_rewritten",
            Mutant::AppBodyNotWaited => "app_body_not_waited",
            Mutant::PushMarksNotWaited => "push_marks_not_waited",
            Mutant::KickForgetsSettledHistory => "kick_forgets_settled_history",
            Mutant::ExpiryFromSettlement => "expiry_from_settlement",
            Mutant::GateSkipsDeadline => "gate_skips_delivery_deadline",
            Mutant::DeadlineFailsMaybeSent => "deadline_fails_maybe_sent",
            Mutant::SendsOnStaleGate => "sends_on_a_stale_gate",
        }
    }
}

/// A delivery record's state (`d:<id>` `state`, with `lease_owner` or `batch`). A
/// delivery settled sent or skipped keeps its period's settled-history entry instead of
/// its record (key layout 7): `Sent` and `Skipped` stand for that entry, which holds no
/// event body and which the kick's dedup reads as it reads a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rec {
    Absent,
    Pending,
    Processing(u8),
    Sealed(u8),
    Sent,
    Failed,
    Skipped,
    Unknown,
}

impl Rec {
    fn is_final(self) -> bool {
        matches!(self, Rec::Sent | Rec::Failed | Rec::Skipped | Rec::Unknown)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BatchState {
    Sealed,
    Sending,
    Retry,
}

/// A batch record: its key is (id, version); the gate's reseal and the sender fallback
/// make a new version.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Batch {
    pub id: u8,
    pub version: u8,
    /// Its body: (delivery, address) per member, in order.
    pub body: Vec<Member>,
    pub state: BatchState,
    pub owner: u8,
    pub maybe_sent: bool,
    /// Sealed again from the fallback sender (`fallback_error` on the record).
    pub fallback: bool,
}

/// One partition's keys on one copy (the primary's, or what survives it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Data {
    pub recs: Vec<Rec>,
    /// Per delivery: its stream entry is not acknowledged (pending or unread).
    pub unacked: u8,
    pub batches: Vec<Batch>,
    /// Per delivery: its subscriber record says unsubscribed (campaign turned off). It
    /// stands for every reason the one rule (`Unwanted::of`, prelude.lua's `unwanted`)
    /// reads off the record at the claim and again at the gate. The claim's `resolve`
    /// also skips a stored address that fails the address rule (`invalid_address`), and
    /// the gate does not: no door lets such an address in, so only a record edited by
    /// hand holds one, and the sealed body keeps the address it was sealed with (as for
    /// any address changed after the seal). Its only reachable effect is a skip at the
    /// claim, a transition this bit already takes there (an unsubscribe before the
    /// claim), so it needs no state of its own.
    pub unsubscribed: u8,
    /// Per delivery: the cascade marked its subscriber record suppressed.
    pub subscriber_suppressed: u8,
    /// Per address: this partition's `suppressed` hash has it.
    pub suppressed: u8,
    pub paused: bool,
    /// Per delivery of the application or Web Push channel: which body its record holds
    /// (`app_body` / `push_body`; 0: none yet, n: the n-th ever written for it).
    pub app_body: Vec<u8>,
    /// Per Web Push delivery: the browsers its record marks as having taken it
    /// (`push_sent:<id>`).
    pub push_marks: Vec<u8>,
    /// Per Web Push delivery: its subscriber's browser subscriptions (`push:<subscriber>`).
    pub push_subs: Vec<u8>,
    /// Per delivery: a request of it went unanswered (`push_maybe_taken`).
    pub maybe_taken: u8,
    /// Per Web Push delivery: the holders whose requests left and whose answers are not
    /// recorded yet (`push_inflight:<owner>`).
    pub push_inflight: Vec<u8>,
    /// Per delivery: when its trace expires (0: none; only stamped on a bound with ticks). A
    /// fixed array: cloned with every state, it should cost no allocation.
    pub expires: [u8; MAX_DELIVERIES],
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    pub live: Data,
    /// What survives the primary: its replica (or its file).
    pub safe: Data,
    /// Replication is behind: writes from here on are lost in a failover, until WAIT
    /// catches the replica up. Otherwise the replica has every write.
    pub lagging: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Running,
    Stalled,
    Dead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    Accepted,
    Timeout,
    Retry,
    Fatal,
    /// The sender refused (`sender_rejected`): fatal, but operator mail may fall back.
    Refused,
}

/// What the application answered an event's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AppAnswer {
    /// 2xx: taken (or taken before: the application dedups on `webhook-id`).
    Taken,
    /// 410: it wants no more of it.
    Gone,
    /// 429, 5xx, another 4xx: not taken, asked again later.
    Again,
    /// Taken, but the answer was lost (a timeout): asked again later.
    TakenAnswerLost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Sealed or taken: the last gate is next.
    ToGate,
    /// Past the gate: WAIT is next.
    Gated,
    /// The request may leave.
    Ready,
    /// The provider answered (or the request timed out): the answer is to be recorded.
    Answered(Answer),
}

/// A batch in a holder's hand, as its memory has it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hand {
    pub partition: u8,
    pub batch: u8,
    pub version: u8,
    pub body: Vec<Member>,
    pub maybe_sent: bool,
    pub phase: Phase,
    /// A member was no longer wanted (as acknowledged to whoever asked) when the gate
    /// let this body through.
    pub gated_unwanted: bool,
    /// Its key is a fallback's (the holder tells from the key it holds).
    pub fallback: bool,
    /// The gate let it through past a deadline it had to hold it to (only a mutant does).
    pub late: bool,
    /// Its slot moved past the gate's freshness while a member was no longer wanted, and
    /// the request leaves on that look (only a mutant does).
    pub stale_unwanted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder {
    pub status: Status,
    /// Claimed and rendered, waiting for a batch: (delivery, address).
    pub claimed: Vec<Member>,
    pub hand: Option<Hand>,
    /// Application events claimed: (delivery, the body it read back, the answer once
    /// the request came back).
    pub posting: Vec<(u8, u8, Option<AppAnswer>)>,
    /// Web Push deliveries claimed, on their way to their browsers.
    pub pushing: Vec<Pushing>,
}

/// A Web Push delivery in a holder's hand: the browsers it asks (subscribed and not
/// marked when it was claimed) and what each answered so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pushing {
    pub delivery: u8,
    pub body: u8,
    /// Its requests have left (after the lease was found still held: renew.lua).
    pub sent: bool,
    pub asked: u8,
    pub answered: u8,
    /// 201 heard.
    pub taken: u8,
    /// 404/410.
    pub gone: u8,
    /// 429, 5xx or no answer: asked again later.
    pub again: u8,
    /// No answer (it may have been taken).
    pub lost: u8,
}

/// What happened for real, beside what Redis says: the properties read this.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ghost {
    /// Real sends per delivery (replays excluded).
    pub sent: Vec<u8>,
    /// Deliveries whose unsubscribe was acknowledged.
    pub unsubscribed: u8,
    /// Addresses whose suppression was acknowledged.
    pub suppressed: u8,
    /// Keys a request left with that may have been processed (accepted, or timed out).
    pub left: Vec<Key>,
    /// Keys sealed longer ago than the resend window.
    pub old: Vec<Key>,
    /// Keys sealed longer ago than the maybe-sent deadline (below the resend window).
    pub unsure: Vec<Key>,
    /// Batches first sealed longer ago than the delivery deadline.
    pub overdue: Vec<u8>,
    /// A request left past a deadline its gate had to hold it to.
    pub late: bool,
    /// A request left with a member no longer wanted a freshness before it.
    pub stale_unwanted: bool,
    pub double: bool,
    pub unwanted: bool,
    pub past_window: bool,
    /// Per application event: bodies written to its record so far, and the body its
    /// requests carried (0: none posted yet).
    pub app_writes: Vec<u8>,
    pub app_posted: Vec<u8>,
    /// Application events the application has taken.
    pub app_taken: u8,
    /// Application events the application answered 410 Gone: it answers so again (a
    /// 410 is permanent), and never takes them.
    pub app_gone: u8,
    /// An event id was posted with two different bodies.
    pub two_bodies: bool,
    /// Per Web Push delivery: the browsers that have it (took a request), and those whose
    /// 201 the holder recorded (marked, acknowledged).
    pub push_shown: Vec<u8>,
    pub push_marked: Vec<u8>,
    /// A browser was posted to again after its 201 was recorded.
    pub reposted: bool,
    /// Per Web Push delivery: the browsers that answered 410 (and always will).
    pub push_gone: Vec<u8>,
    /// Deliveries whose trace expired.
    pub expired: u8,
    /// A kick was accepted for a delivery whose trace had expired.
    pub rekicked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    pub env: Env,
    pub nodes: Vec<Node>,
    pub holders: Vec<Holder>,
    /// Keys the provider remembers, with the body it answered for.
    pub provider: Vec<(Key, Vec<Member>)>,
    pub kicks: Vec<u8>,
    pub left: Budget,
    pub next_batch: u8,
    pub ghost: Ghost,
    /// Redis's clock, in logical steps.
    pub clock: u8,
}

/// settle.lua's modes: who records an outcome of a batch, and what it may find.
#[derive(Debug, Clone, Copy)]
enum Mode<'a> {
    /// 'answer': the provider's 2xx for the batch's key; anyone may record it.
    Answer,
    /// 'holder': a verdict without such an answer; only the batch's holder records it.
    Holder(u8),
    /// 'lost': the batch record is gone; its members (this body) are found by their `batch`.
    Lost(&'a [(u8, u8)]),
}

/// What the provider does with a request whose key it does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Accepted,
    /// Processed, but the answer was lost (a timeout after the provider sent).
    AnswerLost,
    /// Not processed, and the holder cannot tell (a timeout).
    TimedOut,
    /// 429 or a refused connection: not processed.
    RateLimited,
    /// A refusal of the sender (a domain not verified): not processed. Also possible for
    /// a key the provider knows: a refusal before the idempotency store is consulted (an
    /// API key rotated) proves nothing about the earlier request.
    Refused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Kick(u8),
    Claim(u8, u8),
    Seal(u8, u8),
    Gate(u8),
    Wait(u8, bool),
    Send(u8, Outcome),
    Record(u8),
    Take(u8, u8, u8),
    /// Holder h posts application event d; the application answers.
    Post(u8, u8, AppAnswer),
    /// Holder h records the answer for event d: decide.lua or defer.lua.
    Decide(u8, u8),
    /// Holder h finds its lease on Web Push delivery d still held (renew.lua), and its
    /// requests to the browsers it asks leave.
    PushSend(u8, u8),
    /// Browser b's push service answers holder h's request for d.
    PushPost(u8, u8, u8, AppAnswer),
    /// Holder h records what d's browsers answered (marks, removals, WAIT), then decide.lua
    /// or defer.lua.
    PushSettle(u8, u8),
    Crash(u8),
    Stall(u8),
    Resume(u8),
    Lag(u8),
    Failover(u8),
    Unsubscribe(u8),
    Suppress(u8),
    Pause,
    Unpause,
    WindowPasses(u8, u8),
    /// Batch b's delivery deadline passes (since it was first sealed).
    DeadlinePasses(u8),
    /// The maybe-sent deadline of batch b's version v passes (since that key was sealed).
    UnsurePasses(u8, u8),
    /// Holder h's slot moves past its gate's freshness.
    Stale(u8),
    /// Redis's clock moves on one step.
    Tick,
}

fn holder_name(h: u8) -> char {
    (b'A' + h) as char
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Kick(d) => write!(f, "kick: enqueue.lua(d{d})"),
            Action::Claim(h, p) => {
                write!(f, "{}: XREADGROUP/XAUTOCLAIM + claim.lua(partition {p}) + resolve", holder_name(h))
            }
            Action::Seal(h, p) => write!(f, "{}: seal.lua(partition {p})", holder_name(h)),
            Action::Gate(h) => write!(f, "{}: gate.lua", holder_name(h)),
            Action::Wait(h, true) => write!(f, "{}: WAIT 1 -> acknowledged", holder_name(h)),
            Action::Wait(h, false) => {
                write!(f, "{}: WAIT 1 -> not acknowledged, reschedule.lua (put back)", holder_name(h))
            }
            Action::Send(h, o) => write!(f, "{}: POST /emails/batch -> {o:?}", holder_name(h)),
            Action::Record(h) => {
                write!(f, "{}: record the answer (settle.lua / reschedule.lua / fallback.lua)", holder_name(h))
            }
            Action::Take(h, p, b) => write!(f, "{}: take.lua(partition {p}, batch {b})", holder_name(h)),
            Action::Post(h, d, a) => write!(f, "{}: POST event d{d} to the application -> {a:?}", holder_name(h)),
            Action::Decide(h, d) => {
                write!(f, "{}: record the application's answer for d{d} (decide.lua / defer.lua)", holder_name(h))
            }
            Action::PushSend(h, d) => {
                write!(f, "{}: renew.lua(d{d}) -> held; POST its notification to each browser asked", holder_name(h))
            }
            Action::PushPost(h, d, b, a) => {
                write!(f, "{}: browser {b}'s push service answers d{d}'s request -> {a:?}", holder_name(h))
            }
            Action::PushSettle(h, d) => write!(
                f,
                "{}: note.lua marks + HDEL gone browsers + WAIT, then decide.lua / defer.lua for d{d} (or, its lease lost before sending, nothing)",
                holder_name(h)
            ),
            Action::Crash(h) => write!(f, "{} crashes (kill -9)", holder_name(h)),
            Action::Stall(h) => write!(f, "{} stalls (leases run out)", holder_name(h)),
            Action::Resume(h) => write!(f, "{} resumes where it stalled", holder_name(h)),
            Action::Lag(p) => write!(f, "partition {p}: replication falls behind"),
            Action::Failover(p) => write!(f, "partition {p}: primary lost, unreplicated writes gone"),
            Action::Unsubscribe(d) => write!(f, "subscriber of d{d} unsubscribes (acknowledged)"),
            Action::Suppress(a) => {
                write!(f, "address {a} suppressed by a webhook (cascade.lua everywhere, acknowledged)")
            }
            Action::Pause => write!(f, "quota pause (pause.lua in every partition)"),
            Action::Unpause => write!(f, "mailstream resume"),
            Action::WindowPasses(b, v) => {
                write!(f, "the resend window of batch {b} v{v} passes (the provider forgets it)")
            }
            Action::DeadlinePasses(b) => write!(f, "the delivery deadline of batch {b} passes (since first sealed)"),
            Action::UnsurePasses(b, v) => write!(f, "the maybe-sent deadline of batch {b} v{v} passes"),
            Action::Stale(h) => {
                write!(f, "{}: its slot moves past the gate's freshness (the limiter's wait)", holder_name(h))
            }
            Action::Tick => write!(
                f,
                "Redis's clock moves on a step (the period starts at {PERIOD_START}, its kick window ends at {}; traces kept until now expire)",
                PERIOD_START + RETENTION
            ),
        }
    }
}

/// The protocol with its bound, and an optional mutant.
#[derive(Clone, Debug)]
pub struct Protocol {
    pub deliveries: Vec<Delivery>,
    pub partitions: u8,
    pub budget: Budget,
    /// The environments explored (each an initial state).
    pub envs: Vec<Env>,
    pub mutant: Option<Mutant>,
    /// Whether `every_delivery_is_settled` is checked: not in a random simulation, which
    /// ends a trace at the first state it saw before (a loop, not an end) and would
    /// report that as a path that never settles.
    pub liveness: bool,
}

fn bit(i: u8) -> u8 {
    1 << i
}

impl Protocol {
    fn on(&self, m: Mutant) -> bool {
        self.mutant == Some(m)
    }

    /// Whether the record alone says "may have been sent" (the holder's knowledge, from
    /// the record it took the batch with, is not passed to the gate and reschedule.lua).
    fn forgets(&self) -> bool {
        self.on(Mutant::GateForgetsWhatTheHolderKnows)
    }

    /// Partition `p`'s keys at first.
    fn data(&self, p: u8) -> Data {
        Data {
            recs: vec![Rec::Absent; self.deliveries.len()],
            unacked: 0,
            batches: Vec::new(),
            unsubscribed: 0,
            subscriber_suppressed: 0,
            suppressed: 0,
            paused: false,
            app_body: vec![0; self.deliveries.len()],
            push_marks: vec![0; self.deliveries.len()],
            push_subs: self
                .deliveries
                .iter()
                .map(|d| if d.lane == Lane::Push && d.partition == p { BROWSERS } else { 0 })
                .collect(),
            maybe_taken: 0,
            push_inflight: vec![0; self.deliveries.len()],
            expires: [0; MAX_DELIVERIES],
        }
    }

    /// The deliveries of partition `p` that holder `h` would claim now: entries not
    /// acknowledged whose record is pending, or held under a lease that ran out (read or
    /// XAUTOCLAIMed, then claim.lua, in one call for what one read returns).
    pub fn claimable(&self, s: &State, h: u8, p: u8) -> u8 {
        let live = &s.nodes[usize::from(p)].live;
        let holder = &s.holders[usize::from(h)];
        let mut found = 0;
        for d in 0..self.deliveries.len() as u8 {
            if self.partition(d) != usize::from(p)
                || live.unacked & bit(d) == 0
                || holder.claimed.iter().any(|&(c, _)| c == d)
                || holder.posting.iter().any(|&(c, ..)| c == d)
                || holder.pushing.iter().any(|x| x.delivery == d)
            {
                continue;
            }
            let claimable = match live.recs[usize::from(d)] {
                Rec::Pending => true,
                Rec::Processing(o) => {
                    Self::delivery_lease_lapsed(s, o, d) || (o != h && self.on(Mutant::ClaimIgnoresLease))
                }
                _ => false,
            };
            if claimable {
                found |= bit(d);
            }
        }
        found
    }

    pub fn partition(&self, d: u8) -> usize {
        usize::from(self.deliveries[usize::from(d)].partition)
    }

    fn operator(&self, d: u8) -> bool {
        self.deliveries[usize::from(d)].operator
    }

    /// What seal.lua is given for partition `p` from what a holder claimed (the batcher's
    /// take): one operator email alone, or else every other email of the partition; the
    /// rest stays claimed.
    pub fn sealable(&self, claimed: &[Member], p: u8) -> (Vec<Member>, Vec<Member>) {
        let (mut mine, mut rest): (Vec<Member>, Vec<Member>) =
            claimed.iter().partition(|&&(d, _)| self.partition(d) == usize::from(p));
        if let Some(i) = mine.iter().position(|&(d, _)| self.operator(d)) {
            let alone = mine.remove(i);
            rest.extend(mine);
            mine = vec![alone];
        }
        (mine, rest)
    }

    /// Whether a member was no longer wanted as acknowledged: its subscriber unsubscribed
    /// (campaign mail) or its address suppressed (any lane).
    fn ghost_unwanted(&self, g: &Ghost, (d, address): (u8, u8)) -> bool {
        let digest = self.deliveries[usize::from(d)].lane == Lane::Digest;
        (digest && g.unsubscribed & bit(d) != 0) || g.suppressed & bit(address) != 0
    }

    /// Whether a request of `b`'s key is between its gate and leaving.
    fn in_flight(s: &State, b: &Batch) -> bool {
        s.holders.iter().any(|x| {
            x.hand.as_ref().is_some_and(|h| {
                (h.batch, h.version) == (b.id, b.version) && matches!(h.phase, Phase::Gated | Phase::Ready)
            })
        })
    }

    /// Whether holder `h` no longer renews what it held (its leases may run out).
    fn lapsed(s: &State, h: u8) -> bool {
        s.holders[usize::from(h)].status != Status::Running
    }

    /// Whether the lease on delivery `d`, held by `h`, may have run out: `h` does not
    /// renew it (not running, or no longer holding `d` in its queues or hand).
    fn delivery_lease_lapsed(s: &State, h: u8, d: u8) -> bool {
        let holder = &s.holders[usize::from(h)];
        Self::lapsed(s, h)
            || (!holder.claimed.iter().any(|&(c, _)| c == d)
                && !holder.posting.iter().any(|&(c, ..)| c == d)
                && !holder.pushing.iter().any(|x| x.delivery == d)
                && !holder.hand.as_ref().is_some_and(|hand| hand.body.iter().any(|&(m, _)| m == d)))
    }

    fn batch_lease_lapsed(s: &State, b: &Batch) -> bool {
        let holder = &s.holders[usize::from(b.owner)];
        Self::lapsed(s, b.owner) || holder.hand.as_ref().is_none_or(|hand| hand.batch != b.id)
    }

    /// settle.lua in `mode`: each member still sealed into the batch gets `rec`, and the
    /// batch is deleted; by a holder, only while it holds the batch; for a lost batch, the
    /// members (found by their `batch` field) are those of the hand that held it. (An
    /// answer for a batch whose record is gone is `Action::Record`'s.)
    fn settle_members(data: &mut Data, id: u8, mode: Mode<'_>, rec: impl Fn(u8) -> Rec) {
        let members: Vec<u8> = match mode {
            Mode::Lost(body) => body.iter().map(|&(d, _)| d).collect(),
            Mode::Answer | Mode::Holder(_) => {
                let Some(i) = data.batches.iter().position(|b| b.id == id) else { return };
                if let Mode::Holder(h) = mode
                    && data.batches[i].owner != h
                {
                    return;
                }
                data.batches.remove(i).body.iter().map(|&(d, _)| d).collect()
            }
        };
        for d in members {
            if data.recs[usize::from(d)] == Rec::Sealed(id) {
                data.recs[usize::from(d)] = rec(d);
            }
        }
    }

    /// reschedule.lua: kept sealed and due again, if `h` still holds it.
    fn reschedule(data: &mut Data, id: u8, h: u8, maybe_sent: bool) {
        if let Some(b) = data.batches.iter_mut().find(|b| b.id == id && b.owner == h) {
            b.state = BatchState::Retry;
            b.maybe_sent |= maybe_sent;
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        self.envs
            .iter()
            .map(|&env| {
                let mut left = self.budget;
                if env == Env::LostWrites {
                    // One server, relaxed durability: see [`Env::LostWrites`].
                    left.crashes = 0;
                    left.stalls = 0;
                    left.unsubscribes = 0;
                    left.suppressions = 0;
                    left.windows = 0;
                    left.wait_failures = 0;
                    left.failures = 0;
                }
                let holder = Holder {
                    status: Status::Running,
                    claimed: Vec::new(),
                    hand: None,
                    posting: Vec::new(),
                    pushing: Vec::new(),
                };
                let mut holders = vec![holder; HOLDERS];
                if env == Env::LostWrites {
                    // One instance: a second one could claim what a restart put back before
                    // the first recorded its answer.
                    holders.truncate(1);
                }
                State {
                    env,
                    nodes: (0..self.partitions)
                        .map(|p| Node { live: self.data(p), safe: self.data(p), lagging: false })
                        .collect(),
                    holders,
                    provider: Vec::new(),
                    kicks: vec![0; self.deliveries.len()],
                    left,
                    next_batch: 0,
                    ghost: Ghost {
                        sent: vec![0; self.deliveries.len()],
                        unsubscribed: 0,
                        suppressed: 0,
                        left: Vec::new(),
                        old: Vec::new(),
                        unsure: Vec::new(),
                        overdue: Vec::new(),
                        late: false,
                        stale_unwanted: false,
                        double: false,
                        unwanted: false,
                        past_window: false,
                        app_writes: vec![0; self.deliveries.len()],
                        app_posted: vec![0; self.deliveries.len()],
                        app_taken: 0,
                        app_gone: 0,
                        two_bodies: false,
                        push_shown: vec![0; self.deliveries.len()],
                        push_marked: vec![0; self.deliveries.len()],
                        reposted: false,
                        push_gone: vec![0; self.deliveries.len()],
                        expired: 0,
                        rekicked: false,
                    },
                    clock: 0,
                }
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let n = self.deliveries.len() as u8;
        // enqueue.lua refuses a kick once its period's window has ended (nothing written).
        let open = s.clock < PERIOD_START + RETENTION;
        for d in 0..n {
            let first = s.kicks[usize::from(d)] == 0;
            if open && (first || s.kicks[usize::from(d)] < s.left.kicks) {
                actions.push(Action::Kick(d));
            }
        }
        if s.left.ticks > 0 {
            actions.push(Action::Tick);
        }
        for h in 0..s.holders.len() as u8 {
            let holder = &s.holders[usize::from(h)];
            match holder.status {
                Status::Running => {}
                Status::Stalled => {
                    actions.push(Action::Resume(h));
                    continue;
                }
                Status::Dead => continue,
            }
            for p in 0..self.partitions {
                if self.claimable(s, h, p) != 0 {
                    actions.push(Action::Claim(h, p));
                }
            }
            for x in &holder.pushing {
                let d = x.delivery;
                if !x.sent {
                    let held = s.nodes[self.partition(d)].live.recs[usize::from(d)] == Rec::Processing(h);
                    actions.push(if held { Action::PushSend(h, d) } else { Action::PushSettle(h, d) });
                    continue;
                }
                let open = x.asked & !x.answered;
                if open == 0 {
                    actions.push(Action::PushSettle(h, x.delivery));
                }
                for b in (0..8u8).filter(|&b| open & bit(b) != 0) {
                    if (GONE | s.ghost.push_gone[usize::from(d)]) & bit(b) != 0 {
                        actions.push(Action::PushPost(h, x.delivery, b, AppAnswer::Gone));
                        continue;
                    }
                    actions.push(Action::PushPost(h, x.delivery, b, AppAnswer::Taken));
                    if s.left.failures > 0 {
                        actions.push(Action::PushPost(h, x.delivery, b, AppAnswer::Again));
                        actions.push(Action::PushPost(h, x.delivery, b, AppAnswer::TakenAnswerLost));
                        // The browser unsubscribed meanwhile (perhaps after it took this).
                        actions.push(Action::PushPost(h, x.delivery, b, AppAnswer::Gone));
                    }
                }
            }
            for &(d, _, answer) in &holder.posting {
                match answer {
                    Some(_) => actions.push(Action::Decide(h, d)),
                    None if s.ghost.app_gone & bit(d) != 0 => actions.push(Action::Post(h, d, AppAnswer::Gone)),
                    None => {
                        actions.push(Action::Post(h, d, AppAnswer::Taken));
                        if s.left.failures > 0 {
                            actions.push(Action::Post(h, d, AppAnswer::Again));
                            actions.push(Action::Post(h, d, AppAnswer::TakenAnswerLost));
                            // An application that took the event answers 200 again.
                            if s.ghost.app_taken & bit(d) == 0 {
                                actions.push(Action::Post(h, d, AppAnswer::Gone));
                            }
                        }
                    }
                }
            }
            match &holder.hand {
                None => {
                    for p in 0..self.partitions {
                        if holder.claimed.iter().any(|&(d, _)| self.partition(d) == usize::from(p)) {
                            actions.push(Action::Seal(h, p));
                        }
                        for b in &s.nodes[usize::from(p)].live.batches {
                            if b.state == BatchState::Retry || Self::batch_lease_lapsed(s, b) {
                                actions.push(Action::Take(h, p, b.id));
                            }
                        }
                    }
                }
                Some(hand) => {
                    // The limiter's wait moves a slot past the gate's freshness: the
                    // dispatcher looks again before the request leaves.
                    if matches!(hand.phase, Phase::Gated | Phase::Ready) && s.left.stales > 0 {
                        actions.push(Action::Stale(h));
                    }
                    match hand.phase {
                        Phase::ToGate => actions.push(Action::Gate(h)),
                        Phase::Gated => {
                            actions.push(Action::Wait(h, true));
                            if s.left.wait_failures > 0 {
                                actions.push(Action::Wait(h, false));
                            }
                        }
                        Phase::Ready => {
                            actions.push(Action::Send(h, Outcome::Accepted));
                            if s.left.failures > 0 {
                                if s.provider.iter().any(|(k, _)| *k == (hand.batch, hand.version)) {
                                    actions.push(Action::Send(h, Outcome::Refused));
                                } else {
                                    for o in
                                        [Outcome::AnswerLost, Outcome::TimedOut, Outcome::RateLimited, Outcome::Refused]
                                    {
                                        actions.push(Action::Send(h, o));
                                    }
                                }
                            }
                        }
                        Phase::Answered(_) => actions.push(Action::Record(h)),
                    }
                }
            }
            let others_alive =
                s.holders.iter().enumerate().any(|(o, x)| o != usize::from(h) && x.status != Status::Dead);
            if s.left.crashes > 0 && others_alive {
                actions.push(Action::Crash(h));
            }
            if s.left.stalls > 0 {
                actions.push(Action::Stall(h));
            }
        }
        // With one server that loses what it did not fsync, nothing written can be counted
        // on (a lost settle sends again): relaxed durability is checked only where the
        // protocol still claims something, a restart while an answer is on its way.
        let answered =
            s.holders.iter().any(|x| x.hand.as_ref().is_some_and(|hand| matches!(hand.phase, Phase::Answered(_))));
        for p in 0..self.partitions {
            let node = &s.nodes[usize::from(p)];
            if node.lagging {
                if s.env == Env::Replicated || answered {
                    actions.push(Action::Failover(p));
                }
            } else if s.left.failovers > 0 {
                actions.push(Action::Lag(p));
            }
            if s.left.windows > 0 {
                // Not between a key's gate and its request: the resend window ends an hour
                // (by default) before the provider's, and that margin is what a request
                // gated just before the end has to leave in (a stall longer than it is
                // outside the model).
                for b in &node.live.batches {
                    if !s.ghost.old.contains(&(b.id, b.version)) && !Self::in_flight(s, b) {
                        actions.push(Action::WindowPasses(b.id, b.version));
                    }
                }
            }
            if s.left.deadlines > 0 {
                // Hours, not between a gate and its request (which leaves within a
                // freshness and a second look of it), as the window above.
                for b in node.live.batches.iter().filter(|b| !Self::in_flight(s, b)) {
                    if !s.ghost.overdue.contains(&b.id) {
                        actions.push(Action::DeadlinePasses(b.id));
                    }
                    let key = (b.id, b.version);
                    if !s.ghost.unsure.contains(&key) && !s.ghost.old.contains(&key) {
                        actions.push(Action::UnsurePasses(b.id, b.version));
                    }
                }
            }
        }
        if s.nodes.iter().any(|node| node.live.paused) {
            actions.push(Action::Unpause);
        } else if s.left.pauses > 0 {
            actions.push(Action::Pause);
        }
        if s.left.unsubscribes > 0 {
            for d in 0..n {
                let lane = self.deliveries[usize::from(d)].lane;
                if matches!(lane, Lane::Digest | Lane::App | Lane::Push) && s.ghost.unsubscribed & bit(d) == 0 {
                    actions.push(Action::Unsubscribe(d));
                }
            }
        }
        if s.left.suppressions > 0 {
            let mut seen = 0u8;
            for spec in &self.deliveries {
                if seen & bit(spec.address) == 0 && s.ghost.suppressed & bit(spec.address) == 0 {
                    seen |= bit(spec.address);
                    actions.push(Action::Suppress(spec.address));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Kick(d) => {
                s.kicks[usize::from(d)] += 1;
                let node = &mut s.nodes[self.partition(d)];
                // enqueue.lua (ingest.lua for a receipt): HSETNX on the record (its natural
                // key) and XADD, one step for every channel of the key; then WAIT before the
                // kick (or the ingest API) says it is enqueued.
                for e in std::iter::once(d).chain(self.deliveries[usize::from(d)].sibling) {
                    // Accepted (the window is open) for a delivery whose dedup is gone.
                    s.ghost.rekicked |= s.ghost.expired & bit(e) != 0;
                    let forgotten = self.on(Mutant::KickForgetsSettledHistory)
                        && matches!(node.live.recs[usize::from(e)], Rec::Sent | Rec::Skipped);
                    if node.live.recs[usize::from(e)] == Rec::Absent || forgotten {
                        node.live.recs[usize::from(e)] = Rec::Pending;
                        node.live.unacked |= bit(e);
                    }
                }
                if !self.on(Mutant::AcknowledgedWritesNotWaited) {
                    node.safe = node.live.clone();
                }
            }
            Action::Claim(h, p) => {
                let claimable = self.claimable(&s, h, p);
                let live = &mut s.nodes[usize::from(p)].live;
                for d in (0..self.deliveries.len() as u8).filter(|&d| claimable & bit(d) != 0) {
                    let spec = self.deliveries[usize::from(d)];
                    live.recs[usize::from(d)] = Rec::Processing(h);
                    // Resolved at once: the subscriber record, or a transactional address.
                    let unwanted = match spec.lane {
                        Lane::Digest | Lane::App | Lane::Push => {
                            (live.unsubscribed | live.subscriber_suppressed) & bit(d) != 0
                        }
                        Lane::Transactional => live.suppressed & bit(spec.address) != 0,
                    };
                    if unwanted {
                        // decide.lua, the entry acknowledged: skipped, or for an event whose
                        // body is written (a request of it may have been taken) outcome_unknown.
                        let posted = matches!(spec.lane, Lane::App | Lane::Push) && live.app_body[usize::from(d)] != 0;
                        live.recs[usize::from(d)] = if posted { Rec::Unknown } else { Rec::Skipped };
                        live.unacked &= !bit(d);
                    } else if matches!(spec.lane, Lane::App | Lane::Push) {
                        // The body, first writer wins (HSETNX), read back.
                        let body = &mut live.app_body[usize::from(d)];
                        if *body == 0 || self.on(Mutant::AppBodyRewritten) {
                            let writes = &mut s.ghost.app_writes[usize::from(d)];
                            *writes += 1;
                            *body = *writes;
                        }
                        let body = *body;
                        if spec.lane == Lane::App {
                            s.holders[usize::from(h)].posting.push((d, body, None));
                        } else {
                            // Whom it asks is read when its requests leave.
                            let x = Pushing {
                                delivery: d,
                                body,
                                sent: false,
                                asked: 0,
                                answered: 0,
                                taken: 0,
                                gone: 0,
                                again: 0,
                                lost: 0,
                            };
                            s.holders[usize::from(h)].pushing.push(x);
                        }
                    } else {
                        s.holders[usize::from(h)].claimed.push((d, spec.address));
                    }
                }
                // WAIT before any event's request leaves: its body survives a failover.
                let holder = &s.holders[usize::from(h)];
                let posting = holder.posting.iter().any(|&(d, ..)| self.partition(d) == usize::from(p))
                    || holder.pushing.iter().any(|x| self.partition(x.delivery) == usize::from(p));
                if posting && s.env == Env::Replicated && !self.on(Mutant::AppBodyNotWaited) {
                    let node = &mut s.nodes[usize::from(p)];
                    node.safe = node.live.clone();
                }
            }
            Action::Post(h, d, answer) => {
                let holder = &mut s.holders[usize::from(h)];
                let i = holder.posting.iter().position(|&(c, ..)| c == d).expect("posting it");
                let body = holder.posting[i].1;
                holder.posting[i].2 = Some(answer);
                let again_gone = answer == AppAnswer::Gone && s.ghost.app_gone & bit(d) != 0;
                if answer != AppAnswer::Taken && !again_gone {
                    s.left.failures -= 1;
                }
                if answer == AppAnswer::Gone {
                    s.ghost.app_gone |= bit(d);
                }
                let posted = &mut s.ghost.app_posted[usize::from(d)];
                if *posted == 0 {
                    *posted = body;
                } else if *posted != body {
                    s.ghost.two_bodies = true;
                }
                if matches!(answer, AppAnswer::Taken | AppAnswer::TakenAnswerLost) {
                    s.ghost.app_taken |= bit(d);
                }
            }
            Action::Decide(h, d) => {
                let holder = &mut s.holders[usize::from(h)];
                let i = holder.posting.iter().position(|&(c, ..)| c == d).expect("posting it");
                let (_, _, answer) = holder.posting.remove(i);
                let live = &mut s.nodes[self.partition(d)].live;
                // Only what this holder still holds changes.
                if live.recs[usize::from(d)] == Rec::Processing(h) {
                    match answer.expect("answered") {
                        AppAnswer::Taken => {
                            // decide.lua settles it compactly: the record, body and all, goes.
                            live.recs[usize::from(d)] = Rec::Sent;
                            live.app_body[usize::from(d)] = 0;
                        }
                        AppAnswer::Gone => live.recs[usize::from(d)] = Rec::Failed,
                        // defer.lua: pending again, due later (a fresh entry then).
                        AppAnswer::Again | AppAnswer::TakenAnswerLost => {
                            live.recs[usize::from(d)] = Rec::Pending;
                            live.unacked |= bit(d);
                        }
                    }
                    if live.recs[usize::from(d)].is_final() {
                        live.unacked &= !bit(d);
                    }
                }
            }
            Action::PushSend(h, d) => {
                // Its flag, waited for; then every browser subscribed that no mark says took
                // it, read as the requests leave.
                let node = &mut s.nodes[self.partition(d)];
                node.live.push_inflight[usize::from(d)] |= bit(h);
                if s.env == Env::Replicated {
                    node.safe = node.live.clone();
                }
                let asked = node.live.push_subs[usize::from(d)] & !node.live.push_marks[usize::from(d)];
                let holder = &mut s.holders[usize::from(h)];
                let x = holder.pushing.iter_mut().find(|x| x.delivery == d).expect("pushing it");
                x.sent = true;
                x.asked = asked;
                if s.ghost.push_marked[usize::from(d)] & x.asked != 0 {
                    s.ghost.reposted = true;
                }
                let body = x.body;
                if x.asked != 0 {
                    let posted = &mut s.ghost.app_posted[usize::from(d)];
                    if *posted == 0 {
                        *posted = body;
                    } else if *posted != body {
                        s.ghost.two_bodies = true;
                    }
                }
            }
            Action::PushPost(h, d, b, answer) => {
                let holder = &mut s.holders[usize::from(h)];
                let x = holder.pushing.iter_mut().find(|x| x.delivery == d).expect("pushing it");
                x.answered |= bit(b);
                match answer {
                    AppAnswer::Taken => x.taken |= bit(b),
                    AppAnswer::Gone => x.gone |= bit(b),
                    AppAnswer::Again => x.again |= bit(b),
                    AppAnswer::TakenAnswerLost => {
                        x.again |= bit(b);
                        x.lost |= bit(b);
                    }
                }
                // push/mod.rs `record`: the answer is written as it arrives (note.lua onto a
                // record that is there: one settled sent or skipped is compact, none), a
                // gone browser leaves the registry, and the write is WAITed for.
                let node = &mut s.nodes[self.partition(d)];
                let live = &mut node.live;
                let record = !matches!(live.recs[usize::from(d)], Rec::Absent | Rec::Sent | Rec::Skipped);
                match answer {
                    AppAnswer::Taken if record => live.push_marks[usize::from(d)] |= bit(b),
                    AppAnswer::Gone => live.push_subs[usize::from(d)] &= !bit(b),
                    AppAnswer::TakenAnswerLost if record => live.maybe_taken |= bit(d),
                    _ => {}
                }
                if answer == AppAnswer::Taken {
                    s.ghost.push_marked[usize::from(d)] |= bit(b);
                }
                if matches!(answer, AppAnswer::Taken | AppAnswer::Gone)
                    && s.env == Env::Replicated
                    && !self.on(Mutant::PushMarksNotWaited)
                {
                    node.safe = node.live.clone();
                }
                let gone_before = (GONE | s.ghost.push_gone[usize::from(d)]) & bit(b) != 0;
                if answer != AppAnswer::Taken && !gone_before {
                    s.left.failures -= 1;
                }
                if answer == AppAnswer::Gone {
                    s.ghost.push_gone[usize::from(d)] |= bit(b);
                }
                if matches!(answer, AppAnswer::Taken | AppAnswer::TakenAnswerLost) {
                    s.ghost.push_shown[usize::from(d)] |= bit(b);
                }
            }
            Action::PushSettle(h, d) => {
                let holder = &mut s.holders[usize::from(h)];
                let i = holder.pushing.iter().position(|x| x.delivery == d).expect("pushing it");
                let x = holder.pushing.remove(i);
                if !x.sent {
                    // Its lease ran out before its requests left: nothing is written.
                    return Some(self.replicate(s));
                }
                // Every answer is recorded (PushPost): this holder's requests are no longer
                // in doubt. WAIT: the marks survive a failover before anything is decided.
                let node = &mut s.nodes[self.partition(d)];
                node.live.push_inflight[usize::from(d)] &= !bit(h);
                if s.env == Env::Replicated && !self.on(Mutant::PushMarksNotWaited) {
                    node.safe = node.live.clone();
                }
                let live = &mut node.live;
                if live.recs[usize::from(d)] == Rec::Processing(h) {
                    let marked = live.push_marks[usize::from(d)] != 0;
                    live.recs[usize::from(d)] = if x.again != 0 {
                        // defer.lua: pending again, due later (a fresh entry then).
                        Rec::Pending
                    } else if marked {
                        Rec::Sent
                    } else if live.maybe_taken & bit(d) != 0 || live.push_inflight[usize::from(d)] != 0 {
                        // None left, but an unanswered request, or one of a holder that never
                        // recorded its answers, may have reached one.
                        Rec::Unknown
                    } else {
                        // None left to take it: skipped, no_subscription.
                        Rec::Skipped
                    };
                    if matches!(live.recs[usize::from(d)], Rec::Sent | Rec::Skipped) {
                        // decide.lua settles it compactly: the record, marks and all, goes.
                        live.app_body[usize::from(d)] = 0;
                        live.push_marks[usize::from(d)] = 0;
                        live.maybe_taken &= !bit(d);
                        live.push_inflight[usize::from(d)] = 0;
                    }
                    if live.recs[usize::from(d)].is_final() {
                        live.unacked &= !bit(d);
                    } else {
                        live.unacked |= bit(d);
                    }
                }
            }
            Action::Seal(h, p) => {
                let id = s.next_batch;
                let holder = &mut s.holders[usize::from(h)];
                let (mine, rest) = self.sealable(&holder.claimed, p);
                holder.claimed = rest;
                let live = &mut s.nodes[usize::from(p)].live;
                let body: Vec<(u8, u8)> =
                    mine.into_iter().filter(|&(d, _)| live.recs[usize::from(d)] == Rec::Processing(h)).collect();
                if !body.is_empty() {
                    for &(d, _) in &body {
                        live.recs[usize::from(d)] = Rec::Sealed(id);
                        live.unacked &= !bit(d);
                    }
                    live.batches.push(Batch {
                        id,
                        version: 0,
                        body: body.clone(),
                        state: BatchState::Sealed,
                        owner: h,
                        maybe_sent: false,
                        fallback: false,
                    });
                    s.next_batch += 1;
                    let hand = Hand {
                        partition: p,
                        batch: id,
                        version: 0,
                        body,
                        maybe_sent: false,
                        phase: Phase::ToGate,
                        gated_unwanted: false,
                        fallback: false,
                        late: false,
                        stale_unwanted: false,
                    };
                    s.holders[usize::from(h)].hand = Some(hand);
                }
            }
            Action::Gate(h) => self.gate(&mut s, h),
            Action::Wait(h, acked) => {
                let hand = s.holders[usize::from(h)].hand.clone().expect("a hand");
                let node = &mut s.nodes[usize::from(hand.partition)];
                if acked {
                    // Answered by the partition's node: its replica has every write so far.
                    if !self.on(Mutant::WaitAnsweredElsewhere) {
                        node.safe = node.live.clone();
                    }
                    // The gate's write must still be there: a failover between the gate and
                    // WAIT leaves a new primary whose WAIT acknowledges without it.
                    let held = node.live.batches.iter().any(|b| {
                        b.id == hand.batch
                            && b.version == hand.version
                            && b.owner == h
                            && b.state == BatchState::Sending
                    });
                    let hand_ref = s.holders[usize::from(h)].hand.as_mut().expect("a hand");
                    if held || self.on(Mutant::WaitWithoutRecheck) {
                        hand_ref.phase = Phase::Ready;
                    } else {
                        s.holders[usize::from(h)].hand = None;
                    }
                } else {
                    s.left.wait_failures -= 1;
                    Self::reschedule(&mut node.live, hand.batch, h, hand.maybe_sent && !self.forgets());
                    s.holders[usize::from(h)].hand = None;
                }
            }
            Action::Send(h, outcome) => {
                let hand = s.holders[usize::from(h)].hand.clone().expect("a hand");
                s.ghost.late |= hand.late;
                s.ghost.stale_unwanted |= hand.stale_unwanted;
                let key = (hand.batch, hand.version);
                if s.ghost.left.contains(&key) && s.ghost.old.contains(&key) {
                    s.ghost.past_window = true;
                }
                // A request that may have been processed, as far as anyone can tell.
                let maybe = matches!(outcome, Outcome::Accepted | Outcome::AnswerLost | Outcome::TimedOut);
                if maybe && !s.ghost.left.contains(&key) {
                    s.ghost.left.push(key);
                }
                let answer = match s.provider.iter().find(|(k, _)| *k == key) {
                    // Refused before the idempotency store is consulted.
                    Some(_) if outcome == Outcome::Refused => {
                        s.left.failures -= 1;
                        Answer::Refused
                    }
                    // A replay: the same key and body answer as before, no new send.
                    Some((_, body)) if *body == hand.body => Answer::Accepted,
                    // 409 invalid_idempotent_request.
                    Some(_) => Answer::Fatal,
                    None => {
                        let processed = matches!(outcome, Outcome::Accepted | Outcome::AnswerLost);
                        if outcome != Outcome::Accepted {
                            s.left.failures -= 1;
                        }
                        if processed {
                            s.provider.push((key, hand.body.clone()));
                            for &(d, _) in &hand.body {
                                let n = &mut s.ghost.sent[usize::from(d)];
                                *n += 1;
                                s.ghost.double |= *n > 1;
                            }
                            s.ghost.unwanted |= hand.gated_unwanted;
                        }
                        match outcome {
                            Outcome::Accepted => Answer::Accepted,
                            Outcome::AnswerLost | Outcome::TimedOut => Answer::Timeout,
                            Outcome::RateLimited => Answer::Retry,
                            Outcome::Refused => Answer::Refused,
                        }
                    }
                };
                s.holders[usize::from(h)].hand.as_mut().expect("a hand").phase = Phase::Answered(answer);
            }
            Action::Record(h) => {
                let hand = s.holders[usize::from(h)].hand.take().expect("a hand");
                let Phase::Answered(answer) = hand.phase else { unreachable!("recorded after an answer") };
                let live = &mut s.nodes[usize::from(hand.partition)].live;
                let present = live.batches.iter().any(|b| b.id == hand.batch);
                if answer == Answer::Refused && self.fall_back(live, &hand, h) {
                    // Sealed again, still in hand: its gate is next.
                    let version = hand.version + 1;
                    let hand = Hand { version, phase: Phase::ToGate, fallback: true, ..hand };
                    s.holders[usize::from(h)].hand = Some(hand);
                    return Some(s).map(|s| self.replicate(s));
                }
                match answer {
                    Answer::Accepted if present => Self::settle_members(live, hand.batch, Mode::Answer, |_| Rec::Sent),
                    Answer::Accepted => {
                        // settle.lua: the record is gone (a lost write); the answer is still
                        // recorded on every member not yet final, so none is sent again.
                        if !self.on(Mutant::MissingBatchReadAsSettled) {
                            for &(d, _) in &hand.body {
                                let r = &mut live.recs[usize::from(d)];
                                if matches!(*r, Rec::Sealed(_) | Rec::Processing(_) | Rec::Pending) {
                                    *r = Rec::Sent;
                                    live.unacked &= !bit(d);
                                }
                            }
                        }
                    }
                    Answer::Timeout => Self::reschedule(live, hand.batch, h, true),
                    Answer::Retry => Self::reschedule(live, hand.batch, h, hand.maybe_sent && !self.forgets()),
                    Answer::Fatal | Answer::Refused => {
                        // The mutant records the verdict as if it were an answer: no holder.
                        let mode = if self.on(Mutant::VerdictWithoutHolder) { Mode::Answer } else { Mode::Holder(h) };
                        let maybe = hand.maybe_sent || live.batches.iter().any(|b| b.id == hand.batch && b.maybe_sent);
                        let verdict = if maybe { Rec::Unknown } else { Rec::Failed };
                        Self::settle_members(live, hand.batch, mode, |_| verdict);
                    }
                }
            }
            Action::Take(h, p, id) => {
                let live = &mut s.nodes[usize::from(p)].live;
                let i = live.batches.iter().position(|b| b.id == id).expect("a batch");
                let b = &mut live.batches[i];
                let sending = b.state == BatchState::Sending && !self.on(Mutant::TakeIgnoresSending);
                b.maybe_sent |= sending;
                b.owner = h;
                let (version, body, maybe_sent, fallback) = (b.version, b.body.clone(), b.maybe_sent, b.fallback);
                if maybe_sent && s.ghost.old.contains(&(id, version)) && !self.on(Mutant::NoResendWindow) {
                    // Expired: never resent blind; every member outcome_unknown.
                    Self::settle_members(live, id, Mode::Holder(h), |_| Rec::Unknown);
                } else {
                    live.batches[i].state = BatchState::Sealed;
                    let hand = Hand {
                        partition: p,
                        batch: id,
                        version,
                        body,
                        maybe_sent,
                        phase: Phase::ToGate,
                        gated_unwanted: false,
                        fallback,
                        late: false,
                        stale_unwanted: false,
                    };
                    s.holders[usize::from(h)].hand = Some(hand);
                }
            }
            Action::Crash(h) => {
                s.left.crashes -= 1;
                s.holders[usize::from(h)] = Holder {
                    status: Status::Dead,
                    claimed: Vec::new(),
                    hand: None,
                    posting: Vec::new(),
                    pushing: Vec::new(),
                };
            }
            Action::Stall(h) => {
                s.left.stalls -= 1;
                s.holders[usize::from(h)].status = Status::Stalled;
            }
            Action::Resume(h) => s.holders[usize::from(h)].status = Status::Running,
            Action::Lag(p) => {
                // One lag per failover to come: it ends in that failover.
                s.left.failovers -= 1;
                s.nodes[usize::from(p)].lagging = true;
            }
            Action::Failover(p) => {
                let node = &mut s.nodes[usize::from(p)];
                node.live = node.safe.clone();
                node.lagging = false;
            }
            Action::Unsubscribe(d) => {
                s.left.unsubscribes -= 1;
                let node = &mut s.nodes[self.partition(d)];
                node.live.unsubscribed |= bit(d);
                if !self.on(Mutant::AcknowledgedWritesNotWaited) {
                    node.safe = node.live.clone();
                }
                s.ghost.unsubscribed |= bit(d);
            }
            Action::Suppress(a) => {
                s.left.suppressions -= 1;
                for p in 0..usize::from(self.partitions) {
                    let node = &mut s.nodes[p];
                    node.live.suppressed |= bit(a);
                    for (d, spec) in self.deliveries.iter().enumerate() {
                        if spec.registry && spec.address == a && usize::from(spec.partition) == p {
                            // cascade.lua marks the subscriber suppressed and unsubscribed.
                            node.live.subscriber_suppressed |= bit(d as u8);
                            node.live.unsubscribed |= bit(d as u8);
                        }
                    }
                    if !self.on(Mutant::AcknowledgedWritesNotWaited) {
                        node.safe = node.live.clone();
                    }
                }
                s.ghost.suppressed |= bit(a);
            }
            Action::Pause => {
                s.left.pauses -= 1;
                for node in &mut s.nodes {
                    node.live.paused = true;
                }
            }
            Action::Unpause => {
                for node in &mut s.nodes {
                    node.live.paused = false;
                }
            }
            Action::DeadlinePasses(id) => {
                s.left.deadlines -= 1;
                s.ghost.overdue.push(id);
            }
            Action::UnsurePasses(id, version) => {
                s.left.deadlines -= 1;
                s.ghost.unsure.push((id, version));
            }
            Action::Stale(h) => {
                s.left.stales -= 1;
                let ghost = s.ghost.clone();
                let hand = s.holders[usize::from(h)].hand.as_mut().expect("a hand");
                if self.on(Mutant::SendsOnStaleGate) {
                    // Leaves on the old look: a member unwanted since is mailed.
                    hand.stale_unwanted |= hand.body.iter().any(|&m| self.ghost_unwanted(&ghost, m));
                } else {
                    hand.phase = Phase::ToGate;
                }
            }
            Action::WindowPasses(id, version) => {
                s.left.windows -= 1;
                s.ghost.old.push((id, version));
                s.provider.retain(|(k, _)| *k != (id, version));
            }
            Action::Tick => {
                s.left.ticks -= 1;
                s.clock += 1;
                for node in &mut s.nodes {
                    for data in [&mut node.live, &mut node.safe] {
                        for d in 0..self.deliveries.len() as u8 {
                            let e = data.expires[usize::from(d)];
                            if e != 0 && e <= s.clock {
                                Self::expire(data, d);
                                s.ghost.expired |= bit(d);
                            }
                        }
                    }
                }
            }
        }
        self.stamp(&mut s);
        Some(self.replicate(s))
    }

    fn format_action(&self, action: &Action) -> String {
        action.to_string()
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("no_delivery_really_sent_twice", |_, s: &State| !s.ghost.double),
            Property::always("no_send_gated_after_the_delivery_stopped_being_wanted", |_, s: &State| !s.ghost.unwanted),
            Property::always("no_maybe_sent_body_sent_again_after_its_window", |_, s: &State| !s.ghost.past_window),
            Property::always("an_event_is_posted_with_one_body", |_, s: &State| !s.ghost.two_bodies),
            Property::always("no_browser_posted_again_after_its_201_was_recorded", |_, s: &State| !s.ghost.reposted),
            Property::always("no_kick_accepted_after_the_dedup_of_its_deliveries_may_have_expired", |_, s: &State| {
                !s.ghost.rekicked
            }),
            Property::always("no_request_leaves_past_its_delivery_deadline", |_, s: &State| !s.ghost.late),
            Property::always("no_member_unwanted_a_freshness_before_its_request_is_mailed", |_, s: &State| {
                !s.ghost.stale_unwanted
            }),
            Property::always("a_settled_outcome_says_what_was_sent", |m: &Protocol, s: &State| {
                (0..m.deliveries.len()).all(|d| {
                    // An application event is sent when the application took it.
                    let taken = u8::from(s.ghost.app_taken & bit(d as u8) != 0);
                    // A notification is sent when a browser has it.
                    let shown = u8::from(s.ghost.push_shown[d] != 0);
                    let sent = match m.deliveries[d].lane {
                        Lane::App => taken,
                        Lane::Push => shown,
                        Lane::Digest | Lane::Transactional => s.ghost.sent[d],
                    };
                    match s.nodes[m.partition(d as u8)].live.recs[d] {
                        Rec::Sent => sent >= 1,
                        Rec::Failed | Rec::Skipped => sent == 0,
                        _ => true,
                    }
                })
            }),
        ];
        if self.liveness {
            properties.push(Property::eventually("every_delivery_is_settled", |m: &Protocol, s: &State| {
                // Or never to be: its period's kick window ended before it was kicked, or after
                // its trace expired.
                let closed = s.clock >= PERIOD_START + RETENTION;
                (0..m.deliveries.len()).all(|d| {
                    let rec = s.nodes[m.partition(d as u8)].live.recs[d];
                    rec.is_final() || (closed && rec == Rec::Absent)
                })
            }));
        }
        properties
    }
}

impl Protocol {
    /// prelude.lua `keep_until`, on a bound where time passes: a trace settled now (a compact
    /// entry, a failed or outcome_unknown record) expires the retention from now, and never
    /// before its period's kick window ends; nothing unsettled expires.
    fn stamp(&self, s: &mut State) {
        if self.budget.ticks == 0 {
            return;
        }
        let mut keep = s.clock + RETENTION;
        if !self.on(Mutant::ExpiryFromSettlement) {
            keep = keep.max(PERIOD_START + RETENTION);
        }
        for node in &mut s.nodes {
            let live = &mut node.live;
            for (r, e) in live.recs.iter().zip(live.expires.iter_mut()) {
                if !r.is_final() {
                    *e = 0;
                } else if *e == 0 {
                    *e = keep;
                }
            }
        }
    }

    /// Delivery `d`'s trace expires: its record (or compact entry) and all it held are gone.
    fn expire(data: &mut Data, d: u8) {
        let i = usize::from(d);
        data.recs[i] = Rec::Absent;
        data.expires[i] = 0;
        data.app_body[i] = 0;
        data.push_marks[i] = 0;
        data.maybe_taken &= !bit(d);
        data.push_inflight[i] = 0;
    }

    /// Replicas have every write but while replication is behind (with relaxed
    /// durability, but while a batch is on its way: the restart checked against loses
    /// only that batch's writes).
    fn replicate(&self, mut s: State) -> State {
        let idle = s.holders.iter().all(|x| x.hand.is_none());
        for node in &mut s.nodes {
            if (!node.lagging || (s.env == Env::LostWrites && idle)) && node.safe != node.live {
                node.safe = node.live.clone();
            }
        }
        s
    }

    /// The sender fallback after a refusal of `hand`'s request by holder `h`: for a request
    /// of operator mail that is no fallback already, that neither the holder nor the record
    /// says may have been processed before, and whose record is still this request
    /// 'sending' (fallback.lua), a new version from the fallback sender, sealed and held.
    /// True when it fell back.
    fn fall_back(&self, live: &mut Data, hand: &Hand, h: u8) -> bool {
        let operator = hand.body.iter().all(|&(d, _)| self.operator(d));
        let unguarded = self.on(Mutant::FallbackAfterMaybeSent);
        if !operator || hand.fallback || (hand.maybe_sent && !unguarded) {
            return false;
        }
        let Some(b) = live.batches.iter_mut().find(|b| b.id == hand.batch) else { return false };
        let mine = b.owner == h && b.state == BatchState::Sending && b.version == hand.version;
        if !mine || (b.maybe_sent && !unguarded) || b.fallback {
            return false;
        }
        b.version += 1;
        b.fallback = true;
        b.state = BatchState::Sealed;
        true
    }
}

/// The holders are alike: a state and the same state with A and B swapped are explored
/// once (the smaller of the two stands for both).
pub fn representative(s: &State) -> State {
    if s.holders.len() != 2 {
        return s.clone();
    }
    let swap = |h: u8| 1 - h;
    let mut t = s.clone();
    t.holders.swap(0, 1);
    for node in &mut t.nodes {
        for data in [&mut node.live, &mut node.safe] {
            for r in &mut data.recs {
                if let Rec::Processing(h) = r {
                    *h = swap(*h);
                }
            }
            for b in &mut data.batches {
                b.owner = swap(b.owner);
            }
            for f in &mut data.push_inflight {
                *f = (*f & !0b11) | ((*f & 1) << 1) | ((*f >> 1) & 1);
            }
        }
    }
    if t < *s { t } else { s.clone() }
}

impl Protocol {
    /// gate.lua, then what the sender does with its answer.
    fn gate(&self, s: &mut State, h: u8) {
        let mut hand = s.holders[usize::from(h)].hand.take().expect("a hand");
        let env = s.env;
        let ghost = s.ghost.clone();
        let live = &mut s.nodes[usize::from(hand.partition)].live;
        let Some(i) = live.batches.iter().position(|b| b.id == hand.batch) else {
            // 'settled' (every member final) or 'lost': members still sealed into it are
            // outcome_unknown (settle.lua's 'lost'); either way the hand is empty.
            Self::settle_members(live, hand.batch, Mode::Lost(&hand.body), |_| Rec::Unknown);
            return;
        };
        let b = live.batches[i].clone();
        if b.owner != h {
            return;
        }
        if live.paused {
            Self::reschedule(live, b.id, h, hand.maybe_sent && !self.forgets());
            return;
        }
        // What the holder knows counts too (a failover may have taken back the record's mark
        // of an earlier request that may have been processed), and is written back.
        let maybe_sent = b.maybe_sent || (hand.maybe_sent && !self.forgets());
        live.batches[i].maybe_sent = maybe_sent;
        if maybe_sent && ghost.old.contains(&(b.id, b.version)) && !self.on(Mutant::NoResendWindow) {
            Self::settle_members(live, b.id, Mode::Holder(h), |_| Rec::Unknown);
            return;
        }
        // 'deadline': a key that may have been sent, past its maybe-sent deadline, ends
        // outcome_unknown; a batch never sent, past its delivery deadline, ends failed.
        if maybe_sent && ghost.unsure.contains(&(b.id, b.version)) {
            let verdict = if self.on(Mutant::DeadlineFailsMaybeSent) { Rec::Failed } else { Rec::Unknown };
            Self::settle_members(live, b.id, Mode::Holder(h), |_| verdict);
            return;
        }
        let overdue = !maybe_sent && ghost.overdue.contains(&b.id);
        if overdue && !self.on(Mutant::GateSkipsDeadline) {
            Self::settle_members(live, b.id, Mode::Holder(h), |_| Rec::Failed);
            return;
        }
        hand.late = overdue;
        let mut reasons = Vec::with_capacity(b.body.len());
        for &(d, address) in &b.body {
            let spec = self.deliveries[usize::from(d)];
            let lost = live.recs[usize::from(d)] != Rec::Sealed(b.id);
            let address_checked = match spec.lane {
                Lane::Transactional => !self.on(Mutant::LaneSkipsSuppression),
                // An application event is never sealed into a batch.
                Lane::Digest | Lane::App | Lane::Push => !self.on(Mutant::GateReadsSubscriberOnly),
            };
            let suppressed = address_checked && live.suppressed & bit(address) != 0;
            let subscriber =
                spec.lane == Lane::Digest && (live.unsubscribed | live.subscriber_suppressed) & bit(d) != 0;
            reasons.push(if lost {
                Some(false)
            } else if suppressed || subscriber {
                Some(true)
            } else {
                None
            });
        }
        let wanted: Vec<(u8, u8)> = b.body.iter().zip(&reasons).filter(|(_, r)| r.is_none()).map(|(m, _)| *m).collect();
        let batch = &mut live.batches[i];
        if wanted.len() == b.body.len() {
            batch.state = BatchState::Sending;
        } else if maybe_sent && !self.on(Mutant::ResealMaybeSent) {
            // 'withhold': every member outcome_unknown, nothing resent.
            Self::settle_members(live, b.id, Mode::Holder(h), |_| Rec::Unknown);
            return;
        } else {
            for (&(d, _), r) in b.body.iter().zip(&reasons) {
                if *r == Some(true) {
                    live.recs[usize::from(d)] = Rec::Skipped;
                }
            }
            if wanted.is_empty() {
                live.batches.remove(i);
                return;
            }
            let batch = &mut live.batches[i];
            batch.version += 1;
            batch.body = wanted.clone();
            batch.state = BatchState::Sending;
            hand.version = batch.version;
            hand.body = wanted;
        }
        hand.gated_unwanted = hand.body.iter().any(|&m| self.ghost_unwanted(&ghost, m));
        hand.phase =
            if env == Env::LostWrites || self.on(Mutant::CommitBeforeReplicas) { Phase::Ready } else { Phase::Gated };
        s.holders[usize::from(h)].hand = Some(hand);
    }
}
