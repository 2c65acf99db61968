"""The estimator library's input error, below the modules that raise it.

`PlanInputError` (an InvalidArgument and a ValueError) names the offending field in `.field` and in
its message, e.g. ``plan.tp: model.num_heads 12 is not divisible by tp 8``. It lives in its own module,
not in plans.py beside the plans it mostly judges, so that models.py (which validates dimensions) and
plans.py (which checks a plan against a model) can both raise it without importing each other.
"""

from __future__ import annotations

from tessera.common.errors import InvalidArgument


class PlanInputError(InvalidArgument, ValueError):
    """Bad estimator input; `field` names it (``plan.tp``, ``model.num_heads``, ``num_gpus``...)."""
