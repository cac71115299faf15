"""A strict OAuth 2.0 authorization server for Lockbox's tests (Authlib + Flask, over TLS).

It behaves as a careful production server would, and adds test-only switches under /test:

- refresh tokens are issued and rotated on every use; each one is consumed atomically
  (two concurrent uses: one wins), and presenting a rotated token again revokes the whole
  family (every token descended from the same grant) and counts a reuse detection;
- RFC 7009 revocation for public clients; RFC 8628 device grant; authorization code with
  PKCE S256 required; RFC 8414 discovery;
- a protected API: GET /api/resource (scope "api"), POST /api/orders (non-idempotent, scope
  "api"), GET /api/admin (scope "admin", so a token without it gets 403 insufficient_scope);
- DPoP (RFC 9449): a token request carrying a proof gets tokens bound to the proof's key
  (`token_type` DPoP, the key's thumbprint recorded as the tokens' `cnf.jkt`); a bound refresh
  token is refreshed only with a proof of the same key; every proof is checked (signature by
  the header's `jwk`, `typ`, `alg` ES256, `htm`, `htu`, `iat` within a minute, `jti` never
  seen before, `ath` at the resource, and a server nonce for the client "lockbox-dpop-nonce");
  GET/POST /api/dpop/resource is the protected resource that checks `ath` and the binding;
  GET /test/dpop/bindings lists token fingerprints with their `jkt`, POST
  /test/dpop/expire-nonces forgets the nonces handed out;
- fault switches (POST /test/faults), counters (GET /test/counters), an event log
  (GET /test/log, with token fingerprints only), reset (POST /test/reset), device approval
  (POST /test/device/approve).

A third listener serves the same app over plain HTTP (DIR/plain-url), as a network attacker on
an http:// hop would; requests reaching it are counted (plain_http_requests), and
/.well-known/oauth-authorization-server/redirect-to-http sends discovery there.

Usage: server.py --state-dir DIR  (reads DIR/server.pem, DIR/server.key, DIR/rogue.pem,
DIR/rogue.key; writes DIR/url, DIR/rogue-url and DIR/plain-url once listening).
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import socket
import sys
import threading
import time
from urllib.parse import urlparse

from authlib.integrations.flask_oauth2 import AuthorizationServer, ResourceProtector
from authlib.oauth2.rfc6749 import grants
from authlib.oauth2.rfc6750 import BearerTokenValidator
from authlib.oauth2.rfc6750.token import BearerTokenGenerator
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc8628 import DeviceAuthorizationEndpoint, DeviceCodeGrant, DeviceCredentialDict
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from flask import Flask, Response, g, jsonify, redirect, request
from werkzeug.serving import load_ssl_context, make_server

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def fingerprint(token):
    """The first 8 hex digits of SHA-256: enough to correlate, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()[:8] if token else "-"


