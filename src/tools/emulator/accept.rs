//! What the sending endpoints do with a request that passed the rate limit, the key and
//! the faults: Resend's per-request rules (a batch's size, its attachments, permissive
//! validation), the quota, and the real sends recorded (a suppressed address's are not).

use std::time::Instant;

use serde_json::{Value, json};

use super::validate::{self, ApiError};
use super::{Accepted, Faults, Inner, webhooks};
use crate::http::server::HttpRequest;
use crate::model::id::new_uuid;

impl Inner {
    /// Validates and "sends" a request's emails.
    pub(super) fn accept(
        &mut self,
        body: &[u8],
        batch: bool,
        req: &HttpRequest,
        faults: &Faults,
        now: Instant,
    ) -> Result<(Value, Vec<Accepted>), ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|_| ApiError::new(400, "validation_error", "Request body is not valid JSON."))?;
        let emails: Vec<Value> = if batch {
            match value {
                Value::Array(items) => items,
                _ => return Err(ApiError::new(422, "validation_error", "The batch must be a JSON array of emails.")),
            }
        } else {
            vec![value]
        };
        if batch && emails.len() > 100 {
            return Err(ApiError::new(422, "validation_error", "Too many emails: a batch holds at most 100."));
        }
        if batch && emails.is_empty() {
            return Err(ApiError::new(422, "validation_error", "The batch is empty."));
        }
        if batch {
            validate::batch_without_attachments(&emails)?;
        }
        let permissive = batch
            && req
                .headers()
                .get("x-batch-validation")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"permissive"));

        let checked: Vec<_> = emails.iter().map(|e| validate::email(e, batch, faults)).collect();
        // A sender's domain that is not verified is not a per-email validation error: the
        // whole request is refused (403), permissive or not, as a single email would be.
        let refused_sender = |c: &&Result<_, ApiError>| c.as_ref().is_err_and(|e| e.status.as_u16() == 403);
        if let Some(Err(first)) = checked.iter().find(refused_sender) {
            return Err(ApiError::new(first.status.as_u16(), first.name, first.message.clone()));
        }
        if !permissive && let Some(Err(first)) = checked.iter().find(|c| c.is_err()) {
            return Err(ApiError::new(first.status.as_u16(), first.name, first.message.clone()));
        }
        let valid = checked.iter().filter(|c| c.is_ok()).count() as u64;
        if !self.faults.take_quota(valid, now, faults) {
            self.stats.quota_refusals += 1;
            return Err(faults.quota_refusal.error());
        }
        let created_at = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6f+00:00").to_string();

        let mut data = Vec::new();
        let mut errors = Vec::new();
        let mut accepted = Vec::new();
        for (index, (c, email)) in checked.into_iter().zip(emails).enumerate() {
            match c {
                Ok(recipients) => {
                    let (attachments, attachment_bytes) = (recipients.attachments, recipients.attachment_bytes);
                    // As Resend does: accepted (an id, and counted), but not delivered.
                    let suppressed = self.suppressions.reason_for(&email);
                    if suppressed.is_some() {
                        self.stats.suppressed_sends += 1;
                    } else {
                        for to in recipients.to {
                            self.record_send(to, recipients.subject.clone(), now);
                        }
                    }
                    self.stats.emails_accepted += 1;
                    self.stats.attachments_accepted += attachments;
                    self.stats.attachment_bytes += attachment_bytes;
                    let id = new_uuid();
                    data.push(json!({ "id": id }));
                    let last_event = match suppressed {
                        Some(_) => "suppressed",
                        None => webhooks::fate(&email).last().map_or("sent", |e| e.trim_start_matches("email.")),
                    };
                    self.emails.insert(&id, &email, created_at.clone(), last_event);
                    accepted.push((id, email, suppressed));
                }
                Err(e) => {
                    self.stats.invalid_emails += 1;
                    errors.push(json!({ "index": index, "message": e.message }));
                }
            }
        }
        if !batch {
            return Ok((data.pop().expect("one email"), accepted));
        }
        let mut out = json!({ "data": data });
        if permissive && !errors.is_empty() {
            out["errors"] = Value::Array(errors);
        }
        Ok((out, accepted))
    }

    fn record_send(&mut self, to: String, subject: String, now: Instant) {
        let at = self.sends.entry((to, subject)).or_default();
        at.push(now);
        if at.len() == 1 {
            self.stats.distinct_sends += 1;
        } else {
            self.stats.duplicate_sends += 1;
        }
    }
}
