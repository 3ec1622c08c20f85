"""Measuring one cell: load generators, raw records, their validation, isolation and provenance."""
