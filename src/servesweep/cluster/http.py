"""HTTP to the servers on the nodes: one request helper (status and body, the API-key header,
every transport failure as "no answer") that probes, polls and counters share."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from servesweep.cluster.secrets import Secret


def auth_headers(key: Secret | None) -> dict[str, str]:
    """The header SGLang's `--api-key` wants (none without a key)."""
    return {} if key is None else {"Authorization": f"Bearer {key.reveal()}"}


def request(
    url: str, *, timeout: float, key: Secret | None = None, method: str = "GET"
) -> tuple[int | None, str]:
    """(HTTP status, body text) of one request; (None, "") when nothing answers. An error
    status is returned, not raised (its body is not read)."""
    req = urllib.request.Request(
        url, headers=auth_headers(key), method=method, data=b"" if method == "POST" else None
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError, TimeoutError):
        return None, ""


def status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET, or None when nothing answers."""
    return request(url, timeout=timeout)[0]


def text(url: str, timeout: float = 5.0, *, key: Secret | None = None) -> str | None:
    """The body of a GET that answered 200, else None."""
    code, body = request(url, timeout=timeout, key=key)
    return body if code == 200 else None


def get_json(url: str, timeout: float = 5.0, *, key: Secret | None = None) -> Any:
    """GET a JSON document (None on any failure)."""
    body = text(url, timeout, key=key)
    try:
        return None if body is None else json.loads(body)
    except ValueError:
        return None


def post_json(
    url: str, body: Any, *, timeout: float, key: Secret | None = None
) -> tuple[int | None, Any]:
    """(HTTP status, parsed JSON answer) of one POST with a JSON body; (None, None) when nothing
    answers, (status, None) for an error status or an answer that is not JSON."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **auth_headers(key)},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode(errors="replace")
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, TimeoutError):
        return None, None
    try:
        return status, json.loads(text)
    except ValueError:
        return status, None
