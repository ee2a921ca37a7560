"""The ``window`` backend against Forge's conformance kit (fixtures from Forge's pytest
plugin), plus what the kit cannot know: that the window really restricts attention."""

import pytest


@pytest.mark.parametrize("window", [1, 3, 64])
def test_window_passes_the_conformance_kit(forge_conformance, forge_devices, window):
    # The kit compares against causal attention restricted by mask_mod: the window.
    forge_conformance.check_attention_backend(
        "window", options={"window": window}, devices=forge_devices, mask_mod=lambda q, kv: q - kv < window
    )


def test_a_short_window_is_not_plain_causal_attention(forge_conformance):
    with pytest.raises(AssertionError, match="differs from the reference"):
        forge_conformance.check_attention_backend("window", options={"window": 3})


def test_window_is_registered_with_its_capabilities(forge_registries):
    spec = forge_registries["attention"].get("window")
    assert spec.honours == {"doc_ids"}
    assert forge_registries["attention"].plugin_of("window") == "example"


@pytest.mark.parametrize("window", [1, 3, 64])
def test_the_pairs_it_counts_for_mfu_are_the_pairs_its_mask_allows(window):
    import torch

    from forge_plugin_example.options import WindowOptions
    from forge_plugin_example.window import WindowAttention

    backend = WindowAttention(WindowOptions(window=window))
    doc_ids = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2], [0] * 12])
    assert backend.attended_pairs(doc_ids, 2, 12) == int(backend.prepare(doc_ids, 12, "cpu").sum())
    assert backend.attended_pairs(None, 2, 12) == 2 * int(backend.prepare(None, 12, "cpu").sum())
