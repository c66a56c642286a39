#!/usr/bin/env python
"""regenerate_docs_tables: docs/ tables from their bundles (the command is mtl_cog/cli/regenerate_docs_tables.py)."""

from mtl_cog.cli.regenerate_docs_tables import cli

if __name__ == "__main__":
    cli()
