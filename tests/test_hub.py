"""Models and tokenizers by Hub id, against a Hugging Face cache laid out by the tests
with the network off (``HF_HUB_OFFLINE=1``; no test here reaches the network):
an id resolves from the cache, in ``check`` and in the loader; a missing id or revision
is an error in ``check`` with the exact download command (which ``hf download`` itself
parses into the files Forge reads); a local folder of the same name wins; ``forge-run
train`` downloads an uncached id before judging, and refuses offline."""

from __future__ import annotations

import json
import os
import shlex

import pytest
import yaml
from deadline import deadline
from hub_cache import put, random_checkpoint, tokenizer

from forge_core import cli
from forge_core.resolve import load_resolved
from forge_plugins import hub

ID = "acme/tiny-llama"
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 320,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A working directory with a corpus and a config naming :data:`ID` for the model and
    the tokenizer, and an empty Hub cache with the network off."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lines = [json.dumps({"text": f"the quick brown fox {i} jumps"}) for i in range(40)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    config = {
        "run": {"out_dir": "run", "device": "cpu"},
        "model": {"name": "llama", "options": {"init_from_hf": ID, "max_seq_len": 32}},
        "attention": {"backend": "sdpa"},
        "data": {
            "source": "text",
            "source_options": {"paths": ["train.jsonl"]},
            "tokenizer": "hf",
            "tokenizer_options": {"path": ID},
            "packer": "concat",
            "seq_len": 16,
        },
        "train": {"steps": 2, "batch_size": 2, "peak_tflops": 1.0},
        "checkpoint": {"every": 2},
        "logging": {"loggers": ["jsonl"]},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def checkpoint(project, name="ck", **changes):
    return tokenizer(random_checkpoint(project / name, {**CONFIG, **changes}))


def check(capsys, *overrides):
    code = cli.main(["check", "config.yaml", *overrides, "--world-size", "1"])
    return code, capsys.readouterr().out


def test_an_id_resolves_from_the_cache_with_the_network_off(project, capsys):
    snapshot = put(project / "hub", ID, checkpoint(project))
    code, out = check(capsys)
    assert code == 0, out
    options = load_resolved("config.yaml")[0].model.options
    # Shapes from the snapshot's config.json; the branch pinned to the commit it points at.
    assert (options.dim, options.n_layers, options.tie_embeddings) == (32, 2, True)
    assert options.revision == snapshot.name and hub.COMMIT.fullmatch(snapshot.name)
    # A tag resolves too, and a commit names its snapshot without any ref.
    put(project / "hub", ID, checkpoint(project, "v1", hidden_size=48), revision="v1")
    assert load_resolved("config.yaml", ["model.options.revision=v1"])[0].model.options.dim == 48
    assert (
        load_resolved("config.yaml", [f"model.options.revision={snapshot.name}"])[0].model.options.dim == 32
    )


def hf_download_patterns(command, monkeypatch):
    """What ``hf download`` itself makes of ``command``: ``(repo id, revision, patterns)``."""
    from click.testing import CliRunner
    from huggingface_hub.cli import download
    from huggingface_hub.cli.hf import app

    calls = []
    monkeypatch.setattr(
        download, "snapshot_download", lambda repo_id, **kw: calls.append((repo_id, kw)) or "."
    )
    words = shlex.split(command)
    assert words[:2] == ["hf", "download"]
    result = CliRunner().invoke(app, words[1:])
    assert result.exit_code == 0 and len(calls) == 1, result.output
    repo_id, kwargs = calls[0]
    return repo_id, kwargs.get("revision"), tuple(kwargs["allow_patterns"])


def download_commands(out):
    return [line.split("`")[1] for line in out.split("Download it with ")[1:]]


def test_a_missing_id_is_an_error_of_check_with_the_command_that_downloads_it(project, capsys, monkeypatch):
    code, out = check(capsys)
    assert code == 2
    assert "[llama.init-from-hf]" in out and "[hf.tokenizer-files]" in out
    assert f"does not hold {ID} at revision 'main'" in out and "HF_HUB_OFFLINE is set" in out
    model, tok = sorted(download_commands(out), key=lambda command: "safetensors" not in command)
    # The command, as pasted, downloads exactly the files Forge reads.
    assert hf_download_patterns(model, monkeypatch) == (ID, None, hub.MODEL_FILES)
    assert hf_download_patterns(tok, monkeypatch) == (ID, None, hub.TOKENIZER_FILES)


def test_a_revision_that_is_not_cached_is_an_error_likewise(project, capsys, monkeypatch):
    put(project / "hub", ID, checkpoint(project))
    code, out = check(capsys, "model.options.revision=v2", "data.tokenizer_options.revision=v2")
    assert code == 2
    snapshot = hub.cached(ID).commit
    # What the cache does hold, said plainly: v2 has no ref; main resolves to a snapshot.
    held = f"does not hold {ID} at revision 'v2' (no refs/v2; other refs: main -> '{snapshot}'; "
    assert out.count(held + f"snapshots held: {snapshot})") == 2, out
    for command in download_commands(out):
        assert hf_download_patterns(command, monkeypatch)[:2] == (ID, "v2")


def test_a_local_folder_of_the_same_name_wins_and_takes_no_revision(project, capsys):
    put(project / "hub", ID, checkpoint(project, hidden_size=48))
    local = checkpoint(project, ID)  # ./acme/tiny-llama
    assert local.is_dir() and not hub.is_hub_id(ID)
    code, out = check(capsys)
    assert code == 0, out
    options = load_resolved("config.yaml")[0].model.options
    assert (options.dim, options.revision) == (32, "main")
    code, out = check(capsys, "model.options.revision=v1", "data.tokenizer_options.revision=v1")
    assert code == 2 and out.count("a revision chooses a snapshot of a Hub id") == 2, out


