"""Reporting: tables and figures across runs, and the end-of-run report."""
