"""Plugin manager and registries: entry-point discovery, blocking, and the errors a
plugin author meets (failed import, duplicate name, misspelled hook)."""

from __future__ import annotations

import json

import pytest

from conftest import make_distribution, run_cli
from forge_core.errors import ForgeError
from forge_core.hookspecs import hookimpl
from forge_core.plugins import load_plugins
from forge_core.registry import build_registries, load_registries
from forge_core.specs import AttentionBackendSpec, PackerSpec

GOOD_PLUGIN = """
from forge_core.hookspecs import hookimpl
from forge_core.specs import PackerSpec

@hookimpl
def forge_packers():
    return [PackerSpec(name="shuffled", summary="A third-party packer",
                       impl="fakeplug_impl:Packer", emits={"doc_ids"})]
"""


@pytest.fixture
def fake_site(tmp_path):
    return make_distribution(
        tmp_path / "site", "forge-fakeplug", "1.2.3", {"fakeplug": GOOD_PLUGIN}, {"fakeplug": "fakeplug"}
    )


def test_third_party_distribution_is_found_through_entry_points(fake_site):
    result = run_cli("plugins", "--json", env={"PYTHONPATH": str(fake_site)})
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)}
    fake = plugins["fakeplug"]
    assert (fake["distribution"], fake["version"], fake["builtin"]) == ("forge-fakeplug", "1.2.3", False)
    assert fake["components"] == [{"kind": "packer", "name": "shuffled", "summary": "A third-party packer"}]
    assert plugins["attention"]["builtin"] is True


def test_autoload_switch_skips_third_party_but_keeps_builtins(fake_site):
    env = {"PYTHONPATH": str(fake_site), "FORGE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    names = {p["name"] for p in json.loads(run_cli("plugins", "--json", env=env).stdout)}
    assert "fakeplug" not in names and "attention" in names


def test_env_blocklist_skips_named_plugin(fake_site):
    env = {"PYTHONPATH": str(fake_site), "FORGE_BLOCK_PLUGINS": "fakeplug"}
    names = {p["name"] for p in json.loads(run_cli("plugins", "--json", env=env).stdout)}
    assert "fakeplug" not in names


def test_config_blocklist_skips_named_plugin(fake_site, cfg):
    path = cfg({"plugins": {"block": ["fakeplug"]}, "data": {"packer": "shuffled"}})
    result = run_cli("check", path, env={"PYTHONPATH": str(fake_site)})
    assert result.returncode == 2
    assert "unknown packer 'shuffled'" in result.stderr


def test_plugin_that_fails_to_import_names_entry_point_distribution_and_fix(tmp_path):
    site = make_distribution(
        tmp_path / "site", "forge-broken", "0.1", {"brokenplug": "raise RuntimeError('boom at import')"},
        {"broken": "brokenplug"},
    )
    result = run_cli("plugins", env={"PYTHONPATH": str(site)})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for needle in ("'broken'", "broken = brokenplug", "forge-broken 0.1", "boom at import", "FORGE_BLOCK_PLUGINS=broken"):
        assert needle in result.stderr
    # and the advertised fix works
    assert run_cli("plugins", env={"PYTHONPATH": str(site), "FORGE_BLOCK_PLUGINS": "broken"}).returncode == 0


class _Misspelled:
    @hookimpl
    def forge_packer(self):  # the hook is forge_packers
        return []


def test_misspelled_hook_is_an_error_with_did_you_mean():
    with pytest.raises(ForgeError, match=r"unknown hook 'forge_packer'\. Did you mean 'forge_packers'\?"):
        load_plugins(extra=[("typo", _Misspelled())])


class _DuplicateBackend:
    @hookimpl
    def forge_attention_backends(self):
        return [AttentionBackendSpec(name="sdpa", summary="shadow", impl="x.y:Z")]


def test_duplicate_component_name_names_both_plugins():
    with pytest.raises(ForgeError, match=r"attention backend 'sdpa' is registered by two plugins: 'attention' and 'dup'"):
        build_registries(load_plugins(extra=[("dup", _DuplicateBackend())]))


class _WrongType:
    @hookimpl
    def forge_packers(self):
        return [AttentionBackendSpec(name="oops", summary="wrong kind", impl="x.y:Z")]


def test_spec_of_the_wrong_kind_is_rejected():
    with pytest.raises(ForgeError, match="expected PackerSpec objects"):
        build_registries(load_plugins(extra=[("wrong", _WrongType())]))


def test_unknown_name_gives_did_you_mean_and_available_names():
    registries = load_registries()
    with pytest.raises(ForgeError) as info:
        registries["attention"].get("sdpaa", "attention.backend")
    message = str(info.value)
    assert "attention.backend: unknown attention backend 'sdpaa'. Did you mean 'sdpa'?" in message
    assert "Available: eager, flex, sdpa" in message


def test_specs_validate_impl_paths():
    with pytest.raises(ValueError, match="package.module:attr"):
        PackerSpec(name="bad", summary="s", impl="no_colon_here")
