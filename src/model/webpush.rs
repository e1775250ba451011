//! The Web Push cryptography: a message's payload encrypted for one subscription
//! (RFC 8291: an ephemeral P-256 key agreed with the subscription's `p256dh`, mixed with
//! its `auth` secret, then one `aes128gcm` record, RFC 8188), the VAPID token that
//! identifies the sender to the push service (RFC 8292: an ES256 JWT over the push
//! service's origin, with the public key as `k=`), and the `Topic` a message carries.
//!
//! The primitives are RustCrypto's (`p256` for the key agreement and the signature,
//! `ece-native` for the record encryption, `hkdf`/`sha2`); what is here is the two
//! RFCs' framing of them. The push-service emulator decrypts and verifies with the same
//! framing, and a test holds both to Python's `http_ece` and `cryptography`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hkdf::Hkdf;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::elliptic_curve::sec1::ToEncodedPoint;
use p256::{PublicKey, SecretKey};
use sha2::{Digest, Sha256};

/// The most a push service must take (RFC 8030 §7.2): an encrypted payload up to 4096
/// bytes. One record adds 86 bytes to the plaintext (header 21 + key id 65, then a
/// 16-byte tag and the 1-byte delimiter): 3993 bytes of payload at most.
pub const MAX_PAYLOAD: usize = MAX_MESSAGE - OVERHEAD;

/// The largest encrypted message a push service must take (RFC 8030 §7.2).
pub const MAX_MESSAGE: usize = 4096;

/// What one aes128gcm record adds to its plaintext.
const OVERHEAD: usize = 86 + 17;

/// The size of the encrypted message of a `payload`-byte plaintext.
pub fn encrypted_len(payload: usize) -> usize {
    payload + OVERHEAD
}

/// A new P-256 secret key, from the thread's CSPRNG.
pub fn new_secret() -> SecretKey {
    loop {
        // Nearly every 32 random bytes are a valid scalar; the loop is for the rest.
        if let Ok(key) = SecretKey::from_slice(&rand::random::<[u8; 32]>()) {
            return key;
        }
    }
}

/// A public key as Web Push writes it: the uncompressed point, base64url.
pub fn public_b64(key: &PublicKey) -> String {
    B64.encode(key.to_encoded_point(false).as_bytes())
}

/// Reads base64url, padded or not (browsers and libraries write both).
pub fn b64_decode(s: &str) -> Option<Vec<u8>> {
    B64.decode(s.trim().trim_end_matches('=')).ok()
}

/// The VAPID key pair: the private key is the raw 32-byte scalar, base64url (what
/// `mailstream vapid-keys` and the common Web Push libraries write).
pub struct VapidKey {
    signing: SigningKey,
    /// `k=`: the public key, base64url (the application's `applicationServerKey`).
    pub public: String,
}

impl VapidKey {
    /// The key from its base64url private scalar; `None` if it is not one.
    pub fn parse(private: &str) -> Option<VapidKey> {
        let secret = SecretKey::from_slice(&b64_decode(private)?).ok()?;
        Some(VapidKey::from_secret(&secret))
    }

    pub fn from_secret(secret: &SecretKey) -> VapidKey {
        VapidKey { signing: SigningKey::from(secret), public: public_b64(&secret.public_key()) }
    }

    /// A new key pair: (private scalar base64url, the key).
    pub fn generate() -> (String, VapidKey) {
        let secret = new_secret();
        (B64.encode(secret.to_bytes()), VapidKey::from_secret(&secret))
    }

    /// The `Authorization` header for a push service at `audience` (its origin,
    /// `https://host[:port]`), valid until `expires` (unix seconds; at most 24 h ahead),
    /// naming `subject` (a `mailto:` or `https:` contact).
    pub fn authorization(&self, audience: &str, expires: i64, subject: &str) -> String {
        let header = B64.encode(br#"{"typ":"JWT","alg":"ES256"}"#);
        let claims = serde_json::json!({ "aud": audience, "exp": expires, "sub": subject });
        let claims = B64.encode(claims.to_string());
        let signed = format!("{header}.{claims}");
        let signature: Signature = self.signing.sign(signed.as_bytes());
        format!("vapid t={signed}.{}, k={}", B64.encode(signature.to_bytes()), self.public)
    }
}

/// What a push service reads from a valid VAPID `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vapid {
    pub audience: String,
    pub expires: i64,
    pub subject: String,
    /// `k=`, as given.
    pub key: String,
}

