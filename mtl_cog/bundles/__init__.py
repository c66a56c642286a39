"""Results as stored: the results bundle (its files, schema, seal and reliability histograms), a finished run as
bundle rows, a run's curves over epochs, and run folders found as records. Nothing here asks a question of them
(``mtl_cog/analysis/``) or shows them (``mtl_cog/reporting/``)."""
