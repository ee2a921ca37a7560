"""Forge under Slurm, in process: the host-list parser, what an ``srun`` task's
environment becomes (torchrun's variables, explicit ones winning, the batch script not
taken for a task), the requeue signal (saved, exit 128 + the signal, configurable,
judged by check), and the sbatch template (its forge-run line judged valid, its trap
requeueing on the tasks' 138). Two real tasks training together:
tests/distributed/test_slurm_tasks.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, make_distribution, only_plugins
from deadline import deadline
from train_helpers import read_metrics, tiny_config, write_config

from forge_core.cli.slurm import (
    PORT_BASE,
    SlurmEnvError,
    allocation_tasks,
    expand_nodelist,
    first_host,
    task_of,
)
from forge_core.testing import forge_run

TEMPLATE = REPO / "examples/slurm/forge.sbatch"


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("localhost", ["localhost"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("a1,b[8-10],c", ["a1", "b8", "b9", "b10", "c"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("rack[1-2]-n[3,5]", ["rack1-n3", "rack1-n5", "rack2-n3", "rack2-n5"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
        ("node[7]", ["node7"]),
    ],
)
def test_nodelist_expands_as_slurm_writes_it(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("node[01-04", "without its ']'"),
        ("node]1", "without its '['"),
        ("n[1-[2]]", "nested"),
        ("n[4-2]", "runs backwards"),
        ("n[a-c]", "not a number"),
        ("n[0-99999999]", "more hosts than a cluster"),
        ("a,,b", "empty host name"),
        ("  ", "empty"),
    ],
)
def test_nodelist_parser_refuses_what_it_cannot_read(text, says):
    with pytest.raises(ValueError, match=says.replace("[", r"\[")):
        expand_nodelist(text)


def test_first_host_asks_scontrol_only_for_a_list_the_parser_cannot_read(tmp_path, monkeypatch):
    fake = tmp_path / "bin/scontrol"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "odd7\\nodd8\\n"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert first_host("node[03-04]") == "node03"  # the parser, not scontrol's answer
    assert first_host("odd[7-") == "odd7"
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="without its"):
        first_host("odd[7-")


def test_the_first_host_is_read_from_the_syntax_never_expanded():
    # Four billion hosts if expanded (each range alone is within bounds).
    with deadline(2, "finding the first host of a[0-65535]b[0-65535]"):
        assert first_host("a[0-65535]b[0-65535]") == "a0b0"
    assert first_host("gpu[098-101],x") == "gpu098" and first_host("rack[2-3,1]-n[07-08]") == "rack2-n07"
    with pytest.raises(ValueError, match="names 4294967296 hosts, more than a cluster"):
        expand_nodelist("a[0-65535]b[0-65535]")  # counted, not expanded
    with pytest.raises(ValueError, match="is not a number"):
        expand_nodelist("n[\u0663]")  # an Arabic-Indic 3: str.isdigit() takes it, Slurm does not


def srun_env(rank: int = 1, ntasks: int = 4, **extra: str) -> dict[str, str]:
    """What srun exports for task ``rank`` of ``srun -N 2 --ntasks-per-node 2``."""
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % 2),
        "SLURM_NODEID": str(rank // 2),
        "SLURM_NNODES": "2",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
    }
    return {**env, **extra}


def test_an_srun_task_gets_torchruns_variables():
    task = task_of(srun_env(rank=3))
    assert task.torchrun_env() == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(PORT_BASE + 123456 % 20000),
    }
    # A step on part of the job: its own node list and task count.
    step = task_of(srun_env(SLURM_STEP_NODELIST="gpu08", SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="8"))
    assert (step.master_addr, step.world_size) == ("gpu08", 2)
    reserved = task_of(srun_env(SLURM_STEP_RESV_PORTS="12001-12004"))
    assert reserved.master_port == 12001


def test_explicit_variables_win_over_slurms():
    task = task_of(srun_env(MASTER_ADDR="head.ib", MASTER_PORT="29511"))
    assert (task.master_addr, task.master_port) == ("head.ib", 29511)
    # Started by torchrun inside an srun task: torchrun's ranks, nothing adopted.
    assert task_of(srun_env(RANK="5", WORLD_SIZE="8")) is None


def test_the_batch_script_is_not_a_task():
    """sbatch's script sees SLURM_JOB_ID, SLURM_NTASKS and SLURM_PROCID=0 but is one
    process: no step id (or Slurm's batch step id) means no task, and a warning."""
    batch = {k: v for k, v in srun_env(rank=0).items() if not k.startswith("SLURM_STEP")}
    assert task_of(batch) is None and allocation_tasks(batch) == 4
    assert task_of({**batch, "SLURM_STEP_ID": str(0xFFFFFFFB)}) is None  # SLURM_BATCH_SCRIPT
    assert allocation_tasks(srun_env()) is None  # a task: nothing to warn about
    assert allocation_tasks({}) is None


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (srun_env(RANK="0"), "RANK='0' is set but WORLD_SIZE is not"),
        (srun_env(rank=4), "SLURM_PROCID=4 but the step has 4 task(s)"),
        (srun_env(SLURM_PROCID="one"), "SLURM_PROCID='one': not a whole number"),
        (srun_env(SLURM_STEP_NODELIST="gpu[07-"), "SLURM_STEP_NODELIST='gpu[07-': cannot read it"),
        (srun_env(MASTER_PORT="99999"), "MASTER_PORT='99999': not a TCP port"),
        (srun_env(SLURM_JOB_ID="abc"), "SLURM_JOB_ID='abc': no number"),
        ({k: v for k, v in srun_env().items() if k != "SLURM_LOCALID"}, "SLURM_LOCALID is not set"),
    ],
)
def test_an_unusable_task_environment_is_named(env, says):
    with pytest.raises(SlurmEnvError) as info:
        task_of(env)
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SLURM_PROCID", "\u0663", "not a whole number written in ASCII digits 0-9"),  # int() takes it
        ("SLURM_PROCID", "\u00b2", "not a whole number written in ASCII digits 0-9"),  # int() refuses it
        ("SLURM_LOCALID", "-1", "must be at least 0"),
        ("SLURM_STEP_NUM_TASKS", "0", "must be at least 1"),
        ("SLURM_STEP_NUM_TASKS", "9" * 30, "more than 2147483647"),
    ],
)
def test_slurm_numbers_are_ascii_integers_in_range(name, value, says):
    with pytest.raises(SlurmEnvError) as info:
        task_of(srun_env(**{name: value}))
    assert str(info.value).startswith(f"{name}={value!r}: {says}, so this task cannot know its place")
    # Numbers that only decide whether this is a task, or only warn, are ASCII too.
    assert task_of(srun_env(SLURM_STEP_ID="\u00b2")) is None
    assert allocation_tasks({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "\u00b2"}) is None


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RANK": "0", "WORLD_SIZE": "\u0662"}, "WORLD_SIZE='\u0662': not a whole number written in ASCII"),
        ({"RANK": "\u00b2", "WORLD_SIZE": "4"}, "RANK='\u00b2': not a whole number written in ASCII"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0': must be at least 1"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 is not below WORLD_SIZE=4"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK='-1': must be at least 0"),
    ],
)
def test_torchruns_numbers_are_ascii_integers_in_range(tmp_path, env, says):
    path = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, "bad"))
    # check reads only the world size; train every number.
    for command in (["check"], []) if says.startswith("WORLD_SIZE") else ([],):
        result = forge_run([*command, path], env=clean_env(**env))
        assert result.code == 2 and "bug in Forge" not in result.stderr, result.stderr
        assert result.stderr.startswith(f"error: {says}") and "unset the variable" in result.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("value", ["0", "-3", "\u0663"])
