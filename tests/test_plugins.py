"""Plugin manager and registries: entry-point discovery, blocking, name clashes and
``plugins.prefer``, and the errors a plugin author meets (failed import, misspelled hook)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO, make_distribution

from forge_core.api import AttentionBackendSpec, ForgeError, PackerSpec, hookimpl
from forge_core.cli import main
from forge_core.plugins import load_plugins
from forge_core.registry import build_registries, load_registries
from forge_core.testing import forge_run

GOOD_PLUGIN = """
from forge_core.api import PackerSpec, hookimpl

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
    result = forge_run(["plugins", "--json"], paths=[fake_site])
    assert result.code == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)}
    fake = plugins["fakeplug"]
    assert (fake["distribution"], fake["version"], fake["builtin"]) == ("forge-fakeplug", "1.2.3", False)
    assert fake["components"] == [{"kind": "packer", "name": "shuffled", "summary": "A third-party packer"}]
    assert plugins["attention"]["builtin"] is True


def test_autoload_switch_skips_third_party_but_keeps_builtins(fake_site):
    env = {"FORGE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    names = {
        p["name"] for p in json.loads(forge_run(["plugins", "--json"], paths=[fake_site], env=env).stdout)
    }
    assert "fakeplug" not in names and "attention" in names


def test_forge_plugins_names_the_third_party_plugins_loaded_with_autoload_off(fake_site, tmp_path):
    other = make_distribution(
        tmp_path / "other",
        "forge-other",
        "0.1",
        {"otherplug": GOOD_PLUGIN.replace("shuffled", "other")},
        {"other": "otherplug"},
    )

    def names(**env):
        result = forge_run(["plugins", "--json"], paths=[fake_site, other], env=env)
        assert result.code == 0, result.output
        return {p["name"] for p in json.loads(result.stdout)}, result.stderr

    both, _ = names()
    assert {"fakeplug", "other"} <= both
    only, quiet = names(FORGE_DISABLE_PLUGIN_AUTOLOAD="1", FORGE_PLUGINS="fakeplug")
    assert "fakeplug" in only and "other" not in only and "attention" in only and quiet == ""
    none, warned = names(FORGE_DISABLE_PLUGIN_AUTOLOAD="1", FORGE_PLUGINS="fakeplg")
    assert "fakeplug" not in none
    assert "FORGE_PLUGINS names 'fakeplg', but no installed plugin has that name" in warned
    assert "Did you mean 'fakeplug'?" in warned and "fields:" not in warned  # no config field to name


def test_env_blocklist_skips_named_plugin(fake_site):
    env = {"FORGE_BLOCK_PLUGINS": "fakeplug"}
    names = {
        p["name"] for p in json.loads(forge_run(["plugins", "--json"], paths=[fake_site], env=env).stdout)
    }
    assert "fakeplug" not in names


def test_config_blocklist_skips_named_plugin(fake_site, forge_config):
    path = forge_config({"plugins": {"block": ["fakeplug"]}, "data": {"packer": "shuffled"}})
    result = forge_run(["check", path], paths=[fake_site])
    assert result.code == 2
    assert "unknown packer 'shuffled'" in result.stderr


def test_plugin_that_fails_to_import_names_entry_point_distribution_and_fix(tmp_path):
    site = make_distribution(
        tmp_path / "site",
        "forge-broken",
        "0.1",
        {"brokenplug": "raise RuntimeError('boom at import')"},
        {"broken": "brokenplug"},
    )
    result = forge_run(["plugins"], paths=[site])
    assert result.code == 2
    assert "Traceback" not in result.stderr
    for needle in (
        "'broken'",
        "broken = brokenplug",
        "forge-broken 0.1",
        "boom at import",
        "FORGE_BLOCK_PLUGINS=broken",
    ):
        assert needle in result.stderr
    # and the advertised fix works
    assert forge_run(["plugins"], paths=[site], env={"FORGE_BLOCK_PLUGINS": "broken"}).code == 0


