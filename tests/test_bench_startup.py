"""``bench/startup.py`` in its quick mode (a tiny model, one round): each side runs as a
fresh process, the training side reports its CPU and wall seconds to its first step's
end through the probe plugin the bench installs, and the table sets them beside
``import torch``."""

from __future__ import annotations

from conftest import load_bench

bench = load_bench("startup.py", "bench_startup")


def test_the_quick_mode_times_the_first_step_beside_import_torch(tmp_path):
    args = bench.parse(["--quick"])
    times, cold = bench.measure(args, tmp_path)
    assert cold == {} and list(times) == ["import torch", "quickstart"]
    (torch_run,), (train,) = times["import torch"], times["quickstart"]
    assert "first_cpu" not in torch_run and torch_run["cpu"] > 0
    # The probe fired inside the run: after its start-up, before its end.
    assert 0 < train["first_cpu"] <= train["cpu"] and 0 < train["first_wall"] <= train["wall"]
    assert (tmp_path / "runs" / "0" / "checkpoints" / "latest").is_file()
    lines = bench.table(times, cold).splitlines()
    assert lines[0].split()[:3] == ["side", "first", "CPU"]
    assert [line.split()[0] for line in lines[1:]] == ["import", "quickstart"]
    assert float(lines[1].split()[-2]) == 1.0
