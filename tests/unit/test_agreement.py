"""P/D agreement read from both running servers' /server_info (not the config's values)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from servesweep.core.errors import ServerStartError
from servesweep.serving.agreement import check_pd_agreement
from servesweep.serving.state import RankState, ServerState


def _serve(info: object) -> tuple[http.server.ThreadingHTTPServer, str]:
    body = json.dumps(info).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.path == "/server_info" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture()
def pd() -> Iterator[callable]:
    servers = []

    def make(prefill: object, decode: object) -> ServerState:
        ranks = []
        for role, info in (("prefill", prefill), ("decode", decode)):
            httpd, url = _serve(info)
            servers.append(httpd)
            ranks.append(RankState(role, "n1", 0, "1", "log", url))
        return ServerState("fp", "pd", "http://router", ranks=ranks)

    yield make
    for httpd in servers:
        httpd.shutdown()


KIMI = {"page_size": 64, "kv_cache_dtype": "auto", "mamba_ssm_dtype": "float32"}


def test_agreeing_servers_pass_with_what_they_resolved(pd) -> None:
    # a PD prefill of older releases answers a list (one entry per DP rank)
    assert check_pd_agreement(pd([KIMI], dict(KIMI))) == KIMI


def test_a_mamba_state_dtype_mismatch_fails_the_start_naming_both(pd) -> None:
    with pytest.raises(ServerStartError) as info:
        check_pd_agreement(pd(KIMI, {**KIMI, "mamba_ssm_dtype": "bfloat16"}))
    assert str(info.value) == (
        "server pd: prefill and decode disagree on mamba_ssm_dtype: prefill 'float32', "
        "decode 'bfloat16' (the transferred KV would be read wrongly)"
    )


def test_a_single_server_set_has_nothing_to_agree_on() -> None:
    state = ServerState("fp", "s", "u", ranks=[RankState("server", "n", 0, "1", "l", "u")])
    assert check_pd_agreement(state) == {}
