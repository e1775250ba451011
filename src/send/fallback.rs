//! Operator mail whose sender Resend refused falls back, once, to its template's
//! `fallback_from`, and only when nothing of it can have been sent: it is sealed again
//! from that sender under a key derived from the refused one (fallback.lua), still held,
//! to go out as its holder's next request. Customer mail never falls back.

use bytes::Bytes;

use crate::model::error_name::ErrorName;
use crate::model::outcome::Failpoint;
use crate::model::work::{Audience, Lane, Sealed};
use crate::resend::{Action, ProviderError};
use crate::send::ctx::Ctx;
use crate::store::Conn;
use crate::store::records;
use crate::store::scripts::{self, Fallback, FallbackRequest};

/// What ends the Idempotency-Key of a fallback request (no key of ours ends so otherwise).
const FALLBACK_SUFFIX: &str = ".fallback";

/// Resend's longest Idempotency-Key, in characters.
const MAX_KEY: usize = 256;

/// The Idempotency-Key of the fallback request that follows a request under `key` whose
/// sender Resend refused: `key`, cut so that the whole never exceeds Resend's 256
/// characters, then a fixed suffix. Derived, not drawn, so whoever seals it names the
/// same request. (Our keys are at most 155 characters: none is cut in practice.)
pub fn fallback_key(key: &str) -> String {
    let keep: String = key.chars().take(MAX_KEY - FALLBACK_SUFFIX.len()).collect();
    format!("{keep}{FALLBACK_SUFFIX}")
}

/// Whether a request under `key` is the fallback of a refused one.
pub(crate) fn is_fallback_key(key: &str) -> bool {
    key.ends_with(FALLBACK_SUFFIX)
}

/// Whether a request answered with `action` may fall back to another sender: only a
/// sender refusal, of a request that is no fallback already, when neither this answer
/// nor anything its holder knows says a request of it may have been processed (a
/// refusal now does not prove an earlier request was refused too). The record is asked
/// too, by fallback.lua; and only operator mail has a sender to fall back to.
pub fn may_fall_back(action: Action, maybe_sent_now: bool, maybe_sent_before: bool, fallback_already: bool) -> bool {
    action == Action::SenderRejected && !maybe_sent_now && !maybe_sent_before && !fallback_already
}

/// What [`fall_back`] did.
#[derive(Debug)]
pub(crate) enum FellBack {
    /// Sealed again from the fallback sender: send this.
    Sealed(Sealed),
    /// No fallback (customer mail, none configured, or the record says no): settle the
    /// refusal as it is.
    No,
    /// Redis did not answer: the batch is left as it is, for whoever takes it over after
    /// its lease (it finds the refused request 'sending', or the fallback sealed).
    Unknown,
}

/// The refusal a fallback request follows, as its batch record keeps it.
#[derive(Debug, Clone)]
pub(crate) struct ProviderRefusal {
    pub template: String,
    pub error: ErrorName,
    pub status: u16,
}

/// The refusal that batch `b` is the fallback of, or `None` when it is not a fallback
/// (one read, and only for a fallback: the record goes once it is settled).
pub(crate) async fn refusal_of(ctx: &Ctx, b: &Sealed) -> Option<ProviderRefusal> {
    if !is_fallback_key(&b.key) {
        return None;
    }
    let read = async {
        let mut conn = ctx.store.conn().await?;
        let (template, error, status) =
            records::fallback_refusal(&mut conn, &ctx.store.keys, b.partition, &b.id).await?;
        anyhow::Ok(template.zip(error).map(|(template, error)| ProviderRefusal {
            template,
            error: ErrorName::parse(&error),
            status: status.unwrap_or_default(),
        }))
    };
    read.await.unwrap_or_else(|e| {
        ctx.metrics.redis_error("fallback", &e);
        None
    })
}

/// The operator template of `b` and its fallback sender: `Some` only for a request of
/// one operator email whose template names `fallback_from`, to an address that is one
/// of `[operators] to` now (read from its record: the config may have changed since it
/// was enqueued).
async fn fallback_sender(ctx: &Ctx, conn: &mut Conn, b: &Sealed) -> anyhow::Result<Option<(String, String)>> {
    let [member] = b.members.as_slice() else { return Ok(None) };
    let requests = records::stored_requests(conn, &ctx.store.keys, b.partition, &[member.id()]).await?;
    let request = requests.into_iter().next().flatten();
    let Some(request) = request.as_deref().and_then(crate::audience::ingest::Request::from_stored) else {
        return Ok(None);
    };
    let to_operators = request.to.as_deref().is_some_and(|to| ctx.config.operators.includes(to));
    Ok(request.template.filter(|_| to_operators).and_then(|name| {
        let t = ctx.config.templates.get(&name).filter(|t| t.audience == Audience::Operators)?;
        Some((name, t.fallback_from.clone()?))
    }))
}

/// The emails of a sealed body, each from `from` instead.
fn from_sender(body: &[u8], from: &str) -> Option<Vec<String>> {
    let emails: Vec<serde_json::Map<String, serde_json::Value>> = serde_json::from_slice(body).ok()?;
    let swap = |mut email: serde_json::Map<String, serde_json::Value>| {
        email.insert("from".into(), from.into());
        serde_json::to_string(&email).expect("an email serializes")
    };
    Some(emails.into_iter().map(swap).collect())
}