class _Misspelled:
    @hookimpl
    def forge_packer(self):  # the hook is forge_packers
        return []


def test_misspelled_hook_is_an_error_with_did_you_mean():
    with pytest.raises(ForgeError, match=r"unknown hook 'forge_packer'\. Did you mean 'forge_packers'\?"):
        load_plugins(extra=[("typo", _Misspelled())])


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


# --- faults that must not escape as tracebacks or silent exits ------------------------


class _WrongArgument:
    @hookimpl
    def forge_packers(self, config):  # registration hooks pass no argument
        return []


def test_a_hook_implementation_with_an_argument_the_hook_lacks_is_a_clean_error():
    with pytest.raises(ForgeError) as info:
        load_plugins(extra=[("wrongarg", _WrongArgument())])
    message = str(info.value)
    assert (
        "plugin 'wrongarg': its forge_packers() takes 'config', "
        "which the hook does not pass (it passes: nothing)" in message
    )
    assert "FORGE_BLOCK_PLUGINS=wrongarg" in message


def test_faulty_third_party_plugins_give_clean_errors_naming_plugin_and_distribution(tmp_path):
    faults = {
        "exits": ("import sys\nsys.exit(3)\n", "called sys.exit(3) while being imported"),
        "wrongarg": (
            "from forge_core.api import hookimpl\n\n@hookimpl\ndef forge_models(registry):\n    return []\n",
            "its forge_models() takes 'registry', which the hook does not pass",
        ),
    }
    for name, (source, expected) in faults.items():
        site = make_distribution(
            tmp_path / name, f"forge-{name}", "0.2", {f"{name}plug": source}, {name: f"{name}plug"}
        )
        result = forge_run(["check", str(REPO / "configs" / "quickstart.yaml")], paths=[site])
        assert result.code == 2, (name, result.code, result.stderr)
        assert "Traceback" not in result.stderr
        for needle in (expected, f"plugin {name!r}", f"forge-{name} 0.2", f"FORGE_BLOCK_PLUGINS={name}"):
            assert needle in result.stderr, (needle, result.stderr)


def test_a_plugin_calling_sys_exit_in_a_registration_hook_is_named():
    class Exits:
        @hookimpl
        def forge_packers(self):
            raise SystemExit(4)

    with pytest.raises(ForgeError, match=r"plugin 'exits' raised in forge_packers\(\): SystemExit: 4"):
        build_registries(load_plugins(extra=[("exits", Exits())]))


INTERRUPTS = {
    # raised by the plugin's own module: the plugin's fault, named, exit 2
    "selfinterrupt": ("raise KeyboardInterrupt\n", 2),
    "baseexc": ("class Stop(BaseException):\n    pass\n\nraise Stop('at import')\n", 2),
    # a real SIGINT while the module is imported (the user's Ctrl-C): an interrupt, 130
    "ctrlc": ("import signal\n\nsignal.raise_signal(signal.SIGINT)\n", 130),
}


@pytest.mark.parametrize("name", sorted(INTERRUPTS))
def test_a_plugin_interrupting_its_own_import_is_named_but_a_real_ctrl_c_is_an_interrupt(tmp_path, name):
    source, expected = INTERRUPTS[name]
    site = make_distribution(
        tmp_path / "site", f"forge-{name}", "0.3", {f"{name}plug": source}, {name: f"{name}plug"}
    )
    result = forge_run(["check", str(REPO / "configs" / "quickstart.yaml")], paths=[site])
    assert result.code == expected, result.output
    assert "Traceback" not in result.output
    if expected == 2:
        for needle in (
            f"plugin {name!r}",
            f"{name} = {name}plug",
            f"forge-{name} 0.3",
            f"FORGE_BLOCK_PLUGINS={name}",
        ):
            assert needle in result.stderr, (needle, result.stderr)
        assert (
            "KeyboardInterrupt itself" if name == "selfinterrupt" else "raised Stop: at import"
        ) in result.stderr
    else:
        assert result.stderr == ""