class State:
    def __init__(self):
        self.lock = threading.RLock()
        self.reset()

    def reset(self):
        self.by_access = {}
        self.by_refresh = {}
        self.revoked_families = set()
        self.codes = {}
        self.device_credentials = {}
        self.device_grants = {}
        self.device_last_poll = {}
        self.dpop_nonces = {}   # nonce -> time issued
        self.dpop_jtis = {}     # jti -> time it may be forgotten
        self.faults = {
            "token_delay": 0.0,            # seconds to wait before handling /token
            "token_503": 0,                # next N /token calls answer 503 + Retry-After
            "token_drop_after_rotate": 0,  # next N refreshes rotate, then drop the connection
            "token_hang_after_rotate": 0.0,  # seconds to wait after rotating, before answering
            "token_expires_in": "",        # "omit": token answers carry no expires_in; a number: sent instead
            "revoke_fail": 0,              # next N /revoke calls answer 503
            "device_slow_down": 0,         # next N pending device polls answer slow_down
            "access_token_lifetime": 3600,
            "refresh_without_rotation": False,
            "canary_access_token": "",     # the next access token issued, verbatim
            "canary_refresh_token": "",    # the next refresh token issued, verbatim
            "token_trickle": 0.0,          # /token answers 200, then one byte every N seconds, forever
            "token_huge_access_token": 0,  # next refresh answers an access token of N bytes, streamed
            "token_redirect": 0,           # next N /token calls answer 307 to /token-redirected
            "device_user_code": "",        # shown instead of the real user_code (once)
            "device_verification_uri": "",           # replaces verification_uri (once)
            "device_verification_uri_complete": "",  # replaces verification_uri_complete (once)
            "dpop_nonce_loop": False,      # every DPoP request is answered use_dpop_nonce with a new nonce
            "dpop_nonce_header": "",       # sent verbatim as DPoP-Nonce in nonce challenges
            "dpop_answer_bearer": False,   # a DPoP token request gets an unbound Bearer token
        }
        self.counters = {
            "refresh_requests": 0,
            "refresh_successes": 0,
            "refresh_rejections": 0,
            "reuse_detections": 0,
            "families_revoked": 0,
            "revocations": 0,
            "revocation_failures": 0,
            "device_authorizations": 0,
            "device_polls": 0,
            "slow_downs": 0,
            "code_exchanges": 0,
            "api_get": 0,
            "api_post": 0,
            "api_401": 0,
            "api_403": 0,
            "token_503": 0,
            "dropped_responses": 0,
            "trickled_responses": 0,
            "huge_bytes_sent": 0,
            "token_redirects": 0,
            "redirected_token_requests": 0,
            "plain_http_requests": 0,
            "dpop_proofs_accepted": 0,
            "dpop_proofs_rejected": 0,
            "dpop_nonce_challenges": 0,
            "dpop_replays": 0,
            "dpop_binding_refusals": 0,
            "dpop_api_calls": 0,
        }
        self.log = []

    def record(self, event, **fields):
        entry = {"time": time.time(), "event": event, **fields}
        self.log.append(entry)
        print(json.dumps(entry), flush=True)

    def count(self, name, amount=1):
        self.counters[name] = self.counters.get(name, 0) + amount


STATE = State()


class Client:
    """A public client (no secret), as a CLI or desktop app is."""

    def __init__(self, client_id, scope, require_dpop_nonce=False):
        self.client_id = client_id
        self.scope = scope
        self.require_dpop_nonce = require_dpop_nonce

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return "http://127.0.0.1/callback"

    def get_allowed_scope(self, scope):
        allowed = set(self.scope.split())
        if not scope:
            return self.scope
        return " ".join(s for s in scope.split() if s in allowed)

    def check_redirect_uri(self, redirect_uri):
        # RFC 8252 section 7.3: loopback redirects may use any port.
        parsed = urlparse(redirect_uri)
        return parsed.scheme == "http" and parsed.hostname == "127.0.0.1" and parsed.path == "/callback"

    def check_client_secret(self, client_secret):
        return False

    def check_endpoint_auth_method(self, method, endpoint):
        return method == "none"

    def check_token_endpoint_auth_method(self, method):
        return method == "none"

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type in ("authorization_code", "refresh_token", DEVICE_GRANT)


CLIENTS = {
    "lockbox-cli": Client("lockbox-cli", "api"),
    "lockbox-admin": Client("lockbox-admin", "api admin"),
    "lockbox-dpop-nonce": Client("lockbox-dpop-nonce", "api", require_dpop_nonce=True),
}


class Token:
    def __init__(self, payload, client_id, user, family):
        self.access_token = payload["access_token"]
        self.refresh_token = payload.get("refresh_token")
        self.scope = payload.get("scope", "")
        self.expires_in = payload.get("expires_in", 0)
        self.issued_at = time.time()
        self.client_id = client_id
        self.user = user
        self.family = family
        self.access_revoked = False
        self.refresh_consumed = False
        self.jkt = None  # the DPoP key's thumbprint (cnf.jkt) when the tokens are bound

    def check_client(self, client):
        return client.get_client_id() == self.client_id

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.expires_in

    def is_expired(self):
        return time.time() >= self.issued_at + self.expires_in

    def is_revoked(self):
        return self.access_revoked or self.family in STATE.revoked_families

    def get_user(self):
        return self.user

    def get_client(self):
        return CLIENTS[self.client_id]


def query_client(client_id):
    return CLIENTS.get(client_id)


def save_token(payload, req):
    previous = getattr(req, "refresh_token", None)
    family = previous.family if isinstance(previous, Token) else secrets.token_hex(8)
    client_id = req.client.get_client_id()
    user = getattr(req, "user", None) or "test-user"
    token = Token(payload, client_id, user, family)
    token.jkt = g.get("dpop_jkt")
    if previous is not None and isinstance(previous, Token) and not token.refresh_token:
        token.refresh_token = previous.refresh_token
    STATE.by_access[token.access_token] = token
    if payload.get("refresh_token"):
        STATE.by_refresh[payload["refresh_token"]] = token
    STATE.record(
        "token_issued", family=family, access=fingerprint(token.access_token),
        refresh=fingerprint(payload.get("refresh_token")), grant=req.payload.grant_type, jkt=token.jkt)


