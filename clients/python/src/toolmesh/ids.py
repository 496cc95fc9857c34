"""Identifier syntax (PROTOCOL.md "Transport", "ToolRequest") checked before anything is sent,
and invocation ids made here."""

from __future__ import annotations

import re
import secrets

TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""Accounts, sessions, tool names, provider service names."""

INVOCATION = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""Invocation ids (a subject token)."""


def check_token(value: object, what: str) -> str:
    """`value` when it is a string of 1 to 64 of `[A-Za-z0-9_-]`; a `ValueError` naming `what`
    otherwise."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise ValueError(f"{what} must be 1 to 64 characters of A-Z, a-z, 0-9, _ and -; got {value!r}")
    return value


def check_invocation_id(value: object) -> str:
    """`value` when it is a valid invocation id (1 to 128 of `[A-Za-z0-9_-]`)."""
    if not isinstance(value, str) or not INVOCATION.fullmatch(value):
        raise ValueError(
            f"invocation_id must be 1 to 128 characters of A-Z, a-z, 0-9, _ and -; got {value!r}"
        )
    return value


def new_invocation_id() -> str:
    """A fresh invocation id, `inv_` and 128 random bits in hex."""
    return "inv_" + secrets.token_hex(16)
