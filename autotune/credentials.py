"""Storage URLs hold database passwords: one rule hides them wherever a URL is shown or
written, and one rule says where the storage comes from.

- :func:`redact_url`: the password of a URL with a user part (``user:***@host``) and the
  values of secret query parameters (``?password=***``) masked. Console lines, errors,
  ``best_config.yaml``, ``report.json``, the HTML page and exports only ever show this.
- :func:`resolve_storage`: the storage in effect. The explicit one (``--storage``, a
  library call's ``storage=``), else the ``AUTOTUNE_STORAGE`` environment variable, else
  the space file's ``study.storage`` (a literal, or ``{env: NAME}``: the variable NAME).
  A literal password in the space file (a file people commit) is warned about, once.

PostgreSQL's own ``PGPASSWORD`` and ``~/.pgpass`` need no URL password at all: libpq reads
them, so ``postgresql+psycopg2://user@host/db`` is the way to write a shared storage.
"""

from __future__ import annotations

import os
import re
import sys
from urllib.parse import unquote

from .errors import StorageError

ENV = "AUTOTUNE_STORAGE"
MASK = "***"
# user:password@ right after the first "://" (any scheme, even a malformed one: a URL
# SQLAlchemy cannot parse is still quoted in messages), or at the start of a string
# without one. The user part has no ':' or '/', as SQLAlchemy reads it; the password runs
# to the last '@', so a password holding '@' or '/' is masked whole.
_USERINFO = re.compile(r"[^:/@?#]*:(?P<password>.*)@")
# a query parameter whose name says it is a secret: password=, sslpassword=, passwd=, ...
_SECRET_PARAM = re.compile(
    r"(?P<key>[?&;](?:[^=&;#]*(?:pass|pwd|secret|token)[^=&;#]*)=)(?P<value>[^&;#]*)",
    re.IGNORECASE,
)
# Secrets shorter than this are not searched for in free text (an error message): a
# one-letter password would mask every such letter of the message.
_SHORTEST_SCRUBBED = 4

_warned: set[str] = set()


def _secret_spans(url: str) -> list[tuple[int, int]]:
    """Where the secrets of ``url`` lie: (start, end) of the password and of each secret
    query value, non-empty ones only."""
    spans = []
    scheme = url.find("://")
    userinfo = _USERINFO.match(url, scheme + 3 if scheme >= 0 else 0)
    after = 0
    if userinfo:
        if userinfo.group("password"):
            spans.append(userinfo.span("password"))
        after = userinfo.end()
    query = url.find("?", after)
    if query >= 0:
        for m in _SECRET_PARAM.finditer(url, query):
            if m.group("value"):
                spans.append(m.span("value"))
    return spans


def redact_url(url: str) -> str:
    """``url`` with its password and secret query values replaced by ``***``.

    ``postgresql://me:pw@host/db`` -> ``postgresql://me:***@host/db``;
    ``mysql://host/db?password=pw`` -> ``mysql://host/db?password=***``. A URL without a
    user part (``sqlite:///path``, ``journal:///path``, a ``.log`` path, ``memory``) keeps
    its path as it is.
    """
    out = url
    for start, end in sorted(_secret_spans(url), reverse=True):
        out = out[:start] + MASK + out[end:]
    return out


def has_secret(url: str) -> bool:
    """Whether ``url`` holds a password or a secret query value."""
    return bool(_secret_spans(url))


def scrub(text: str, url: str) -> str:
    """``text`` (an error message that may quote ``url`` or its password) with the URL
    redacted and each of its secrets (as written and percent-decoded) masked."""
    text = text.replace(url, redact_url(url))
    for start, end in _secret_spans(url):
        for secret in {url[start:end], unquote(url[start:end])}:
            if len(secret) >= _SHORTEST_SCRUBBED:
                text = text.replace(secret, MASK)
    return text


def resolve_storage(
    explicit: str | None,
    configured: str,
    configured_env: str | None = None,
    source: str = "the space file",
) -> str:
    """The storage URL in effect: ``explicit``, else ``$AUTOTUNE_STORAGE``, else the space
    file's: the variable ``configured_env`` names when it names one, else ``configured``.

    A literal password in the space file's URL (``source``) is warned about on stderr,
    once per process and URL, when that URL is the one in effect.

    Raises:
        StorageError: the space file names an environment variable that is not set.
    """
    if explicit:
        return explicit
    from_env = os.environ.get(ENV)
    if from_env:
        return from_env
    if configured_env is not None:
        value = os.environ.get(configured_env)
        if not value:
            raise StorageError(
                f"{source}: study.storage names the environment variable {configured_env}, "
                f"which is not set; set it, or give the storage with --storage or {ENV}"
            )
        return value
    if has_secret(configured):
        warn_literal_password(configured, source)
    return configured


def literal_password_warning(url: str, source: str) -> str:
    """What to say about a password written into a space file."""
    return (
        f"{source}: study.storage {redact_url(url)} holds a password, in a file people "
        "commit. Leave it out of the URL: PostgreSQL reads it from PGPASSWORD or ~/.pgpass; "
        f"or give the whole URL in {ENV}, or write study.storage as {{env: VARIABLE}}"
    )


def warn_literal_password(url: str, source: str) -> None:
    """Print :func:`literal_password_warning` to stderr, once per process and URL."""
    key = f"{source}\0{url}"
    if key in _warned:
        return
    _warned.add(key)
    print(f"autotune: warning: {literal_password_warning(url, source)}", file=sys.stderr)
