"""The bounded sandbox chat templates render in: jinja2's immutable sandbox (no file
access, no attribute that starts with an underscore, no mutation of lists and dicts), with
limits so that a template taken from a model folder or a file cannot exhaust the machine.

jinja2's sandbox stops escapes, not exhaustion: ``{{ 'x' * 10000000000 }}`` allocates
10 GB in one C call (no signal handler runs until it returns) and ``{{ 9 ** (9 ** 9) }}``
computes a number of a billion bits. Here every value a template makes is bounded
*before* it is made:

- the operators that grow a value (``+``, ``*``, ``**``, ``%`` and ``~``) predict the
  size of their result and refuse one larger than :attr:`Limits.size` characters or list
  items (nested lists counted in full) or :attr:`Limits.int_bits` bits;
- so do the ``str`` methods and filters that take a width or a count or multiply their
  input (``center``, ``ljust``, ``rjust``, ``zfill``, ``expandtabs``, ``replace``,
  ``join``, ``format``, ``indent``, ``batch``, ``slice``, ``sum``, ``wordwrap``,
  ``translate``), and every filter refuses an input larger than the bound (a list that
  holds the last one twice, sixty times over, is small in memory and huge once printed);
- what is printed (``{{ }}``), captured (``{% set %}`` blocks, macros) or rendered in all
  is at most :attr:`Limits.size` characters, and so is what is compared (``==``, ``in``),
  tested (``is``) or used as a key;
- each call, operator, attribute read and loop iteration is a step: a render takes at
  most :attr:`Limits.steps` of them and :attr:`Limits.seconds` seconds, checked as it
  goes (no tracing), so it stops with an error instead of hanging, and, being Python
  between steps, a SIGTERM handler still runs.

A refusal raises :class:`RenderLimit` (a jinja2 ``SecurityError``): the renderer turns it
into a ForgeError that names the template and the record. ``lipsum``, jinja2's text
generator, is not offered (its size is an argument and no chat template needs it).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, operators
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment


@attrs.frozen
class Limits:
    """What one render may take: characters or list items of any value and of the output
    (``size``), bits of an integer, steps and seconds."""

    size: int = 1 << 24
    int_bits: int = 4096
    steps: int = 10_000_000
    seconds: float = 10.0


class RenderLimit(SecurityError):
    """A render stopped at a bound of :class:`Limits`."""


def weight(value: Any, cap: int) -> int:
    """The size of ``value`` as printed, roughly: characters of a string, digits of an
    integer, items of a container plus the weight of each (a list holding one list twice
    counts it twice); at most ``cap + 1``. A container is walked once however often it is
    held, so a list that holds itself twice, sixty times over, costs sixty steps."""
    seen: dict[int, int] = {}  # id of a container walked -> its weight

    def walk(v: Any) -> int:
        if isinstance(v, str):
            return len(v)
        if isinstance(v, bool) or not isinstance(v, (int, list, tuple, dict)):
            return 1
        if isinstance(v, int):
            return v.bit_length() // 3 + 1
        if id(v) in seen:
            return seen[id(v)]
        total = len(v)
        for item in v.items() if isinstance(v, dict) else v:
            if total > cap:
                break
            # A dict's (key, value) tuples are made anew: weigh their parts, never their ids.
            total += walk(item[0]) + walk(item[1]) if isinstance(v, dict) else walk(item)
        seen[id(v)] = min(total, cap + 1)
        return seen[id(v)]

    return min(walk(value), cap + 1)


# The conversion specifications of a %-format, and the specs of a {}-format's fields:
# their digits are widths and precisions; a '*' or a nested '{' takes one from the arguments.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d*)(?:\.(?:\*|\d*))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:[^}]*\}")
_DIGITS = re.compile(r"\d+")


class _Generator(CodeGenerator):
    """jinja2's code generator, with ``~``, every ``{% for %}`` and the operands of every
    comparison going through the environment's guards (none calls a hook of the sandbox
    otherwise)."""

    def visit_For(self, node: nodes.For, frame: Any) -> None:
        node.iter = nodes.Call(nodes.EnvironmentAttribute("loop_guard"), [node.iter], [], None, None)
        super().visit_For(node, frame)

    def visit_Compare(self, node: nodes.Compare, frame: Any) -> None:
        self.write("(environment.weighed(")
        self.visit(node.expr, frame)
        self.write(")")
        for op in node.ops:
            self.write(f" {operators[op.op]} environment.weighed(")
            self.visit(op.expr, frame)
            self.write(")")
        self.write(")")

    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:
        self.write("environment.join_guard((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox under :class:`Limits`; :meth:`start` begins a render's count."""

    code_generator_class = _Generator
    intercepted_binops = frozenset(["+", "*", "**", "%"])

    def __init__(
        self, limits: Limits, filters: dict[str, Any], globals: dict[str, Any], **options: Any
    ) -> None:
        super().__init__(**options)
        self.limits = limits
        self.steps = 0
        self.deadline = float("inf")
        self.finalize = self._finalize
        self.globals.pop("lipsum", None)
        self.globals.update(globals)
        every = {**self.filters, **filters}
        self.filters = {name: self._guard_filter(name, f, "filter") for name, f in every.items()}
        self.tests = {name: self._guard_filter(name, f, "test") for name, f in self.tests.items()}

    def start(self) -> None:
        """A render begins: its steps and seconds count from here."""
        self.steps = 0
        self.deadline = time.monotonic() + self.limits.seconds

    # -- the bounds --------------------------------------------------------------------

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self.limits.steps:
            raise RenderLimit(f"the render took more than {self.limits.steps:,} steps")
        if not self.steps & 63 and time.monotonic() > self.deadline:
            raise RenderLimit(f"the render took more than {self.limits.seconds:g} seconds")

    def bound(self, size: int, what: str) -> None:
        if size > self.limits.size:
            raise RenderLimit(f"{what} would hold more than {self.limits.size:,} characters or items")

    def weigh(self, value: Any, what: str, times: int = 1) -> int:
        """``weight(value) * times``, refused above the size bound."""
        times = max(times, 1)
        w = len(value) if isinstance(value, str) else weight(value, self.limits.size // times)
        self.bound(w * times, what)
        return w * times

    def _bits(self, bits: int, op: str) -> None:
        if bits > self.limits.int_bits:
            raise RenderLimit(f"'{op}' would make an integer of more than {self.limits.int_bits:,} bits")

    def _format_args(self, fmt: str, args: list[Any], spec: re.Pattern[str], what: str) -> None:
        """The widths and precisions of ``fmt`` (digits in its specifications, or, where
        one takes them from the arguments, every integer argument) within the bound; and
        the result, each field at most all the arguments (a named one may be repeated)."""
        specs = spec.findall(fmt)
        self.bound(max((int(d) for s in specs for d in _DIGITS.findall(s)), default=0), what)
        if any("*" in s or "{" in s[1:] for s in specs):
            for a in args:
                for v in a.values() if isinstance(a, dict) else a if isinstance(a, (list, tuple)) else [a]:
                    if isinstance(v, int):
                        self.bound(abs(v), what)
        fields = fmt.count("{" if spec is _BRACE_SPEC else "%")
        self.bound(len(fmt) + self.weigh(args, what, fields), what)

    # -- the sandbox's hooks -----------------------------------------------------------

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.tick()
        what = f"'{operator}'"
        ints = isinstance(left, int) and isinstance(right, int)
        if operator == "+":
            if ints:
                self._bits(max(left.bit_length(), right.bit_length()) + 1, operator)
            elif isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                self.bound(self.weigh(left, what) + self.weigh(right, what), what)
        elif operator == "*":
            if ints:
                self._bits(left.bit_length() + right.bit_length(), operator)
            elif isinstance(right, int) and isinstance(left, (str, list, tuple)):
                self.weigh(left, what, right)
            elif isinstance(left, int) and isinstance(right, (str, list, tuple)):
                self.weigh(right, what, left)
        elif operator == "**":
            if ints and right > 0 and abs(left) > 1:
                self._bits((abs(left).bit_length() - 1) * right, operator)
        elif operator == "%" and isinstance(left, str):
            self._format_args(left, [right], _PERCENT_SPEC, what)
        return self.binop_table[operator](left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.tick()
        if isinstance(argument, tuple):  # hashed in one C call, like a compared value
            self.weigh(argument, "a key")
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self.tick()
        method = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
        owner = getattr(method, "__self__", None)
        if isinstance(owner, str):
            name = getattr(method, "__name__", "")
            if name == "join" and len(args) == 1 and not isinstance(args[0], (list, tuple)):
                args = (list(args[0]),)  # a generator: what it yields is weighed as a list
            __self._str_method(owner, name, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def _str_method(self, s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        what = f"str.{name}"
        first = args[0] if args else next(iter(kwargs.values()), None)
        if name in ("center", "ljust", "rjust", "zfill") and isinstance(first, int):
            self.bound(first, what)
        elif name == "expandtabs":
            size = first if isinstance(first, int) else 8
            self.bound(len(s) + s.count("\t") * size, what)
        elif name == "replace" and len(args) >= 2 and isinstance(args[1], str):
            old, new = args[0], args[1]
            count = (s.count(old) if old else len(s) + 1) if isinstance(old, str) else 0
            self.bound(len(s) + count * len(new), what)
        elif name == "join" and isinstance(first, (list, tuple)):
            self.bound(self.weigh(first, what) + len(s) * len(first), what)
        elif name in ("format", "format_map"):
            self._format_args(s, [*args, kwargs], _BRACE_SPEC, what)
        elif name == "translate":
            self.weigh(first, what, len(s))

    def loop_guard(self, iterable: Any) -> Iterator[Any]:
        """Each iteration of a ``{% for %}`` is a step."""
        for item in iterable:
            self.tick()
            yield item

    def join_guard(self, parts: tuple[Any, ...]) -> str:
        """``a ~ b``: the parts printed and joined, within the bound."""
        self.tick()
        self.bound(sum(weight(p, self.limits.size) for p in parts), "'~'")
        return "".join(map(str, parts))

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """What a ``{% set %}`` block, a macro or a ``caller()`` captured, within the bound."""
        parts = parts if isinstance(parts, list) else list(parts)
        self.bound(sum(map(len, parts)), "a captured block")
        return "".join(parts)

    def _finalize(self, value: Any) -> Any:
        """Each ``{{ }}``'s value, before it is printed."""
        if not (isinstance(value, str) and len(value) <= self.limits.size):
            self.weigh(value, "a printed value")
        return value

    def weighed(self, value: Any) -> Any:
        """An operand of a comparison, within the bound (``==`` and ``in`` walk what they
        compare in one C call: two lists that each hold the last one twice, sixty times
        over, would take forever)."""
        if isinstance(value, (list, tuple, dict)):
            self.weigh(value, "a compared value")
        return value

    def _guard_filter(self, name: str, f: Any, kind: str) -> Any:
        what = f"the {name} {kind}"

        @functools.wraps(f)  # keeps jinja2's pass_context/pass_environment marks
        def run(*args: Any, **kwargs: Any) -> Any:
            self.tick()
            values = args[1:] if getattr(f, "jinja_pass_arg", None) else args  # after a context
            if values:
                self.weigh(values[0], what)
                if kind == "filter":
                    self._filter_args(name, values[0], list(values[1:]), kwargs)
                else:
                    self.weigh(list(values[1:]), what)
            return f(*args, **kwargs)

        return run

    def _filter_args(self, name: str, value: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
        what = f"the {name} filter"
        if name in ("center", "indent", "batch"):
            size = args[0] if args else kwargs.get("width", kwargs.get("linecount", 0))
            lines = str(value).count("\n") + 1 if name == "indent" else 1
            size = len(size) if isinstance(size, str) else size if isinstance(size, int) else 0
            self.bound(size * lines + (len(str(value)) if name != "batch" else 0), what)
            if name == "batch":
                self.weigh(args[1] if len(args) > 1 else kwargs.get("fill_with"), what, size)
        elif name == "format" and isinstance(value, str):
            self._format_args(value, [*args, kwargs], _PERCENT_SPEC, what)
        elif name == "replace" and len(args) >= 2:
            old, new, s = str(args[0]), str(args[1]), str(value)
            self.bound(len(s) + (s.count(old) if old else len(s) + 1) * len(new), what)
        elif name == "join" and isinstance(value, (list, tuple)):
            sep = str(args[0]) if args else str(kwargs.get("d", ""))
            self.bound(self.weigh(value, what) + len(sep) * len(value), what)
        elif name == "slice":
            slices = args[0] if args else kwargs.get("slices", 0)
            self.bound(slices if isinstance(slices, int) else 0, what)
        elif name == "sum" and isinstance(value, (list, tuple)) and value:
            if isinstance(value[0], (list, tuple, str)):  # each addition copies what came before
                self.weigh(value, what, len(value))
        elif name == "wordwrap":
            wrap = args[2] if len(args) > 2 else kwargs.get("wrapstring")
            width = args[0] if args else kwargs.get("width", 79)
            s = str(value)
            lines = len(s) // max(width, 1) + s.count("\n") + 1 if isinstance(width, int) else 0
            self.bound(len(s) + lines * len(str(wrap or "")), what)
