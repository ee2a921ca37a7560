"""The plugin contract: everything a plugin author imports, from one torch-free module.

    from forge_core.api import hookimpl, ModelSpec, Rule, ForgeError, DOC_IDS

The names below are defined in this package's submodules (``hooks``, ``specs``,
``rules``, ``errors``, ``run``, ``batch``, ``packing``, ``fingerprint``, ``parallel``,
``optim``, ``options``, ``protocols``, ``shards``, ``transforms``, ``validators``) and
nothing here imports torch or any other part of Forge, so a plugin's registration
module stays as light as ``forge-run check`` needs it. Trainer internals are free to
move; the names in ``__all__`` are what Forge keeps stable, and nothing else is.

Helpers that the kernel and the built-in plugins share without promising them to
anyone live in :mod:`forge_core.api.unstable` (not stable: they may change without
notice; third-party plugins should not import them). A name that moved there from here
raises an ``ImportError`` that says so when imported from here.
"""

from forge_core.api.batch import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS
from forge_core.api.errors import ForgeError
from forge_core.api.fingerprint import FileSet, files_fingerprint
from forge_core.api.hooks import PROJECT, hookimpl, hookspec
from forge_core.api.optim import NamedParameter
from forge_core.api.options import option
from forge_core.api.packing import BOUNDARIES, Boundaries, LazyPacker, RowLayout
from forge_core.api.parallel import (
    BLOCKS,
    OUTPUT_HEAD,
    PIPELINE,
    QUERY_SHARDS,
    SEQUENCE_PARALLEL,
    TENSOR_PARALLEL,
    AttentionContext,
    MeshDim,
    ModelFacts,
    ModelSplit,
    ParallelContext,
    ParallelContract,
    PipelineSplit,
    TensorParallelPlan,
    TensorParallelScope,
    blocks_of,
    contract_of,
)
from forge_core.api.protocols import (
    AdapterWritingTransform,
    AttentionBackend,
    BatchEncodingTokenizer,
    BatchTransformingStrategy,
    CachingModel,
    ChatRenderingTokenizer,
    ChatTokenizer,
    FileFingerprintedSource,
    FingerprintedSource,
    HFSavingTokenizer,
    Model,
    ModelTransform,
    OptimizerStepModule,
    Packer,
    PairCountingBackend,
    ParallelModule,
    PretrainedModel,
    QueryShardingBackend,
    RecordSource,
    Source,
    SpecialDecodingTokenizer,
    Strategy,
    TokenDocumentSource,
    TokenGroupModule,
    Tokenizer,
    model_contract_gaps,
)
from forge_core.api.rules import (
    DEGREES,
    ActiveStrategy,
    ChosenSource,
    ChosenTransform,
    Plan,
    Rule,
    Severity,
)
from forge_core.api.run import RunContext
from forge_core.api.shards import MaskedDocument, TokenDocuments
from forge_core.api.specs import (
    AttentionBackendSpec,
    ComponentSpec,
    LoggerSpec,
    ModelSpec,
    NoOptions,
    ObjectiveSpec,
    OptimizerSpec,
    PackerSpec,
    ParallelismSpec,
    ScheduleSpec,
    SourceSpec,
    TokenizerSpec,
    TransformSpec,
    import_path,
)
from forge_core.api.transforms import (
    ROLES,
    TransformContext,
    transforms_disabled,
)
from forge_core.api.validators import (
    Validator,
    above,
    at_least,
    between,
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
    "FileSet",
    "files_fingerprint",
    "PROJECT",
    "hookimpl",
    "hookspec",
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
    "QUERY_SHARDS",
    "AttentionContext",
    "MeshDim",
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
    "AttentionBackend",
    "CachingModel",
    "Model",
    "ModelTransform",
    "Packer",
    "ParallelModule",
    "PretrainedModel",
    "model_contract_gaps",
    "Source",
    "Strategy",
    "Tokenizer",
    "AdapterWritingTransform",
    "BatchEncodingTokenizer",
    "BatchTransformingStrategy",
    "ChatRenderingTokenizer",
    "ChatTokenizer",
    "FileFingerprintedSource",
    "FingerprintedSource",
    "HFSavingTokenizer",
    "SpecialDecodingTokenizer",
    "OptimizerStepModule",
    "PairCountingBackend",
    "QueryShardingBackend",
    "RecordSource",
    "TokenDocumentSource",
    "TokenGroupModule",
    "DEGREES",
    "ActiveStrategy",
    "ChosenSource",
    "ChosenTransform",
    "Plan",
    "Rule",
    "Severity",
    "RunContext",
    "TokenDocuments",
    "MaskedDocument",
    "AttentionBackendSpec",
    "ComponentSpec",
    "LoggerSpec",
    "ModelSpec",
    "NoOptions",
    "ObjectiveSpec",
    "OptimizerSpec",
    "PackerSpec",
    "ParallelismSpec",
    "ScheduleSpec",
    "SourceSpec",
    "TokenizerSpec",
    "TransformSpec",
    "import_path",
    "ROLES",
    "TransformContext",
    "transforms_disabled",
    "Validator",
    "above",
    "at_least",
    "between",
    "max_chars",
    "non_blank",
    "path_fits",
    "relative_path",
    "satisfies",
]


def __getattr__(name: str) -> object:
    # An ImportError, not an AttributeError: ``from forge_core.api import X`` turns an
    # AttributeError into a bare "cannot import name", which would hide where X went.
    from forge_core.api.unstable import MOVED_FROM_API

    if name in MOVED_FROM_API:
        raise ImportError(
            f"forge_core.api.{name} moved to forge_core.api.unstable.{name} (not stable: "
            f"{MOVED_FROM_API[name]}, which may change without notice; a third-party plugin "
            f"should not import forge_core.api.unstable: copy what it needs instead)",
            name=name,
        )
    raise AttributeError(f"module 'forge_core.api' has no attribute {name!r}")
