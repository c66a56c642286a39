"""Questions asked of stored results: paired intervals over seeds, claims and verdicts by a plan's rule, power,
the regime gate, leader-rate curves, what a campaign ran and chose. Reads ``mtl_cog/bundles/``; shown by
``mtl_cog/reporting/``."""
