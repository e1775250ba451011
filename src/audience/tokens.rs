//! Unsubscribe tokens and the headers a campaign email carries for them (RFC 8058):
//! `List-Unsubscribe: <{base_url}/u/TOKEN>` and `List-Unsubscribe-Post:
//! List-Unsubscribe=One-Click`, TOKEN being a URL-safe encoding of (subscriber,
//! campaign) and an HMAC-SHA256 of it: no address inside. Made when an email is
//! rendered (the consumer), read when the link is used (the public listener). With
//! no secret configured, the header points to the application's settings page
//! instead: the secret's presence is the feature flag.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::{Config, Secret};

/// The path prefix of unsubscribe links.
pub const PATH: &str = "/u/";

/// Bytes of HMAC kept in a token (128 bits).
const MAC_LEN: usize = 16;

/// Makes and reads unsubscribe tokens: the first secret signs, every one is accepted
/// (rotation).
#[derive(Clone)]
pub struct Tokens {
    secrets: Vec<Secret>,
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenError {
    /// Not a token at all (400).
    Malformed,
    /// A well-formed token no current secret signed: forged, altered, or rotated out (404).
    Forged,
}

impl Tokens {
    pub fn new(secrets: &[Secret]) -> Tokens {
        Tokens { secrets: secrets.to_vec() }
    }

    /// Whether one-click unsubscribe is on (a secret is configured).
    pub fn enabled(&self) -> bool {
        !self.secrets.is_empty()
    }

    fn mac(secret: &Secret, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes()).expect("any key length");
        mac.update(b"mailstream-unsubscribe-v1\n");
        mac.update(payload);
        mac
    }

    /// The token for `subscriber` turning `campaign` off (`None` without a secret).
    pub fn make(&self, subscriber: &str, campaign: &str) -> Option<String> {
        let secret = self.secrets.first()?;
        let payload = format!("{subscriber}\n{campaign}");
        let tag = Tokens::mac(secret, payload.as_bytes()).finalize().into_bytes();
        Some(format!("{}.{}", URL_SAFE_NO_PAD.encode(&payload), URL_SAFE_NO_PAD.encode(&tag[..MAC_LEN])))
    }

    /// The (subscriber, campaign) a token names, if one of the secrets signed it.
    pub(crate) fn read(&self, token: &str) -> Result<(String, String), TokenError> {
        let (payload, tag) = token.split_once('.').ok_or(TokenError::Malformed)?;
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| TokenError::Malformed)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| TokenError::Malformed)?;
        let text = std::str::from_utf8(&payload).map_err(|_| TokenError::Malformed)?;
        let (subscriber, campaign) = text.split_once('\n').ok_or(TokenError::Malformed)?;
        if tag.len() != MAC_LEN || !crate::config::is_name(subscriber) || !crate::config::is_tag_value(campaign) {
            return Err(TokenError::Malformed);
        }
        // verify_truncated_left compares the first bytes in constant time.
        let signed = self.secrets.iter().any(|s| Tokens::mac(s, &payload).verify_truncated_left(&tag).is_ok());
        if signed { Ok((subscriber.to_string(), campaign.to_string())) } else { Err(TokenError::Forged) }
    }
}

/// The headers a campaign email carries for `subscriber`: one-click with a secret,
/// else a link to the settings page (none if that is not set either).
pub fn headers(config: &Config, tokens: &Tokens, subscriber: &str, campaign: &str) -> Vec<(&'static str, String)> {
    match tokens.make(subscriber, campaign) {
        Some(token) => vec![
            ("List-Unsubscribe", format!("<{}{PATH}{token}>", config.unsubscribe.base_url.trim_end_matches('/'))),
            ("List-Unsubscribe-Post", "List-Unsubscribe=One-Click".to_string()),
        ],
        None if !config.unsubscribe.settings_url.is_empty() => {
            vec![("List-Unsubscribe", format!("<{}>", config.unsubscribe.settings_url))]
        }
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tokens(secrets: &[&str]) -> Tokens {
        Tokens::new(&secrets.iter().map(|s| Secret::new(*s)).collect::<Vec<_>>())
    }

    #[test]
    fn tokens_round_trip_and_carry_no_address() {
        let t = tokens(&["a-long-enough-secret-1"]);
        let token = t.make("u42", "weekly_digest").unwrap();
        assert!(!token.contains('@') && token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
        assert_eq!(t.read(&token), Ok(("u42".into(), "weekly_digest".into())));
    }

    #[test]
    fn forged_altered_and_rotated_out_tokens_are_refused() {
        let old = tokens(&["the-old-secret-xxxxxx"]);
        let token = old.make("u42", "weekly_digest").unwrap();
        // Rotation: the new secret signs, the old one is still accepted...
        let rotating = tokens(&["the-new-secret-yyyyyy", "the-old-secret-xxxxxx"]);
        assert!(rotating.read(&token).is_ok());
        assert!(rotating.read(&rotating.make("u42", "weekly_digest").unwrap()).is_ok());
        // ...until it is removed.
        let rotated = tokens(&["the-new-secret-yyyyyy"]);
        assert_eq!(rotated.read(&token), Err(TokenError::Forged));
        // Another subscriber in the payload, the same tag: forged.
        let (_, tag) = token.split_once('.').unwrap();
        let altered = format!("{}.{tag}", URL_SAFE_NO_PAD.encode("u43\nweekly_digest"));
        assert_eq!(old.read(&altered), Err(TokenError::Forged));
        for garbage in ["", "x", "no-dot", "%%%.%%%", &format!("{}.AAAA", URL_SAFE_NO_PAD.encode("u1\nc"))] {
            assert_eq!(old.read(garbage), Err(TokenError::Malformed), "{garbage}");
        }
    }

    #[test]
    fn without_a_secret_the_header_points_to_the_settings_page() {
        let mut config = Config::example();
        config.unsubscribe.settings_url = "https://app.acme.example/settings/email".into();
        let off = headers(&config, &tokens(&[]), "u42", "weekly_digest");
        assert_eq!(off, vec![("List-Unsubscribe", "<https://app.acme.example/settings/email>".to_string())]);
        config.unsubscribe.base_url = "https://mail.acme.example/".into();
        let on = headers(&config, &tokens(&["a-long-enough-secret-1"]), "u42", "weekly_digest");
        assert!(on[0].1.starts_with("<https://mail.acme.example/u/") && on[0].1.ends_with('>'), "{on:?}");
        assert_eq!(on[1], ("List-Unsubscribe-Post", "List-Unsubscribe=One-Click".to_string()));
    }

    proptest! {
        #[test]
        fn the_token_reader_never_panics(token in ".{0,300}") {
            let _ = tokens(&["a-long-enough-secret-1"]).read(&token);
        }
    }
}
