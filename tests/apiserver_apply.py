"""Field ownership as kube-apiserver keeps it (structured-merge-diff), over plain JSON objects:
what the emulator needs for server-side apply and `metadata.managedFields`.

A field path is a tuple of path elements written as `fieldsV1` writes them: `f:status` (a
field), `k:{"type":"Ready"}` (an item of a `listType=map` list, by its keys), `v:"x"` (an item
of a `listType=set` list). A manager's fields are a set of such paths. The schema is the CRD's
`openAPIV3Schema`: a list is atomic unless it says `x-kubernetes-list-type: map` or `set`, an
object is granular unless it says `x-kubernetes-map-type: atomic`.

What each operation does, as `merge.Updater` does it:

* an Update (PUT, merge or JSON patch) takes the fields it adds or changes from every other
  manager, adds them to its own, and every manager loses the fields it removed;
* an Apply merges its configuration into the object (`listType=map` items by key, keeping the
  others and their order, a new item last), owns exactly the fields of its configuration,
  removes the fields it applied last time and omits now unless another manager owns them, and
  conflicts with any other manager owning a field it changes, unless forced (then the field
  moves to it).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

Json = dict[str, Any]
Path = tuple[str, ...]

# Never owned by anyone (the apiserver's stripMetaManager): set by the server, not by managers.
STRIPPED: frozenset[Path] = frozenset(
    {("f:apiVersion",), ("f:kind",), ("f:metadata",)}
    | {
        ("f:metadata", f"f:{name}")
        for name in (
            "name",
            "namespace",
            "creationTimestamp",
            "selfLink",
            "uid",
            "generation",
            "managedFields",
            "resourceVersion",
        )
    }
)

# ObjectMeta's list and map types (its Go markers), for objects whose schema says nothing more.
OBJECT_META: Json = {
    "type": "object",
    "properties": {
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "x-kubernetes-list-type": "set"},
        "ownerReferences": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["uid"],
        },
    },
}


class SchemaError(ValueError):
    """An object the schema cannot place (a list item without its keys): `path` is where."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True)
class Schema:
    """One node of an `openAPIV3Schema` (an empty node: lists atomic, objects granular)."""

    node: Json = field(default_factory=dict)

    @classmethod
    def of_object(cls, root: Json) -> Schema:
        """A kind's schema, its `metadata` read as ObjectMeta."""
        node = copy.deepcopy(root)
        node.setdefault("properties", {})["metadata"] = OBJECT_META
        return cls(node)

    def _properties(self) -> Json:
        props = self.node.get("properties")
        return props if isinstance(props, dict) else {}

    def declares(self, name: str) -> bool:
        return name in self._properties()

    def field(self, name: str) -> Schema:
        props = self._properties()
        if name in props:
            return Schema(props[name])
        extra = self.node.get("additionalProperties")
        return Schema(extra if isinstance(extra, dict) else {})

    def items(self) -> Schema:
        items = self.node.get("items")
        return Schema(items if isinstance(items, dict) else {})

    @property
    def list_type(self) -> str:
        return str(self.node.get("x-kubernetes-list-type") or "atomic")

    @property
    def list_keys(self) -> tuple[str, ...]:
        return tuple(self.node.get("x-kubernetes-list-map-keys") or ())

    @property
    def atomic_map(self) -> bool:
        return self.node.get("x-kubernetes-map-type") == "atomic"


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def item_element(item: Any, schema: Schema, where: str) -> str:
    """The path element of an item of a `listType=map` or `set` list."""
    if schema.list_type == "set":
        return "v:" + _compact(item)
    keys = schema.list_keys
    missing = [k for k in keys if not isinstance(item, dict) or k not in item]
    if missing:
        why = f'associative list with keys has an element that omits key field "{missing[0]}"'
        raise SchemaError(where, why)
    return "k:" + _compact({k: item[k] for k in keys})


def _granular_list(value: Any, schema: Schema) -> bool:
    return isinstance(value, list) and schema.list_type in ("map", "set")


def _granular_map(value: Any, schema: Schema) -> bool:
    return isinstance(value, dict) and not schema.atomic_map


def _items(value: list[Any], schema: Schema, where: str) -> dict[str, Any]:
    """A granular list's items by path element (a repeated key: the first one, as SMD does)."""
    out: dict[str, Any] = {}
    for index, item in enumerate(value):
        out.setdefault(item_element(item, schema, f"{where}[{index}]"), item)
    return out


# --- the fields of an object ---------------------------------------------------------------


def fields_of(obj: Any, schema: Schema) -> set[Path]:
    """The fields `obj` sets (SMD's ToFieldSet): every leaf, every list item, every empty
    object, and every entry of a map that is not a declared field."""
    found: set[Path] = set()
    _collect(obj, schema, (), found)
    return found - STRIPPED


