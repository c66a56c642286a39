"""What a method's name in a table stands for: ``baseline+vs`` is post-hoc *vector scaling* on the baseline.

A post-hoc method's short name (``vs``, ``ms``, ``ts_guo``) reads as a word in a table ("vs" as "versus"); the report
shows its title beside it, from the post-hoc registry (each calibrator's ``title``), so a new calibrator needs nothing
here.
"""

from __future__ import annotations

from mtl_cog.evaluation.posthoc import POSTHOC


def method_title(method: str) -> str:
    """What a report method stands for: ``baseline+vs`` -> ``baseline + post-hoc vector scaling`` (a short
    post-hoc name reads as a word otherwise: "vs" as "versus"); a trained method's name is its own title."""
    trained, _, posthoc = method.partition("+")
    if posthoc not in POSTHOC.names():
        return method
    return f"{trained} + post-hoc {POSTHOC.get(posthoc).title or posthoc}"