/// What follows a failed request of `b` (`e`: the error, or the refusal of its one
/// email in a 200), `refusal` being the refusal `b` is itself the fallback of: the
/// fallback, when [`may_fall_back`] allows one and the template names a sender.
pub(crate) async fn try_after(ctx: &Ctx, b: &Sealed, e: &ProviderError, refusal: Option<&ProviderRefusal>) -> FellBack {
    if !may_fall_back(e.action, e.maybe_sent, b.maybe_sent, refusal.is_some()) {
        return FellBack::No;
    }
    fall_back(ctx, b, e).await
}

/// Resend refused the sender of `b` (`e`, an answer: nothing of this request was sent)
/// and, as far as its holder knows, no earlier request of it may have been processed
/// ([`may_fall_back`]; checked by [`try_after`]): if it is operator mail whose template names a fallback sender,
/// seals it again from that sender under [`fallback_key`], still held, to send as its
/// holder's next resend.
async fn fall_back(ctx: &Ctx, b: &Sealed, e: &ProviderError) -> FellBack {
    // Customer mail is never looked up: a request of one transactional email at most.
    if b.members.len() != 1 || b.members[0].lane() != Lane::Transactional {
        return FellBack::No;
    }
    let result = async {
        let mut conn = ctx.store.conn().await?;
        let Some((template, from)) = fallback_sender(ctx, &mut conn, b).await? else { return Ok(FellBack::No) };
        let Some(emails) = from_sender(&b.body, &from) else {
            tracing::error!(template, "a sealed body is not a list of emails; no sender fallback");
            return Ok(FellBack::No);
        };
        let key = fallback_key(&b.key);
        let request = FallbackRequest {
            partition: b.partition,
            batch: &b.id,
            owner: &ctx.owner,
            refused_key: &b.key,
            key: &key,
            template: &template,
            error: e.name.as_str(),
            status: e.status.unwrap_or_default(),
            lease_ms: crate::model::ms(ctx.config.lease()),
            retention_secs: ctx.config.retention().as_secs(),
        };
        let sealed = match scripts::fallback(&mut conn, &ctx.store.keys, &request, &b.members, &emails).await? {
            Fallback::Sealed { body } => body,
            other => {
                tracing::info!(template, outcome = ?other, "no sender fallback for this request");
                return Ok(FellBack::No);
            }
        };
        tracing::info!(
            template,
            error = e.name.as_str(),
            "sender refused: operator mail sealed again from fallback_from"
        );
        ctx.failpoints.at(Failpoint::FellBack).await;
        let again = Sealed { key, body: Bytes::from(sealed), tries: b.tries + 1, maybe_sent: false, ..b.clone() };
        anyhow::Ok(FellBack::Sealed(again))
    };
    result.await.unwrap_or_else(|err| {
        ctx.metrics.redis_error("fallback", &err);
        FellBack::Unknown
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fallback_key_never_exceeds_resend_s_256_characters() {
        let key = crate::send::seal::idempotency_key("mailstream", "01JD0000000000000000000000");
        assert_eq!(fallback_key(&key), format!("{key}.fallback"));
        assert!(is_fallback_key(&fallback_key(&key)) && !is_fallback_key(&key));
        for len in [1, 246, 247, 248, 255, 256] {
            let key = "k".repeat(len);
            let derived = fallback_key(&key);
            assert!(derived.chars().count() <= MAX_KEY, "{len}: {}", derived.len());
            assert!(derived.ends_with(FALLBACK_SUFFIX) && derived != key, "{len}");
            assert!(key.starts_with(derived.trim_end_matches(FALLBACK_SUFFIX)), "{len}");
        }
        assert_eq!(fallback_key(&"k".repeat(256)).len(), 256);
        assert_eq!(fallback_key(&"k".repeat(255)).len(), 256);
        // Characters, not bytes: a key of 256 multi-byte characters is cut on one.
        assert_eq!(fallback_key(&"é".repeat(256)).chars().count(), 256);
    }

    #[test]
    fn only_a_first_sender_refusal_with_nothing_maybe_sent_may_fall_back() {
        assert!(may_fall_back(Action::SenderRejected, false, false, false));
        assert!(!may_fall_back(Action::SenderRejected, true, false, false), "this request may have been processed");
        assert!(!may_fall_back(Action::SenderRejected, false, true, false), "an earlier one may have been");
        assert!(!may_fall_back(Action::SenderRejected, false, false, true), "once only");
        for other in [Action::Fatal, Action::Retryable, Action::QuotaExhausted] {
            assert!(!may_fall_back(other, false, false, false), "{other}");
        }
    }

    #[test]
    fn a_fallback_body_changes_the_sender_only() {
        let body = br#"[{"from":"Acme <digest@acme.example>","to":["oncall@acme.example"],"subject":"s","text":"t"}]"#;
        let emails = from_sender(body, "Alerts <alerts@fallback.example>").unwrap();
        let email: serde_json::Value = serde_json::from_str(&emails[0]).unwrap();
        assert_eq!(email["from"], "Alerts <alerts@fallback.example>");
        assert_eq!((email["to"][0].as_str(), email["subject"].as_str()), (Some("oncall@acme.example"), Some("s")));
        assert!(from_sender(b"not json", "a@b.example").is_none());
    }
}
