"""Which component failed: plugin failures named by the component and the plugin that
registered it.

:func:`describe` names a component (``tokenizer 'hf' (plugin 'tokenizers')``),
:func:`original_error` quotes what it raised, :func:`culprit` finds, from an
exception's traceback, the component whose code raised it while the run used it, and
:func:`failure` is the error the command ends with.

A component's code is not always in its plugin's package: an optimizer factory may
return a stock ``torch.optim.Adafactor``, a tokenizer plugin a ``transformers`` object.
So the builder :func:`remember` s every object it builds, and a traceback frame whose
``self`` is one of them is that component's code, wherever its module lives.
"""

from __future__ import annotations

import inspect
import weakref
from typing import TYPE_CHECKING, Any

from forge_core.errors import TRACEBACK_ENV, ComponentError, where_raised

if TYPE_CHECKING:
    from forge_core.registry import Registries

#: Longest original message quoted in a ComponentError.
_MAX_MESSAGE = 1000


def describe(registries: Registries, kind: str, name: str) -> str:
    """``tokenizer 'hf' (plugin 'tokenizers')``."""
    registry = registries[kind]
    return f"{registry.kind.label} {name!r} (plugin {registry.plugin_of(name)!r})"


#: The objects the builder made, each with its :func:`describe` line; weak, so a run's
#: components go when the run lets them go.
_BUILT: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def remember(component: Any, description: str) -> None:
    """Note that ``component`` (a built model, optimizer, logger, ...) is the one
    ``description`` names. An object that cannot be weakly referenced or hashed (a
    builtin function, a list) is not remembered: its frames carry no ``self``."""
    try:
        _BUILT[component] = description
    except TypeError:
        pass


#: Base classes whose methods are machinery around a component, not its code: a hook
#: FSDP runs inside ``Module.__call__`` is no failure of the model.
_MACHINERY = {
    ("torch.nn.modules.module", "Module"),
    ("torch.optim.optimizer", "Optimizer"),
    ("builtins", "object"),
}


def _own_code(cls: type) -> set[Any]:
    """The code objects of the functions ``cls`` itself defines (decorators unwrapped)."""
    codes = set()
    for value in vars(cls).values():
        function = getattr(value, "__func__", value)  # staticmethod, classmethod
        try:
            function = inspect.unwrap(function)
        except ValueError:  # a __wrapped__ cycle
            pass
        code = getattr(function, "__code__", None)
        if code is not None:
            codes.add(code)
    return codes


def _built_component(frame: Any) -> str | None:
    """The description of the built component whose own method ``frame`` runs (a method
    of its class or of a base class other than :data:`_MACHINERY`), if any. Matched by
    code object: torch renames the ``__module__`` of its public classes."""
    owner = frame.f_locals.get("self")
    if owner is None:
        return None
    try:
        description = _BUILT.get(owner)
    except TypeError:  # unhashable or not weakly referenceable: no component of ours
        return None
    if description is None:
        return None
    for cls in type(owner).__mro__:
        if (cls.__module__, cls.__qualname__) not in _MACHINERY and frame.f_code in _own_code(cls):
            return description
    return None


def built_culprit(exc: BaseException) -> str | None:
    """The innermost built component whose method is on ``exc``'s traceback."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        found = _built_component(tb.tb_frame) or found
        tb = tb.tb_next
    return found


def original_error(exc: BaseException) -> str:
    text = str(exc)
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + " ..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_kernel(module: str) -> bool:
    return module == "forge_core" or module.startswith("forge_core.")


def culprit(exc: BaseException, registries: Registries) -> str | None:
    """Which plugin code raised ``exc``: ``"model 'llama' (plugin 'models')"``, or
    ``"plugin 'observer'"`` when the code belongs to a plugin but to none of its
    components, or ``None`` when no plugin code is on the traceback.

    The innermost frame in a plugin's package names the plugin. Within it, the innermost
    frame in a component's implementation (its function or class, else its module when
    no other component of the plugin shares it) names the component. The kernel's own
    modules never count. Failing that, a method of a built component on the traceback
    (:func:`built_culprit`: a stock torch optimizer's ``step``) names that component."""
    found = _package_culprit(exc, registries)
    if found is not None and not found.startswith("plugin "):
        return found
    return built_culprit(exc) or found


def _package_culprit(exc: BaseException, registries: Registries) -> str | None:
    """:func:`culprit` by the package of the code on the traceback alone."""
    packages: dict[str, str] = {}
    for name, plugin in registries.plugins.pm.list_name_plugin():
        module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__
        package = module.rpartition(".")[0] or module
        if not _is_kernel(package):
            packages.setdefault(package, name)
    impls = [
        (
            registry.plugin_of(component),
            *registry.get(component).impl.partition(":")[::2],
            describe(registries, registry.kind.name, component),
        )
        for registry in registries
        for component in registry.names()
    ]
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(
            (str(tb.tb_frame.f_globals.get("__name__", "")), getattr(code, "co_qualname", code.co_name))
        )
        tb = tb.tb_next
    owner = None
    for module, qualname in reversed(frames):
        if _is_kernel(module):
            continue
        plugin = next(
            (p for pkg, p in packages.items() if module == pkg or module.startswith(pkg + ".")), None
        )
        owner = owner or plugin
        if owner is None or plugin != owner:
            continue
        here = [(attr, what) for p, mod, attr, what in impls if p == owner and mod == module]
        exact = [what for attr, what in here if qualname == attr or qualname.startswith(attr + ".")]
        if exact or len(here) == 1:
            return (exact or [here[0][1]])[0]
    return None if owner is None else f"plugin {owner!r}"


#: What torch's DTensor says when an in-place op would have to change a placement.
_INPLACE_ON_SHARD = "in-place operations that require placement changes are not supported"


def failure(exc: BaseException, who: str) -> ComponentError:
    """The error naming ``who`` (a :func:`culprit`) for ``exc`` raised by its code."""
    hint = ""
    if _INPLACE_ON_SHARD in str(exc):
        hint = (
            " It updates a sharded tensor (a DTensor, under FSDP or tensor parallelism) in place "
            "with a value whose sharding differs; compute that value out of place. For an "
            "optimizer, forge_core.testing.check_optimizer shows this on one process."
        )
    return ComponentError(
        f"{who} failed: {original_error(exc)} (at {where_raised(exc)}; "
        f"{TRACEBACK_ENV}=1 shows the traceback).{hint}"
    )
