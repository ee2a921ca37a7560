"""The data build of a run: a third-party packer written for the former eager contract
still trains (with a warning naming the lazy one); a lazy packer whose layout breaks its
spec's promise is refused before training; bad input stops ``forge-run`` with exit 2
and the file's name, never a traceback; the config's two forms of sources."""

from __future__ import annotations

import json

import pytest
from train_helpers import tiny_config, write_config

from forge_core import cli
from forge_core.api import DOC_IDS, POSITIONS, PackerSpec, hookimpl


class EagerBfd:
    """A packer of the former preview contract: pack(documents) -> whole arrays."""

    def __init__(self, options, *, seq_len, eos_id, pad_id):
        pass

    def pack(self, documents):
        raise AssertionError("never called")


class NoMetadataBfd:
    """Lazy, but its layout drops the metadata its spec declares."""

    def __init__(self, options, **kwargs):
        from forge_plugins.packers.bfd import BfdPacker

        self.inner = BfdPacker(options, **kwargs)

    def layout(self, lengths):
        import attrs

        return attrs.evolve(self.inner.layout(lengths), metadata=False)


class Packers:
    @hookimpl
    def forge_packers(self):
        return [
            PackerSpec(
                name="eager",
                summary="old contract",
                impl="test_data_build:EagerBfd",
                emits={DOC_IDS, POSITIONS},
            ),
            PackerSpec(
                name="broken",
                summary="drops metadata",
                impl="test_data_build:NoMetadataBfd",
                emits={DOC_IDS, POSITIONS},
            ),
        ]


def test_a_packer_with_only_the_old_pack_contract_is_refused_naming_layout(tmp_path):
    from forge_core.api import ForgeError
    from forge_core.testing import train_in_process

    cfg = tiny_config(tmp_path, "eager", data={"packer": "eager"}, train={"steps": 2})
    with pytest.raises(ForgeError, match=r"packer 'eager' .*pack\(documents\).*Implement layout\(lengths\)"):
        train_in_process(write_config(tmp_path / "e.yaml", cfg), [], extra_plugins=(("p", Packers()),))
    assert not (tmp_path / "eager" / "checkpoints").exists()


def test_a_layout_that_breaks_the_spec_is_refused_before_training(tmp_path):
    from forge_core.api import ForgeError
    from forge_core.testing import train_in_process

    cfg = tiny_config(tmp_path, "broken", data={"packer": "broken"}, train={"steps": 2})
    with pytest.raises(
        ForgeError,
        match=r"packer 'broken' .*declares that it emits doc_ids, positions .* "
        r"metadata=False",
    ):
        train_in_process(write_config(tmp_path / "b.yaml", cfg), [], extra_plugins=(("p", Packers()),))
    assert not (tmp_path / "broken" / "checkpoints").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a NUL byte"),
        (b"caf\xe9 au lait", "invalid UTF-8"),
    ],
)
def test_bad_input_stops_the_run_with_exit_2_and_the_file_name(tmp_path, capsys, content, message):
    bad = tmp_path / "corpus" / "bad.txt"
    bad.parent.mkdir()
    bad.write_bytes(content)
    cfg = tiny_config(tmp_path, "bad")
    assert cli.main(["train", write_config(tmp_path / "c.yaml", cfg)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and message in err and "Traceback" not in err


def test_one_source_and_a_mixture_are_two_forms_of_one_setting(tmp_path, capsys):
    cfg = tiny_config(tmp_path, "both")
    cfg["data"]["sources"] = [{"name": "text", "options": cfg["data"]["source_options"]}]
    assert cli.main(["check", write_config(tmp_path / "both.yaml", cfg)]) == 2
    assert (
        "$.data.source: give one source with data.source (and data.source_options), or a mixture"
        in capsys.readouterr().err
    )
    del cfg["data"]["source"], cfg["data"]["source_options"]
    assert cli.main(["check", write_config(tmp_path / "mix.yaml", cfg)]) == 0
    cfg["data"]["sources"].append(
        {"name": "text", "weight": 2, "options": {"paths": [str(tmp_path / "none/*.txt")]}}
    )
    assert cli.main(["check", write_config(tmp_path / "bad.yaml", cfg)]) == 2
    assert "data.sources[1]: data.source_options.paths: pattern" in capsys.readouterr().out
    json.dumps(cfg)  # the config is plain data
