"""A task started by Slurm's ``srun`` as one rank of the process group, the way torchrun
would have started it.

``srun forge-run train CONFIG`` starts one ``forge-run`` per task (one per GPU: ``srun
--ntasks-per-node 8``) and no torchrun. Each task reads what Slurm exported for it and
sets torchrun's variables before anything else looks at them:

============  ==========================================================================
``RANK``          ``SLURM_PROCID``
``WORLD_SIZE``    ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``)
``LOCAL_RANK``    ``SLURM_LOCALID``
``MASTER_ADDR``   the first host of ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``):
                  task 0 runs there under every distribution but ``--distribution=arbitrary``
``MASTER_PORT``   the first of ``SLURM_STEP_RESV_PORTS`` (ports Slurm reserved for the
                  step, when the cluster reserves them), else ``10000 + SLURM_JOB_ID % 20000``
                  (below Linux's ephemeral ports; two jobs whose first node is the same
                  collide only when their ids are 20000 apart)
============  ==========================================================================

Whatever is already in the environment wins: ``MASTER_ADDR``/``MASTER_PORT`` set by the
user are kept, and a process that has ``RANK`` and ``WORLD_SIZE`` (started by torchrun,
inside an srun task or not) is left alone. Only one of the two is a mistake that would
give every task the same rank: refused.

What is a task: a process of a job *step* (``SLURM_STEP_ID`` is a step number). The
batch script of ``sbatch`` (and the interactive step of ``salloc``) exports
``SLURM_JOB_ID``, ``SLURM_NTASKS`` and often ``SLURM_PROCID=0`` too, but it is one
process: ``forge-run`` there trains alone (with a warning when the allocation has more
tasks), as it does outside Slurm. A step started with ``srun`` that runs ``forge-run
--nproc N`` (one task per node, torchrun's agent inside) is not adopted either:
``forge-run`` is then the node's launcher.

Pure functions of an environment mapping; nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator, Mapping, MutableMapping

import attrs

from forge_core.api import ForgeError
from forge_core.api.unstable import environment

#: Step ids from this one up are Slurm's special steps (batch script, extern, interactive,
#: pending), not ``srun`` steps (slurm.h's ``SLURM_MAX_NORMAL_STEP_ID``).
MAX_NORMAL_STEP_ID = 0xFFFFFFF0
#: ``MASTER_PORT`` derived from the job id: ``PORT_BASE + job_id % PORT_SPAN``.
PORT_BASE, PORT_SPAN = 10000, 20000
#: The most hosts one range may name (Slurm's host lists stay far below).
MAX_RANGE = 1 << 16

# One host of a hostlist: a name with any number of [ranges] (``node[01-04,07]``,
# ``rack[1-2]-gpu[1-8]``).
_BRACKET = re.compile(r"\[([^\[\]]*)\]")


class SlurmEnvError(ForgeError):
    """What Slurm exported cannot make a rank of a process group."""


def expand_nodelist(text: str) -> list[str]:
    """The hosts of a Slurm hostlist, in order: ``node[01-03,07],gpu5`` is
    ``node01 node02 node03 node07 gpu5``. Zero padding follows the range's lower bound,
    as Slurm writes it; several bracket groups in one name give their product.
    Raises ValueError naming what cannot be read."""
    if not text.strip():
        raise ValueError("the node list is empty")
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        if not item:
            raise ValueError(f"an empty host name in {text!r}")
        hosts.extend(_expand_one(item, text))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"a ']' without its '[' in {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"a '[' without its ']' in {text!r}")
    items.append(text[start:])
    return items


def _expand_one(item: str, whole: str) -> list[str]:
    match = _BRACKET.search(item)  # brackets are balanced and flat (_split_top_level)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    tails = _expand_one(tail, whole) if tail else [""]
    return [head + number + rest for number in _expand_ranges(match.group(1), whole) for rest in tails]


def _expand_ranges(body: str, whole: str) -> list[str]:
    numbers = []
    for part in body.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{part!r} in [{body}] of {whole!r} is not a number or a range a-b")
        if not dash:
            numbers.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"the range {part!r} of {whole!r} runs backwards")
        if int(high) - int(low) >= MAX_RANGE:
            raise ValueError(f"the range {part!r} of {whole!r} has more hosts than a cluster")
        width = len(low)  # node[08-10]: node08 node09 node10
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return numbers


def first_host(nodelist: str) -> str:
    """The first host of ``nodelist``: this module's parser, and ``scontrol show
    hostnames`` (Slurm's own) only for a list the parser cannot read."""
    try:
        return expand_nodelist(nodelist)[0]
    except ValueError as exc:
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            raise exc from None
        hosts = out.stdout.split()
        if out.returncode != 0 or not hosts:
            raise exc from None
        return hosts[0]


def is_task(env: Mapping[str, str]) -> bool:
    """Whether this process is a task of an ``srun`` step (not a batch script)."""
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", ""))
    return "SLURM_PROCID" in env and step.isdigit() and int(step) < MAX_NORMAL_STEP_ID


@attrs.frozen
class SlurmTask:
    """What an ``srun`` task is, read from its environment."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    job_id: str

    def torchrun_env(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def _number(env: Mapping[str, str], *names: str) -> int:
    for name in names:
        if name in env:
            value = env[name].strip()
            if not value.isdigit():
                raise SlurmEnvError(
                    f"{name}={env[name]!r}: not a whole number, so this task cannot know its place in "
                    "the process group. Slurm sets it for every task of `srun`; if a script changed "
                    "it, leave it as Slurm set it (or unset the SLURM_* variables to train alone)"
                )
            return int(value)
    raise SlurmEnvError(
        f"{' / '.join(names)} is not set, but SLURM_STEP_ID and SLURM_PROCID are: this srun task's "
        "environment is incomplete. Start forge-run with srun itself (not through a script that "
        "drops variables), or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT yourself"
    )


def _port(env: Mapping[str, str], job_id: str) -> int:
    if env.get("MASTER_PORT", "").strip():
        value = env["MASTER_PORT"].strip()
        if not value.isdigit() or not 0 < int(value) < 65536:
            raise SlurmEnvError(f"MASTER_PORT={value!r}: not a TCP port (1-65535); set it to a free port")
        return int(value)
    reserved = env.get("SLURM_STEP_RESV_PORTS", "").strip()
    first = re.match(r"\d+", reserved)
    if first:
        return int(first.group())
    if not job_id.isdigit():
        raise SlurmEnvError(
            f"SLURM_JOB_ID={job_id!r}: no number to derive the rendezvous port from; set MASTER_PORT "
            "to a port free on the first node"
        )
    return PORT_BASE + int(job_id) % PORT_SPAN


def read_task(env: Mapping[str, str]) -> SlurmTask:
    """The task ``env`` describes (:func:`is_task` must hold); SlurmEnvError names the
    variable that cannot be used, its value and what to do."""
    rank = _number(env, "SLURM_PROCID")
    world = _number(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    local = _number(env, "SLURM_LOCALID")
    if not rank < world:
        raise SlurmEnvError(
            f"SLURM_PROCID={rank} but the step has {world} task(s) (SLURM_STEP_NUM_TASKS / "
            "SLURM_NTASKS): the ranks would not fit the process group. Leave these variables as "
            "srun sets them"
        )
    if "MASTER_ADDR" in env and env["MASTER_ADDR"].strip():
        addr = env["MASTER_ADDR"].strip()
    else:
        name = "SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
        nodelist = env.get(name, "")
        if not nodelist.strip():
            raise SlurmEnvError(
                "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set: no host for the "
                "rendezvous. Set MASTER_ADDR to the host of task 0"
            )
        try:
            addr = first_host(nodelist)
        except ValueError as exc:
            raise SlurmEnvError(
                f"{name}={nodelist!r}: cannot read it as a Slurm host list ({exc}); set MASTER_ADDR "
                "to the host of task 0"
            ) from None
    job_id = env.get("SLURM_JOB_ID", env.get("SLURM_JOBID", "")).strip()
    return SlurmTask(rank, world, local, addr, _port(env, job_id), job_id)


@contextlib.contextmanager
def adopted(env: MutableMapping[str, str]) -> Iterator[SlurmTask | None]:
    """Within: torchrun's variables set in ``env`` from Slurm's when this process is an
    ``srun`` task that torchrun did not start; yields the task, or ``None`` when there is
    nothing to adopt. Restored after (``forge-run`` called in process leaves no ``RANK``)."""
    task = task_of(env)
    if task is None:
        yield None
        return
    with environment(task.torchrun_env(), env):
        yield task


def task_of(env: Mapping[str, str]) -> SlurmTask | None:
    """The ``srun`` task this environment describes, unless torchrun's variables are
    already there (or this is no task): ``None``."""
    has = [k for k in ("RANK", "WORLD_SIZE") if k in env]
    if len(has) == 2 or not is_task(env):
        return None
    if has:
        missing = "WORLD_SIZE" if has == ["RANK"] else "RANK"
        raise SlurmEnvError(
            f"{has[0]}={env[has[0]]!r} is set but {missing} is not, in an srun task: the ranks would "
            f"come from two places and tasks could share one. Unset {has[0]} to take the ranks from "
            "Slurm (SLURM_PROCID, SLURM_NTASKS), or set both"
        )
    return read_task(env)


def allocation_tasks(env: Mapping[str, str]) -> int | None:
    """The task count of the allocation this process runs in as its batch script (not
    as an srun task), or ``None``: nothing to warn about."""
    if "SLURM_JOB_ID" not in env or is_task(env):
        return None
    value = env.get("SLURM_NTASKS", "")
    return int(value) if value.isdigit() and int(value) > 1 else None
