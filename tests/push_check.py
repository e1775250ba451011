#!/usr/bin/env python3
"""Independent check of one Web Push request, for the Rust integration tests.

Reads one JSON object on stdin:

    {"private_key": "<base64url: the subscription's raw 32-byte P-256 private scalar>",
     "auth": "<base64url: the subscription's 16-byte auth secret>",
     "body": "<base64: the request body the push service received>",
     "authorization": "vapid t=<JWT>, k=<base64url uncompressed P-256 public key>",
     "audience": "<origin of the push service, e.g. http://127.0.0.1:12345>"}

and checks that:

- the body is an RFC 8188 aes128gcm record whose key is derived as RFC 8291 says
  (the sender's ephemeral public key is the header's 65-byte keyid); it is decrypted
  with the `http_ece` package and must be JSON;
- the Authorization header is RFC 8292 VAPID: the JWT's alg is ES256, its signature
  verifies against the `k=` key (with the `cryptography` package), `aud` is the
  audience, `exp` is in the future and at most 24 hours away, and `sub` is a
  mailto: or https: contact.

On success it prints {"payload": <the decrypted JSON>, "vapid": {"aud", "exp", "sub"}}
and exits 0; otherwise it prints a one-line reason on stderr and exits 1.

It is independent of the daemon: it shares no code with the Rust side, and the
cryptography is done by http_ece (the reference Python ECE implementation, also used
by pywebpush) and pyca/cryptography, so a bug in the Rust encoder cannot be mirrored here.
"""

import base64
import binascii
import json
import sys
import time

import http_ece
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature


def fail(reason):
    print(f"push_check: {reason}", file=sys.stderr)
    sys.exit(1)


def b64(s, what, url=True):
    """Strict base64 (url-safe alphabet if url), padding optional."""
    s = s.strip().rstrip("=")
    try:
        return base64.b64decode(
            s + "=" * (-len(s) % 4), altchars=b"-_" if url else None, validate=True
        )
    except (binascii.Error, ValueError) as e:
        fail(f"{what} is not valid base64{'url' if url else ''}: {e}")


def decrypt(req):
    scalar = b64(req["private_key"], "private_key")
    if len(scalar) != 32:
        fail(f"private_key is {len(scalar)} bytes, want 32")
    auth = b64(req["auth"], "auth")
    if len(auth) != 16:
        fail(f"auth is {len(auth)} bytes, want 16")
    body = b64(req["body"], "body", url=False)
    # Header: salt(16) | rs(4) | idlen(1) | keyid; RFC 8291 wants the keyid to be
    # the sender's uncompressed public key.
    if len(body) < 86 or body[20] != 65 or body[21] != 0x04:
        fail("body header's keyid is not a 65-byte uncompressed P-256 public key")
    try:
        key = ec.derive_private_key(int.from_bytes(scalar, "big"), ec.SECP256R1())
        plain = http_ece.decrypt(
            body, private_key=key, auth_secret=auth, version="aes128gcm"
        )
    except Exception as e:
        fail(f"cannot decrypt body: {e!r}")
    try:
        return json.loads(plain.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        fail(f"plaintext is not JSON: {e}; plaintext={plain[:200]!r}")


def vapid(header, audience):
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "vapid":
        fail(f"Authorization scheme is {scheme!r}, want vapid")
    params = {}
    for part in rest.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq:
            fail(f"malformed Authorization parameter {part.strip()!r}")
        params[name.strip()] = value.strip()
    if "t" not in params or "k" not in params:
        fail(f"Authorization lacks t= or k=: {header!r}")

    point = b64(params["k"], "k")
    if len(point) != 65 or point[0] != 0x04:
        fail(f"k is not an uncompressed P-256 point ({len(point)} bytes)")
    try:
        pub = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
    except ValueError as e:
        fail(f"k is not a P-256 point: {e}")

    pieces = params["t"].split(".")
    if len(pieces) != 3:
        fail(f"JWT has {len(pieces)} parts, want 3")
    try:
        head = json.loads(b64(pieces[0], "JWT header"))
        claims = json.loads(b64(pieces[1], "JWT claims"))
    except ValueError as e:
        fail(f"JWT header or claims are not JSON: {e}")
    if not isinstance(head, dict) or head.get("alg") != "ES256":
        fail(f"JWT header is {head!r}, want alg ES256")
    sig = b64(pieces[2], "JWT signature")
    if len(sig) != 64:
        fail(f"JWT signature is {len(sig)} bytes, want 64 (raw r||s)")
    der = encode_dss_signature(
        int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big")
    )
    signed = f"{pieces[0]}.{pieces[1]}".encode("ascii")
    try:
        pub.verify(der, signed, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        fail("JWT signature does not verify against k")

    if not isinstance(claims, dict):
        fail(f"JWT claims are not an object: {claims!r}")
    aud, exp, sub = claims.get("aud"), claims.get("exp"), claims.get("sub")
    if aud != audience:
        fail(f"JWT aud is {aud!r}, want {audience!r}")
    now = time.time()
    if not isinstance(exp, int) or isinstance(exp, bool):
        fail(f"JWT exp is {exp!r}, want an integer")
    if not now < exp <= now + 24 * 3600:
        fail(f"JWT exp {exp} is not in (now, now + 24h]; now={int(now)}")
    if not isinstance(sub, str) or not sub.startswith(("mailto:", "https:")):
        fail(f"JWT sub is {sub!r}, want a mailto: or https: URI")
    return {"aud": aud, "exp": exp, "sub": sub}


def main():
    try:
        req = json.load(sys.stdin)
        fields = ("private_key", "auth", "body", "authorization", "audience")
        if not isinstance(req, dict) or not all(
            isinstance(req.get(f), str) for f in fields
        ):
            fail(f"stdin must be a JSON object with string fields {', '.join(fields)}")
    except ValueError as e:
        fail(f"stdin is not JSON: {e}")
    claims = vapid(req["authorization"], req["audience"])
    payload = decrypt(req)
    print(json.dumps({"payload": payload, "vapid": claims}))


if __name__ == "__main__":
    main()
