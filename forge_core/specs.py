"""Deprecated location of the component specs: import them from :mod:`forge_core.api`.

Kept for one release; every name warns and names its new home."""

from forge_core.deprecation import moved

__getattr__ = moved(
    __name__,
    {
        name: "forge_core.api"
        for name in (
            "ComponentSpec",
            "AttentionBackendSpec",
            "ParallelismSpec",
            "PackerSpec",
            "ModelSpec",
            "SourceSpec",
            "TokenizerSpec",
            "OptimizerSpec",
            "ScheduleSpec",
            "LoggerSpec",
            "NoOptions",
            "import_path",
            "DOC_IDS",
            "POSITIONS",
        )
    },
)
