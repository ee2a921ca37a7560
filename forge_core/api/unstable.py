"""Helpers the kernel and the built-in plugins share, with no promise: NOT STABLE.

Anything here may change or go without notice, in any release. It exists because the
built-ins are written as a third party would write them and so may import nothing from
the kernel but :mod:`forge_core.api`; what two of them share without being part of the
contract lives here instead of in the facade (pytest's ``_pytest`` beside ``pytest``).

A third-party plugin should not import this module: copy what it needs, or build on
the stable names of :mod:`forge_core.api` alone. Torch-free, like the facade.
"""

from __future__ import annotations

from forge_core.api.chat import chat_hint, conversation, missing_fields
from forge_core.api.environ import environment
from forge_core.api.errors import did_you_mean, show_value, unknown_name
from forge_core.api.files import METADATA_LIMIT, FileRefused, atomic_write, fsync_dir, read_small_text
from forge_core.api.fingerprint import file_stat, stat_unchanged
from forge_core.api.metrics import format_perplexity
from forge_core.api.options import option_doc
from forge_core.api.parallel import tensor_parallel_coverage, tied_parameter_names
from forge_core.api.rules import Violation, get_path
from forge_core.api.shards import Shards, read_shard_index
from forge_core.api.transforms import AppliedTransform, applied_transforms
from forge_core.api.validators import INT_MAX, INT_MIN, describe

#: Why each name that left :mod:`forge_core.api` is not part of the contract, for the
#: error an import of it from the old place raises.
MOVED_FROM_API = {
    "did_you_mean": "a helper that words error messages",
    "show_value": "a helper that words error messages",
    "unknown_name": "a helper that words error messages",
    "environment": "a helper for environment variables",
    "atomic_write": "a file-writing helper",
    "fsync_dir": "a file-writing helper",
    "file_stat": "a helper of the token cache's file manifest",
    "stat_unchanged": "a helper of the token cache's file manifest",
    "format_perplexity": "how the kernel prints a metric",
    "option_doc": "how the documentation generator reads an option back",
    "describe": "how the documentation generator reads a validator back",
    "INT_MAX": "the config loader's integer bounds",
    "INT_MIN": "the config loader's integer bounds",
    "get_path": "how the rule engine reads a config path",
    "Violation": "the rule engine's report of a finding",
    "tensor_parallel_coverage": "a check the tp strategy and the kit share",
    "tied_parameter_names": "a helper of the built-in strategies",
    "Shards": "the built-in shards source's reader",
    "read_shard_index": "the built-in shards source's reader",
    "AppliedTransform": "the kernel's record of applied transforms",
    "applied_transforms": "the kernel's record of applied transforms",
}

__all__ = [
    "chat_hint",
    "conversation",
    "missing_fields",
    "did_you_mean",
    "show_value",
    "unknown_name",
    "environment",
    "atomic_write",
    "fsync_dir",
    "read_small_text",
    "FileRefused",
    "METADATA_LIMIT",
    "file_stat",
    "stat_unchanged",
    "format_perplexity",
    "option_doc",
    "describe",
    "INT_MAX",
    "INT_MIN",
    "get_path",
    "Violation",
    "tensor_parallel_coverage",
    "tied_parameter_names",
    "Shards",
    "read_shard_index",
    "AppliedTransform",
    "applied_transforms",
]
