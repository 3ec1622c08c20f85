"""Tests for servesweep.cluster.secrets: where the sudo password comes from and what is refused."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from servesweep.cluster.secrets import Secret, scrub, sudo_password, sudo_secret
from servesweep.core.errors import SecretError

CANARY = "canary-Zq81xPw"


def _file(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "sudo_pw"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_neither_variable_means_no_password() -> None:
    assert sudo_password({}) is None
    assert sudo_secret({"OTHER": "x"}) is None


def test_password_from_the_environment() -> None:
    assert sudo_password({"SUDO_PASSWORD": CANARY}) == CANARY
    assert sudo_password({"SUDO_PASSWORD": CANARY + "\n"}) == CANARY


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_password_from_a_private_file(tmp_path: Path, mode: int) -> None:
    path = _file(tmp_path, CANARY + "\n", mode)
    assert sudo_password({"SUDO_PASSWORD_FILE": str(path)}) == CANARY


def test_password_keeps_inner_and_leading_spaces(tmp_path: Path) -> None:
    path = _file(tmp_path, " a b \r\n\n", 0o600)
    assert sudo_password({"SUDO_PASSWORD_FILE": str(path)}) == " a b "


def test_file_path_with_tilde(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _file(tmp_path, CANARY, 0o600)
    assert sudo_password({"SUDO_PASSWORD_FILE": "~/sudo_pw"}) == CANARY


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o644, 0o660])
def test_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = _file(tmp_path, CANARY, mode)
    with pytest.raises(SecretError, match="chmod 600") as err:
        sudo_password({"SUDO_PASSWORD_FILE": str(path)})
    assert f"{mode:04o}" in str(err.value)
    assert CANARY not in str(err.value)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="does not exist"):
        sudo_password({"SUDO_PASSWORD_FILE": str(tmp_path / "nope")})


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="not a regular file"):
        sudo_password({"SUDO_PASSWORD_FILE": str(tmp_path)})


@pytest.mark.parametrize("text", ["", "\n", "\r\n\n"])
def test_empty_password_file_is_refused(tmp_path: Path, text: str) -> None:
    path = _file(tmp_path, text, 0o600)
    with pytest.raises(SecretError, match="empty"):
        sudo_password({"SUDO_PASSWORD_FILE": str(path)})


def test_empty_variables_are_refused() -> None:
    with pytest.raises(SecretError, match="empty"):
        sudo_password({"SUDO_PASSWORD": ""})
    with pytest.raises(SecretError, match="SUDO_PASSWORD_FILE is set but empty"):
        sudo_password({"SUDO_PASSWORD_FILE": " "})


def test_multi_line_password_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, f"{CANARY}\nsecond\n", 0o600)
    with pytest.raises(SecretError, match="more than one line") as err:
        sudo_password({"SUDO_PASSWORD_FILE": str(path)})
    assert CANARY not in str(err.value)
    with pytest.raises(SecretError, match="more than one line") as err:
        sudo_password({"SUDO_PASSWORD": f"{CANARY}\nx"})
    assert CANARY not in str(err.value)


def test_both_sources_are_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, CANARY, 0o600)
    with pytest.raises(SecretError, match="only one") as err:
        sudo_password({"SUDO_PASSWORD": CANARY, "SUDO_PASSWORD_FILE": str(path)})
    assert CANARY not in str(err.value)


def test_logs_never_carry_the_password(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    path = _file(tmp_path, CANARY, 0o600)
    assert sudo_password({"SUDO_PASSWORD_FILE": str(path)}) == CANARY
    assert str(path) in caplog.text
    assert CANARY not in caplog.text


def test_secret_hides_its_value() -> None:
    secret = Secret(CANARY)
    assert secret.reveal() == CANARY
    shown = [repr(secret), str(secret), f"{secret}", f"{secret!r}", f"{secret:>20}", str([secret])]
    assert all(CANARY not in s for s in shown)
    assert repr(secret) == "***"
    with pytest.raises(TypeError):
        pickle.dumps(secret)


def test_sudo_secret_wraps_the_password() -> None:
    secret = sudo_secret({"SUDO_PASSWORD": CANARY})
    assert isinstance(secret, Secret)
    assert secret.reveal() == CANARY


def test_scrub() -> None:
    text = f"sudo said {CANARY} twice {CANARY}"
    assert scrub(text, CANARY) == "sudo said *** twice ***"
    assert scrub(text, Secret(CANARY)) == "sudo said *** twice ***"
    assert scrub(text, None) == text
    assert scrub(text, "") == text


def test_check_secrets_at_workflow_start(tmp_path: Path) -> None:
    from servesweep.cluster.secrets import check_secrets

    assert check_secrets(sudo=False, default_file=None, passwordless=False, env={}) == "no sudo"
    with pytest.raises(SecretError, match="secrets.sudo_password_file") as info:
        check_secrets(sudo=True, default_file=None, passwordless=False, env={})
    assert "\n" not in str(info.value)
    assert "passwordless" in check_secrets(sudo=True, default_file=None, passwordless=True, env={})
    private = tmp_path / "pw"
    private.write_text("hunter2\n")
    private.chmod(0o600)
    where = check_secrets(sudo=True, default_file=str(private), passwordless=False, env={})
    assert where == str(private) and "hunter2" not in where
    private.chmod(0o640)
    with pytest.raises(SecretError, match="mode 0640"):
        check_secrets(sudo=True, default_file=str(private), passwordless=False, env={})
    # The environment wins over the config's file.
    env = {"SUDO_PASSWORD": "from-env"}
    assert check_secrets(sudo=True, default_file=str(private), passwordless=False, env=env) == (
        "env SUDO_PASSWORD"
    )
