"""Analysis: results.csv, summary statistics, comparisons, plots, the report, imported runs."""
