"""A list applied page by page as it comes (issue 37 part 2): the store and its listeners end
as a whole list would have left them, and a relist holds the store and one page, never a second
list beside the store (both replicas relist at once after an API server restart)."""

from __future__ import annotations

import copy
import gc
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from tests.bench.cache_bench import PagedServer, changed
from tests.bench.cache_bench import trainjob as bench_trainjob
from tests.bench.reconcile_bench import cluster_runtime
from webhook.kube import rest
from webhook.kube.informer import Informer, Resource
from webhook.kube.store import Store, key_of
from webhook.kube.trainjobstore import TrainJobStore

Json = dict[str, Any]
Heard = tuple[str, str | None, str | None]  # (event, the name before, after)


def obj(namespace: str, name: str, version: int = 1) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Thing",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(version)},
        "spec": {"version": version},
    }


def shown(o: Json | None) -> str | None:
    return None if o is None else f"{o['metadata']['name']}@{o['spec']['version']}"


def listening(store: Store) -> list[Heard]:
    heard: list[Heard] = []

    def told(event: str, old: Json | None, new: Json | None) -> None:
        heard.append((event, shown(old), shown(new)))

    store.subscribe(told)
    return heard


def what_a_whole_list_tells(before: list[Json], items: list[Json]) -> list[Heard]:
    """The events a whole list told (the store's contract before pages): ADDED or MODIFIED for
    each changed item in list order, then DELETED for what the list no longer has."""
    old = {key_of(o): o for o in before}
    heard: list[Heard] = []
    for item in items:
        was = old.get(key_of(item))
        if was != item:
            heard.append(("MODIFIED" if was else "ADDED", shown(was), shown(item)))
    listed = {key_of(i) for i in items}
    for key, was in old.items():
        if key not in listed:
            heard.append(("DELETED", shown(was), None))
    return heard


def pages(items: list[Json], size: int) -> Iterator[list[Json]]:
    for start in range(0, len(items), size):
        yield copy.deepcopy(items[start : start + size])


BEFORE = [obj("a", f"o-{i}") for i in range(10)]
# Unchanged, modified, deleted (o-2, o-5, o-9) and added, in another order.
AFTER = [
    obj("a", "o-8"),
    obj("a", "o-0"),
    obj("a", "o-1", 2),
    obj("a", "n-1"),
    obj("a", "o-3"),
    obj("a", "o-4", 3),
    obj("a", "o-6"),
    obj("a", "n-2"),
    obj("a", "o-7", 2),
]


@pytest.mark.parametrize("size", [1, 2, 4, 100])
def test_a_relist_in_pages_tells_what_a_whole_list_told(size: int) -> None:
    store = Store("things")
    store.replace(copy.deepcopy(BEFORE))
    memo = store.get("a", "o-0")
    assert memo is not None
    memo.memo = "derived"
    heard = listening(store)
    listing = store.relist()
    for page in pages(AFTER, size):
        listing.add(page)
        # Each page is in the store at once; nothing goes before the list is whole.
        assert len(store) >= len(BEFORE)
    listing.done()
    assert heard == what_a_whole_list_tells(BEFORE, AFTER)
    assert {k: e.raw for k, e in store.items()} == {key_of(i): i for i in AFTER}
    assert store.get("a", "o-0") is memo and memo.memo == "derived"  # unchanged: kept
    assert store.synced and listing.count == len(AFTER)


def test_the_first_list_syncs_the_store_only_when_it_is_whole() -> None:
    store = Store("things")
    store.watched = ("a", "b")
    listing = store.relist("a")
    listing.add([obj("a", "x")])
    assert not store.synced and store.get("a", "x") is not None
    listing.done()
    assert not store.synced  # namespace b is not listed yet
    other = store.relist("b")
    other.add([obj("b", "y")])
    other.done()
    assert store.synced


def test_a_namespace_relisted_leaves_the_others_alone() -> None:
    store = Store("things")
    store.watched = ("a", "b")
    store.replace([obj("a", "x")], "a")
    store.replace([obj("b", "y"), obj("b", "z")], "b")
    heard = listening(store)
    listing = store.relist("a")
    listing.add([obj("a", "w")])
    listing.done()
    assert sorted(k for k, _ in store.items()) == [("a", "w"), ("b", "y"), ("b", "z")]
    assert heard == [("ADDED", None, "w@1"), ("DELETED", "x@1", None)]


def test_a_list_given_up_part_way_removes_nothing_and_the_next_one_converges() -> None:
    store = Store("things")
    store.replace(copy.deepcopy(BEFORE))
    heard = listening(store)
    broken = store.relist()
    broken.add(copy.deepcopy(AFTER[:4]))  # then the connection drops: no done()
    assert not [h for h in heard if h[0] == "DELETED"]
    assert len(store) == len(BEFORE) + 1  # n-1 in, nothing out
    listing = store.relist()
    for page in pages(AFTER, 3):
        listing.add(page)
    listing.done()
    assert {k: e.raw for k, e in store.items()} == {key_of(i): i for i in AFTER}
    assert sorted(h for h in heard if h[0] == "DELETED") == [
        ("DELETED", "o-2@1", None), ("DELETED", "o-5@1", None), ("DELETED", "o-9@1", None)
    ]  # fmt: skip


def test_a_watch_event_between_two_lists_is_judged_by_the_next_list() -> None:
    store = Store("things")
    store.replace([obj("a", "x")])
    store.apply("ADDED", obj("a", "from-watch"))
    store.replace([obj("a", "x")])  # the next list does not have it: it was deleted meanwhile
    assert [k for k, _ in store.items()] == [("a", "x")]


# --- the memory a relist holds -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_relist_holds_the_store_and_a_page_not_a_second_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every TrainJob changed while the watch was down (a relist after an API server restart):
    the relist's peak beyond the store stays far below the store itself (a whole list built
    beside the store, as before, doubled it). A generous bound: half the store."""
    n, page_size = 3000, 20
    runtime = cluster_runtime()
    runtime["metadata"]["name"] = "torch-distributed"
    server = PagedServer(changed(bench_trainjob, runtime), n, page_size)
    monkeypatch.setattr(rest, "get_json", server)
    store = TrainJobStore("trainjobs")
    heard: list[str] = []
    store.subscribe(lambda event, old, new: heard.append(event))
    resource = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs")
    informer = Informer(None, resource, store, page_size=page_size)  # type: ignore[arg-type]
    gc.collect()
    tracemalloc.start()
    try:
        empty = tracemalloc.get_traced_memory()[0]
        await informer._list()  # private: one list, without a watch after it
        gc.collect()
        filled = tracemalloc.get_traced_memory()[0]
        store_bytes = filled - empty
        server.version = 2  # every object changed meanwhile
        tracemalloc.reset_peak()
        await informer._list()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(store) == n and server.asked == 2 * n // page_size
    assert heard == ["ADDED"] * n + ["MODIFIED"] * n
    entry = store.get("team-0", "pytorch-mnist-00000")
    assert entry is not None and entry.raw["metadata"]["resourceVersion"] == "2000000"
    assert "written 2 times" in entry.raw["status"]["conditions"][0]["message"]
    extra = peak - filled
    assert extra < store_bytes / 2, (extra, store_bytes)