def next_token(canary_fault, size):
    """A random token, or the canary a test planted (once), so it can search for it later."""
    canary = STATE.faults[canary_fault]
    if canary:
        STATE.faults[canary_fault] = ""
        return canary
    return secrets.token_urlsafe(size)


def token_lifetime(client, grant_type):
    return int(STATE.faults["access_token_lifetime"])


class RefreshTokenGrant(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token):
        STATE.count("refresh_requests")
        token = STATE.by_refresh.get(refresh_token)
        if token is None:
            STATE.count("refresh_rejections")
            STATE.record("refresh_rejected", reason="unknown", refresh=fingerprint(refresh_token))
            return None
        if token.family in STATE.revoked_families:
            STATE.count("refresh_rejections")
            STATE.record("refresh_rejected", reason="family_revoked", family=token.family,
                         refresh=fingerprint(refresh_token))
            return None
        if token.refresh_consumed:
            # A rotated token came back: someone holds a copy. Revoke the family.
            STATE.count("reuse_detections")
            STATE.count("families_revoked")
            STATE.count("refresh_rejections")
            STATE.revoked_families.add(token.family)
            STATE.record("reuse_detected", family=token.family, refresh=fingerprint(refresh_token))
            return None
        return token

    def authenticate_user(self, refresh_token):
        return refresh_token.user

    def issue_token(self, user, refresh_token):
        include = not STATE.faults["refresh_without_rotation"]
        return self.generate_token(user=user, scope=refresh_token.get_scope(), include_refresh_token=include)

    def revoke_old_credential(self, refresh_token):
        if STATE.faults["refresh_without_rotation"]:
            return
        refresh_token.refresh_consumed = True
        STATE.count("refresh_successes")
        STATE.record("refresh_rotated", family=refresh_token.family, old=fingerprint(refresh_token.refresh_token))


class S256Only(CodeChallenge):
    DEFAULT_CODE_CHALLENGE_METHOD = "S256"
    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]


class AuthorizationCodeGrant(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]

    def save_authorization_code(self, code, req):
        STATE.codes[code] = {
            "client_id": req.client.get_client_id(),
            "redirect_uri": req.payload.redirect_uri,
            "scope": req.payload.scope,
            "user": req.user,
            "code_challenge": req.payload.data.get("code_challenge"),
            "code_challenge_method": req.payload.data.get("code_challenge_method"),
        }

    def query_authorization_code(self, code, client):
        item = STATE.codes.get(code)
        if item and item["client_id"] == client.get_client_id():
            return AuthorizationCode(code, item)
        return None

    def delete_authorization_code(self, authorization_code):
        STATE.codes.pop(authorization_code.code, None)
        STATE.count("code_exchanges")

    def authenticate_user(self, authorization_code):
        return authorization_code.item["user"]


class AuthorizationCode:
    def __init__(self, code, item):
        self.code = code
        self.item = item
        self.code_challenge = item["code_challenge"]
        self.code_challenge_method = item["code_challenge_method"]

    def get_redirect_uri(self):
        return self.item["redirect_uri"]

    def get_scope(self):
        return self.item["scope"]

    def is_expired(self):
        return False

    def get_nonce(self):
        return None

    def get_auth_time(self):
        return None

    def get_acr(self):
        return None

    def get_amr(self):
        return None


class DeviceEndpoint(DeviceAuthorizationEndpoint):
    CLIENT_AUTH_METHODS = ["none"]
    INTERVAL = 1
    EXPIRES_IN = 120

    def get_verification_uri(self):
        return BASE_URL["url"] + "/device"

    def save_device_credential(self, client_id, scope, data):
        STATE.count("device_authorizations")
        STATE.device_credentials[data["device_code"]] = DeviceCredentialDict(
            client_id=client_id, scope=scope, user_code=data["user_code"],
            expires_at=time.time() + data["expires_in"])
        STATE.record("device_authorization", user_code=data["user_code"])


