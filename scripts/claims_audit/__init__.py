"""claims_audit: the independent audit of a claims page (``scripts/audit_claims.py``). Imports only the standard
library, numpy, pandas and scipy, never mtl_cog, so that a bug in mtl_cog's reporting cannot pass it.

Modules, each one job: ``rule`` (the decision rule on numbers), ``bundle`` (a bundle's raw files and what the page
recomputes from them), ``page`` (the page's blocks and the comparison ledger), ``checks`` (one check per block kind;
``curve``: the leader-rate curve blocks).
"""
