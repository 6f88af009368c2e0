"""A Griffe extension for the API reference (mkdocs.yml, the python handler's ``extensions``).

A ``Queue`` holds its faces and offers their methods as its own (``aioqueue/_model/held.py``):
``purge = held("_admin", QueueAdmin.purge)``. Read from the source, such a line is an
attribute with no docstring; this extension puts the held method in its place (its signature,
its docstring, ``async``), named after the class that offers it, so the reference documents
``Queue.purge`` exactly as it documents a method written in the class.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import griffe


class HeldMethods(griffe.Extension):
    """Replace each ``name = held("_attr", Face.method)`` class attribute with the method."""

    def on_package(self, *, pkg: griffe.Module, **_: Any) -> None:
        for cls in _classes(pkg):
            for name, member in list(cls.members.items()):
                target = _held_target(cls, member)
                if target is not None and isinstance(member, griffe.Attribute):
                    cls.set_member(name, _method_of(cls, name, member, target))


def _classes(obj: griffe.Object) -> Iterator[griffe.Class]:
    """Every class defined (not imported) in ``obj``, at any depth."""
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Class):
            yield member
        if isinstance(member, griffe.Module | griffe.Class):
            yield from _classes(member)


def _held_target(cls: griffe.Class, member: Any) -> griffe.Function | None:
    """The method a ``held(...)`` attribute offers, or None for any other member."""
    if member.is_alias or not isinstance(member, griffe.Attribute):
        return None
    call = member.value
    if not isinstance(call, griffe.ExprCall) or str(call.function) != "held":
        return None
    face_name, _, method = str(call.arguments[1]).partition(".")
    face = cls.module.members[face_name]
    target = (face.final_target if isinstance(face, griffe.Alias) else face).members[method]
    target = target.final_target if isinstance(target, griffe.Alias) else target
    if not isinstance(target, griffe.Function):
        raise TypeError(f"{cls.path}.{member.name}: held({call.arguments[1]}) is no method")
    return target


def _method_of(
    cls: griffe.Class, name: str, member: griffe.Attribute, target: griffe.Function
) -> griffe.Function:
    """A copy of ``target`` as a method of ``cls`` named ``name`` (its parameters, return
    annotation and docstring; its annotations still resolve in the face's module)."""
    func = griffe.Function(
        name,
        parameters=target.parameters,
        returns=target.returns,
        decorators=target.decorators,
        lineno=member.lineno,
        endlineno=member.endlineno,
        parent=cls,
    )
    func.labels |= target.labels
    if target.docstring is not None:
        func.docstring = griffe.Docstring(
            target.docstring.value,
            lineno=target.docstring.lineno,
            endlineno=target.docstring.endlineno,
            parent=func,
            parser=target.docstring.parser,
            parser_options=target.docstring.parser_options,
        )
    return func
