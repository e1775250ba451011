//! Resend's own suppression list, read a page at a time: `GET /suppressions` with its
//! cursor (`limit`, `after`: the id the page starts after), oldest first, for
//! `mailstream suppressions sync`. An answer is the list or a classified error, as a batch's.

use serde::Deserialize;

use super::client::{Client, ErrorBody, rate_headers, transport_error};
use super::{ProviderError, RateHeaders};

/// One suppression of Resend's list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ListedSuppression {
    pub id: String,
    pub email: String,
    /// `bounce`, `complaint` or `manual`.
    #[serde(default)]
    pub origin: Option<String>,
}

/// A page of the list.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SuppressionPage {
    #[serde(default)]
    pub data: Vec<ListedSuppression>,
    #[serde(default)]
    pub has_more: bool,
}

impl Client {
    /// The page of Resend's suppression list after `after` (from the start without),
    /// `limit` (1..=100) at most, and the answer's rate headers.
    pub async fn suppressions_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<(SuppressionPage, RateHeaders), (ProviderError, RateHeaders)> {
        let url = {
            let mut query = form_urlencoded::Serializer::new(String::new());
            query.append_pair("limit", &limit.clamp(1, 100).to_string());
            if let Some(after) = after {
                query.append_pair("after", after);
            }
            format!("{}/suppressions?{}", self.base_url, query.finish())
        };
        let sent = self.http.get(url).bearer_auth(self.api_key.expose()).send().await;
        let response = sent.map_err(|e| (transport_error(&e), RateHeaders::default()))?;
        let status = response.status().as_u16();
        let rate = rate_headers(response.headers());
        let bytes = response.bytes().await.map_err(|e| (transport_error(&e), rate))?;
        if (200..300).contains(&status) {
            let page = serde_json::from_slice(&bytes).map_err(|_| {
                (ProviderError::local(crate::model::error_name::ErrorName::UnexpectedResponse, false), rate)
            })?;
            return Ok((page, rate));
        }
        let body: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_default();
        let retry_after = rate.retry_after.or(if status == 429 { rate.reset } else { None });
        let message = body.message.as_deref().unwrap_or("");
        Err((ProviderError::from_response(status, body.name.as_deref(), message, retry_after), rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_reads_as_resend_writes_it() {
        let body = r#"{"object":"list","has_more":true,"data":[
            {"object":"suppression","id":"e169","email":"a@b.example","origin":"manual","source_id":null,"created_at":"2026-10-06T23:47:56.678Z"},
            {"object":"suppression","id":"5207","email":"c@d.example","origin":"bounce","source_id":"4ef9","created_at":"2026-10-07T08:12:03.412Z"}]}"#;
        let page: SuppressionPage = serde_json::from_str(body).unwrap();
        assert!(page.has_more);
        assert_eq!(page.data.len(), 2);
        assert_eq!((page.data[1].id.as_str(), page.data[1].origin.as_deref()), ("5207", Some("bounce")));
        let empty: SuppressionPage = serde_json::from_str(r#"{"object":"list","data":[]}"#).unwrap();
        assert!(!empty.has_more && empty.data.is_empty());
    }
}
