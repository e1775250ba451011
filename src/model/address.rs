//! The one address rule, on every path an address enters by (`subscribe`, NDJSON, `enqueue`,
//! the ingest API, `suppressions add`, the render hook's answer): `local@domain`, the
//! local part a dot-atom (RFC 5322, ASCII; a quoted string is refused), the domain an
//! LDH hostname with a dot, or an internationalized one (stored as given, compared in
//! punycode), at most 254 octets. A refusal says what is wrong, never the address.

/// The most octets an address may have (RFC 5321's path limit less its brackets).
pub const MAX_OCTETS: usize = 254;

/// Whether `address` is one this deployment sends to; the error says what is wrong,
/// to follow "the address" (`has no @`), and never echoes the address.
pub fn check(address: &str) -> Result<(), &'static str> {
    if address.len() > MAX_OCTETS {
        return Err("is longer than 254 octets");
    }
    let Some((local, domain)) = address.split_once('@') else { return Err("has no @") };
    if domain.contains('@') {
        return Err("has more than one @ (a quoted local part is not taken)");
    }
    check_local(local)?;
    check_domain(&ascii_domain(domain).ok_or("has a domain that is not a valid internationalized name")?)
}

/// Whether `address` passes [`check`].
pub fn is_valid(address: &str) -> bool {
    check(address).is_ok()
}

/// The form two addresses are compared in (the suppression list, the address index):
/// trimmed, ASCII-lowercased, and the domain in punycode (`Ann@Bücher.example` and
/// `ann@xn--bcher-kva.example` are one address).
pub fn comparable(address: &str) -> String {
    let trimmed = address.trim();
    match trimmed.rsplit_once('@') {
        Some((local, domain)) if !domain.is_ascii() => match ascii_domain(domain) {
            Some(domain) => format!("{}@{domain}", local.to_ascii_lowercase()),
            None => trimmed.to_ascii_lowercase(),
        },
        _ => trimmed.to_ascii_lowercase(),
    }
}

/// RFC 5322's atext: what a dot-atom's atoms are made of.
fn is_atext(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~".contains(&b)
}

fn check_local(local: &str) -> Result<(), &'static str> {
    if local.is_empty() {
        return Err("has nothing before the @");
    }
    if local.len() > 64 {
        return Err("has a local part longer than 64 octets");
    }
    if local.starts_with('"') {
        return Err("has a quoted local part, which is not taken");
    }
    if local.split('.').any(|atom| atom.is_empty()) {
        return Err("has a local part that starts or ends with a dot, or has two in a row");
    }
    if !local.bytes().all(|b| b == b'.' || is_atext(b)) {
        return Err("has a character a dot-atom local part does not take (a space, a comma, <, >, non-ASCII)");
    }
    Ok(())
}

/// `domain` in ASCII (punycode for an internationalized one), lowercased.
fn ascii_domain(domain: &str) -> Option<String> {
    if domain.is_ascii() {
        return Some(domain.to_ascii_lowercase());
    }
    idna::domain_to_ascii(domain).ok().filter(|d| !d.is_empty())
}

fn check_domain(domain: &str) -> Result<(), &'static str> {
    if domain.is_empty() {
        return Err("has nothing after the @");
    }
    if domain.starts_with('[') {
        return Err("has an address literal for a domain, which is not taken");
    }
    if domain.len() > 253 {
        return Err("has a domain longer than 253 octets");
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if labels.len() < 2 {
        return Err("has a domain with no dot");
    }
    for label in &labels {
        let ldh = label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if label.is_empty() || label.len() > 63 || !ldh || label.starts_with('-') || label.ends_with('-') {
            return Err("has a domain that is not a hostname (letters, digits and inner hyphens, 1-63 per label)");
        }
    }
    if labels.last().is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit())) {
        return Err("has a domain that ends in a number, not a name");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_addresses_pass() {
        for a in [
            "ann@acme.example",
            "delivered+user-000042@resend.dev",
            "o'brien@x.co",
            "a.b.c@sub.domain-1.example",
            "x@bücher.example",
            "UPPER@ACME.EXAMPLE",
        ] {
            assert_eq!(check(a), Ok(()), "{a}");
        }
        let long_local = format!("{}@acme.example", "a".repeat(64));
        assert_eq!(check(&long_local), Ok(()));
    }

    #[test]
    fn bad_addresses_are_refused_with_the_part_named() {
        for (a, says) in [
            ("nope", "no @"),
            ("@acme.example", "nothing before"),
            ("ann@", "nothing after"),
            ("ann@localhost", "no dot"),
            ("a@b@acme.example", "more than one @"),
            ("\"a b\"@acme.example", "quoted"),
            ("\"a@b\"@acme.example", "more than one @"),
            ("\"ab\"@acme.example", "quoted"),
            (".ann@acme.example", "dot"),
            ("ann..x@acme.example", "dot"),
            ("ann x@acme.example", "character"),
            ("Ann <ann@acme.example>", "character"),
            ("ann@[10.0.0.1]", "literal"),
            ("ann@-acme.example", "hostname"),
            ("ann@acme_x.example", "hostname"),
            ("ann@acme..example", "hostname"),
            ("ann@10.0.0.1", "number"),
            ("ännë@acme.example", "character"),
        ] {
            let e = check(a).expect_err(a);
            assert!(e.contains(says), "{a}: {e}");
            assert!(!e.contains(a), "never echoes the address");
        }
        assert!(check(&format!("{}@acme.example", "a".repeat(65))).is_err());
        assert!(check(&format!("a@{}.example", "b".repeat(250))).unwrap_err().contains("254"));
    }

    #[test]
    fn an_internationalized_domain_compares_in_punycode() {
        assert_eq!(comparable("Ann@Bücher.Example"), "ann@xn--bcher-kva.example");
        assert_eq!(comparable("ann@xn--bcher-kva.example"), comparable("ANN@bücher.example"));
        assert_eq!(comparable(" Ann@Acme.Example "), "ann@acme.example");
    }
}
