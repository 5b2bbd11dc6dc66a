"""Bounded YAML loading: libyaml where installed, no duplicate keys, alias/depth limits."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_YAML_DEPTH = 64
"""Deepest nesting of lists/mappings accepted (a scenario needs fewer than 10 levels)."""
MAX_YAML_NODES = 500_000
"""Most nodes a document may expand to, aliases counted each time they are used."""
MAX_NUMBER_CHARS = 100
"""Longest integer literal accepted (Python refuses to convert over 4300 digits)."""

_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LIBYAML = _Base is not yaml.SafeLoader


class BoundedLoader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader (C parser where installed) that refuses duplicate keys and long numbers."""

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = (key_node.tag, key_node.value)
                    if key in seen:
                        raise ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"duplicate key {_clip(key_node.value)!r}", key_node.start_mark)
                    seen[key] = True
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]

    def construct_yaml_int(self, node: Node) -> int:
        value = str(node.value)
        if len(value) > MAX_NUMBER_CHARS:
            raise ConstructorError(None, None, f"number too long ({len(value)} characters; "
                                   f"at most {MAX_NUMBER_CHARS})", node.start_mark)
        return super().construct_yaml_int(node)  # type: ignore[no-any-return]


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
BoundedLoader.add_constructor("tag:yaml.org,2002:map", BoundedLoader.construct_yaml_map)


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_node_graph(root: Node) -> None:
    """Refuse a composed document nested too deep or expanding (through aliases) to too
    many nodes; iterative, so that neither check itself recurses."""
    expanded: dict[int, int] = {}  # id(node) -> nodes it expands to
    on_path: set[int] = set()
    stack: list[tuple[Node, int]] = [(root, 0)]
    while stack:
        node, state = stack.pop()
        nid = id(node)
        if state == 0:
            if nid in expanded:
                continue
            if nid in on_path:
                raise ConstructorError(None, None, "recursive alias", node.start_mark)
            if len(on_path) >= MAX_YAML_DEPTH:
                raise ConstructorError(None, None, f"nested deeper than {MAX_YAML_DEPTH} "
                                       "levels", node.start_mark)
            on_path.add(nid)
            stack.append((node, 1))
            for child in _children(node):
                if id(child) not in expanded:
                    stack.append((child, 0))
        else:
            total = 1 + sum(expanded[id(c)] for c in _children(node))
            if total > MAX_YAML_NODES:
                raise ConstructorError(None, None, f"document expands to more than "
                                       f"{MAX_YAML_NODES} values (aliases counted each time "
                                       "they are used)", node.start_mark)
            expanded[nid] = total
            on_path.discard(nid)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_bounded_yaml(text: str) -> Any:
    """Parse one YAML document within the limits above (raises yaml.YAMLError)."""
    loader = BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_node_graph(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
