//! Which push endpoints the daemon may be aimed at. An endpoint comes from a browser through
//! the customer's application, so whoever can register a subscription chooses where the
//! daemon POSTs: a rule here is all that stands between that and an internal address
//! (SSRF). An endpoint is taken only if it is `https` (plain `http` only for a loopback host
//! listed with its port, for an emulator or a test), has no userinfo, and its host is one of
//! `channels.push.allowed_hosts` (by default the public push services); an IP literal in any
//! form the URL standard reads (dotted, decimal, octal, hex, IPv6, IPv4-mapped) is refused in
//! the forbidden ranges unless that exact host and port is listed. Registration checks this
//! without a DNS lookup (it works offline); a send checks it again, then resolves the host
//! and connects only to a resolved address outside the forbidden ranges
//! (`channels/push/resolver.rs`: the one lookup, so a name that rebinds between a check and the
//! connection cannot slip past).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use reqwest::Url;

/// The public push services (Chrome's and Edge's FCM, Firefox's autopush, Safari's, Windows'
/// WNS), taken when `channels.push.allowed_hosts` is not set.
pub const DEFAULT_ALLOWED_HOSTS: [&str; 4] =
    ["fcm.googleapis.com", "updates.push.services.mozilla.com", "web.push.apple.com", "*.notify.windows.com"];

/// Why an endpoint is refused: a bounded label (`mailstream_push_endpoints_refused_total`'s
/// `reason`), and the rule in words for a refusal at registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointRefusal {
    /// The URL names a user (`https://user:pw@host/…`).
    Userinfo,
    /// Its host is not one of `channels.push.allowed_hosts`.
    HostNotAllowed,
    /// Its address (an IP literal, or what its name resolves to) is loopback, private,
    /// link-local, CGNAT, unique-local, unspecified, multicast or broadcast.
    AddressForbidden,
    /// Not `https` (and not a listed loopback `http` host and port), or not a URL at all.
    NotHttps,
}

impl EndpointRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointRefusal::Userinfo => "userinfo",
            EndpointRefusal::HostNotAllowed => "host_not_allowed",
            EndpointRefusal::AddressForbidden => "address_forbidden",
            EndpointRefusal::NotHttps => "not_https",
        }
    }

    /// Every reason, for the metric's declared label values.
    pub const ALL: [EndpointRefusal; 4] = [
        EndpointRefusal::Userinfo,
        EndpointRefusal::HostNotAllowed,
        EndpointRefusal::AddressForbidden,
        EndpointRefusal::NotHttps,
    ];

    /// The rule, in words (never quoting the endpoint: it is personal data).
    pub fn message(self) -> &'static str {
        match self {
            EndpointRefusal::Userinfo => "endpoint: a push endpoint names no user (no user:password@)",
            EndpointRefusal::HostNotAllowed => {
                "endpoint: its host is not a push service this deployment sends to (channels.push.allowed_hosts)"
            }
            EndpointRefusal::AddressForbidden => {
                "endpoint: its address is loopback, private, link-local, shared, unique-local, unspecified, multicast \
                 or broadcast"
            }
            EndpointRefusal::NotHttps => "endpoint: must be an https URL",
        }
    }
}

/// One entry of `channels.push.allowed_hosts`: a host, or `*.` and a domain (any host under
/// it, not the domain itself), with an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    /// Lower case, without the `*.`; an IPv6 literal without its brackets.
    host: String,
    wildcard: bool,
    port: Option<u16>,
}

impl Pattern {
    fn parse(entry: &str) -> Result<Pattern, String> {
        let bad = || format!("{entry:?} is not a host, `*.` and a domain, or either with `:port`");
        let entry = entry.trim().to_ascii_lowercase();
        let (host, port) = match entry.rsplit_once(':') {
            // `[::1]:9` or `host:9`; a bare IPv6 literal has colons but no brackets.
            Some((h, p)) if !h.contains(':') || (h.starts_with('[') && h.ends_with(']')) => {
                (h.to_string(), Some(p.parse::<u16>().map_err(|_| bad())?))
            }
            _ => (entry.clone(), None),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let (wildcard, host) = match host.strip_prefix("*.") {
            Some(domain) => (true, domain.to_string()),
            None => (false, host),
        };
        let label =
            |l: &str| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let is_name = host.split('.').all(label) && host.len() <= 253;
        if host.is_empty() || (!is_name && host.parse::<IpAddr>().is_err()) || (wildcard && !host.contains('.')) {
            return Err(bad());
        }
        Ok(Pattern { host, wildcard, port })
    }

    fn matches(&self, host: &str, port: u16) -> bool {
        let host_ok = if self.wildcard {
            host.strip_suffix(&self.host).is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'))
        } else {
            host == self.host
        };
        host_ok && self.port.is_none_or(|p| p == port)
    }

    /// Listed with its exact host and port (what lets an IP literal or plain http through).
    fn is_exactly(&self, host: &str, port: u16) -> bool {
        !self.wildcard && self.host == host && self.port == Some(port)
    }
}

/// `channels.push.allowed_hosts`, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHosts(Vec<Pattern>);

impl Default for AllowedHosts {
    fn default() -> AllowedHosts {
        AllowedHosts::parse(DEFAULT_ALLOWED_HOSTS.iter().copied()).expect("the default push services parse")
    }
}

impl AllowedHosts {
    /// Whether `host` is listed with its exact port: the operator's own (an emulator on
    /// loopback), whose addresses are not checked.
    pub fn lists_with_port(&self, host: &str) -> bool {
        self.0.iter().any(|p| !p.wildcard && p.host == host && p.port.is_some())
    }