def test_a_ctrl_c_while_a_run_imports_its_plugins_stops_the_run_as_an_interrupt(tmp_path):
    """A run handles SIGINT itself from its first moment (Interrupted, not KeyboardInterrupt):
    a Ctrl-C while it imports a plugin is still the user's interrupt, not the plugin's fault."""
    source, _ = INTERRUPTS["ctrlc"]
    site = make_distribution(
        tmp_path / "site", "forge-ctrlc", "0.3", {"ctrlcplug": source}, {"ctrlc": "ctrlcplug"}
    )
    result = forge_run([str(REPO / "configs" / "quickstart.yaml")], paths=[site])
    assert result.code == 130, result.output
    assert "SIGINT received during start-up" in result.stderr and "plugin 'ctrlc'" not in result.stderr


def test_a_run_warns_about_a_blocked_name_no_plugin_has(capsys):
    from forge_core.cli.train import judged

    judged(str(REPO / "configs" / "quickstart.yaml"), ["plugins.block=[nope]"], 1)
    assert "warning: [plugins.block-matches-no-plugin]" in capsys.readouterr().err


def test_a_keyboard_interrupt_raised_by_a_registration_hook_is_named():
    class Interrupts:
        @hookimpl
        def forge_packers(self):
            raise KeyboardInterrupt

    with pytest.raises(
        ForgeError, match=r"plugin 'interrupts' raised in forge_packers\(\): KeyboardInterrupt\. Block it"
    ):
        build_registries(load_plugins(extra=[("interrupts", Interrupts())]))


UNMARKED_PLUGIN = """
from forge_core.api import PackerSpec, hookimpl
from json import loads as forge_imported_helper  # imported, not the plugin's own: no word


def forge_packers():  # the marker is missing: pluggy skips it
    return [PackerSpec(name="forgotten", summary="never registered", impl="x:Y")]


def forge_rule():  # neither marked nor a hook's name
    return []


@hookimpl
def forge_optimizers():
    return []
"""


def test_a_function_named_like_a_hook_but_not_marked_is_a_warning_naming_module_function_and_fix(
    tmp_path, forge_config
):
    site = make_distribution(
        tmp_path / "site",
        "forge-unmarked",
        "0.1",
        {"unmarkedplug": UNMARKED_PLUGIN},
        {"unmarked": "unmarkedplug"},
    )
    listing = forge_run(["plugins", "--json"], paths=[site])
    assert listing.code == 0, listing.output
    assert json.loads(listing.stdout)  # the warnings go to stderr, the JSON stays whole
    for needle in (
        "[plugins.hook-not-marked] (plugin 'unmarked')",
        "plugin 'unmarked' (distribution forge-unmarked 0.1): unmarkedplug.forge_packers() is the hook "
        "forge_packers but is not marked with @hookimpl, so Forge never calls it",
        "`@hookimpl` on the line above `def forge_packers`",
        "unmarkedplug.forge_rule() is named like a hook but is not marked with @hookimpl and is no "
        "hook's name. Did you mean 'forge_rules'?",
    ):
        assert needle in " ".join(listing.stderr.split()), (needle, listing.stderr)
    assert "forge_optimizers" not in listing.stderr and "forge_imported_helper" not in listing.stderr
    check = forge_run(["check", forge_config({}), "--json"], paths=[site])
    assert check.code == 0, check.output
    warned = [v for v in json.loads(check.stdout)["violations"] if v["rule"] == "plugins.hook-not-marked"]
    assert [v["plugin"] for v in warned] == ["unmarked", "unmarked"]


def test_an_unmarked_hook_method_of_a_plugin_object_is_a_warning():
    class Forgetful:
        def forge_packers(self):
            return []

    (warning,) = load_plugins(extra=[("forgetful", Forgetful())]).warnings
    assert "Forgetful.forge_packers() is the hook forge_packers but is not marked" in warning.message


def test_the_built_in_plugins_load_without_warnings():
    assert load_plugins().warnings == ()


