"""Drafter sets, one per running sequence, kept per SpecConfig.

A drafter holds per-sequence state between begin() and end() (its match position, its KV
cache), so two sequences that run at the same time need two sets. A set is built the first
time every existing set of that config is busy and reused after; the configs kept are bounded
(per-request overrides make new ones). Drafters with memory across requests (suffix's
global trie, ngram-cache's dynamic tier) learn from the requests their own set served.

    pool = DrafterPool(build=lambda spec: [...], max_configs=8)
    drafters = pool.acquire(spec)   # a set no running sequence uses
    ...
    pool.release(spec, drafters)    # free for the next sequence with this config
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable

from specdec.drafters.base import Drafter


class DrafterPool:
    def __init__(self, build: Callable[[Hashable], list[Drafter]], max_configs: int):
        self.build = build
        self.max_configs = max_configs
        self._sets: OrderedDict[Hashable, list[list[Drafter]]] = OrderedDict()  # config -> its sets, first built first
        self._busy: set[int] = set()  # id() of the sets running sequences hold

    def first(self, config: Hashable) -> list[Drafter]:
        """The config's first set (built now if there is none), busy or not: for checks and reports."""
        return self._sets_of(config)[0]

    def acquire(self, config: Hashable) -> list[Drafter]:
        """A set of the config's drafters that no running sequence holds (built when all are busy)."""
        sets = self._sets_of(config)
        for drafters in sets:
            if id(drafters) not in self._busy:
                break
        else:
            drafters = self.build(config)
            sets.append(drafters)
        self._busy.add(id(drafters))
        return drafters

    def release(self, config: Hashable, drafters: list[Drafter]) -> None:
        self._busy.discard(id(drafters))

    def __len__(self) -> int:
        """How many configs have sets."""
        return len(self._sets)

    def sets(self, config: Hashable) -> int:
        """How many sets the config has (0 when it has none or was dropped)."""
        return len(self._sets.get(config, ()))

    def _sets_of(self, config: Hashable) -> list[list[Drafter]]:
        if config in self._sets:
            self._sets.move_to_end(config)
            return self._sets[config]
        self._sets[config] = [self.build(config)]
        for old in list(self._sets)[:-1]:
            if len(self._sets) <= self.max_configs:
                break
            if not any(id(d) in self._busy for d in self._sets[old]):  # a running sequence keeps its config
                del self._sets[old]
        return self._sets[config]
