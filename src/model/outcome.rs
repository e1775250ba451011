//! The states a delivery passes through, the outcomes it ends in, the reasons
//! given and the failpoints, as enums. Strings exist only at the Redis boundary
//! (`as_str` / `parse`, or `names!`), so metric labels are bounded by construction and a typo
//! is a compile error; what an older or newer version wrote reads as `Unknown`.

use std::fmt;

use crate::model::error_name::ErrorName;
use crate::model::names::names;

/// Where a delivery is in its life (`state` in its record).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeliveryState {
    /// Enqueued, waiting for a consumer.
    Pending,
    /// Claimed under a lease, being resolved and rendered.
    Processing,
    /// In a sealed batch: the request body and key are stored.
    Sealed,
    /// Final.
    Done(Outcome),
    /// Written by another version; shown as it is, never acted on.
    Unknown(String),
}

impl DeliveryState {
    pub fn as_str(&self) -> &str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Processing => "processing",
            DeliveryState::Sealed => "sealed",
            DeliveryState::Done(outcome) => outcome.as_str(),
            DeliveryState::Unknown(s) => s,
        }
    }

    /// The state named `s` (never fails: an unknown name is kept as `Unknown`).
    pub fn parse(s: &str) -> DeliveryState {
        match s {
            "pending" => DeliveryState::Pending,
            "processing" => DeliveryState::Processing,
            "sealed" => DeliveryState::Sealed,
            other => other.parse().map_or_else(|_| DeliveryState::Unknown(other.to_string()), DeliveryState::Done),
        }
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

names! {
    /// The final state of one delivery.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Outcome {
        Sent = "sent",
        Skipped = "skipped",
        Failed = "failed",
        OutcomeUnknown = "outcome_unknown",
    }
}

/// Why a delivery was not sent, or why its outcome is what it is: a reason of
/// mailstream's own, or the provider's error name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No subscriber record (deleted since the kick).
    UnknownSubscriber,
    NotEntitled,
    Unsubscribed,
    /// The address is on the suppression list (bounced, complained).
    Suppressed,
    /// The campaign is no longer in the config.
    UnknownCampaign,
    RenderError,
    /// Claimed too often without being sealed (a poison delivery).
    TooManyAttempts,
    /// The subscriber's `data` is not JSON.
    InvalidSubscriberData,
    /// The subscriber's stored address fails the address rule (`model::address`): a
    /// record written before the rule, or by hand.
    InvalidAddress,
    /// Retried until the delivery deadline without the provider accepting it.
    Expired,
    /// A maybe-sent batch outlived the provider's idempotency window.
    IdempotencyWindowPassed,
    /// The record was gone where one was expected (a lost write, an eviction).
    RecordLost,
    /// A batch put back unsent (its slot moved far away, a pause, a stop).
    Postponed,
    /// In a batch that may have been sent, beside a member no longer wanted: the batch
    /// was not resent, so nobody can say whether this one was delivered.
    Withheld,
    /// The application's render hook said it has no address for the recipient.
    NoAddress,
    /// The render hook said there is nothing to report this period.
    NothingToReport,
    /// The render hook skipped it for a reason of its own (kept bounded: `hook_skipped`).
    HookSkipped,
    /// The render hook did not answer for it before the delivery deadline.
    HookUnavailable,
    /// The application took the event (a 2xx): what a sent application delivery records.
    Accepted,
    /// The application answered 410 Gone: it wants no more of this event.
    AppGone,
    /// The application did not take the event before the delivery deadline.
    AppUnavailable,
    /// Web Push: no subscription of the subscriber's was there to take it.
    NoSubscription,
    /// Web Push: the push service refused the payload as too large (413).
    PushTooLarge,
    /// Web Push: the push service refused the request (another 4xx: a VAPID key it
    /// will not take, a malformed request).
    PushRefused,
    /// Web Push: no push service took it before the delivery deadline.
    PushUnavailable,
    /// Web Push: every subscription's endpoint (that none took) is one this deployment may
    /// not be aimed at (`push_endpoint`): never sent.
    PushEndpointRefused,
    /// The provider refused it, by this name.
    Provider(ErrorName),
}

impl Reason {
    const LOCAL: [Reason; 26] = [
        Reason::UnknownSubscriber,
        Reason::NotEntitled,
        Reason::Unsubscribed,
        Reason::Suppressed,
        Reason::UnknownCampaign,
        Reason::RenderError,
        Reason::TooManyAttempts,
        Reason::InvalidSubscriberData,
        Reason::InvalidAddress,
        Reason::Expired,
        Reason::IdempotencyWindowPassed,
        Reason::RecordLost,
        Reason::Postponed,
        Reason::Withheld,
        Reason::NoAddress,
        Reason::NothingToReport,
        Reason::HookSkipped,
        Reason::HookUnavailable,
        Reason::Accepted,
        Reason::AppGone,
        Reason::AppUnavailable,
        Reason::NoSubscription,
        Reason::PushTooLarge,
        Reason::PushRefused,
        Reason::PushUnavailable,
        Reason::PushEndpointRefused,
    ];