class DeviceGrant(DeviceCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]

    def query_device_credential(self, device_code):
        STATE.count("device_polls")
        return STATE.device_credentials.get(device_code)

    def query_user_grant(self, user_code):
        return STATE.device_grants.get(user_code)

    def should_slow_down(self, credential):
        code = credential.get_user_code()
        now = time.time()
        last = STATE.device_last_poll.get(code)
        STATE.device_last_poll[code] = now
        slow = False
        if STATE.faults["device_slow_down"] > 0:
            STATE.faults["device_slow_down"] -= 1
            slow = True
        elif last is not None and now - last < DeviceEndpoint.INTERVAL * 0.8:
            slow = True  # polled faster than the interval
        if slow:
            STATE.count("slow_downs")
            STATE.record("device_slow_down", user_code=code)
        return slow

    def create_token_response(self):
        result = super().create_token_response()
        # A device code is good for one token response.
        for code, credential in list(STATE.device_credentials.items()):
            if credential is self.request.credential:
                del STATE.device_credentials[code]
        return result


class Revocation(RevocationEndpoint):
    CLIENT_AUTH_METHODS = ["none"]

    def query_token(self, token_string, token_type_hint):
        if token_type_hint == "access_token":
            return STATE.by_access.get(token_string)
        if token_type_hint == "refresh_token":
            return STATE.by_refresh.get(token_string)
        return STATE.by_access.get(token_string) or STATE.by_refresh.get(token_string)

    def revoke_token(self, token, req):
        hint = req.form.get("token_type_hint")
        if hint == "access_token":
            token.access_revoked = True
            STATE.record("access_token_revoked", access=fingerprint(token.access_token))
        else:
            STATE.revoked_families.add(token.family)
            STATE.record("family_revoked_by_client", family=token.family)
        STATE.count("revocations")


class AccessTokenValidator(BearerTokenValidator):
    def authenticate_token(self, token_string):
        token = STATE.by_access.get(token_string)
        # A DPoP-bound token is no bearer token: presented as one, it is refused.
        return None if token is not None and token.jkt else token


# DPoP (RFC 9449) proof checking.

DPOP_IAT_WINDOW = 60      # seconds a proof's iat may differ from the server's clock
DPOP_NONCE_LIFETIME = 300
DPOP_MAX_PROOF = 8192


class ProofError(Exception):
    def __init__(self, error, description):
        super().__init__(description)
        self.error = error  # "invalid_dpop_proof" or "use_dpop_nonce"
        self.description = description


def b64url_decode(text):
    if not isinstance(text, str) or any(c in text for c in "+/="):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk_thumbprint(jwk):
    canonical = json.dumps({k: jwk[k] for k in ("crv", "kty", "x", "y")}, separators=(",", ":"), sort_keys=True)
    return b64url(hashlib.sha256(canonical.encode()).digest())


def new_nonce():
    nonce = secrets.token_urlsafe(24)
    STATE.dpop_nonces[nonce] = time.time()
    return nonce


def nonce_header():
    planted = STATE.faults["dpop_nonce_header"]
    return planted if planted else new_nonce()


