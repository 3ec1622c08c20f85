#!/usr/bin/env python3
"""Trace a running SGLang server's `/metrics` during a rehearsal (evidence, not a measurement).

    python3 tools/rehearsal/watch_metrics.py RESULTS_DIR OUT_FILE [--interval 0.5]

Every interval it reads the URL of whatever server set `RESULTS_DIR/*/service/current.json`
(or a service's `RESULTS_DIR/.services/*.json`) names (for PD its first engine, not the
router), fetches `/metrics` (open without a key in SGLang), and appends one line per sample to
OUT_FILE: the wall time and the `sglang:` samples whose value changed since the last line. The
first sample of a server, and one every 30 s, is written whole. It ends when its parent does
(run.sh kills it) and never touches the server otherwise.
"""

from __future__ import annotations

import glob
import json
import sys
import time
import urllib.request
from pathlib import Path


def base_url(results: str) -> str | None:
    """The server to trace: a run's own server set, else a `servesweep up` service (its state
    lives in RESULTS_DIR/.services/); for PD its first engine (the router has no /metrics)."""
    found = sorted(glob.glob(f"{results}/*/service/current*.json"))
    found += sorted(glob.glob(f"{results}/.services/*.json"))
    for path in found:
        try:
            state = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        engines = [
            r["url"] for r in state.get("ranks") or [] if r.get("url") and r.get("role") != "router"
        ]
        if engines or state.get("base_url"):
            return str(engines[0] if engines else state["base_url"])
    return None


def samples(url: str) -> dict[str, str]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=2) as resp:
        text = resp.read().decode(errors="replace")
    out = {}
    for line in text.splitlines():
        if line.startswith("sglang:"):
            name, _, value = line.rpartition(" ")
            out[name] = value
    return out


def main() -> None:
    results, out_file = sys.argv[1], sys.argv[2]
    interval = 0.5
    if "--interval" in sys.argv:
        interval = float(sys.argv[sys.argv.index("--interval") + 1])
    last: dict[str, str] = {}
    last_url, last_full = None, 0.0
    with open(out_file, "a", buffering=1) as out:
        while True:
            time.sleep(interval)
            url = base_url(results)
            if url is None:
                continue
            try:
                now = samples(url)
            except (OSError, ValueError):
                continue
            full = url != last_url or time.time() - last_full > 30
            changed = now if full else {k: v for k, v in now.items() if last.get(k) != v}
            if changed:
                kind = "full" if full else "delta"
                line = {"t": round(time.time(), 3), kind: changed, "url": url}
                out.write(json.dumps(line) + "\n")
            if full:
                last_full = time.time()
            last, last_url = now, url


if __name__ == "__main__":
    main()
