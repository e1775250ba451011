//! Identifiers for deliveries and batches: ULIDs (48-bit milliseconds, 80
//! random bits, Crockford base32), so ids sort by creation time in `redis-cli`.

use rand::RngExt;

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A new ULID for the current time.
pub(crate) fn new_id() -> String {
    let millis = super::local_now_ms();
    ulid(millis, rand::rng().random::<u128>())
}

/// The ULID of `millis` (low 48 bits) and `random` (low 80 bits).
fn ulid(millis: u64, random: u128) -> String {
    let value: u128 = (u128::from(millis & 0xFFFF_FFFF_FFFF) << 80) | (random & ((1u128 << 80) - 1));
    (0..26).rev().map(|i| ALPHABET[((value >> (i * 5)) & 31) as usize] as char).collect()
}

/// A random RFC 4122 version-4 UUID (the emulator's email ids).
pub(crate) fn new_uuid() -> String {
    let mut v: u128 = rand::rng().random();
    v = (v & !(0xF000u128 << 64)) | (0x4000u128 << 64);
    v = (v & !(0xC000u128 << 48)) | (0x8000u128 << 48);
    let h = format!("{v:032x}");
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// `consumer-pid-xxxx`: a lease owner unique to this process.
pub(crate) fn owner_name(consumer: &str) -> String {
    let tag: u16 = rand::random();
    format!("{consumer}-{}-{tag:04x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulid_matches_the_spec_layout() {
        assert_eq!(ulid(0, 0), "00000000000000000000000000");
        // Time 1469918176385 with zero randomness: the spec's example prefix.
        assert!(ulid(1_469_918_176_385, 0).starts_with("01ARYZ6S41"));
        assert!(new_id() < ulid(u64::MAX, 0));
        assert_eq!(new_id().len(), 26);
    }

    #[test]
    fn uuid_is_version_4() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
    }
}