def check_proof(method, access_token=None, require_nonce=False):
    """Checks the request's one DPoP header; returns the key's thumbprint or raises ProofError."""
    values = request.headers.getlist("DPoP")
    if len(values) != 1:
        raise ProofError("invalid_dpop_proof", "exactly one DPoP header is required")
    proof = values[0]
    if len(proof) > DPOP_MAX_PROOF or proof.count(".") != 2:
        raise ProofError("invalid_dpop_proof", "not a compact JWS")
    header_part, payload_part, signature_part = proof.split(".")
    try:
        header = json.loads(b64url_decode(header_part))
        payload = json.loads(b64url_decode(payload_part))
        signature = b64url_decode(signature_part)
    except (ValueError, UnicodeDecodeError):
        raise ProofError("invalid_dpop_proof", "undecodable")
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise ProofError("invalid_dpop_proof", "header and claims must be objects")
    if header.get("typ") != "dpop+jwt" or header.get("alg") != "ES256":
        raise ProofError("invalid_dpop_proof", "typ must be dpop+jwt and alg ES256")
    jwk = header.get("jwk")
    if (not isinstance(jwk, dict) or "d" in jwk or jwk.get("kty") != "EC" or jwk.get("crv") != "P-256"
            or not isinstance(jwk.get("x"), str) or not isinstance(jwk.get("y"), str)):
        raise ProofError("invalid_dpop_proof", "jwk must be a public P-256 key")
    try:
        x, y = b64url_decode(jwk["x"]), b64url_decode(jwk["y"])
        if len(x) != 32 or len(y) != 32 or len(signature) != 64:
            raise ValueError("sizes")
        key = ec.EllipticCurvePublicNumbers(int.from_bytes(x, "big"), int.from_bytes(y, "big"), ec.SECP256R1()).public_key()
        key.verify(encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")),
                   (header_part + "." + payload_part).encode(), ec.ECDSA(hashes.SHA256()))
    except (ValueError, InvalidSignature):
        raise ProofError("invalid_dpop_proof", "bad signature")
    if payload.get("htm") != method:
        raise ProofError("invalid_dpop_proof", "htm does not match")
    if payload.get("htu") != BASE_URL["url"] + request.path:
        raise ProofError("invalid_dpop_proof", "htu does not match")
    iat = payload.get("iat")
    now = time.time()
    if not isinstance(iat, int) or abs(now - iat) > DPOP_IAT_WINDOW:
        raise ProofError("invalid_dpop_proof", "iat outside the window")
    jti = payload.get("jti")
    if not isinstance(jti, str) or not 0 < len(jti) <= 256:
        raise ProofError("invalid_dpop_proof", "jti missing")
    for seen, forget_at in list(STATE.dpop_jtis.items()):
        if forget_at < now:
            del STATE.dpop_jtis[seen]
    if jti in STATE.dpop_jtis:
        STATE.count("dpop_replays")
        raise ProofError("invalid_dpop_proof", "jti already used")
    if access_token is not None:
        if payload.get("ath") != b64url(hashlib.sha256(access_token.encode()).digest()):
            raise ProofError("invalid_dpop_proof", "ath does not match the access token")
    if STATE.faults["dpop_nonce_loop"]:
        raise ProofError("use_dpop_nonce", "a new nonce, again")
    if require_nonce:
        issued = STATE.dpop_nonces.get(payload.get("nonce"))
        if issued is None or now - issued > DPOP_NONCE_LIFETIME:
            raise ProofError("use_dpop_nonce", "a nonce is required")
    STATE.dpop_jtis[jti] = now + 2 * DPOP_IAT_WINDOW
    STATE.count("dpop_proofs_accepted")
    return jwk_thumbprint(jwk)


def proof_refusal(error, status):
    """The answer to a refused proof: the token endpoint's JSON error (400), or a resource's
    WWW-Authenticate challenge (401); a nonce challenge carries a new nonce."""
    if error.error == "use_dpop_nonce":
        STATE.count("dpop_nonce_challenges")
    else:
        STATE.count("dpop_proofs_rejected")
    STATE.record("dpop_refused", error=error.error, reason=error.description)
    headers = {}
    if error.error == "use_dpop_nonce":
        headers["DPoP-Nonce"] = nonce_header()
    if status == 401:
        headers["WWW-Authenticate"] = 'DPoP error="%s", algs="ES256"' % error.error
    return jsonify({"error": error.error}), status, headers


BASE_URL = {"url": ""}
PLAIN_URL = {"url": ""}
app = Flask(__name__)
authorization = AuthorizationServer(app, query_client=query_client, save_token=save_token)
authorization.register_token_generator(
    "default",
    BearerTokenGenerator(
        access_token_generator=lambda **_: next_token("canary_access_token", 32),
        refresh_token_generator=lambda **_: next_token("canary_refresh_token", 48),
        expires_generator=token_lifetime))
authorization.register_grant(RefreshTokenGrant)
authorization.register_grant(AuthorizationCodeGrant, [S256Only(required=True)])
authorization.register_grant(DeviceGrant)
authorization.register_endpoint(DeviceEndpoint)
authorization.register_endpoint(Revocation)
require_oauth = ResourceProtector()
require_oauth.register_token_validator(AccessTokenValidator())


@app.get("/.well-known/oauth-authorization-server")
def metadata():
    return metadata_for(BASE_URL["url"])


@app.get("/.well-known/oauth-authorization-server/<name>")
def redirecting_metadata(name):
    """Discovery for the issuers BASE/redirect-to-http and BASE/redirect-to-https: a redirect to
    a document that names that issuer, over plain HTTP or over HTTPS."""
    issuer = BASE_URL["url"] + "/" + name
    if name == "redirect-to-http":
        return redirect(PLAIN_URL["url"] + "/test/metadata?issuer=" + issuer, code=302)
    if name == "redirect-to-https":
        return redirect(BASE_URL["url"] + "/test/metadata?issuer=" + issuer, code=302)
    return jsonify({"error": "not_found"}), 404


