"""Configuration: the experiment schema, loading, matrix expansion, site files and paths."""