def _collect(value: Any, schema: Schema, path: Path, found: set[Path]) -> None:
    if _granular_map(value, schema):
        for key, child in value.items():
            child_path = (*path, f"f:{key}")
            _collect(child, schema.field(key), child_path, found)
            if child is None or child == {} or not schema.declares(key):
                found.add(child_path)
    elif _granular_list(value, schema):
        for element, item in _items(value, schema, pretty(path)).items():
            _collect(item, schema.items(), (*path, element), found)
            found.add((*path, element))
    elif path:
        found.add(path)


# --- what changed between two versions of an object ------------------------------------------


@dataclass
class Comparison:
    added: set[Path] = field(default_factory=set)
    modified: set[Path] = field(default_factory=set)
    removed: set[Path] = field(default_factory=set)


_MISSING: Any = object()


def compare(old: Any, new: Any, schema: Schema) -> Comparison:
    """What `new` adds, modifies (leaves only) and removes (whole subtrees) against `old`."""
    result = Comparison()
    _compare(old, new, schema, (), result)
    result.added -= STRIPPED
    result.modified -= STRIPPED
    result.removed -= STRIPPED
    return result


def _empty(value: Any) -> bool:
    return value is _MISSING or value is None or value in ({}, [])


def _compare(old: Any, new: Any, schema: Schema, path: Path, out: Comparison) -> None:
    both_empty = _empty(old) and _empty(new)
    present = [v for v in (old, new) if v is not _MISSING]
    if not both_empty and all(_granular_map(v, schema) for v in present):
        olds = old if old is not _MISSING else {}
        news = new if new is not _MISSING else {}
        for key in {**olds, **news}:
            child = (*path, f"f:{key}")
            _compare(
                olds.get(key, _MISSING), news.get(key, _MISSING), schema.field(key), child, out
            )
    elif not both_empty and all(_granular_list(v, schema) for v in present):
        where = pretty(path)
        olds = _items(old, schema, where) if old is not _MISSING else {}
        news = _items(new, schema, where) if new is not _MISSING else {}
        for element in {**olds, **news}:
            child = (*path, element)
            _compare(olds.get(element, _MISSING), news.get(element, _MISSING), schema.items(),
                     child, out)  # fmt: skip
    elif old is not _MISSING and new is not _MISSING:
        if old != new and path:
            out.modified.add(path)
        return
    if not path:
        return
    if old is _MISSING:
        out.added.add(path)
    elif new is _MISSING:
        out.removed.add(path)


# --- apply: merging a configuration into an object, and removing fields -----------------------


def merge(live: Any, config: Any, schema: Schema, path: Path = ()) -> Any:
    """The object with `config` applied: objects merge key by key, `listType=map`/`set` lists
    item by item (the live order kept, new items after the items they follow in `config`),
    anything else is replaced by the configuration's value."""
    if _granular_map(live, schema) and _granular_map(config, schema):
        merged = copy.deepcopy(live)
        for key, value in config.items():
            child = (*path, f"f:{key}")
            merged[key] = merge(live.get(key, _MISSING), value, schema.field(key), child)
        return merged
    if _granular_list(live, schema) and _granular_list(config, schema):
        return _merge_items(live, config, schema, path)
    if _granular_list(config, schema):
        _items(config, schema, pretty(path))  # every item has its keys
    return copy.deepcopy(config)


def _merge_items(live: list[Any], config: list[Any], schema: Schema, path: Path) -> list[Any]:
    """SMD's merge of two associative lists: shared items in the configuration's order, live
    items the configuration does not name where they were, new items where the configuration
    has them."""
    where = pretty(path)
    lhs, rhs = _items(live, schema, where), _items(config, schema, where)
    left, right = list(lhs), list(rhs)
    shared = [e for e in right if e in lhs]
    out: list[Any] = []

    def merged(element: str) -> Any:
        if element not in rhs:
            return copy.deepcopy(lhs[element])
        item_path = (*path, element)
        return merge(lhs.get(element, _MISSING), rhs[element], schema.items(), item_path)

    li = ri = 0
    next_shared = shared.pop(0) if shared else None
    while li < len(left) or ri < len(right):
        if li < len(left) and ri < len(right):
            element = left[li]
            if element == right[ri]:
                out.append(merged(element))
                li, ri = li + 1, ri + 1
                next_shared = shared.pop(0) if shared else None
                continue
            if element in rhs and next_shared is not None and next_shared != element:
                li += 1  # named by the configuration, later: it goes where the configuration says
                continue
        if li < len(left) and left[li] not in rhs:
            out.append(merged(left[li]))
            li += 1
            continue
        if ri < len(right):
            element = right[ri]
            out.append(merged(element))
            ri += 1
            if next_shared is not None and next_shared == element:
                next_shared = shared.pop(0) if shared else None
            continue
        li += 1  # a live item the configuration already placed
    return out


