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