    /// The name stored in Redis and shown to operators.
    pub fn as_str(&self) -> &str {
        match self {
            Reason::UnknownSubscriber => "unknown_subscriber",
            Reason::NotEntitled => "not_entitled",
            Reason::Unsubscribed => "unsubscribed",
            Reason::Suppressed => "suppressed",
            Reason::UnknownCampaign => "unknown_campaign",
            Reason::RenderError => "render_error",
            Reason::TooManyAttempts => "too_many_attempts",
            Reason::InvalidSubscriberData => "invalid_subscriber_data",
            Reason::InvalidAddress => "invalid_address",
            Reason::Expired => "expired",
            Reason::IdempotencyWindowPassed => "idempotency_window_passed",
            Reason::RecordLost => "record_lost",
            Reason::Postponed => "postponed",
            Reason::Withheld => "withheld",
            Reason::NoAddress => "no_address",
            Reason::NothingToReport => "nothing_to_report",
            Reason::HookSkipped => "hook_skipped",
            Reason::HookUnavailable => "render_hook_unavailable",
            Reason::Accepted => "accepted",
            Reason::AppGone => "app_gone",
            Reason::AppUnavailable => "app_unavailable",
            Reason::NoSubscription => "no_subscription",
            Reason::PushTooLarge => "push_too_large",
            Reason::PushRefused => "push_refused",
            Reason::PushUnavailable => "push_unavailable",
            Reason::PushEndpointRefused => "push_endpoint_refused",
            Reason::Provider(name) => name.as_str(),
        }
    }

    /// A bounded metric label (an unknown provider name becomes `other`).
    pub fn label(&self) -> &str {
        match self {
            Reason::Provider(name) => name.label(),
            other => other.as_str(),
        }
    }

    /// The reason named `s`: one of ours, else a provider error name.
    pub fn parse(s: &str) -> Reason {
        Reason::LOCAL.into_iter().find(|r| r.as_str() == s).unwrap_or_else(|| Reason::Provider(ErrorName::parse(s)))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `dead-letters retry` did with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    Requeued,
    /// No such delivery (never existed, or expired).
    Missing,
    /// Not requeued: its state does not allow it (sent, pending, outcome_unknown without leave).
    Refused(DeliveryState),
    /// Not requeued: its attachments were deleted when it settled (enqueue it again).
    FilesGone,
}

impl Requeue {
    pub fn parse(s: &str) -> Requeue {
        match s {
            "requeued" => Requeue::Requeued,
            "missing" => Requeue::Missing,
            state => Requeue::Refused(DeliveryState::parse(state)),
        }
    }
}

impl fmt::Display for Requeue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requeue::Requeued => f.write_str("requeued"),
            Requeue::Missing => f.write_str("missing"),
            Requeue::Refused(state) => write!(f, "not requeued: it is {state}"),
            Requeue::FilesGone => f.write_str(
                "not requeued: its attachments were deleted when it settled; enqueue it again under a new key",
            ),
        }
    }
}

names! {
    /// Points in a batch's life where a crash matters; tests freeze the daemon there.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Failpoint {
        /// Deliveries claimed (and rendered), not yet sealed.
        Claimed = "claimed",
        /// A batch sealed, its request not yet sent.
        Sealed = "sealed",
        /// The last gate's write is made; WAIT (with `wait_replicas`) is not asked yet.
        Gating = "gating",
        /// A batch passed its last gate (and, with `wait_replicas`, its WAIT); its request
        /// has not left yet.
        Gated = "gated",
        /// The provider answered; nothing recorded yet.
        Answered = "answered",
        /// The answer recorded.
        Settled = "settled",
        /// Resend refused the sender of operator mail, and it is sealed again from its
        /// fallback sender; that request has not left yet.
        FellBack = "fell_back",
        /// One pass of the reclaimer's loop (the loop the watchdog follows).
        ReclaimTick = "reclaim_tick",
    }
}

names! {
    /// Why an address is suppressed (bounded: metric labels).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Why {
        /// A permanent bounce (the mailbox does not exist).
        Bounced = "bounced",
        /// Marked as spam by the recipient.
        Complained = "complained",
        /// Resend reported it on its own suppression list.
        ProviderSuppressed = "provider_suppressed",
        /// Transient or undetermined bounces, often enough within the window.
        TransientBounces = "transient_bounces",
        /// An operator added it.
        Manual = "manual",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_unknown_ones_are_kept() {
        for s in ["pending", "processing", "sealed", "sent", "skipped", "failed", "outcome_unknown"] {
            assert_eq!(DeliveryState::parse(s).as_str(), s);
            assert!(!matches!(DeliveryState::parse(s), DeliveryState::Unknown(_)));
        }
        assert_eq!(DeliveryState::parse("teleported"), DeliveryState::Unknown("teleported".into()));
    }

    #[test]
    fn reasons_round_trip_and_labels_stay_bounded() {
        for r in Reason::LOCAL {
            assert_eq!(Reason::parse(r.as_str()), r);
        }
        assert_eq!(Reason::parse("validation_error"), Reason::Provider(ErrorName::ValidationError));
        let odd = Reason::parse("some_new_provider_error");
        assert_eq!(odd.as_str(), "some_new_provider_error");
        assert_eq!(odd.label(), "other");
    }

    #[test]
    fn requeue_results_parse() {
        assert_eq!(Requeue::parse("requeued"), Requeue::Requeued);
        assert_eq!(Requeue::parse("missing"), Requeue::Missing);
        assert_eq!(Requeue::parse("sent"), Requeue::Refused(DeliveryState::Done(Outcome::Sent)));
    }
}
