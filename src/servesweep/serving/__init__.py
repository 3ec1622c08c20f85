"""Serving: engine launch plans, server lifecycle, log scans and evidence, preflight, liveness."""