def test_a_world_size_or_process_count_is_an_ascii_integer_of_at_least_1(tmp_path, value):
    path = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, "bad"))
    for argv, option in (
        (["check", path, "--world-size", value], "--world-size"),
        ([path, "--nproc", value], "--nproc/--nproc-per-node/--nproc_per_node"),
    ):
        result = forge_run(argv, env=clean_env())
        why = (
            "not a whole number written in ASCII digits 0-9" if not value.isascii() else "must be at least 1"
        )
        assert result.code == 2 and f"error: argument {option}: {value!r}: {why}; give " in result.stderr, (
            result.stderr
        )
    assert not (tmp_path / "bad").exists()


def clean_env(**extra: str) -> dict[str, str | None]:
    """For forge_run: no Slurm or torchrun variable of this environment, then ``extra``."""
    gone = {k: None for k in os.environ if k.startswith("SLURM_")}
    gone.update(dict.fromkeys(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")))
    return {**gone, **only_plugins(), **extra}


def test_forge_run_refuses_a_broken_task_environment_with_exit_2(tmp_path):
    path = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, "bad"))
    result = forge_run(["train", path], env=clean_env(**srun_env(rank=7)))
    assert result.code == 2, result.stderr
    assert result.stderr.startswith("error: SLURM_PROCID=7 but the step has 4 task(s)")
    assert "Traceback" not in result.stderr and not (tmp_path / "bad").exists()