    /// The entries of a list; an error names the first that is not one.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<AllowedHosts, String> {
        entries.into_iter().map(Pattern::parse).collect::<Result<Vec<_>, _>>().map(AllowedHosts)
    }

    /// Checks an endpoint without a DNS lookup.
    pub fn admit(&self, endpoint: &str) -> Result<(), EndpointRefusal> {
        // The URL standard's parser, as the HTTP client reads it: an IPv4 literal in any
        // form (decimal, octal, hex, dotted or not) comes out dotted.
        let url = Url::parse(endpoint).map_err(|_| EndpointRefusal::NotHttps)?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(EndpointRefusal::Userinfo);
        }
        let port = url.port_or_known_default().ok_or(EndpointRefusal::NotHttps)?;
        let named = url.host_str().ok_or(EndpointRefusal::NotHttps)?;
        let bare = named.trim_start_matches('[').trim_end_matches(']');
        let ip = bare.parse::<IpAddr>().ok();
        let host = match ip {
            Some(ip) => ip.to_string(),
            None => bare.trim_end_matches('.').to_ascii_lowercase(),
        };
        let exact = self.0.iter().any(|p| p.is_exactly(&host, port));
        match url.scheme() {
            "https" => {}
            // A loopback emulator or test service, listed as it is.
            "http" if exact && (ip.is_some_and(|ip| ip.is_loopback()) || host == "localhost") => {}
            _ => return Err(EndpointRefusal::NotHttps),
        }
        if ip.is_some_and(forbidden) && !exact {
            return Err(EndpointRefusal::AddressForbidden);
        }
        if !self.0.iter().any(|p| p.matches(&host, port)) {
            return Err(EndpointRefusal::HostNotAllowed);
        }
        Ok(())
    }
}

/// Whether an address is one a push endpoint may not reach: loopback, private (RFC 1918),
/// link-local (cloud metadata's 169.254.169.254 among them), shared (CGNAT, 100.64/10),
/// unique-local (fc00::/7), unspecified, multicast, broadcast, and the IPv4 ones again
/// mapped or compatible into IPv6.
pub fn forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => forbidden_v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped().or_else(|| ipv4_compatible(a)) {
            Some(v4) => forbidden_v4(v4),
            None => forbidden_v6(a),
        },
    }
}

fn forbidden_v4(a: Ipv4Addr) -> bool {
    let [o0, o1, ..] = a.octets();
    a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || a.is_unspecified()
        || a.is_multicast()
        || a.is_broadcast()
        || o0 == 0
        || (o0 == 100 && (64..128).contains(&o1))
}

fn forbidden_v6(a: Ipv6Addr) -> bool {
    let first = a.segments()[0];
    a.is_loopback()
        || a.is_unspecified()
        || a.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
}

