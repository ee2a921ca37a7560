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
import math
import re
import subprocess
from collections.abc import Iterator, Mapping, MutableMapping

import attrs

from forge_core.api import ForgeError
from forge_core.api.unstable import environment, show_value
from forge_core.parallel_dims import count_problem

#: Step ids from this one up are Slurm's special steps (batch script, extern, interactive,
#: pending), not ``srun`` steps (slurm.h's ``SLURM_MAX_NORMAL_STEP_ID``).
MAX_NORMAL_STEP_ID = 0xFFFFFFF0
#: ``MASTER_PORT`` derived from the job id: ``PORT_BASE + job_id % PORT_SPAN``.
PORT_BASE, PORT_SPAN = 10000, 20000
#: The most hosts one range may name (Slurm's host lists stay far below); also the most
#: :func:`expand_nodelist` lists. Finding the first host never expands anything.
MAX_RANGE = 1 << 16
#: ASCII digits only: ``str.isdigit`` also takes Arabic-Indic or superscript digits.
_DIGITS = re.compile(r"[0-9]+")

# One host of a hostlist: a name with any number of [ranges] (``node[01-04,07]``,
# ``rack[1-2]-gpu[1-8]``).
_BRACKET = re.compile(r"\[([^\[\]]*)\]")


class SlurmEnvError(ForgeError):
    """What Slurm exported cannot make a rank of a process group."""


#: One name of a host list, parsed: literal text and, for each ``[...]``, its ranges as
#: ``(low, high)`` strings as written (``high`` is ``low`` for a single number).
Pattern = list[str | list[tuple[str, str]]]


def parse_nodelist(text: str) -> list[Pattern]:
    """The names of a Slurm hostlist, each parsed into text and bracket ranges, every
    part checked, nothing expanded: ``a[0-65535]b[0-65535]`` is two ranges, not four
    billion hosts. Raises ValueError naming what cannot be read."""
    if not text.strip():
        raise ValueError("the node list is empty")
    patterns = []
    for item in _split_top_level(text.strip()):
        if not item:
            raise ValueError(f"an empty host name in {text!r}")
        pattern: Pattern = []
        at = 0
        for match in _BRACKET.finditer(item):  # brackets are balanced and flat (_split_top_level)
            pattern += [item[at : match.start()], _ranges(match.group(1), text)]
            at = match.end()
        patterns.append([*pattern, item[at:]])
    return patterns


def _ranges(body: str, whole: str) -> list[tuple[str, str]]:
    ranges = []
    for part in body.split(","):
        low, dash, high = part.strip().partition("-")
        if not _DIGITS.fullmatch(low) or (dash and not _DIGITS.fullmatch(high)):
            raise ValueError(f"{part!r} in [{body}] of {whole!r} is not a number or a range a-b")
        high = high if dash else low
        if int(high) < int(low):
            raise ValueError(f"the range {part!r} of {whole!r} runs backwards")
        if int(high) - int(low) >= MAX_RANGE:
            raise ValueError(f"the range {part!r} of {whole!r} has more hosts than a cluster")
        ranges.append((low, high))
    return ranges


def _count(pattern: Pattern) -> int:
    return math.prod(
        sum(int(high) - int(low) + 1 for low, high in part) for part in pattern if isinstance(part, list)
    )


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


def expand_nodelist(text: str) -> list[str]:
    """The hosts of a Slurm hostlist, in order: ``node[01-03,07],gpu5`` is
    ``node01 node02 node03 node07 gpu5``. Zero padding follows the range's lower bound,
    as Slurm writes it; several bracket groups in one name give their product. A list
    of more than :data:`MAX_RANGE` hosts is refused (counted, not expanded).
    Raises ValueError naming what cannot be read."""
    patterns = parse_nodelist(text)
    total = sum(_count(pattern) for pattern in patterns)
    if total > MAX_RANGE:
        raise ValueError(f"{text!r} names {total} hosts, more than a cluster")
    hosts = []
    for pattern in patterns:
        names = [""]
        for part in pattern:
            if isinstance(part, str):
                names = [name + part for name in names]
                continue
            numbers = [
                str(n).zfill(len(low)) for low, high in part for n in range(int(low), int(high) + 1)
            ]  # node[08-10]: node08 node09 node10
            names = [name + number for name in names for number in numbers]
        hosts += names
    return hosts


def first_host(nodelist: str) -> str:
    """The first host of ``nodelist``: this module's parser, and ``scontrol show
    hostnames`` (Slurm's own) only for a list the parser cannot read."""
    try:
        # Each bracket's first number, as written: nothing is expanded.
        return "".join(part if isinstance(part, str) else part[0][0] for part in parse_nodelist(nodelist)[0])
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
    number = _ascii_int(step)
    return "SLURM_PROCID" in env and number is not None and number < MAX_NORMAL_STEP_ID


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


def _ascii_int(value: str) -> int | None:
    value = value.strip()
    return int(value) if _DIGITS.fullmatch(value) and len(value) < 20 else None


def _number(env: Mapping[str, str], *names: str, minimum: int = 0) -> int:
    for name in names:
        if name in env:
            problem = count_problem(env[name], minimum)
            if problem:
                raise SlurmEnvError(
                    f"{name}={show_value(env[name])}: {problem}, so this task cannot know its place in "
                    "the process group. Slurm sets it for every task of `srun`; if a script changed "
                    "it, leave it as Slurm set it (or unset the SLURM_* variables to train alone)"
                )
            return int(env[name].strip())
    raise SlurmEnvError(
        f"{' / '.join(names)} is not set, but SLURM_STEP_ID and SLURM_PROCID are: this srun task's "
        "environment is incomplete. Start forge-run with srun itself (not through a script that "
        "drops variables), or set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT yourself"
    )


def _port(env: Mapping[str, str], job_id: str) -> int:
    if env.get("MASTER_PORT", "").strip():
        value = env["MASTER_PORT"].strip()
        port = _ascii_int(value)
        if port is None or not 0 < port < 65536:
            raise SlurmEnvError(
                f"MASTER_PORT={show_value(value)}: not a TCP port (1-65535 in ASCII digits); set it to a "
                "free port"
            )
        return port
    reserved = env.get("SLURM_STEP_RESV_PORTS", "").strip()
    first = re.match(r"[0-9]{1,5}(?![0-9])", reserved)
    if first and 0 < int(first.group()) < 65536:
        return int(first.group())
    if _ascii_int(job_id) is None:
        raise SlurmEnvError(
            f"SLURM_JOB_ID={job_id!r}: no number to derive the rendezvous port from; set MASTER_PORT "
            "to a port free on the first node"
        )
    return PORT_BASE + int(job_id) % PORT_SPAN


def read_task(env: Mapping[str, str]) -> SlurmTask:
    """The task ``env`` describes (:func:`is_task` must hold); SlurmEnvError names the
    variable that cannot be used, its value and what to do."""
    rank = _number(env, "SLURM_PROCID")
    world = _number(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", minimum=1)
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
    value = _ascii_int(env.get("SLURM_NTASKS", ""))
    return value if value is not None and value > 1 else None