@app.get("/test/metadata")
def test_metadata():
    return metadata_for(request.args["issuer"])


def metadata_for(issuer):
    base = BASE_URL["url"]
    return jsonify({
        "issuer": issuer,
        "authorization_endpoint": base + "/authorize",
        "token_endpoint": base + "/token",
        "revocation_endpoint": base + "/revoke",
        "device_authorization_endpoint": base + "/device_authorization",
        "grant_types_supported": ["authorization_code", "refresh_token", DEVICE_GRANT],
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "scopes_supported": ["api", "admin"],
        "dpop_signing_alg_values_supported": ["ES256"],
    })


def trickle_response(interval):
    """200 and headers at once, then a space (valid JSON whitespace) every `interval` seconds."""
    def drip():
        for _ in range(3600):
            yield b" "
            time.sleep(interval)
    return Response(drip(), status=200, mimetype="application/json")


def huge_token_response(size):
    """A token response whose access token is `size` bytes, streamed with no Content-Length."""
    def body():
        yield b'{"token_type": "Bearer", "expires_in": 3600, "access_token": "'
        chunk = b"A" * 65536
        sent = 0
        while sent < size:
            yield chunk
            sent += len(chunk)
            with STATE.lock:
                STATE.count("huge_bytes_sent", len(chunk))
        yield b'"}'
    return Response(body(), status=200, mimetype="application/json")


@app.post("/token")
def token():
    delay = float(STATE.faults["token_delay"])
    if delay > 0:
        time.sleep(delay)
    with STATE.lock:
        trickle = float(STATE.faults["token_trickle"])
        if trickle > 0:
            STATE.count("trickled_responses")
            STATE.record("token_trickle", interval=trickle)
            return trickle_response(trickle)
        if STATE.faults["token_redirect"] > 0:
            STATE.faults["token_redirect"] -= 1
            STATE.count("token_redirects")
            STATE.record("token_redirect")
            return redirect(BASE_URL["url"] + "/token-redirected", code=307)
        huge = int(STATE.faults["token_huge_access_token"])
        if huge > 0 and request.form.get("grant_type") == "refresh_token":
            STATE.faults["token_huge_access_token"] = 0
            STATE.record("token_huge", size=huge)
            return huge_token_response(huge)
        if STATE.faults["token_503"] > 0:
            STATE.faults["token_503"] -= 1
            STATE.count("token_503")
            STATE.record("token_503")
            return jsonify({"error": "temporarily_unavailable"}), 503, {"Retry-After": "1"}
        is_refresh = request.form.get("grant_type") == "refresh_token"
        refused = dpop_token_request(is_refresh)
        if refused is not None:
            return refused
        before = STATE.counters["refresh_successes"]
        response = authorization.create_token_response()
        if g.get("dpop_jkt") and response.status_code == 200:
            body = json.loads(response.get_data())
            body["token_type"] = "DPoP"
            response.set_data(json.dumps(body))
        if STATE.faults["token_expires_in"] != "" and response.status_code == 200:
            body = json.loads(response.get_data())
            if STATE.faults["token_expires_in"] == "omit":
                body.pop("expires_in", None)
            else:
                body["expires_in"] = int(STATE.faults["token_expires_in"])
            response.set_data(json.dumps(body))
        rotated = is_refresh and STATE.counters["refresh_successes"] > before
        drop = rotated and STATE.faults["token_drop_after_rotate"] > 0
        if drop:
            STATE.faults["token_drop_after_rotate"] -= 1
        hang = float(STATE.faults["token_hang_after_rotate"]) if rotated else 0
    if hang > 0:
        STATE.record("token_hang_after_rotate", seconds=hang)
        time.sleep(hang)
    if drop:
        STATE.count("dropped_responses")
        STATE.record("token_response_dropped")
        connection = request.environ.get("werkzeug.socket")
        if connection is not None:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()
    return response


