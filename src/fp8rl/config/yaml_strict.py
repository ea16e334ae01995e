"""YAML as written: PyYAML's safe loader, refusing what YAML 1.1 reads other than it looks.

A duplicated key (PyYAML keeps the last one silently), a base-60 number (`1:30` is 90) and a
leading-zero octal (`010` is 8) are errors naming the line. Merge keys (`<<: *base`) and
anchors work as usual: a key that overrides a merged one is no duplicate.
"""

from __future__ import annotations

import re

import yaml

_MERGE = "tag:yaml.org,2002:merge"
_OCTAL = re.compile(r"[-+]?0[0-7_]+")


class YamlMeaningError(yaml.YAMLError):
    """A construct YAML 1.1 reads silently differently from how it looks."""


class StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            _check_duplicates(self, node)
        return super().construct_mapping(node, deep=deep)


def _line(node) -> int:
    return node.start_mark.line + 1


def _check_duplicates(loader: StrictLoader, node: yaml.MappingNode) -> None:
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise YamlMeaningError(
                f"duplicate key {key!r} on line {_line(key_node)} (first on line {seen[key]}); "
                "YAML would keep the last one silently"
            )
        seen[key] = _line(key_node)


def _number(kind: str):
    base = getattr(yaml.SafeLoader, f"construct_yaml_{kind}")

    def construct(loader, node):
        text = loader.construct_scalar(node)
        if ":" in text:
            raise YamlMeaningError(
                f"{text!r} on line {_line(node)} is a base-60 number in YAML 1.1 "
                f"({base(loader, node)}); quote it or write the number"
            )
        if kind == "int" and _OCTAL.fullmatch(text):
            raise YamlMeaningError(
                f"{text!r} on line {_line(node)} is an octal number in YAML 1.1 "
                f"({base(loader, node)}); drop the leading zero or quote it"
            )
        return base(loader, node)

    return construct


StrictLoader.add_constructor("tag:yaml.org,2002:int", _number("int"))
StrictLoader.add_constructor("tag:yaml.org,2002:float", _number("float"))


def load_yaml(text: str):
    """The document in `text` (safe types only); YamlMeaningError is a yaml.YAMLError."""
    return yaml.load(text, Loader=StrictLoader)
