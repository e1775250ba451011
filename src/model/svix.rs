//! Webhook signatures as Svix writes them (Resend's webhooks are Svix's):
//! HMAC-SHA256 over `{id}.{timestamp}.{raw body}` with the base64 key after
//! `whsec_`, sent as one or more space-separated `v1,<base64>` in
//! `svix-signature` (or the unbranded `webhook-signature`). Verification is on
//! the raw bytes, before any parsing, in constant time, with the clock passed in.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::model::names::names;

/// How far a signed timestamp may be from now, either way.
const TOLERANCE_SECS: i64 = 5 * 60;

/// A webhook signing secret (`whsec_…`), decoded.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl SigningKey {
    /// Decodes `whsec_<base64>` (the prefix is optional).
    pub fn parse(secret: &str) -> Option<SigningKey> {
        let encoded = secret.trim().strip_prefix("whsec_").unwrap_or(secret.trim());
        let key = STANDARD.decode(encoded).ok().filter(|k| !k.is_empty())?;
        Some(SigningKey(key))
    }

    /// The `v1,<base64>` signature of a message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.mac(id, timestamp, body).finalize().into_bytes()))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

names! {
    /// Why a webhook request was refused (bounded names: metric labels, log fields).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Rejection {
        MissingHeaders = "missing_headers",
        BadTimestamp = "bad_timestamp",
        StaleTimestamp = "stale_timestamp",
        BadSignature = "bad_signature",
    }
}

/// The three signature headers of a request (Svix's or the unbranded names).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signed<'a> {
    pub id: &'a str,
    pub timestamp: &'a str,
    pub signatures: &'a str,
}

impl<'a> Signed<'a> {
    /// Reads `svix-id`/`svix-timestamp`/`svix-signature`, or the `webhook-*` names.
    pub(crate) fn from_headers(headers: &'a hyper::HeaderMap) -> Option<Signed<'a>> {
        let get =
            |svix: &str, plain: &str| headers.get(svix).or_else(|| headers.get(plain)).and_then(|v| v.to_str().ok());
        Some(Signed {
            id: get("svix-id", "webhook-id").filter(|s| !s.is_empty())?,
            timestamp: get("svix-timestamp", "webhook-timestamp")?,
            signatures: get("svix-signature", "webhook-signature")?,
        })
    }
}

/// Verifies a request against any of `keys` (the first signs; the others are
/// accepted while a rotation settles), at `now` (Unix seconds).
pub(crate) fn verify(keys: &[SigningKey], signed: &Signed<'_>, body: &[u8], now: i64) -> Result<(), Rejection> {
    let timestamp: i64 = signed.timestamp.trim().parse().map_err(|_| Rejection::BadTimestamp)?;
    if timestamp < 0 {
        return Err(Rejection::BadTimestamp);
    }
    if (now - timestamp).abs() > TOLERANCE_SECS {
        return Err(Rejection::StaleTimestamp);
    }
    let candidates: Vec<Vec<u8>> = signed
        .signatures
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .collect();
    let matches = keys.iter().any(|key| {
        let mac = key.mac(signed.id, timestamp, body);
        // verify_slice compares in constant time; each candidate gets a fresh MAC.
        candidates.iter().any(|sig| mac.clone().verify_slice(sig).is_ok())
    });
    if matches { Ok(()) } else { Err(Rejection::BadSignature) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(secret: &str, id: &str, ts: &str, sigs: &str, body: &[u8], now: i64) -> Result<(), Rejection> {
        let key = SigningKey::parse(secret).unwrap();
        verify(&[key], &Signed { id, timestamp: ts, signatures: sigs }, body, now)
    }

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TS: i64 = 1649367553;
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const GOOD: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    #[test]
    fn the_official_vectors() {
        assert_eq!(check(SECRET, ID, &TS.to_string(), GOOD, BODY, TS), Ok(()));
        assert_eq!(SigningKey::parse(SECRET).unwrap().sign(ID, TS, BODY), GOOD);
        let (secret, id, ts) = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330);
        let good = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert_eq!(check(secret, id, &ts.to_string(), good, br#"{"test": 2432232314}"#, ts), Ok(()));
        // The negative vector.
        let bad = "v1,R3PTzyfHASBKHH98a7yexTwaJ4yNIcGhFQc1yuN+BPU=";
        assert_eq!(check(SECRET, ID, &TS.to_string(), bad, BODY, TS), Err(Rejection::BadSignature));
    }

    #[test]
    fn everything_short_of_a_valid_signature_is_refused() {
        let ts = TS.to_string();
        let refused = |sigs: &str| check(SECRET, ID, &ts, sigs, BODY, TS);
        assert_eq!(refused(&GOOD[..GOOD.len() - 4]), Err(Rejection::BadSignature), "truncated");
        assert_eq!(refused("v1,"), Err(Rejection::BadSignature), "bare v1,");
        assert_eq!(refused(""), Err(Rejection::BadSignature));
        assert_eq!(refused("v1,R3PTzyfHASBKHH98a7yexTwaJ4yNIcGhFQc1yuN+BPU= v2,abc"), Err(Rejection::BadSignature));
        assert_eq!(refused(&GOOD.replace("v1,", "v2,")), Err(Rejection::BadSignature), "another version");
        // Several signatures, one of them right: accepted.
        assert_eq!(refused(&format!("v1,Zm9v {GOOD} v1a,bar")), Ok(()));
        // A wrong secret.
        assert_eq!(
            check("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", ID, &ts, GOOD, BODY, TS),
            Err(Rejection::BadSignature)
        );
        // ±6 minutes, a non-numeric and a negative timestamp.
        assert_eq!(check(SECRET, ID, &ts, GOOD, BODY, TS + 360), Err(Rejection::StaleTimestamp));
        assert_eq!(check(SECRET, ID, &ts, GOOD, BODY, TS - 360), Err(Rejection::StaleTimestamp));
        assert_eq!(check(SECRET, ID, "1649367553x", GOOD, BODY, TS), Err(Rejection::BadTimestamp));
        assert_eq!(check(SECRET, ID, "-5", GOOD, BODY, TS), Err(Rejection::BadTimestamp));
        // The body, byte for byte: one space more is another message.
        assert_eq!(
            check(SECRET, ID, &ts, GOOD, br#"{"email": "test@example.com","username":"test_user"}"#, TS),
            Err(Rejection::BadSignature)
        );
    }

    #[test]
    fn rotation_accepts_any_listed_key() {
        let old = SigningKey::parse(SECRET).unwrap();
        let new = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signed = Signed { id: ID, timestamp: "1649367553", signatures: GOOD };
        assert_eq!(verify(&[new.clone(), old], &signed, BODY, TS), Ok(()));
        assert_eq!(verify(&[new], &signed, BODY, TS), Err(Rejection::BadSignature));
    }

    proptest! {
        #[test]
        fn the_parser_never_panics(id in ".{0,40}", ts in ".{0,24}", sigs in ".{0,200}", body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let key = SigningKey::parse(SECRET).unwrap();
            let _ = verify(&[key], &Signed { id: &id, timestamp: &ts, signatures: &sigs }, &body, TS);
            let _ = SigningKey::parse(&sigs);
        }
    }
}