SIGNAL_AT = """
import os, signal
from forge_core.api import hookimpl

@hookimpl
def forge_step_end(run, step, metrics):
    if step == 2:  # what the scheduler does, at a step the test knows
        os.kill(os.getpid(), getattr(signal, "SIG" + os.environ["TEST_SIGNAL"]))
"""


def signal_run(tmp_path, name: str, signal_name: str) -> tuple[str, dict, Path]:
    """A config whose run.requeue_signal is ``signal_name``, the srun environment of a
    one-task step (srun -n 1), and a plugin that sends it at step 2."""
    site = make_distribution(
        tmp_path / "site", "signal-at", "0.1", {"signal_at": SIGNAL_AT}, {"signal_at": "signal_at"}
    )
    cfg = tiny_config(
        tmp_path,
        name,
        train={"steps": 4},
        run={"requeue_signal": signal_name},
        logging={"loggers": ["jsonl"]},
    )
    return write_config(tmp_path / f"{name}.yaml", cfg), clean_env(**srun_env(rank=0, ntasks=1)), site


def test_usr1_saves_exits_138_and_the_requeued_task_resumes_exactly(tmp_path):
    """USR1 at step 2 saves step 2 and the task exits 138 (128 + USR1); started again
    (the requeued job) it resumes to step 4 with the losses and gradient norms of a run
    never interrupted, bit for bit. torchrun's variables set for the task are gone after."""
    path, env, site = signal_run(tmp_path, "req", "USR1")
    signalled = {**env, **only_plugins("signal_at"), "TEST_SIGNAL": "USR1"}
    result = forge_run(["train", path], env=signalled, paths=[site])
    assert result.code == 138, result.stderr
    assert "SIGUSR1 received: saving a checkpoint at step 2" in result.stdout
    assert "srun task 0 of 1 (Slurm job 123456)" in result.stderr
    assert (tmp_path / "req/checkpoints/latest").read_text().strip() == "step-000002"
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ
    assert forge_run(["train", path], env=env).code == 0

    straight = write_config(
        tmp_path / "straight.yaml",
        tiny_config(tmp_path, "straight", logging={"loggers": ["jsonl"]}, train={"steps": 4}),
    )
    assert forge_run(["train", straight], env=env).code == 0
    got, want = read_metrics(tmp_path / "req"), read_metrics(tmp_path / "straight")
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    for key in ("loss", "grad_norm"):
        assert [m[key] for m in got] == [m[key] for m in want], key


def test_the_requeue_signal_is_the_configs(tmp_path):
    """run.requeue_signal: USR2 stops on USR2 (exit 140) the same way."""
    path, env, site = signal_run(tmp_path, "usr2", "USR2")
    result = forge_run(
        ["train", path], env={**env, **only_plugins("signal_at"), "TEST_SIGNAL": "USR2"}, paths=[site]
    )
    assert result.code == 128 + signal.SIGUSR2, result.stderr
    assert (tmp_path / "usr2/checkpoints/latest").read_text().strip() == "step-000002"


def test_check_judges_the_requeue_signal(tmp_path):
    cfg = tiny_config(tmp_path, "sig", run={"requeue_signal": "TERM"})
    result = forge_run(["check", write_config(tmp_path / "c.yaml", cfg)])
    assert result.code == 2
    assert (
        "$.run.requeue_signal: expected one of '', 'USR1', 'USR2', 'HUP', 'XCPU', got TERM" in result.stderr
    )


def test_in_an_allocation_but_not_under_srun_it_trains_alone_and_says_so(tmp_path):
    path = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, "alone", train={"steps": 1}))
    batch = {k: v for k, v in srun_env(rank=0).items() if not k.startswith("SLURM_STEP")}
    result = forge_run(["train", path], env=clean_env(**batch))
    assert result.code == 0, result.stderr
    assert "this Slurm job (123456) has 4 tasks, but forge-run was not started by srun" in result.stderr
    assert "device cpu x 1" in result.stdout


