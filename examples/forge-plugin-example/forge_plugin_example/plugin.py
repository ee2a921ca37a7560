"""The entry-point module: hook implementations that register the example components.

Everything here is metadata (specs point at implementations by import path), so
loading the plugin imports neither torch nor numpy.
"""

from __future__ import annotations

from forge_core.api import DOC_IDS, POSITIONS, AttentionBackendSpec, LoggerSpec, PackerSpec, hookimpl
from forge_plugin_example.options import CsvOptions, WindowOptions


@hookimpl
def forge_attention_backends():
    return [
        AttentionBackendSpec(
            name="window",
            summary="Sliding-window causal attention (SDPA with a banded mask); honours doc_ids",
            impl="forge_plugin_example.window:WindowAttention",
            options=WindowOptions,
            # attend() masks across documents, so the rule engine may pair this backend
            # with packers that emit doc_ids.
            honours={DOC_IDS},
        )
    ]


@hookimpl
def forge_packers():
    return [
        PackerSpec(
            name="greedy",
            summary="First-fit packing of whole documents into padded rows; isolates documents",
            impl="forge_plugin_example.greedy:GreedyPacker",
            emits={DOC_IDS, POSITIONS},
        )
    ]


@hookimpl
def forge_loggers():
    return [
        LoggerSpec(
            name="csv",
            summary="Metrics as CSV in the run directory (metrics.csv)",
            impl="forge_plugin_example.csv_logger:CsvLogger",
            options=CsvOptions,
        )
    ]


@hookimpl
def forge_rules():
    from forge_plugin_example.rules import RULES

    return RULES
