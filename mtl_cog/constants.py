"""Constants shared by several layers, defined once."""

DEFAULT_BINS = (5, 10, 15, 20, 50)  # bin counts of every calibration error (eval.bins, --bins)
SUMMARY_BINS = 15  # the bin count shown in console tables, summary.md and figures
