"""``forge_core.api.option``: the documented field every config section and options class
is declared with."""

from __future__ import annotations

import attrs
import pytest

from forge_core.api import at_least, option
from forge_core.api.unstable import option_doc


@attrs.frozen
class Example:
    count: int = option(2, "How many.", at_least(1))
    names: list[str] = option(["a"], "Which ones.")
    table: dict[str, int] = option({}, "By name.")
    late: int = option(0, "Keyword-only.", kw_only=True)


def test_an_option_carries_its_default_doc_and_validator():
    fields = attrs.fields_dict(Example)
    assert Example().count == 2
    assert option_doc(fields["count"]) == "How many."
    assert fields["count"].metadata == {"doc": "How many."}  # the key the references read
    with pytest.raises(ValueError, match="must be at least 1, got 0"):
        Example(count=0)


def test_a_mutable_default_is_a_fresh_copy_for_every_instance():
    first, second = Example(), Example()
    first.names.append("b")
    first.table["x"] = 1
    assert second.names == ["a"] and second.table == {}
    assert Example().names == ["a"]


def test_other_keywords_go_to_attrs():
    assert attrs.fields_dict(Example)["late"].kw_only
    with pytest.raises(TypeError):
        Example(2, ["a"], {}, 5)  # late is keyword-only


@pytest.mark.parametrize("doc", ["", "   ", None])
def test_an_option_without_a_doc_is_refused_where_it_is_declared(doc):
    with pytest.raises(TypeError, match="every option needs a doc"):
        option(1, doc)


def test_a_plain_attrs_field_has_no_doc():
    @attrs.frozen
    class Plain:
        x: int = attrs.field(default=1)

    assert option_doc(attrs.fields(Plain).x) == ""
