"""The plugin contract: everything a plugin author imports, from one torch-free module.

    from forge_core.api import hookimpl, ModelSpec, Rule, ForgeError, DOC_IDS

The names below are defined in this package's submodules (``hooks``, ``specs``,
``rules``, ``errors``, ``run``, ``metrics``, ``batch``, ``packing``, ``files``, ``fingerprint``,
``parallel``, ``optim``, ``options``, ``protocols``, ``shards``, ``validators``) and
nothing here imports torch or any other part of Forge, so a plugin's registration
module stays as light as ``forge-run check`` needs it. Trainer internals are free to
move; these names are what Forge keeps stable.
"""

from forge_core.api.batch import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS
from forge_core.api.errors import ForgeError, did_you_mean, show_value, unknown_name
from forge_core.api.files import atomic_write, fsync_dir
from forge_core.api.fingerprint import FileSet, files_fingerprint
from forge_core.api.hooks import PROJECT, hookimpl, hookspec
from forge_core.api.metrics import format_perplexity
from forge_core.api.optim import NamedParameter
from forge_core.api.options import option, option_doc
from forge_core.api.packing import BOUNDARIES, Boundaries, LazyPacker, RowLayout
from forge_core.api.parallel import (
    BLOCKS,
    OUTPUT_HEAD,
    PIPELINE,
    SEQUENCE_PARALLEL,
    TENSOR_PARALLEL,
    ModelFacts,
    ModelSplit,
    ParallelContext,
    ParallelContract,
    PipelineSplit,
    TensorParallelPlan,
    TensorParallelScope,
    blocks_of,
    contract_of,
    tensor_parallel_coverage,
    tied_parameter_names,
)
from forge_core.api.protocols import AttentionBackend, Packer, ParallelModule, Source, Strategy, Tokenizer
from forge_core.api.rules import ActiveStrategy, ChosenSource, Plan, Rule, Severity, Violation, get_path
from forge_core.api.run import RunContext
from forge_core.api.shards import Shards, TokenDocuments, read_shard_index
from forge_core.api.specs import (
    AttentionBackendSpec,
    ComponentSpec,
    LoggerSpec,
    ModelSpec,
    NoOptions,
    OptimizerSpec,
    PackerSpec,
    ParallelismSpec,
    ScheduleSpec,
    SourceSpec,
    TokenizerSpec,
    import_path,
)
from forge_core.api.validators import (
    INT_MAX,
    INT_MIN,
    Validator,
    above,
    at_least,
    between,
    describe,
    max_chars,
    non_blank,
    path_fits,
    relative_path,
    satisfies,
)

__all__ = [
    "DOC_IDS",
    "IGNORE_INDEX",
    "INPUT_IDS",
    "LABELS",
    "POSITIONS",
    "ForgeError",
    "did_you_mean",
    "show_value",
    "unknown_name",
    "atomic_write",
    "fsync_dir",
    "FileSet",
    "files_fingerprint",
    "PROJECT",
    "hookimpl",
    "hookspec",
    "format_perplexity",
    "BOUNDARIES",
    "Boundaries",
    "LazyPacker",
    "RowLayout",
    "BLOCKS",
    "OUTPUT_HEAD",
    "PIPELINE",
    "SEQUENCE_PARALLEL",
    "TENSOR_PARALLEL",
    "ModelFacts",
    "ModelSplit",
    "ParallelContext",
    "ParallelContract",
    "PipelineSplit",
    "TensorParallelPlan",
    "TensorParallelScope",
    "blocks_of",
    "contract_of",
    "NamedParameter",
    "option",
    "option_doc",
    "tensor_parallel_coverage",
    "tied_parameter_names",
    "AttentionBackend",
    "Packer",
    "ParallelModule",
    "Source",
    "Strategy",
    "Tokenizer",
    "ActiveStrategy",
    "ChosenSource",
    "Plan",
    "Rule",
    "Severity",
    "Violation",
    "get_path",
    "RunContext",
    "Shards",
    "TokenDocuments",
    "read_shard_index",
    "AttentionBackendSpec",
    "ComponentSpec",
    "LoggerSpec",
    "ModelSpec",
    "NoOptions",
    "OptimizerSpec",
    "PackerSpec",
    "ParallelismSpec",
    "ScheduleSpec",
    "SourceSpec",
    "TokenizerSpec",
    "import_path",
    "INT_MAX",
    "INT_MIN",
    "Validator",
    "above",
    "at_least",
    "between",
    "describe",
    "max_chars",
    "non_blank",
    "path_fits",
    "relative_path",
    "satisfies",
]
