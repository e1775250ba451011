//! `[attachments]`: how large a receipt's attachments may be, and how many of their bytes
//! may wait unsettled in Redis.

use serde::Deserialize;

/// Resend's limit on one email after base64 encoding.
pub const RESEND_MAX_BYTES: u64 = 40_000_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttachmentsConfig {
    /// The most bytes of attachments (their base64 `content`, summed) one delivery may carry.
    pub max_bytes: u64,
    /// The most attachment bytes waiting unsettled in one partition (in Redis and its AOF);
    /// beyond, ingest answers 429 with `Retry-After`.
    pub max_pending_bytes: u64,
}

impl Default for AttachmentsConfig {
    fn default() -> Self {
        AttachmentsConfig { max_bytes: 10 * 1024 * 1024, max_pending_bytes: 256 * 1024 * 1024 }
    }
}

impl AttachmentsConfig {
    /// Adds a message, naming its key, for each setting that is wrong.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        if !(1..=RESEND_MAX_BYTES).contains(&self.max_bytes) {
            errors.push(format!(
                "attachments.max_bytes: must be 1..={RESEND_MAX_BYTES}, Resend's limit per email (got {})",
                self.max_bytes
            ));
        }
        if self.max_pending_bytes < self.max_bytes {
            errors.push(format!(
                "attachments.max_pending_bytes: must be at least attachments.max_bytes ({}) (got {})",
                self.max_bytes, self.max_pending_bytes
            ));
        }
    }

    /// The body the ingest listener reads for a request with its token: the attachments'
    /// limit plus room for the rest of one delivery.
    pub fn ingest_body_bytes(&self) -> usize {
        usize::try_from(self.max_bytes).unwrap_or(usize::MAX).saturating_add(64 * 1024)
    }
}