def remove(obj: Any, paths: Iterable[Path], schema: Schema) -> Any:
    """`obj` without the fields and items at `paths` (each with what is under it)."""
    trie = _trie(paths)
    return _remove(copy.deepcopy(obj), trie, schema, ())


def _remove(value: Any, trie: Json, schema: Schema, path: Path) -> Any:
    if _granular_map(value, schema):
        for key in list(value):
            below = trie.get(f"f:{key}")
            if below is None:
                continue
            if "." in below:
                del value[key]
            else:
                value[key] = _remove(value[key], below, schema.field(key), (*path, f"f:{key}"))
    elif _granular_list(value, schema):
        kept = []
        for index, item in enumerate(value):
            element = item_element(item, schema, f"{pretty(path)}[{index}]")
            below = trie.get(element)
            if below is None:
                kept.append(item)
            elif "." not in below:
                kept.append(_remove(item, below, schema.items(), (*path, element)))
        value[:] = kept
    return value


def _trie(paths: Iterable[Path]) -> Json:
    """Paths as nested dicts; `"."` marks a node that is itself in the set."""
    root: Json = {}
    for path in paths:
        node = root
        for element in path:
            node = node.setdefault(element, {})
        node["."] = {}
    return root


# --- managedFields ----------------------------------------------------------------------------


@dataclass
class Entry:
    """One `metadata.managedFields` entry."""

    manager: str
    operation: str  # "Apply" or "Update"
    api_version: str
    subresource: str = ""
    time: str | None = None
    fields: set[Path] = field(default_factory=set)

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """What tells managers apart: an applier is one manager whatever version it applies."""
        version = "" if self.operation == "Apply" else self.api_version
        return (self.manager, self.operation, self.subresource, version)

    def describe(self) -> str:
        """The manager as a conflict names it (the apiserver's printManager)."""
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == "Update":
            text += f" using {self.api_version}"
        return text


Managers = dict[tuple[str, str, str, str], Entry]


def encode_fields(paths: Iterable[Path]) -> Json:
    """A set of paths as `fieldsV1`: a leaf is `{}`, a member with children has `".": {}`."""
    trie = _trie(paths)

    def tidy(node: Json) -> Json:
        children = {k: tidy(v) for k, v in node.items() if k != "."}
        ordered = dict(sorted(children.items(), key=lambda kv: _order(kv[0])))
        return {".": {}, **ordered} if "." in node and children else ordered

    return tidy(trie)


def _order(element: str) -> tuple[int, str]:
    return ("fkvi".find(element[0]), element)


def decode_fields(fields_v1: Any) -> set[Path]:
    found: set[Path] = set()

    def walk(node: Any, path: Path) -> None:
        if not isinstance(node, dict):
            return
        if path and (not node or "." in node):
            found.add(path)
        for element, child in node.items():
            if element != ".":
                walk(child, (*path, element))

    walk(fields_v1, ())
    return found


def decode_managers(entries: Any) -> Managers:
    managers: Managers = {}
    for raw in entries if isinstance(entries, list) else []:
        if not isinstance(raw, dict):
            continue
        entry = Entry(
            manager=str(raw.get("manager") or ""),
            operation=str(raw.get("operation") or "Update"),
            api_version=str(raw.get("apiVersion") or ""),
            subresource=str(raw.get("subresource") or ""),
            time=raw.get("time"),
            fields=decode_fields(raw.get("fieldsV1")),
        )
        managers[entry.identity] = entry
    return managers