/// `::a.b.c.d` (deprecated IPv4-compatible), but not `::` or `::1`.
fn ipv4_compatible(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    (s[..6].iter().all(|&x| x == 0) && (s[6] != 0 || s[7] > 1))
        .then(|| Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_internal_range_is_forbidden_and_a_public_address_is_not() {
        for bad in [
            "127.0.0.1",
            "10.0.0.5",
            "192.168.1.10",
            "172.16.0.1",
            "172.31.255.255",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.2",
        ] {
            assert!(forbidden(ip(bad)), "{bad}");
        }
        for good in ["8.8.8.8", "142.250.0.1", "100.63.255.255", "100.128.0.1", "172.32.0.1", "2607:f8b0::1"] {
            assert!(!forbidden(ip(good)), "{good}");
        }
    }

    /// Every endpoint an outside check had accepted, each refused at registration with its
    /// rule; the four public push services accepted.
    #[test]
    fn internal_addresses_and_the_userinfo_trick_are_refused_and_the_push_services_taken() {
        use EndpointRefusal::*;
        let defaults = AllowedHosts::default();
        for (endpoint, why) in [
            ("https://10.0.0.5/push", AddressForbidden),
            ("https://192.168.1.10/push", AddressForbidden),
            ("https://172.16.0.1/push", AddressForbidden),
            ("https://169.254.169.254/latest/meta-data", AddressForbidden),
            ("https://127.0.0.1/push", AddressForbidden),
            ("https://localhost/push", HostNotAllowed),
            ("https://[::1]/push", AddressForbidden),
            ("https://[fd00::1]/push", AddressForbidden),
            ("https://0.0.0.0/push", AddressForbidden),
            // 127.0.0.1 as one decimal number, in octal, in hex, and mapped into IPv6.
            ("https://2130706433/push", AddressForbidden),
            ("https://0177.0.0.1/push", AddressForbidden),
            ("https://0x7f.0.0.1/push", AddressForbidden),
            ("https://[::ffff:127.0.0.1]/push", AddressForbidden),
            ("https://[::ffff:a9fe:a9fe]/push", AddressForbidden),
            ("https://100.64.0.1/push", AddressForbidden),
            ("https://224.0.0.1/push", AddressForbidden),
            ("https://255.255.255.255/push", AddressForbidden),
            ("https://8.8.8.8/push", HostNotAllowed),
            ("https://user:pw@fcm.googleapis.com/fcm/send/x", Userinfo),
            ("https://user@fcm.googleapis.com/fcm/send/x", Userinfo),
            // Sent, before, over plain http to the host after the `@`.
            ("http://127.0.0.1:1@otherhost/push", Userinfo),
            ("http://fcm.googleapis.com/fcm/send/x", NotHttps),
            ("ftp://fcm.googleapis.com/x", NotHttps),
            ("fcm.googleapis.com/x", NotHttps),
            ("https://push.example/x", HostNotAllowed),
            ("https://fcm.googleapis.com.evil.example/x", HostNotAllowed),
            ("https://notify.windows.com/x", HostNotAllowed),
        ] {
            assert_eq!(defaults.admit(endpoint), Err(why), "{endpoint}");
        }
        for endpoint in [
            "https://fcm.googleapis.com/fcm/send/dGVzdA:APA91b",
            "https://updates.push.services.mozilla.com/wpush/v2/gAAAAABh",
            "https://web.push.apple.com/QGuQyavXutnMH9Ns",
            "https://db5p.notify.windows.com/w/?token=BQYAAA",
            "https://FCM.googleapis.com./fcm/send/x",
        ] {
            assert_eq!(defaults.admit(endpoint), Ok(()), "{endpoint}");
        }
        // A loopback service listed with its exact port is the operator's choice (an
        // emulator, a test); the same address on another port is not.
        let local = AllowedHosts::parse(["127.0.0.1:4000", "[::1]:4001"]).unwrap();
        assert_eq!(local.admit("http://127.0.0.1:4000/push/1"), Ok(()));
        assert_eq!(local.admit("https://127.0.0.1:4000/push/1"), Ok(()));
        assert_eq!(local.admit("http://[::1]:4001/push/1"), Ok(()));
        assert_eq!(local.admit("https://127.0.0.1:4002/push/1"), Err(AddressForbidden));
        assert_eq!(local.admit("https://fcm.googleapis.com/x"), Err(HostNotAllowed), "a list replaces the defaults");
        // Listed without a port, a private address is still refused.
        let loose = AllowedHosts::parse(["10.0.0.5"]).unwrap();
        assert_eq!(loose.admit("https://10.0.0.5/push"), Err(AddressForbidden));
    }

    #[test]
    fn a_pattern_is_a_host_or_a_domain_s_subdomains_with_an_optional_port() {
        let allowed =
            AllowedHosts::parse(["*.notify.windows.com", "push.example:8443", "[::1]:9", "127.0.0.1:4000"]).unwrap();
        assert!(allowed.admit("https://wns2-par02p.notify.windows.com/w/?token=x").is_ok());
        assert_eq!(allowed.admit("https://notify.windows.com/w").unwrap_err(), EndpointRefusal::HostNotAllowed);
        assert_eq!(allowed.admit("https://evilnotify.windows.com/w").unwrap_err(), EndpointRefusal::HostNotAllowed);
        assert!(allowed.admit("https://push.example:8443/x").is_ok());
        assert_eq!(allowed.admit("https://push.example/x").unwrap_err(), EndpointRefusal::HostNotAllowed);
        assert!(allowed.admit("http://[::1]:9/push/1").is_ok());
        assert!(allowed.admit("http://127.0.0.1:4000/push/1").is_ok());
        assert_eq!(allowed.admit("http://127.0.0.1:4001/push/1").unwrap_err(), EndpointRefusal::NotHttps);
        for bad in ["", "*.", "*.com", "a b", "host:99999", "host:x", "exa_mple.com"] {
            assert!(AllowedHosts::parse([bad]).is_err(), "{bad:?}");
        }
    }
}
