"""The built-in tokenizers and BPE training: ids, EOS/PAD, identity, Hugging Face format."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from forge_core.api import ForgeError
from forge_core.data.bpe import EOS_TOKEN, PAD_TOKEN, train_bpe
from forge_plugins.tokenizers.byte import ByteTokenizer
from forge_plugins.tokenizers.hf import HFTokenizer
from forge_plugins.tokenizers.options import HFOptions

TEXT = "def f(x):\n    return x + 1  # héllo ✓ 日本\n"


class ListSource:
    def __init__(self, docs):
        self.docs = docs

    def documents(self):
        return iter(self.docs)

    def describe(self):
        return f"{len(self.docs)} test documents"


CORPUS = ListSource([f"def f{i}(x):\n    return x * {i} + len('héllo')\n" for i in range(200)])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_bpe(CORPUS, 300, tmp_path_factory.mktemp("bpe") / "tok", progress=False)


def test_byte_tokenizer_round_trip_and_ids():
    tok = ByteTokenizer(None)
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8")) and max(ids) < 256
    assert (tok.vocab_size, tok.eos_id, tok.pad_id) == (258, 256, 257)
    assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == TEXT  # specials are skipped
    assert [a.tolist() for a in tok.encode_batch([TEXT, ""])] == [ids, []]
    assert tok.decode(list("é".encode())[:1]) == "\ufffd"  # half a character


def test_trained_bpe_opens_in_transformers_with_its_specials(trained):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(trained, trust_remote_code=False)
    assert hf.eos_token == EOS_TOKEN and hf.pad_token == PAD_TOKEN
    ids = hf.encode(TEXT, add_special_tokens=False)
    assert hf.decode(ids) == TEXT  # byte-level: nothing is unknown, even unseen characters
    assert len(ids) < len(TEXT.encode())  # merges were learned


def test_hf_tokenizer_wraps_a_local_directory(trained):
    tok = HFTokenizer(HFOptions(path=str(trained)))
    assert tok.vocab_size == 300
    assert (tok.eos_id, tok.pad_id) == (0, 1)
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert [list(x) for x in tok.encode_batch([TEXT, "x"])] == [ids, tok.encode("x")]
    assert tok.identity.startswith("hf:") and tok.identity != ByteTokenizer.identity


def test_hf_identity_follows_the_token_ids(trained, tmp_path):
    tok = HFTokenizer(HFOptions(path=str(trained)))
    tok.save(str(tmp_path / "copy"))
    assert HFTokenizer(HFOptions(path=str(tmp_path / "copy"))).identity == tok.identity
    other = train_bpe(CORPUS, 320, tmp_path / "bigger", progress=False)
    assert HFTokenizer(HFOptions(path=str(other))).identity != tok.identity


def test_hf_tokenizer_without_pad_uses_eos(trained, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(trained, trust_remote_code=False)
    hf.pad_token = None
    hf.save_pretrained(tmp_path / "nopad")
    tok = HFTokenizer(HFOptions(path=str(tmp_path / "nopad")))
    assert tok.pad_id == tok.eos_id == 0


def test_hf_tokenizer_errors(trained, tmp_path):
    with pytest.raises(ForgeError, match="path is empty"):
        HFTokenizer(HFOptions())
    with pytest.raises(ForgeError, match="is not a directory"):
        HFTokenizer(HFOptions(path=str(tmp_path / "missing")))
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(trained, trust_remote_code=False)
    hf.eos_token = None
    hf.save_pretrained(tmp_path / "noeos")
    with pytest.raises(ForgeError, match="has no EOS token"):
        HFTokenizer(HFOptions(path=str(tmp_path / "noeos")))


def test_empty_or_vocabulary_less_folder_says_which_files_are_missing(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ForgeError) as caught:
        HFTokenizer(HFOptions(path=str(tmp_path / "empty")))
    message = str(caught.value)
    assert "holds no tokenizer files (found: nothing)" in message and "tokenizer.json" in message
    assert "You need to have sentencepiece or tiktoken installed" not in message
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only/tokenizer_config.json").write_text('{"eos_token": "<eos>"}')
    with pytest.raises(ForgeError, match=r"found: tokenizer_config.json\).*vocab.json with merges.txt"):
        HFTokenizer(HFOptions(path=str(tmp_path / "config-only")))


EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def remote_code_folder(trained, folder, marker, file="tokenizer_config.json", key="AutoTokenizer"):
    """A working tokenizer folder whose ``file`` asks for its own code (a module that
    would leave ``marker`` behind when imported)."""
    shutil.copytree(trained, folder)
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    path = folder / file
    data = json.loads(path.read_text()) if path.is_file() else {"model_type": "llama"}
    data["auto_map"] = {key: ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    path.write_text(json.dumps(data))
    return folder


def test_folder_that_needs_remote_code_is_refused_and_its_code_never_runs(trained, tmp_path):
    marker = tmp_path / "ran-remote-code"
    folder = remote_code_folder(trained, tmp_path / "remote", marker)
    with pytest.raises(ForgeError) as caught:
        HFTokenizer(HFOptions(path=str(folder)))
    message = str(caught.value)
    assert str(folder / "tokenizer_config.json") in message and "evil.EvilTokenizer" in message
    assert "never runs code from model folders" in message and "trust_remote_code=False" in message
    assert not marker.exists()
    # The folder put to transformers directly, as Forge loads it (trust_remote_code=False),
    # naming only the custom class: transformers refuses too, and the code never runs.
    from forge_plugins.tokenizers.hf import load_pretrained

    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "EvilTokenizer"}))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_pretrained(str(folder))
    assert not marker.exists()
    # A config.json that maps AutoTokenizer to its own code is refused as well.
    other = remote_code_folder(trained, tmp_path / "remote-config", marker, file="config.json")
    with pytest.raises(ForgeError, match=r"config.json names custom tokenizer code"):
        HFTokenizer(HFOptions(path=str(other)))


def test_remote_code_folder_through_forge_run_is_refused_without_a_prompt(trained, tmp_path):
    """stdin closed, as under a scheduler: no "[y/N]" question, exit 2, nothing ran."""
    from conftest import REPO
    from train_helpers import tiny_config, write_config

    marker = tmp_path / "ran-remote-code"
    folder = remote_code_folder(trained, tmp_path / "remote", marker)
    cfg = tiny_config(
        tmp_path, "remote", data={"tokenizer": "hf", "tokenizer_options": {"path": str(folder)}}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "forge_core.cli", write_config(tmp_path / "c.yaml", cfg)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "never runs code from model folders" in proc.stderr and "Traceback" not in proc.stderr
    assert "[y/N]" not in proc.stdout + proc.stderr and not marker.exists()
    assert not (tmp_path / "remote" / "checkpoints").exists()


def test_train_bpe_refuses_bad_input(tmp_path, trained):
    with pytest.raises(ForgeError, match="at least 258"):
        train_bpe(CORPUS, 100, tmp_path / "x", progress=False)
    with pytest.raises(ForgeError, match="already exists"):
        train_bpe(CORPUS, 300, trained, progress=False)
    with pytest.raises(ForgeError, match="needs a text source"):
        train_bpe(ListSource([np.array([1, 2])]), 300, tmp_path / "y", progress=False)
    assert not (tmp_path / "y").exists() and not list(tmp_path.glob(".y.forge-*"))