def encode_managers(managers: Managers) -> list[Json]:
    """The entries as the apiserver stores them: appliers first, then by time, manager, version
    and subresource; an entry that owns nothing is dropped."""
    entries = sorted(
        (e for e in managers.values() if e.fields),
        key=lambda e: (e.operation, e.time or "", e.manager, e.api_version, e.subresource),
    )
    out = []
    for e in entries:
        raw: Json = {"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version}
        if e.time:
            raw["time"] = e.time
        raw.update(fieldsType="FieldsV1", fieldsV1=encode_fields(e.fields))
        if e.subresource:
            raw["subresource"] = e.subresource
        out.append(raw)
    return out


def updated(managers: Managers, me: Entry, old: Any, new: Any, schema: Schema) -> Managers:
    """The managers after `me` wrote `new` over `old` with an Update: it takes what it added
    or changed (from everyone else), and everyone loses what it removed."""
    change = compare(old, new, schema)
    taken = change.added | change.modified
    out: Managers = {}
    for identity, entry in managers.items():
        out[identity] = replace(entry, fields=entry.fields - taken - change.removed)
    if taken:
        mine = out.get(me.identity)
        fields = (mine.fields if mine else set()) | taken
        out[me.identity] = replace(me, fields=fields)
    return {i: e for i, e in out.items() if e.fields}


@dataclass(frozen=True)
class Conflict:
    manager: Entry
    path: Path


class ApplyConflict(Exception):
    """Fields another manager owns that an apply would change (without `force`)."""

    def __init__(self, conflicts: list[Conflict]) -> None:
        self.conflicts = conflicts
        super().__init__(conflict_message(conflicts))


def conflict_message(conflicts: list[Conflict]) -> str:
    """The apiserver's wording (`getConflictMessage`)."""
    if len(conflicts) == 1:
        only = conflicts[0]
        return (
            f"Apply failed with 1 conflict: conflict with {only.manager.describe()}: "
            f"{pretty(only.path)}"
        )
    by_manager: dict[str, list[str]] = {}
    for c in conflicts:
        by_manager.setdefault(c.manager.describe(), []).append(pretty(c.path))
    lines = []
    for name in sorted(by_manager):
        lines.append(f"conflicts with {name}:")
        lines.extend(f"- {p}" for p in by_manager[name])
    return f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)


def applied(
    managers: Managers, me: Entry, live: Json, config: Json, schema: Schema, *, force: bool
) -> tuple[Json, Managers]:
    """The object and managers after `me` applied `config` to `live` (raises ApplyConflict)."""
    merged = merge(live, config, schema)
    last = managers.get(me.identity)
    mine = fields_of(config, schema)
    others = [e for i, e in managers.items() if i != me.identity]
    owned = set(mine).union(*(e.fields for e in others))
    dropped = (last.fields if last else set()) - owned
    merged = _without_emptied(remove(merged, dropped, schema), dropped, owned, schema)

    change = compare(live, merged, schema)
    touched = change.added | change.modified
    conflicts = [Conflict(e, p) for e in others for p in sorted(e.fields & touched, key=pretty)]
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    out: Managers = {}
    for entry in others:
        left = entry.fields - touched - change.removed
        if left:
            out[entry.identity] = replace(entry, fields=left)
    if mine:
        # The time says when the manager last changed the object: not for an apply of the same.
        time = last.time if last is not None and merged == live else me.time
        out[me.identity] = replace(me, fields=mine, time=time)
    return merged, out


def _without_emptied(obj: Json, dropped: set[Path], owned: set[Path], schema: Schema) -> Json:
    """A field left empty by what an apply removed goes too (no `conditions: []` or `status:
    {}` left behind), unless someone owns something under it."""
    parents = {path[:cut] for path in dropped for cut in range(1, len(path))}
    for parent in sorted(parents, key=len, reverse=True):  # the deepest first
        if any(p[: len(parent)] == parent for p in owned):
            continue
        if _at(obj, parent, schema) in ({}, []):
            obj = remove(obj, [parent], schema)
    return obj


def _at(obj: Any, path: Path, schema: Schema) -> Any:
    value = obj
    for element in path:
        if element.startswith("f:") and isinstance(value, dict):
            name = element[2:]
            value, schema = value.get(name, _MISSING), schema.field(name)
        elif isinstance(value, list):
            found = {item_element(i, schema, "") : i for i in value}  # fmt: skip
            value, schema = found.get(element, _MISSING), schema.items()
        else:
            return _MISSING
    return value


# --- paths as the apiserver prints them ----------------------------------------------------


def pretty(path: Path) -> str:
    """`.status.conditions[type="Ready"].status`, as fieldpath.Path.String() prints it."""
    return "".join(_pretty_element(e) for e in path)


def _pretty_element(element: str) -> str:
    kind, text = element[:2], element[2:]
    if kind == "f:":
        return "." + text
    if kind == "k:":
        keys = json.loads(text)
        return "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]"
    if kind == "v:":
        return f"[={text}]"
    if kind == "i:":
        return f"[{text}]"
    return element


def iter_lists(obj: Any, schema: Schema, path: str = "") -> Iterator[tuple[str, list[Any], Schema]]:
    """Every granular (`map` or `set`) list in `obj`, with its field path (`status.conditions`)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            child = f"{path}.{key}" if path else key
            yield from iter_lists(value, schema.field(key), child)
    elif _granular_list(obj, schema):
        yield path, obj, schema
        for index, item in enumerate(obj):
            yield from iter_lists(item, schema.items(), f"{path}[{index}]")