/// Checks a `vapid t=…, k=…` header: the JWT's ES256 signature against `k`, and that it
/// has an audience, an expiry and a subject. Says what is wrong, never the token.
pub fn verify_vapid(header: &str) -> Result<Vapid, &'static str> {
    let rest = header.strip_prefix("vapid ").ok_or("not a vapid authorization")?;
    let (mut token, mut key) = (None, None);
    for part in rest.split(',').map(str::trim) {
        match part.split_once('=') {
            Some(("t", v)) => token = Some(v),
            Some(("k", v)) => key = Some(v),
            _ => {}
        }
    }
    let (token, key) = (token.ok_or("no t=")?, key.ok_or("no k=")?);
    let point = b64_decode(key).ok_or("k= is not base64url")?;
    let verifying = VerifyingKey::from_sec1_bytes(&point).map_err(|_| "k= is not a P-256 public key")?;
    let (signed, signature) = token.rsplit_once('.').ok_or("t= is not a JWT")?;
    let (header, claims) = signed.split_once('.').ok_or("t= is not a JWT")?;
    let header: serde_json::Value =
        serde_json::from_slice(&b64_decode(header).ok_or("bad JWT header")?).map_err(|_| "bad JWT header")?;
    if header["alg"] != "ES256" {
        return Err("the JWT is not ES256");
    }
    let signature =
        Signature::from_slice(&b64_decode(signature).ok_or("bad signature")?).map_err(|_| "bad signature")?;
    verifying.verify(signed.as_bytes(), &signature).map_err(|_| "the signature does not verify against k=")?;
    let claims: serde_json::Value =
        serde_json::from_slice(&b64_decode(claims).ok_or("bad JWT claims")?).map_err(|_| "bad JWT claims")?;
    Ok(Vapid {
        audience: claims["aud"].as_str().ok_or("no aud")?.to_string(),
        expires: claims["exp"].as_i64().ok_or("no exp")?,
        subject: claims["sub"].as_str().ok_or("no sub")?.to_string(),
        key: key.to_string(),
    })
}

/// The `Topic` of a delivery's messages: 32 base64url characters of a hash of its id
/// (RFC 8030 §5.4 allows 32 at most from that alphabet, and an id is neither), so a
/// retry replaces a copy the push service still holds. Also the notification's `tag`.
pub fn topic(delivery_id: &str) -> String {
    let digest = Sha256::digest(delivery_id.as_bytes());
    B64.encode(&digest[..24])
}

/// A subscription's keys as the browser gives them (`keys.p256dh`, `keys.auth`).
#[derive(Debug, Clone)]
pub struct Receiver {
    pub public: PublicKey,
    pub auth: [u8; 16],
}

impl Receiver {
    /// From base64url `p256dh` (an uncompressed P-256 point) and `auth` (16 bytes).
    pub fn parse(p256dh: &str, auth: &str) -> Result<Receiver, &'static str> {
        let point = b64_decode(p256dh).ok_or("keys.p256dh is not base64url")?;
        // RFC 8291 §4: the 65-byte uncompressed point (a compressed one is not what a browser gives).
        if point.len() != 65 || point[0] != 0x04 {
            return Err("keys.p256dh is not an uncompressed P-256 point (65 bytes)");
        }
        let public = PublicKey::from_sec1_bytes(&point).map_err(|_| "keys.p256dh is not a P-256 public key")?;
        let auth = b64_decode(auth).ok_or("keys.auth is not base64url")?;
        let auth = auth.try_into().map_err(|_| "keys.auth is not 16 bytes")?;
        Ok(Receiver { public, auth })
    }
}

/// RFC 8291 §3.3–3.4: the input keying material of a message from the shared secret.
fn ikm(auth: &[u8; 16], shared: &[u8], receiver: &PublicKey, sender: &PublicKey) -> [u8; 32] {
    let mut info = b"WebPush: info\0".to_vec();
    info.extend_from_slice(receiver.to_encoded_point(false).as_bytes());
    info.extend_from_slice(sender.to_encoded_point(false).as_bytes());
    let mut out = [0u8; 32];
    Hkdf::<Sha256>::new(Some(auth), shared).expand(&info, &mut out).expect("32 bytes is a valid length");
    out
}