def test_train_downloads_an_uncached_id_before_judging_and_refuses_offline(project, capsys, monkeypatch):
    import huggingface_hub

    folder, calls = checkpoint(project), []

    def snapshot_download(repo_id, *, revision, allow_patterns):
        calls.append((repo_id, revision, tuple(allow_patterns)))
        return str(put(project / "hub", repo_id, folder, revision=revision))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert cli.main(["config.yaml"]) == 2
    out = capsys.readouterr()
    assert calls == [] and "hf download acme/tiny-llama --include" in out.err + out.out
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert cli.main(["config.yaml"]) == 0, capsys.readouterr()
    # One download for both (the tokenizer finds the model's snapshot in the cache).
    assert calls == [(ID, "main", hub.MODEL_FILES)]
    saved = yaml.safe_load((project / "run" / "config.yaml").read_text())["model"]["options"]
    first = saved["revision"]
    assert hub.COMMIT.fullmatch(first)
    # The branch moves on in the cache: a resume says the snapshot is not the one it started from.
    put(project / "hub", ID, folder, commit="f" * 40)
    assert cli.main(["config.yaml", "train.steps=3"]) == 0
    out = capsys.readouterr()
    assert "model.options.revision" in out.out + out.err and len(calls) == 1


def test_a_failed_download_is_an_error_naming_the_id_and_the_command(project, capsys, monkeypatch):
    import huggingface_hub

    def snapshot_download(repo_id, **kwargs):
        raise OSError("401 Client Error: Unauthorized (a gated repository)")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert cli.main(["config.yaml"]) == 2
    out = capsys.readouterr()
    message = out.err + out.out
    assert f"model.options.init_from_hf='{ID}': downloading it from the Hugging Face Hub failed" in message
    assert "OSError: 401 Client Error" in message and "HF_TOKEN" in message
    assert f"`hf download {ID} --include '*.json'" in message and "Traceback" not in message


def test_adapters_on_a_hub_id_are_bound_to_its_snapshot(project, capsys):
    # LoRA checkpoints hold only the adapters: the base is the snapshot's files, so a
    # branch that moved to other weights is refused on resume, not trained on silently.
    put(project / "hub", ID, checkpoint(project))
    lora = ["model.transforms=[lora]"]
    assert cli.main(["config.yaml", *lora]) == 0, capsys.readouterr()
    other = tokenizer(random_checkpoint(project / "other", CONFIG, seed=1))
    put(project / "hub", ID, other, commit="e" * 40)
    assert cli.main(["config.yaml", *lora, "train.steps=3"]) == 2
    out = capsys.readouterr()
    assert "holds adapters trained on another base" in out.err + out.out


def test_the_base_an_adapter_run_by_id_depends_on_is_its_cached_repository(project):
    """What ``export-hf`` refuses to write over for a LoRA run on a Hub id: the snapshot
    and the whole cached repository its files link into (blobs included)."""
    from test_lora import plan_of

    from forge_core.cli.export import base_folders

    snapshot = put(project / "hub", ID, checkpoint(project))
    config = yaml.safe_load((project / "config.yaml").read_text())
    config["model"]["transforms"] = ["lora"]
    plan, _ = plan_of(project, config)
    assert base_folders(plan) == [snapshot.resolve(), snapshot.parent.parent.resolve()]
    config["model"]["transforms"] = []  # checkpoints hold every weight: the base is not needed
    assert base_folders(plan_of(project, config)[0]) == []


def test_a_short_commit_name_in_a_ref_is_said_with_the_snapshots_held(project, capsys):
    snapshot = put(project / "hub", ID, checkpoint(project))
    (project / "hub" / f"models--{ID.replace('/', '--')}" / "refs" / "main").write_text("abc1234")
    code, out = check(capsys)
    assert code == 2
    # Not "at revision 'main' (it holds revision main)": what main resolves to, and why not.
    said = (
        f"does not hold {ID} at revision 'main' (refs/main holds 'abc1234', not a full commit name "
        f"(40 hex digits); snapshots held: {snapshot.name})"
    )
    assert out.count(said) == 2, out


def test_a_ref_that_is_a_fifo_is_refused_at_its_path_without_hanging(project, capsys):
    put(project / "hub", ID, checkpoint(project))
    ref = project / "hub" / f"models--{ID.replace('/', '--')}" / "refs" / "main"
    ref.unlink()
    os.mkfifo(ref)  # opened for reading, a FIFO waits for a writer forever
    with deadline(30, "check with a FIFO as the Hub cache ref"):
        code, out = check(capsys)
    assert code == 2 and "Traceback" not in out
    assert out.count(f"the Hub cache ref '{ref}' is a FIFO (named pipe), not a regular file") == 2, out
    # A model folder's config.json likewise (what `init_from_hf` and the tokenizer read).
    folder = checkpoint(project, "folder")
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with deadline(30, "check with a FIFO as config.json"):
        code, out = check(
            capsys, f"model.options.init_from_hf={folder}", f"data.tokenizer_options.path={folder}"
        )
    assert code == 2 and out.count(f"config.json '{folder / 'config.json'}' is a FIFO (named pipe)") == 2, out
