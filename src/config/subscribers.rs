//! `[subscribers]`: what a subscriber record may hold, checked where records enter
//! (`subscribe --ndjson`, `kick --audience`).

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubscribersConfig {
    /// The most bytes a record's `data` may take (as JSON); a record with more is
    /// refused, naming its line, the size and this limit.
    pub max_data_bytes: usize,
}

impl Default for SubscribersConfig {
    fn default() -> Self {
        SubscribersConfig { max_data_bytes: 65_536 }
    }
}

impl SubscribersConfig {
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        if !(2..=16 * 1024 * 1024).contains(&self.max_data_bytes) {
            errors.push(format!("subscribers.max_data_bytes: must be 2..=16777216 (got {})", self.max_data_bytes));
        }
    }
}
