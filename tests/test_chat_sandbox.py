"""Chat templates cannot exhaust the machine: every attack that grows a value, loops or
prints without end is refused with a message that names the template and the bound;
a render stays interruptible by a signal; a template file is read only if it is a small
regular file. The attacks run in a child process under a memory limit and a timeout, so a
regression fails the test instead of eating the machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from forge_core.api import ForgeError
from forge_plugins.tokenizers.chat import TEMPLATE_BYTES, ChatTemplate, read_template
from forge_plugins.tokenizers.sandbox import Limits, weight

LOOP = "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}"
DOUBLE = (
    "{% set ns = namespace(v=VALUE) %}{% for i in range(80) %}{% set ns.v = STEP %}{% endfor %}{{ ns.v }}"
)
# Small in memory (each list holds the last one twice), huge once printed or compared.
TREE = DOUBLE.replace("VALUE", "[1]").replace("STEP", "[ns.v, ns.v]")

# template -> what the refusal says (steps are bounded low in the child: 200,000).
ATTACKS = {
    "{{ 'x' * 10000000000 }}": "'*' would hold more than 16,777,216 characters or items",
    "{{ 9 ** (9 ** 9) }}": "'**' would make an integer of more than 4,096 bits",
    "{{ [1] * 10000000000 }}": "'*' would hold more than",
    DOUBLE.replace("VALUE", "'x'").replace("STEP", "ns.v ~ ns.v"): "'~' would hold more than",
    DOUBLE.replace("VALUE", "'x'").replace("STEP", "ns.v + ns.v"): "'+' would hold more than",
    TREE: "a printed value would hold",
    TREE.replace("}}", "|tojson }}"): "the tojson filter would hold",
    TREE.replace("{{ ns.v }}", "{{ ns.v == [ns.v] }}"): "a compared value would hold",
    TREE.replace("}}", "is sameas 1 }}"): "the sameas test would hold",
    "{{ 'x'.center(10000000000) }}": "str.center would hold",
    "{{ 'x'|indent(10000000000, true) }}": "the indent filter would hold",
    "{{ '%*s' % (10000000000, 'x') }}": "'%' would hold",
    "{{ '{:>{}}'.format('x', 10000000000) }}": "str.format would hold",
    "{{ ('x' * 1000000)|replace('x', 'y' * 1000000) }}": "the replace filter would hold",
    "{{ ('{0}' * 1000).format('x' * 100000) }}": "str.format would hold",
    "{{ ('%(a)s' * 1000) % {'a': 'x' * 100000} }}": "'%' would hold",
    "{{ ('y' * 1000000).join(range(1000)|map('string')) }}": "str.join would hold",
    "{{ [1]|slice(10000000000)|list }}": "the slice filter would hold",
    "{{ ([[1] * 2000] * 2000)|sum(start=[]) }}": "the sum filter would hold",
    "{{ [1]|batch(10000000000, 'x')|list }}": "the batch filter would hold",
    "{% set x %}{% for i in range(1000) %}{{ 'y' * 100000 }}{% endfor %}{% endset %}{{ x|length }}": (
        "a captured block would hold"
    ),
    "{% for i in range(1000) %}{{ 'y' * 100000 }}{% endfor %}": "the rendering would hold",
    LOOP: "the render took more than 200,000 steps",
    "{{ lipsum(1000000000) }}": "'lipsum' is undefined",
    "{{ 2.0 ** 100000 }}": "OverflowError",
    "{{ cycler.__init__.__globals__ }}": "unsafe",
}

CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from forge_core.api import ForgeError
from forge_plugins.tokenizers.chat import ChatTemplate
from forge_plugins.tokenizers.sandbox import Limits
said = {}
cases = json.loads(sys.argv[1])
for source in cases:
    limits = Limits(steps=200_000)
    if source == "TIME":
        source, limits = cases["TIME"], Limits(steps=10**12, seconds=0.2)
    try:
        ChatTemplate(source, "attack.jinja", limits=limits).render([{"role": "user", "content": "hi"}], False)
        said[source] = "rendered"
    except ForgeError as exc:
        said[source] = str(exc)
print(json.dumps(said))
"""


def test_each_attack_is_refused_with_its_bound_under_a_memory_limit():
    cases = {**dict.fromkeys(ATTACKS, ""), "TIME": LOOP.replace("100000", "99999")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cases)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    for source, message in ATTACKS.items():
        assert said[source].startswith("attack.jinja: ") and message in said[source], (source, said[source])
    assert "the render took more than 0.2 seconds" in said[LOOP.replace("100000", "99999")]


def test_weight_counts_shared_lists_in_full_without_walking_them_again():
    inner = ["ab", 1]
    assert weight(inner, 100) == 2 + 2 + 1
    assert weight([inner, inner, {"k": inner}], 100) == 3 + 5 + 5 + (1 + 1 + 5)
    v = [1]
    for _ in range(200):  # 2**200 leaves once printed, 200 lists in memory
        v = [v, v]
    assert weight(v, 10**6) == 10**6 + 1


def test_templates_of_the_published_shapes_render_within_the_bounds():
    tools = (
        "{%- set ns = namespace(n=0) %}{%- for m in messages %}{%- set ns.n = ns.n + 1 %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content | trim + '<|im_end|>\\n' }}{%- endfor %}"
        "{{- '%d turns' % ns.n }}{{ ' {:>4}'.format(messages|length) }}{{ messages[-1] | tojson }}"
    )
    talk = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    text, _ = ChatTemplate(tools, "t").render(talk, False)
    assert text == (
        '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n2 turns    2{"role": '
        '"assistant", "content": "yo"}'
    )


def test_a_render_stays_interruptible_by_sigterm():
    class Stop(BaseException):
        pass

    def stop(signum, frame):
        raise Stop

    previous = signal.signal(signal.SIGTERM, stop)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        template = ChatTemplate(LOOP, "long.jinja", limits=Limits(steps=10**12, seconds=60))
        timer.start()
        with pytest.raises(Stop):
            template.render([], False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)


def test_a_template_file_must_be_a_small_regular_file(tmp_path):
    fifo = tmp_path / "template.fifo"
    os.mkfifo(fifo)
    said = []

    def read():
        try:
            read_template(str(fifo))
        except ForgeError as exc:
            said.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # the read blocks: let it go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO as a template blocked")
    assert said and "data.chat.template: the chat template" in said[0] and "not a regular file" in said[0]
    big = tmp_path / "big.jinja"
    big.write_bytes(b"x" * (TEMPLATE_BYTES + 1))
    with pytest.raises(ForgeError, match=r"more than the 1048576 bytes"):
        read_template(str(big))
    big.write_bytes(b"x" * TEMPLATE_BYTES)
    assert read_template(str(big)) == "x" * TEMPLATE_BYTES