def dpop_token_request(is_refresh):
    """Checks the proof of a token request, if it has one, and the binding of a refresh token.
    Sets g.dpop_jkt to the key the new tokens are bound to; returns an answer when refused."""
    client = CLIENTS.get(request.form.get("client_id", ""))
    if "DPoP" in request.headers:
        try:
            jkt = check_proof("POST", require_nonce=client is not None and client.require_dpop_nonce)
        except ProofError as error:
            return proof_refusal(error, 400)
        if not STATE.faults["dpop_answer_bearer"]:
            g.dpop_jkt = jkt
    if is_refresh:
        bound = STATE.by_refresh.get(request.form.get("refresh_token", ""))
        if bound is not None and bound.jkt and bound.jkt != g.get("dpop_jkt"):
            # A bound refresh token without its key's proof: refused, and left usable by its holder.
            STATE.count("dpop_binding_refusals")
            STATE.record("dpop_binding_refused", refresh=fingerprint(bound.refresh_token))
            return jsonify({"error": "invalid_dpop_proof"}), 400
    return None


@app.post("/token-redirected")
def token_redirected():
    """Where the token_redirect fault points: a client that follows it resends its grant."""
    with STATE.lock:
        STATE.count("redirected_token_requests")
        STATE.record("redirected_token_request")
        return authorization.create_token_response()


@app.post("/device_authorization")
def device_authorization():
    with STATE.lock:
        response = authorization.create_endpoint_response("device_authorization")
        overrides = {field: STATE.faults["device_" + field] for field in
                     ("user_code", "verification_uri", "verification_uri_complete") if STATE.faults["device_" + field]}
        if not overrides:
            return response
        for field in overrides:
            STATE.faults["device_" + field] = ""
        body = json.loads(response.get_data())
        body.update(overrides)
        response.set_data(json.dumps(body))
        STATE.record("device_authorization_overridden", fields=sorted(overrides))
        return response


@app.post("/revoke")
def revoke():
    with STATE.lock:
        if STATE.faults["revoke_fail"] > 0:
            STATE.faults["revoke_fail"] -= 1
            STATE.count("revocation_failures")
            STATE.record("revocation_failed_by_fault")
            return jsonify({"error": "temporarily_unavailable"}), 503, {"Retry-After": "1"}
        return authorization.create_endpoint_response("revocation")


@app.get("/authorize")
def authorize():
    # Test-only consent: the user "test-user" approves at once.
    with STATE.lock:
        return authorization.create_authorization_response(grant_user=request.args.get("login_hint") or "test-user")


@app.get("/api/resource")
@require_oauth("api")
def api_resource():
    STATE.count("api_get")
    return jsonify({"ok": True, "method": "GET"})


@app.post("/api/orders")
@require_oauth("api")
def api_orders():
    STATE.count("api_post")
    return jsonify({"ok": True, "method": "POST"}), 201


@app.route("/api/items", methods=["PUT", "DELETE"])
@require_oauth("api")
def api_items():
    STATE.count("api_" + request.method.lower())
    return jsonify({"ok": True, "method": request.method})


@app.get("/api/always-401")
def api_always_401():
    """Rejects every token, as a misconfigured resource server would: clients must not loop."""
    STATE.count("api_always_401")
    return jsonify({"error": "invalid_token"}), 401, {"WWW-Authenticate": 'Bearer error="invalid_token"'}


@app.route("/api/dpop/resource", methods=["GET", "POST"])
def api_dpop_resource():
    """A resource that takes DPoP-bound tokens only: `Authorization: DPoP <token>` and a proof
    by the token's key for this request, bound to the token (ath)."""
    scheme, _, token_string = request.headers.get("Authorization", "").partition(" ")
    with STATE.lock:
        token = STATE.by_access.get(token_string)
        if (scheme.lower() != "dpop" or token is None or token.jkt is None or token.is_expired() or token.is_revoked()):
            return jsonify({"error": "invalid_token"}), 401, {"WWW-Authenticate": 'DPoP error="invalid_token", algs="ES256"'}
        try:
            jkt = check_proof(request.method, access_token=token_string,
                              require_nonce=CLIENTS[token.client_id].require_dpop_nonce)
        except ProofError as error:
            return proof_refusal(error, 401)
        if jkt != token.jkt:
            return proof_refusal(ProofError("invalid_dpop_proof", "the proof's key is not the token's"), 401)
        STATE.count("dpop_api_calls")
        return jsonify({"ok": True, "method": request.method, "jkt": jkt})