def test_a_blocked_name_no_plugin_has_is_a_warning_with_did_you_mean_and_the_installed_names(
    forge_config,
):
    config = str(REPO / "configs" / "quickstart.yaml")
    for override, hint in (
        ("plugins.block=[nope]", ""),
        ("plugins.block=[attentoin]", " Did you mean 'attention'?"),
    ):
        result = forge_run(["check", config, override, "--json"])
        assert result.code == 0, result.output
        (warning,) = [
            v
            for v in json.loads(result.stdout)["violations"]
            if v["rule"] == "plugins.block-matches-no-plugin"
        ]
        name = override.split("[")[1].rstrip("]")
        assert warning["severity"] == "warning" and warning["fields"] == {"plugins.block": [name]}
        why = f"plugins.block names {name!r}, but no installed plugin has that name, so it blocks nothing."
        assert warning["message"] == why + hint
        assert "installed: attention, " in warning["fix"] and "sources, tokenizers" in warning["fix"]
    env = forge_run(["check", config], env={"FORGE_BLOCK_PLUGINS": "packer"})
    assert env.code == 0, env.output
    assert "FORGE_BLOCK_PLUGINS names 'packer', but no installed plugin has that name" in env.stdout
    assert "Did you mean 'packers'?" in env.stdout
    # A name that is installed blocks it, and is no warning.
    real = forge_run(["check", forge_config({"plugins": {"block": ["loggers"]}, "logging": {"loggers": []}})])
    assert "plugins.block-matches-no-plugin" not in real.output


LONG_NAMES_PLUGIN = """
from forge_core.api import PackerSpec, hookimpl

@hookimpl
def forge_packers():
    return [PackerSpec(name=name, summary=f"summary of {name}", impl="x:Y")
            for name in ("short", "fifteen_letters", "a_much_longer_packer_name_than_any")]
"""


def test_plugins_sizes_the_name_column_to_the_longest_name(tmp_path):
    site = make_distribution(
        tmp_path / "site",
        "forge-longnames",
        "0.1",
        {"longplug": LONG_NAMES_PLUGIN},
        {"longnames": "longplug"},
    )
    result = forge_run(["plugins"], paths=[site])
    assert result.code == 0, result.output
    # Every component row of every plugin: its kind, its name, then its summary.
    rows = [
        m
        for m in map(re.compile(r"^    (\S+) +(\S+) +(\S.*)$").match, result.stdout.splitlines())
        if m and m[1] != "rule"
    ]
    mine = {m[2]: m for m in rows if m[3].startswith("summary of")}
    assert sorted(mine) == ["a_much_longer_packer_name_than_any", "fifteen_letters", "short"], result.stdout
    assert all(m[3] == f"summary of {name}" for name, m in mine.items())  # no name ran into its summary
    # All summaries start in one column, at least two spaces past the longest name.
    assert {m.start(3) for m in rows} == {mine["a_much_longer_packer_name_than_any"].end(2) + 2}


# --- the kernel's rules cannot be switched off ---------------------------------------


