"""The ``hf_datasets`` source on data sets saved locally with ``datasets``: a
``save_to_disk`` folder (Arrow, a DatasetDict split), Parquet, JSON Lines and Arrow
files, each read in memory and streaming, give the same documents in the same order;
bad input is an error naming the folder or files; the fingerprint follows the bytes;
a run trains on it through the cache. Skipped only where ``datasets`` is not
installed (CI installs it with the dev extra)."""

from __future__ import annotations

import json

import numpy as np
import pytest

datasets = pytest.importorskip(
    "datasets", reason="the hf_datasets source needs `datasets`: pip install 'forge-trainer[datasets]'"
)

from forge_core.api import ForgeError  # noqa: E402
from forge_plugins.sources.hf_datasets import HFDatasetsSource  # noqa: E402
from forge_plugins.sources.options import HFDatasetsOptions  # noqa: E402

TEXTS = [f"row {i}: " + "é" * (i % 5) + "text " * (i % 9) for i in range(60)] + ["   "]  # the last is blank


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    ds = datasets.Dataset.from_dict({"text": TEXTS, "id": list(range(len(TEXTS)))})
    ds.save_to_disk(str(root / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(5))}).save_to_disk(str(root / "dict"))
    ds.select(range(30)).to_parquet(str(root / "part-0.parquet"))
    ds.select(range(30, len(TEXTS))).to_parquet(str(root / "part-1.parquet"))
    ds.to_json(str(root / "rows.jsonl"))
    arrow = next((root / "saved").glob("*.arrow"))
    return root, arrow


def docs(**options):
    return list(HFDatasetsSource(HFDatasetsOptions(**options)).documents())


@pytest.mark.parametrize("streaming", [False, True])
def test_every_kind_of_local_data_set_gives_the_same_documents(saved, streaming):
    root, arrow = saved
    want = TEXTS[:-1]  # blank rows are skipped
    assert docs(path=str(root / "saved"), streaming=streaming) == want
    assert docs(path=str(root / "dict"), split="train", streaming=streaming) == want
    assert docs(path=str(root / "dict"), split="test", streaming=streaming) == want[:5]
    assert docs(data_files=[str(root / "part-*.parquet")], streaming=streaming) == want
    assert docs(data_files=[str(root / "rows.jsonl")], streaming=streaming) == want
    assert docs(data_files=[str(arrow)], streaming=streaming) == want


def test_bad_input_names_what_is_wrong(saved, tmp_path):
    root, _ = saved
    cases = [
        ({"path": str(tmp_path / "nope")}, "is not a directory \\(it does not exist\\)"),
        ({"path": str(tmp_path)}, "is not a folder written by `save_to_disk`"),
        ({}, "give exactly one of `path`"),
        ({"data_files": [str(tmp_path / "*.parquet")]}, "matches no file"),
    ]
    for options, message in cases:
        with pytest.raises(ForgeError, match=message):
            docs(**options)
    with pytest.raises(ForgeError, match=r"saved: no column 'body' \(columns: text, id\)"):
        docs(path=str(root / "saved"), text_field="body")
    with pytest.raises(ForgeError, match=r"no split 'validation' \(splits: train, test\)"):
        docs(path=str(root / "dict"), split="validation")
    with pytest.raises(ForgeError, match=r"row 0: 'id' is int, not a string"):
        docs(path=str(root / "saved"), text_field="id")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ForgeError, match="broken.parquet.*datasets cannot read it"):
        docs(data_files=[str(broken)])
    (tmp_path / "blank.jsonl").write_text(json.dumps({"text": " "}) + "\n")
    with pytest.raises(ForgeError, match="contains no document"):
        docs(data_files=[str(tmp_path / "blank.jsonl")])


def test_the_fingerprint_follows_the_bytes_and_the_column(saved, tmp_path):
    root, _ = saved
    a = HFDatasetsSource(HFDatasetsOptions(data_files=[str(root / "rows.jsonl")])).fingerprint()
    assert (
        a
        == HFDatasetsSource(
            HFDatasetsOptions(data_files=[str(root / "rows.jsonl")], streaming=True)
        ).fingerprint()
    )
    assert (
        a
        != HFDatasetsSource(
            HFDatasetsOptions(data_files=[str(root / "rows.jsonl")], text_field="id")
        ).fingerprint()
    )
    copy = tmp_path / "rows.jsonl"
    copy.write_bytes((root / "rows.jsonl").read_bytes().replace(b"row 1:", b"row X:"))
    assert a != HFDatasetsSource(HFDatasetsOptions(data_files=[str(copy)])).fingerprint()