/// `payload` encrypted for `to` (`Content-Encoding: aes128gcm`): a fresh key pair and
/// salt per call, so two requests of one message never share a ciphertext.
pub fn encrypt(payload: &[u8], to: &Receiver) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(payload.len() <= MAX_PAYLOAD, "a push payload is at most {MAX_PAYLOAD} bytes");
    let ephemeral = new_secret();
    let shared = p256::ecdh::diffie_hellman(ephemeral.to_nonzero_scalar(), to.public.as_affine());
    let key = ikm(&to.auth, shared.raw_secret_bytes(), &to.public, &ephemeral.public_key());
    let key_id = ephemeral.public_key().to_encoded_point(false);
    let record_size = u32::try_from(payload.len() + 17).expect("bounded above");
    ece_native::encrypt(key, rand::random(), key_id.as_bytes(), std::iter::once(payload.to_vec()), record_size)
        .map_err(|e| anyhow::anyhow!("encrypting a push payload: {e:?}"))
}

/// What a browser does with a message: decrypts `body` with its subscription's secret
/// key and auth secret.
pub fn decrypt(body: &[u8], secret: &SecretKey, auth: &[u8; 16]) -> Result<Vec<u8>, &'static str> {
    if body.len() < 21 || body.len() < 21 + usize::from(body[20]) {
        return Err("the header is cut short");
    }
    let sender = PublicKey::from_sec1_bytes(&body[21..21 + usize::from(body[20])]).map_err(|_| "bad key id")?;
    let shared = p256::ecdh::diffie_hellman(secret.to_nonzero_scalar(), sender.as_affine());
    let key = ikm(auth, shared.raw_secret_bytes(), &secret.public_key(), &sender);
    ece_native::decrypt(key, body.to_vec()).map_err(|_| "the payload does not decrypt")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_goes_to_its_subscription_only() {
        let secret = new_secret();
        let auth: [u8; 16] = rand::random();
        let to = Receiver::parse(&public_b64(&secret.public_key()), &B64.encode(auth)).unwrap();
        let body = encrypt(b"{\"title\":\"hi\"}", &to).unwrap();
        assert_ne!(body, encrypt(b"{\"title\":\"hi\"}", &to).unwrap(), "a fresh key and salt each time");
        assert_eq!(decrypt(&body, &secret, &auth).unwrap(), b"{\"title\":\"hi\"}");
        assert!(decrypt(&body, &new_secret(), &auth).is_err());
        assert!(decrypt(&body, &secret, &[0; 16]).is_err());
        assert!(encrypt(&vec![b'x'; MAX_PAYLOAD + 1], &to).is_err());
        let most = encrypt(&vec![b'x'; MAX_PAYLOAD], &to).unwrap();
        assert_eq!(most.len(), 4096);
    }

    #[test]
    fn a_vapid_token_verifies_against_its_key_only() {
        let (private, key) = VapidKey::generate();
        assert_eq!(VapidKey::parse(&private).unwrap().public, key.public);
        let header = key.authorization("http://127.0.0.1:9", 1_900_000_000, "mailto:ops@example.com");
        let v = verify_vapid(&header).unwrap();
        assert_eq!(
            (v.audience.as_str(), v.expires, v.key.as_str()),
            ("http://127.0.0.1:9", 1_900_000_000, key.public.as_str())
        );
        let (_, other) = VapidKey::generate();
        let forged = header.replace(&key.public, &other.public);
        assert_eq!(verify_vapid(&forged), Err("the signature does not verify against k="));
        assert!(verify_vapid("Bearer x").is_err());
        assert!(VapidKey::parse("not a key").is_none());
    }

    #[test]
    fn a_topic_is_32_base64url_characters_of_the_id() {
        let t = topic("weekly_digest:2026-W49:u42:team-7:push");
        assert_eq!(t.len(), 32);
        assert!(t.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'), "{t}");
        assert_eq!(t, topic("weekly_digest:2026-W49:u42:team-7:push"));
        assert_ne!(t, topic("weekly_digest:2026-W49:u43:team-7:push"));
    }
}
