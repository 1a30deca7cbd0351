"""Who may see the page, and who may act from it. Pure: the token is passed in.

- The token lives in `<home>/web.token` (mode 0600), made with the home; `pulsectl web
  rotate-token` replaces it, which ends every session at once.
- Opening `/?token=TOKEN` sets a session cookie and redirects to the same page without the
  token. The cookie is `NONCE.SIG`, SIG = HMAC(token, "session:" NONCE): stateless, so it
  survives a restart of the web worker and dies with the token. HttpOnly, SameSite=Strict.
- Every other request needs that cookie or `Authorization: Bearer TOKEN`; else 401.
- A state-changing request is a POST that also carries the session's CSRF token
  (HMAC(token, "csrf:" NONCE), in the page) in `X-CSRF-Token`, and an `Origin` that is the
  page's own. A bearer client (a script, Prometheus) sends no cookie a browser could forge,
  so it needs neither.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Mapping

COOKIE = "pulse_session"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _sign(token: str, purpose: str, nonce: str) -> str:
    return hmac.new(token.encode(), f"{purpose}:{nonce}".encode(), hashlib.sha256).hexdigest()


def new_session(token: str) -> str:
    """A fresh session cookie value."""
    nonce = secrets.token_urlsafe(16)
    return f"{nonce}.{_sign(token, 'session', nonce)}"


def session_nonce(token: str, cookie: str | None) -> str | None:
    """The session's nonce if the cookie is one this token signed, else None."""
    if not cookie or "." not in cookie:
        return None
    nonce, sig = cookie.rsplit(".", 1)
    return nonce if hmac.compare_digest(sig, _sign(token, "session", nonce)) else None


def csrf_token(token: str, nonce: str) -> str:
    return _sign(token, "csrf", nonce)


def bearer_ok(token: str, header: str | None) -> bool:
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), token.encode())


def token_ok(token: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def post_refusal(token: str, headers: Mapping[str, str], cookie: str | None, own_origin: str) -> str | None:
    """Why a POST may not act, or None. Bearer clients pass on the token alone."""
    if bearer_ok(token, headers.get("authorization")):
        return None
    nonce = session_nonce(token, cookie)
    if nonce is None:
        return "no session"
    origin = headers.get("origin")
    if origin != own_origin:
        return f"cross-origin request (Origin {origin or 'missing'}, this page is {own_origin})"
    if not hmac.compare_digest(headers.get("x-csrf-token", "").encode(), csrf_token(token, nonce).encode()):
        return "missing or wrong CSRF token"
    return None