def test_a_run_reads_it_through_the_cache(saved, tmp_path):
    from forge_core.data.build import build_training_data
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved
    from forge_plugins.tokenizers.byte import ByteTokenizer

    root, _ = saved
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "data": {
                    "source": "hf_datasets",
                    "source_options": {"path": str(root / "saved")},
                    "packer": "bfd",
                    "seq_len": 64,
                    "cache": {"dir": str(tmp_path / "cache")},
                }
            }
        )
    )
    cfg, registries = load_resolved(str(config))
    data = build_training_data(
        make_plan(cfg, registries, 1), registries, ByteTokenizer(), report=lambda m: None
    )
    rows = data.rows.read(np.arange(data.rows.num_rows))
    tokens = int((rows["input_ids"] != 257).sum())
    assert tokens == sum(len(t.encode()) + 1 for t in TEXTS[:-1])


@pytest.mark.parametrize("streaming", [False, True])
def test_datasets_draws_no_progress_bar_into_the_console(tmp_path, capfd, streaming):
    """A file ``datasets`` has not seen makes it build its cache, with a tqdm bar of its
    own ("Generating train split") whose redraws are raw carriage returns in a log: the
    source switches them off while it loads, and back on after."""
    rows = tmp_path / "fresh.jsonl"
    rows.write_text("".join(json.dumps({"text": f"{tmp_path.name} {i}"}) + "\n" for i in range(50)))
    assert datasets.is_progress_bar_enabled()
    capfd.readouterr()
    assert len(docs(data_files=[str(rows)], streaming=streaming)) == 50
    err = capfd.readouterr().err
    assert "\r" not in err and "Generating" not in err and "examples" not in err, err
    assert datasets.is_progress_bar_enabled()  # left as it was
    datasets.disable_progress_bars()
    try:
        docs(data_files=[str(rows)])
        assert not datasets.is_progress_bar_enabled()  # not switched on behind the user's back
    finally:
        datasets.enable_progress_bars()


def test_check_reads_the_fields_and_names_a_text_field_the_data_does_not_have(saved, tmp_path, forge_config):
    """Before: check said valid and the run failed once it read the data. Now check reads
    the schema (Parquet footer, Arrow stream, saved folder's dataset_info.json), the first
    JSON record or the CSV header, without torch or datasets."""
    from forge_core.judge import judge

    root, arrow = saved
    (tmp_path / "rows.csv").write_text("id,body\n1,hello\n")

    def problems(**options):
        path = forge_config({"data": {"source": "hf_datasets", "source_options": options, "packer": "none"}})
        return [v for v in judge(path, [], 1).errors if v.rule_id == "hf_datasets.readable"]

    for options, where in (
        ({"data_files": [str(root / "part-*.parquet")]}, "part-0.parquet"),
        ({"data_files": [str(root / "rows.jsonl")]}, "rows.jsonl"),
        ({"data_files": [str(arrow)]}, arrow.name),
        ({"path": str(root / "saved")}, "saved"),
        ({"path": str(root / "dict"), "split": "test"}, "dict"),
    ):
        (violation,) = problems(**options, text_field="txt")
        read = violation.message.partition("'txt' is not a field of ")[2]
        assert violation.message.startswith("data.source_options.text_field: ") and where in read
        assert "(fields: text, id). Did you mean 'text'?" in read, (where, violation.message)
        assert ("data.source_options.text_field", "txt") in violation.fields
        assert not problems(**options), where  # the default, "text", is there
    (violation,) = problems(data_files=[str(tmp_path / "rows.csv")])
    assert "'text' is not a field of" in violation.message and "(fields: id, body)" in violation.message
    (violation,) = problems(path=str(root / "dict"), split="validation")
    assert "no split 'validation' (splits: train, test)" in violation.message
    # A JSON array (not JSON Lines) cannot be told without reading it all: the build says.
    (tmp_path / "array.json").write_text(json.dumps([{"body": "x"}]))
    assert not problems(data_files=[str(tmp_path / "array.json")])
