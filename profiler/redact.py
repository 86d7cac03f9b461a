"""Keep credentials out of everything perfscope stores or prints.

Two rules, applied to manifests, command lines, error texts and printed lines:

- URL userinfo (``http://user:SECRET@host``) loses its password: ``http://user:***@host``
  (a lone user name, which may itself be a token, becomes ``***``).
- A field whose name looks like a credential (its words include token, secret, password,
  authorization, or key with another word as in ``api_key``; ``max_tokens`` or a device's
  ``key`` do not) keeps its name and loses its text value: ``"***"`` (numbers are kept).
  This covers engine options, headers and extra-body fields alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["REDACTED", "is_secret_name", "redact", "redact_argv", "redact_text"]

REDACTED = "***"

_SECRET_WORDS = frozenset(
    {
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "authorization",
        "bearer",
        "credential",
        "credentials",
        "cookie",
    }
)
# scheme://userinfo@ — userinfo stops at the first '/', '@' or whitespace.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/@\s]+)@")
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_name(name: str) -> bool:
    """True when a field or option called ``name`` probably holds a credential."""
    words = {w.lower() for w in _SPLIT.split(name) if w}
    compact = re.sub(r"[^a-z0-9]", "", name.lower())
    if words & _SECRET_WORDS:
        return True
    # "api_key", "access-key", "X-Api-Key" are secrets; a bare "key" (a device key) is not.
    return ("key" in words and len(words) > 1) or compact in {"apikey", "xapikey"}


def _strip_userinfo(match: re.Match[str]) -> str:
    info = match.group("info")
    user, sep, _ = info.partition(":")
    return (
        f"{match.group('scheme')}{user}:{REDACTED}@"
        if sep
        else f"{match.group('scheme')}{REDACTED}@"
    )


def redact_text(text: str) -> str:
    """``text`` with URL passwords replaced (cheap when there is no ``@``)."""
    if "@" not in text or "://" not in text:
        return text
    return _USERINFO.sub(_strip_userinfo, text)


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (JSON-like: dicts, lists, scalars) with secrets replaced."""
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v != "":
                out[k] = REDACTED
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


#: Flags whose value is always a secret.
_SECRET_FLAGS = frozenset({"--api-key", "--token", "--password"})
#: Flags whose value is ``KEY=VALUE`` (the value is a secret when KEY looks like one).
_KV_FLAGS = frozenset({"--engine-opt", "--header", "-H"})
#: Flags whose value is a JSON object (secret-looking fields are replaced).
_JSON_FLAGS = frozenset({"--extra-body"})


def _redact_kv(value: str) -> str:
    for sep in ("=", ":"):
        k, eq, _v = value.partition(sep)
        if eq and k.strip() and is_secret_name(k.strip()):
            return f"{k}{sep}{REDACTED}"
        if eq:
            break
    return redact_text(value)


def _redact_json(value: str) -> str:
    try:
        data = json.loads(value)
    except ValueError:
        return redact_text(value)
    return json.dumps(redact(data))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with secret values replaced (flags above, URL passwords anywhere)."""
    out: list[str] = []
    pending: str | None = None
    for a in argv:
        if pending is not None:
            flag, pending = pending, None
            if flag in _SECRET_FLAGS:
                out.append(REDACTED)
            elif flag in _KV_FLAGS:
                out.append(_redact_kv(a))
            else:
                out.append(_redact_json(a))
            continue
        flag, eq, value = a.partition("=")
        if flag in _SECRET_FLAGS | _KV_FLAGS | _JSON_FLAGS:
            if not eq:
                out.append(a)
                pending = flag
            elif flag in _SECRET_FLAGS:
                out.append(f"{flag}={REDACTED}")
            elif flag in _KV_FLAGS:
                out.append(f"{flag}={_redact_kv(value)}")
            else:
                out.append(f"{flag}={_redact_json(value)}")
            continue
        out.append(redact_text(a))
    return out
