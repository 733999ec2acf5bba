"""URLs and command lines as a person or a file may see them: with every password hidden, here and nowhere else.

A URL is shown with everything between its user name and the last ``@`` of its authority masked (a password may hold
an unescaped ``@``), and every string SQLAlchemy or a driver might read as its password (up to the first ``@`` or the
last, raw or decoded) hidden wherever else it appears; ``remember``ed ones anywhere. The standard library only.
"""

import re
import shlex
from collections.abc import Iterable, Sequence
from urllib.parse import quote, unquote

MASK = "***"
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|key|auth|credential", re.IGNORECASE)
# A URL in running text, after "://": it ends at a blank or a quote, but a password may hold a few blanks before '@'.
_SCHEME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_URL_TAIL = re.compile(r"(?:[^@\s'\"]*(?: [^@\s'\"]*){0,3}@)?[^\s'\"]*")
# An argument of a command line that is a URL, or a flag's value given as --flag=URL.
_URL_ARGUMENT = re.compile(r"(--?[\w.-]+=)?([A-Za-z][A-Za-z0-9+.\-]*://.*)", re.DOTALL)
_QUERY_PAIR = re.compile(r"([?&;]|^)([^=&;?#]+)=([^&;#]*)")
# Passwords shorter than this are not searched for in other text: they would hide ordinary letters.
_SHORTEST_SCRUBBED = 4
_remembered: set[str] = set()


def hidden(url: str) -> str:
    """``url`` with its password, and any secret query parameter, replaced by ``***``; any text is accepted."""
    text = str(url)
    if "://" not in text:  # no URL, or one mistyped (``user:secret@host``): a password in it is hidden all the same
        head, mark, query = text.partition("?")
        text = f"{_masked_authority(head)}{mark}{query}"
        return _mask_query(text) if "=" in text else text
    result = _by_pattern(text)
    for secret in _candidates(text):
        result = result.replace(secret, MASK)
    return result


def remember(url: str) -> None:
    """Note ``url``'s password (and secret query values): ``scrubbed`` hides them in any text from now on."""
    _remembered.update(_candidates(str(url)))


def scrubbed(text: str) -> str:
    """``text`` with every URL in it hidden, and every remembered password; in linear time (from each ``://``)."""
    text = str(text)
    if "://" in text:
        pieces, done = [], 0
        for separator in re.finditer("://", text):
            start = separator.start()
            if start < done:
                continue  # inside the URL hidden last
            while start > done and text[start - 1] in _SCHEME_CHARACTERS:
                start -= 1
            tail = _URL_TAIL.match(text, separator.end())
            end = tail.end() if tail else separator.end()
            if start == separator.start() or not text[start].isalpha():
                continue  # no scheme before it: not a URL
            pieces += [text[done:start], hidden(text[start:end])]
            done = end
        text = "".join([*pieces, text[done:]])
    for secret in sorted(_remembered, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def hidden_command(args: Iterable[str]) -> list[str]:
    """A command line's arguments with every URL in them hidden (``--storage URL`` and ``--storage=URL`` alike)."""
    matched = [(arg, _URL_ARGUMENT.fullmatch(arg)) for arg in map(str, args)]
    return [scrubbed(f"{found[1] or ''}{hidden(found[2])}" if found else arg) for arg, found in matched]


def shown_command(args: Sequence[str]) -> str:
    """A command line to show a person, quoted for a shell, every URL in it hidden."""
    return shlex.join(hidden_command(args))


def _by_pattern(text: str) -> str:
    """``scheme://user:***@rest``: the user information ends at the last ``@`` before the query."""
    scheme, _, rest = text.partition("://")
    authority, mark, query = rest.partition("?")
    return f"{scheme}://{_masked_authority(authority)}{_mask_query(mark + query)}"


def _masked_authority(authority: str) -> str:
    """``user:***@host``: what lies between the user name and the last ``@`` of ``authority`` (and its path) masked."""
    if authority.startswith("/") or "@" not in authority:
        return authority
    userinfo, _, host = authority.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    return f"{user}{':' + MASK if colon else ''}@{host}"


def _mask_query(text: str) -> str:
    """``text`` with the values of secret-looking ``key=value`` pairs (after ``?``, ``&`` or ``;``) masked."""
    head, mark, query = text.partition("?") if "?" in text else ("", "", text)
    masked = _QUERY_PAIR.sub(
        lambda found: f"{found[1]}{found[2]}={MASK if _SECRET_KEY.search(found[2]) else found[3]}", query
    )
    return f"{head}{mark}{masked}"


def _candidates(text: str) -> list[str]:
    """What in ``text`` may be a password, raw and decoded, longest first: up to the last ``@`` of the authority or
    the first (as SQLAlchemy and the drivers read it); none shorter than ``_SHORTEST_SCRUBBED``."""
    found: list[str] = []
    _, separator, rest = text.partition("://")
    if separator and not rest.startswith("/") and "@" in rest:
        found.append(rest.rpartition("@")[0].partition(":")[2])
        found.append(rest.partition("@")[0].partition(":")[2])  # an '@' in the query or path: it ends at the first
    found += [value for _, key, value in _QUERY_PAIR.findall(text.partition("?")[2]) if _SECRET_KEY.search(key)]
    variants = set()
    for secret in found:
        variants.update({secret, unquote(secret), quote(secret, safe=""), quote(unquote(secret), safe="")})
    return sorted((secret for secret in variants if len(secret) >= _SHORTEST_SCRUBBED), key=len, reverse=True)
