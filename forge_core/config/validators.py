"""Deprecated location of the option validators: import them from :mod:`forge_core.api`
(defined in :mod:`forge_core.api.validators`).

Kept for one release; every name warns and names its new home."""

from forge_core.deprecation import moved

__getattr__ = moved(
    __name__,
    {
        name: "forge_core.api"
        for name in (
            "Validator",
            "satisfies",
            "at_least",
            "above",
            "between",
            "non_blank",
            "relative_path",
            "describe",
            "INT_MIN",
            "INT_MAX",
        )
    },
)