@app.get("/test/dpop/bindings")
def test_dpop_bindings():
    with STATE.lock:
        return jsonify([{"access": fingerprint(token.access_token), "refresh": fingerprint(token.refresh_token),
                         "jkt": token.jkt, "client_id": token.client_id} for token in STATE.by_access.values()])


@app.post("/test/dpop/expire-nonces")
def test_dpop_expire_nonces():
    with STATE.lock:
        STATE.dpop_nonces.clear()
    return jsonify({"ok": True})


@app.get("/api/admin")
@require_oauth("admin")
def api_admin():
    return jsonify({"ok": True})


@app.before_request
def count_plain_http():
    if request.scheme == "http":
        with STATE.lock:
            STATE.count("plain_http_requests")
            STATE.record("plain_http_request", path=request.path)


@app.after_request
def count_api_errors(response):
    if request.path.startswith("/api/"):
        if response.status_code == 401:
            STATE.count("api_401")
        elif response.status_code == 403:
            STATE.count("api_403")
    return response


@app.post("/test/reset")
def test_reset():
    with STATE.lock:
        STATE.reset()
    return jsonify({"ok": True})


@app.post("/test/faults")
def test_faults():
    with STATE.lock:
        for key, value in (request.get_json(force=True) or {}).items():
            if key not in STATE.faults:
                return jsonify({"error": "unknown fault " + key}), 400
            STATE.faults[key] = value
        return jsonify(STATE.faults)


@app.get("/test/counters")
def test_counters():
    with STATE.lock:
        return jsonify(STATE.counters)


@app.get("/test/log")
def test_log():
    with STATE.lock:
        return jsonify(STATE.log)


@app.post("/test/device/approve")
def test_device_approve():
    body = request.get_json(force=True)
    with STATE.lock:
        STATE.device_grants[body["user_code"]] = (body.get("user", "test-user"), body.get("approve", True))
        STATE.record("device_approved", user_code=body["user_code"], approve=body.get("approve", True))
    return jsonify({"ok": True})


@app.post("/test/revoke-all")
def test_revoke_all():
    """Revokes every family, as an administrator revoking a user's sessions would."""
    with STATE.lock:
        for token in STATE.by_refresh.values():
            STATE.revoked_families.add(token.family)
        STATE.record("all_families_revoked")
    return jsonify({"ok": True})


@app.get("/health")
def health():
    return jsonify({"ok": True})


def serve(server):
    server.serve_forever()


def tls_server(port, certificate, key):
    """A threaded TLS server whose handshakes run in each connection's own thread (at its first
    read), not in the accept loop: there, one client that connects and says nothing stalled every
    other client until it left."""
    server = make_server("127.0.0.1", port, app, threaded=True)
    context = load_ssl_context(certificate, key)
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    server.ssl_context = context
    return server


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--port", type=int, default=0)
    arguments = parser.parse_args()
    directory = arguments.state_dir

    server = tls_server(arguments.port, os.path.join(directory, "server.pem"), os.path.join(directory, "server.key"))
    BASE_URL["url"] = "https://127.0.0.1:%d" % server.server_port
    # The same app behind a certificate from a CA nobody trusts: clients must refuse it.
    rogue = tls_server(0, os.path.join(directory, "rogue.pem"), os.path.join(directory, "rogue.key"))
    threading.Thread(target=serve, args=(rogue,), daemon=True).start()
    plain = make_server("127.0.0.1", 0, app, threaded=True)
    PLAIN_URL["url"] = "http://127.0.0.1:%d" % plain.server_port
    threading.Thread(target=serve, args=(plain,), daemon=True).start()
    with open(os.path.join(directory, "plain-url.tmp"), "w") as file:
        file.write(PLAIN_URL["url"] + "\n")
    os.replace(os.path.join(directory, "plain-url.tmp"), os.path.join(directory, "plain-url"))
    with open(os.path.join(directory, "rogue-url.tmp"), "w") as file:
        file.write("https://127.0.0.1:%d\n" % rogue.server_port)
    os.replace(os.path.join(directory, "rogue-url.tmp"), os.path.join(directory, "rogue-url"))
    with open(os.path.join(directory, "url.tmp"), "w") as file:
        file.write(BASE_URL["url"] + "\n")
    os.replace(os.path.join(directory, "url.tmp"), os.path.join(directory, "url"))
    print("listening on " + BASE_URL["url"], file=sys.stderr, flush=True)
    serve(server)


if __name__ == "__main__":
    main()