def test_kernel_rules_cannot_be_blocked_by_config_or_environment(forge_config, monkeypatch, capsys):
    # The reproduction: blocking core_rules used to pass pp with document isolation.
    path = forge_config(
        {"plugins": {"block": ["core_rules"]}, "parallel": {"pp": 2}, "data": {"packer": "concat"}}
    )
    assert main(["check", path, "--world-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "plugins.block in the config names 'core_rules'" in err and "cannot be switched off" in err
    monkeypatch.setenv("FORGE_BLOCK_PLUGINS", "core_rules")
    with pytest.raises(ForgeError, match="FORGE_BLOCK_PLUGINS names 'core_rules'"):
        load_plugins()


def test_no_package_can_take_the_kernel_rules_name(tmp_path):
    site = make_distribution(
        tmp_path / "site", "forge-shadow", "1.0", {"shadowplug": "x = 1\n"}, {"core_rules": "shadowplug"}
    )
    result = forge_run(["rules"], paths=[site])
    assert result.code == 2
    assert "forge-shadow 1.0 declares a plugin named 'core_rules'" in result.stderr
    assert "Uninstall it (pip uninstall forge-shadow)" in result.stderr and "FORGE_BLOCK" not in result.stderr


def test_kernel_rules_are_loaded_whatever_is_blocked_and_check_counts_them(forge_config, capsys):
    from forge_core.core_rules import RULES

    registries = load_registries(block=("attention", "parallel", "models", "packers"))
    kernel = [e for e in registries.rules if e.kernel]
    assert [e.rule.id for e in kernel] == [r.id for r in RULES] and {e.plugin for e in kernel} == {
        "core_rules"
    }
    assert main(["check", forge_config({"plugins": {"block": ["loggers"]}, "logging": {"loggers": []}})]) == 0
    out = capsys.readouterr().out
    assert f"({len(RULES)} from the kernel)" in out
    assert "blocked plugins (their components and rules not loaded): loggers" in out


# --- name clashes: a third-party component named like a built-in ---------------------

WSD_PLUGIN = """
from forge_core.api import ScheduleSpec, hookimpl

@hookimpl
def forge_schedules():
    return [ScheduleSpec(name="wsd", summary="My own warmup-stable-decay", impl="os.path:join")]
"""


@pytest.fixture
def wsd_site(tmp_path, monkeypatch):
    """An installed package that registers ``wsd``, which the built-in ``optim`` has too."""
    site = make_distribution(
        tmp_path / "site", "forge-mywsd", "2.0", {"mywsd_plugin": WSD_PLUGIN}, {"mywsd": "mywsd_plugin"}
    )
    monkeypatch.syspath_prepend(str(site))
    return site


def test_a_clash_leaves_every_other_component_of_both_plugins_usable(wsd_site):
    registries = load_registries()
    schedules = registries["schedule"]
    assert "wsd" not in schedules and {"cosine", "linear", "constant"} <= set(schedules.names())
    assert "adamw" in registries["optimizer"]
    with pytest.raises(ForgeError) as info:
        schedules.get("wsd", "train.schedule")
    message = str(info.value)
    assert message.startswith(
        "train.schedule: schedule 'wsd' is registered by 2 plugins: 'optim' "
        "(forge-trainer 0.1.0, built-in) and 'mywsd' (forge-mywsd 2.0)."
    )
    assert "plugins.prefer: {schedule: {wsd: mywsd}} (or optim)" in message
    # Never advice to block the built-in plugin: its other components and rules would go too.
    assert "FORGE_BLOCK_PLUGINS=mywsd" in message and "FORGE_BLOCK_PLUGINS=optim" not in message
    assert "uninstall forge-mywsd" in message


def test_every_command_works_with_a_clash_and_a_config_chooses_explicitly(wsd_site, forge_config, capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "schedule     wsd            My own warmup-stable-decay  [also registered by 'optim']" in out
    assert "name clashes: a config can use these names only once it says whose it means" in out
    assert "    schedule 'wsd': 'optim', 'mywsd'" in out
    assert main(["rules"]) == 0
    capsys.readouterr()

    quickstart = str(REPO / "configs" / "quickstart.yaml")
    assert main(["check", quickstart]) == 0  # cosine: the clash does not concern it
    capsys.readouterr()
    assert main(["check", quickstart, "train.schedule=wsd"]) == 2
    err = capsys.readouterr().err
    assert "error: $.train.schedule: schedule 'wsd' is registered by 2 plugins" in err
    assert "Traceback" not in err

    for chosen, other, summary in (("mywsd", "optim", "My own"), ("optim", "mywsd", "Warmup-stable-decay")):
        overrides = ["train.schedule=wsd", f"plugins.prefer.schedule.wsd={chosen}"]
        assert main(["check", quickstart, *overrides]) == 0
        out = capsys.readouterr().out
        assert "[component.shadowed]" in out
        assert (
            f"schedule 'wsd' is the one of plugin {chosen!r}, as plugins.prefer says; "
            f"it shadows the one of {other!r}" in out
        )
        from forge_core.judge import judge

        assert judge(quickstart, overrides).plan.specs["schedule"].summary.startswith(summary)


def test_a_preference_that_names_nothing_real_is_a_config_error(wsd_site, forge_config, capsys):
    path = forge_config(
        {
            "plugins": {
                "block": ["mywsd"],
                "prefer": {
                    "schedules": {"wsd": "mywsd"},
                    "schedule": {"wsd": "mywsd", "cosin": "optim"},
                    "optimizer": {"adamw": "optimm"},
                },
            }
        }
    )
    assert main(["check", path]) == 2
    err = capsys.readouterr().err
    assert (
        "$.plugins.prefer.schedules: unknown kind of component 'schedules'. Did you mean 'schedule'?" in err
    )
    assert "$.plugins.prefer.schedule.cosin: unknown schedule 'cosin'. Did you mean 'cosine'?" in err
    assert (
        "$.plugins.prefer.schedule.wsd: plugin 'mywsd' (it is blocked) does not register the schedule "
        "'wsd', which 'optim' does."
    ) in err
    assert (
        "$.plugins.prefer.optimizer.adamw: plugin 'optimm' does not register the optimizer 'adamw', "
        "which 'optim' does. Did you mean 'optim'?" in err
    )


def test_a_preference_pins_a_name_no_other_plugin_registers():
    registries = load_registries(prefer={"schedule": {"cosine": "optim"}})
    assert registries.preference_issues == () and registries["schedule"].shadowed == {}
    assert registries["schedule"].plugin_of("cosine") == "optim"


def test_a_clashing_strategy_switched_on_by_a_degree_is_refused_not_dropped():
    from forge_core.api import ParallelismSpec
    from forge_core.parallel_dims import active_strategies

    class MyDdp:
        @hookimpl
        def forge_parallelisms(self):
            return [ParallelismSpec(name="ddp", summary="mine", impl="os.path:join", mesh_dim="dp_replicate")]

    registry = load_registries(extra=(("myddp", MyDdp()),))["parallelism"]
    assert [s.name for s in active_strategies(registry, {"tp": 2}, [])] == ["tp"]
    with pytest.raises(ForgeError, match=r"parallel: parallelism strategy 'ddp' is registered by 2 plugins"):
        active_strategies(registry, {"dp_replicate": 2}, [])


def test_a_plugin_registering_one_name_twice_is_named():
    class Twice:
        @hookimpl
        def forge_packers(self):
            return [
                PackerSpec(name="twin", summary="a", impl="x.y:Z"),
                PackerSpec(name="twin", summary="b", impl="x.y:Z"),
            ]

    with pytest.raises(
        ForgeError,
        match=r"plugin 'twice' registers the packer 'twin' twice\. Block it with FORGE_BLOCK_PLUGINS=twice",
    ):
        load_registries(extra=(("twice", Twice()),))


def test_a_resumed_run_keeps_the_choice_its_config_made(wsd_site, tmp_path):
    from forge_core.train.rundir import load_run_config

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(
        "train: {schedule: wsd}\nplugins: {prefer: {schedule: {wsd: mywsd}}}\n"
    )
    plan, registries = load_run_config(tmp_path / "run")
    assert registries["schedule"].plugin_of(plan.config.train.schedule) == "mywsd"
    assert plan.specs["schedule"] is registries["schedule"].get("wsd")  # what sample/export build


def test_the_doc_id_rule_holds_for_a_third_party_backend_with_the_attention_plugin_blocked(forge_config):
    class CausalOnly:
        @hookimpl
        def forge_attention_backends(self):
            return [AttentionBackendSpec(name="causal", summary="ignores doc_ids", impl="os:path")]

    from forge_core.judge import judge

    path = forge_config(
        {"plugins": {"block": ["attention"]}, "attention": {"backend": "causal"}, "data": {"packer": "bfd"}}
    )
    result = judge(path, extra_plugins=(("causal", CausalOnly()),))
    assert [v.rule_id for v in result.errors] == ["attention.honours-doc-ids"]
    assert result.errors[0].plugin == "core_rules"