# --- the sbatch template -----------------------------------------------------------------


def template_words() -> list[str]:
    """The template's ``config`` and ``overrides`` as bash reads them."""
    lines = [
        line for line in TEMPLATE.read_text().splitlines() if line.startswith(("config=", "overrides=("))
    ]
    script = "\n".join(lines) + '\nprintf "%s\\n" "$config" "${overrides[@]}"\n'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()


def test_the_templates_forge_run_line_is_a_valid_config_for_its_tasks():
    text = TEMPLATE.read_text()
    for line in ("#SBATCH --signal=B:USR1@120", "#SBATCH --requeue", "trap requeue USR1"):
        assert line in text
    assert 'srun --kill-on-bad-exit=0 forge-run train "$config" "${overrides[@]}" &' in text
    config, *overrides = template_words()
    assert "run.requeue_signal=USR1" in overrides
    nodes, per_node = (int(text.split(f"#SBATCH --{k}=")[1].split()[0]) for k in ("nodes", "ntasks-per-node"))
    result = forge_run(["check", config, *overrides, "--world-size", str(nodes * per_node)], cwd=REPO)
    assert result.code == 0, result.stdout + result.stderr


def test_the_templates_trap_passes_usr1_on_and_requeues_on_138(tmp_path):
    """The template run by bash with stand-ins for srun, scancel, scontrol and forge-run:
    USR1 to the script reaches the task (through scancel), the task exits 138, the
    script requeues the job and exits 138. A task that completes (0) is not requeued."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {
        "srun": 'while [ "${1#--}" != "$1" ]; do shift; done; exec "$@"',
        # train: wait for USR1 (or end at once when told to), then exit 138 as Forge does.
        "forge-run": (
            '[ "$1" = check ] && exit 0\n'
            'echo $$ > "$LOG/task.pid"\n'
            '[ -n "${COMPLETE:-}" ] && exit 0\n'
            "trap 'exit 138' USR1\n"
            "while :; do sleep 0.05; done"
        ),
        "scancel": 'echo "scancel $*" >> "$LOG/calls"; kill -USR1 "$(cat "$LOG/task.pid")"',
        "scontrol": 'echo "scontrol $*" >> "$LOG/calls"',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOG": str(tmp_path),
        "SLURM_JOB_ID": "77",
    }

    script = subprocess.Popen(
        ["bash", str(TEMPLATE)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "task.pid").exists():
        assert script.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    script.send_signal(signal.SIGUSR1)
    out, _ = script.communicate(timeout=30)
    assert script.returncode == 138, out
    assert (tmp_path / "calls").read_text().splitlines() == [
        "scancel --signal=USR1 77",
        "scontrol requeue 77",
    ]

    (tmp_path / "calls").unlink()
    done = subprocess.run(["bash", str(TEMPLATE)], env={**env, "COMPLETE": "1"}, cwd=tmp_path, timeout=30)
    assert done.returncode == 0 and not (tmp_path / "calls").exists()


FAKE_AGENT = """
import os, subprocess, sys
open(os.path.join(sys.argv[1], "agent-env"), "w").write(os.environ.get("FORGE_REQUEUE_SIGNAL", ""))
worker = (
    "import os, signal, sys, time\\n"
    "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(0))\\n"  # a worker: saves, exits 0
    "open(os.path.join(sys.argv[1], 'ready'), 'w').close()\\n"
    "time.sleep(30); sys.exit(1)\\n"
)
sys.exit(subprocess.call([sys.executable, "-c", worker, sys.argv[1]]))
"""


def test_forge_run_nproc_passes_the_requeue_signal_to_its_workers_and_exits_138(tmp_path, monkeypatch):
    """Under --nproc, USR1 to forge-run reaches the workers (not the agent, which is told
    to ignore it); they stop cleanly, and forge-run exits 138 for the batch script."""
    import threading

    from forge_core.cli import train

    monkeypatch.setattr(
        train, "torchrun_command", lambda args, overrides: [sys.executable, "-c", FAKE_AGENT, str(tmp_path)]
    )

    def signal_when_ready():
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=signal_when_ready, daemon=True).start()
    assert train.relaunch(None, [], requeue=signal.SIGUSR1) == 138
    assert (tmp_path / "agent-env").read_text() == str(int(signal.SIGUSR1))
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # forge-run's handler is gone
