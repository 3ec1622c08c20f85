"""Secrets: the sudo password (read at run time from the environment or a private file) and a
service's API key (made at its start); never shown."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from servesweep.core.errors import SecretError

logger = logging.getLogger(__name__)

PASSWORD_ENV = "SUDO_PASSWORD"
PASSWORD_FILE_ENV = "SUDO_PASSWORD_FILE"
MASK = "***"


class Secret:
    """A string that prints as '***'; `reveal()` is the only way to the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return MASK

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return MASK

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret is not pickled (it would leave the process in clear)")


def new_api_key() -> Secret:
    """A random API key for one server set (256 bits, URL-safe: fits an HTTP header)."""
    return Secret(secrets.token_urlsafe(32))


def scrub(text: str, secret: str | Secret | None) -> str:
    """`text` with every occurrence of the secret replaced by '***' (for error messages)."""
    value = secret.reveal() if isinstance(secret, Secret) else secret
    return text.replace(value, MASK) if value else text


def sudo_password(env: Mapping[str, str], *, default_file: str | None = None) -> str | None:
    """The sudo password from SUDO_PASSWORD or SUDO_PASSWORD_FILE, else from `default_file`
    (config `secrets.sudo_password_file`); None if none is set.

    The file must be a regular file that neither group nor others can read or write (chmod 600);
    its first line is the password. Messages never contain the password.
    """
    direct = env.get(PASSWORD_ENV)
    path = env.get(PASSWORD_FILE_ENV)
    if direct is not None and path is not None:
        raise SecretError(f"set only one of {PASSWORD_ENV} and {PASSWORD_FILE_ENV}, not both")
    if direct is not None:
        return _checked(direct, where=f"env {PASSWORD_ENV}")
    if path is None and default_file is not None:
        return _checked(_read_private_file(Path(default_file).expanduser()), where=default_file)
    if path is not None:
        if not path.strip():
            raise SecretError(f"env {PASSWORD_FILE_ENV} is set but empty")
        return _checked(_read_private_file(Path(path).expanduser()), where=path)
    return None


def check_secrets(
    *, sudo: bool, default_file: str | None, passwordless: bool, env: Mapping[str, str]
) -> str:
    """At workflow start: a config that needs sudo has a readable, private password source
    (or says sudo needs none). Returns where it comes from; SecretError is one line."""
    if not sudo:
        return "no sudo"
    value = sudo_password(env, default_file=default_file)
    if value is not None:
        return env.get(PASSWORD_FILE_ENV) or (
            f"env {PASSWORD_ENV}" if PASSWORD_ENV in env else str(default_file)
        )
    if passwordless:
        return "passwordless sudo (secrets.passwordless_sudo)"
    raise SecretError(
        f"runtime.sudo is true but no sudo password is given: set {PASSWORD_FILE_ENV} (a chmod "
        f"600 file), {PASSWORD_ENV}, or config key secrets.sudo_password_file (or "
        f"secrets.passwordless_sudo: true)"
    )


def sudo_secret(env: Mapping[str, str]) -> Secret | None:
    """`sudo_password` wrapped in a Secret."""
    value = sudo_password(env)
    return None if value is None else Secret(value)


def _read_private_file(path: Path) -> str:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SecretError(f"sudo password file {path} does not exist") from None
    except OSError as exc:
        raise SecretError(f"sudo password file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecretError(f"sudo password file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise SecretError(
            f"sudo password file {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or "
            f"others may read or write it; run `chmod 600 {path}`"
        )
    if st.st_uid != os.geteuid():
        logger.warning("sudo password file %s is owned by uid %d, not by us", path, st.st_uid)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SecretError(f"sudo password file {path}: cannot read it ({reason})") from None
    logger.info("sudo password read from %s", path)
    return text


def _checked(value: str, *, where: str) -> str:
    """The password without trailing line breaks; refuse an empty or multi-line one."""
    value = value.rstrip("\r\n")
    if not value:
        raise SecretError(f"sudo password from {where} is empty")
    if "\n" in value or "\r" in value:
        raise SecretError(f"sudo password from {where} has more than one line")
    return value
