"""A collision-free embedding: one row per distinct id, allocated as ids arrive, in a row budget.

Hashing ids into a fixed table makes distinct ids share rows. :class:`IdEmbedding` gives every
distinct ``(feature, id)`` its own row, as Monolith's collisionless tables and MindSpore's
``MapParameter`` do: a vectorized open-addressing hash table maps a key to its row; when the
``num_rows`` budget is full the least frequently (``"lfu"``) or recently (``"lru"``) used rows
are evicted; a batch with more new keys than the budget shares one overflow row. New rows are
initialised from ``seed`` and the step counter, and under DDP every rank admits the union of
the ranks' keys, so resumed and distributed runs map ids identically. The id map is a buffer
(saved with the weights, ``weights_only``-loadable); for delta publishing and snapshots the
module names its row state, the rows it changed (:meth:`take_changed_rows`) and announces its
own row writes (:meth:`register_row_write_hook`).

Example:
    >>> emb = IdEmbedding(num_rows=4, embedding_dim=2)
    >>> ids = torch.tensor([10**18, -5, 10**18])
    >>> emb(ids).shape, emb.row_of(ids).tolist()  # new ids take free rows in id order
    (torch.Size([3, 2]), [1, 0, 1])
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from lit_amp._runtime import world_size
from lit_amp._validation import check_bool, check_choice, check_int, type_error
from lit_amp.rec.huge_pages import huge_empty

__all__ = ["IdEmbedding"]

log = logging.getLogger(__name__)

_EMPTY, _TOMB = -1, -2  # slot values besides a row index
_RNG_LOCK = threading.Lock()  # new rows are drawn from the seeded default generator
_MAX = torch.iinfo(torch.int64).max
_VICTIM_CHUNK = 1 << 21  # rows scored at a time when choosing the rows to evict


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


# the multipliers of splitmix64 / MurmurHash3's finaliser, as signed int64
_K0, _K1, _K2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                      0x94D049BB133111EB))


def _default_init(rows: torch.Tensor) -> None:
    nn.init.normal_(rows, std=0.01)


def _all_gather_rows(t: torch.Tensor) -> torch.Tensor:
    """The rows of ``t`` of every rank, concatenated in rank order (sizes may differ)."""
    world = world_size()
    n = torch.tensor([t.shape[0]], device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    most = int(max(int(s) for s in sizes))
    padded = t.new_zeros((most, *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(s)] for p, s in zip(parts, sizes)])


class IdEmbedding(nn.Module):
    """An embedding with one row per distinct id within a row budget (see the module docstring).

    Args:
        num_rows: the row budget (distinct keys held at once).
        embedding_dim: the width of a row.
        num_features: key spaces: with more than 1, the last dimension of the input indexes
            the feature, and equal ids of different features get different rows.
        sparse: sparse gradients (use :class:`~lit_amp.rec.optim.LazyAdam`, SparseAdam,
            Adagrad or SGD).
        policy: which rows a full table evicts: ``"lfu"`` (fewest lookups, then the least
            recent) or ``"lru"`` (least recent).
        init: fills the rows of new keys in place (default: normal, std 0.01); it draws
            from torch's default generator, which is seeded for the call (``seed``).
        seed: the seed of new rows' initial values.

    Attributes:
        evictions: rows evicted so far (a tensor scalar, saved with the state).
        overflows: keys that found no row and used the shared row (saved with the state).

    Raises:
        TypeError / ValueError: an argument of the wrong type or value.

    Example:
        >>> emb = IdEmbedding(num_rows=2, embedding_dim=3, policy="lru")
        >>> _ = emb(torch.tensor([1, 2])); _ = emb(torch.tensor([3]))  # full: evicts id 1
        >>> emb.row_of(torch.tensor([1, 2, 3])).tolist(), int(emb.evictions)
        ([2, 1, 0], 1)
    """

    #: state names indexed by row (published by rows)
    row_state = ("weight", "row_keys")
    #: state names that only training needs (never in a published delta)
    train_state = ("row_count", "row_seen", "clock", "next_row")

    def __init__(
        self,
        num_rows: int,
        embedding_dim: int,
        *,
        num_features: int = 1,
        sparse: bool = False,
        policy: str = "lfu",
        init: Callable[[torch.Tensor], Any] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        owner = "IdEmbedding"
        n = check_int(owner, "num_rows", num_rows, minimum=1)
        check_int(owner, "embedding_dim", embedding_dim, minimum=1)
        self.num_features = check_int(owner, "num_features", num_features, minimum=1)
        self.sparse = check_bool(owner, "sparse", sparse)
        self.policy = check_choice(owner, "policy", policy, ("lfu", "lru"))
        if init is not None and not callable(init):
            raise type_error(owner, "init", "a callable or None", init)
        self.init = init or _default_init
        self.seed = check_int(owner, "seed", seed, minimum=0)
        self.num_rows = n
        # a row is initialised when a key takes it; the last is the shared row, zero at first
        self.weight = nn.Parameter(huge_empty(n + 1, embedding_dim).zero_())
        self.register_buffer("row_keys", torch.full((n, 2), -1, dtype=torch.long))
        self.register_buffer("row_count", torch.zeros(n, dtype=torch.long))
        self.register_buffer("row_seen", torch.zeros(n, dtype=torch.long))
        for name in ("clock", "next_row", "evictions", "overflows"):
            self.register_buffer(name, torch.zeros((), dtype=torch.long))
        self._capacity = 1 << max(4, math.ceil(math.log2(2 * n)))
        idx = torch.int32 if self._capacity < 2**31 else torch.long
        self.register_buffer("_slots", torch.full((self._capacity,), _EMPTY, dtype=idx),
                             persistent=False)
        self.register_buffer("_row_slot", torch.zeros(n, dtype=idx), persistent=False)
        self.register_buffer("_changed", torch.zeros(n, dtype=torch.bool), persistent=False)
        self._pool = torch.zeros(0, dtype=torch.long)  # free rows below next_row, ascending
        self._tombstones = 0
        self._reused: list[torch.Tensor] = []  # rows handed to a new key since the last step
        self._opt_hooks: list[Any] = []
        self._write_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self._last_log: dict[str, float] = {}

    @property
    def embedding_dim(self) -> int:
        return self.weight.shape[1]

    def extra_repr(self) -> str:
        return (f"num_rows={self.num_rows}, embedding_dim={self.embedding_dim}, "
                f"num_features={self.num_features}, policy={self.policy!r}, "
                f"sparse={self.sparse}")

    # ------------------------------------------------------------------ the hash table
    def _hash(self, keys: torch.Tensor) -> torch.Tensor:
        x = keys[:, 1] ^ (keys[:, 0] * _K0)  # int64 arithmetic wraps around
        x = (x ^ (x >> 31)) * _K1
        x = (x ^ (x >> 27)) * _K2
        return (x ^ (x >> 33)) & (self._capacity - 1)

    def _find(self, keys: torch.Tensor) -> torch.Tensor:
        """The row of each key (``(n, 2)``), -1 where absent."""
        rows = torch.full((keys.shape[0],), -1, dtype=torch.long, device=keys.device)
        todo = torch.arange(keys.shape[0], device=keys.device)
        pos, want = self._hash(keys), keys
        mask = self._capacity - 1
        while todo.numel():
            s = self._slots.index_select(0, pos).long()
            held = self.row_keys.index_select(0, s.clamp_min(0))
            match = (s >= 0) & (held == want).all(dim=1)
            rows[todo[match]] = s[match]
            go_on = (~match & (s != _EMPTY)).nonzero().squeeze(1)
            todo, pos = todo.index_select(0, go_on), (pos.index_select(0, go_on) + 1) & mask
            want = want.index_select(0, go_on)
        return rows

    def _insert(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Put absent ``keys`` (distinct) into the table, pointing at ``rows``."""
        pos, mask = self._hash(keys), self._capacity - 1
        while rows.numel():
            s = self._slots[pos]
            free = s < 0
            p, r = pos[free], rows[free]
            self._slots[p] = r.to(self._slots.dtype)  # a slot claimed twice keeps one
            won = self._slots[p].long() == r
            self._row_slot[r[won]] = p[won].to(self._row_slot.dtype)
            self._tombstones -= int((s[free][won] == _TOMB).sum())
            placed = torch.zeros_like(free)
            placed[free.nonzero().squeeze(1)[won]] = True
            keep = ~placed
            pos, rows = (pos[keep] + 1) & mask, rows[keep]

    def _remove(self, rows: torch.Tensor) -> None:
        """Take the keys of ``rows`` (live) out of the table."""
        self._slots[self._row_slot[rows].long()] = _TOMB
        self._tombstones += rows.numel()

    def _rebuild(self) -> None:
        """The table, the row slots and the free pool from ``row_keys`` (after a load)."""
        self._slots.fill_(_EMPTY)
        self._tombstones = 0
        live = (self.row_keys[:, 0] >= 0).nonzero().squeeze(1)
        self._insert(self.row_keys.index_select(0, live), live)
        below = torch.arange(int(self.next_row), device=live.device)
        self._pool = below[self.row_keys[:, 0].index_select(0, below) < 0]

    # ------------------------------------------------------------------ allocation
    def _scores(self, lo: int, hi: int, protect: torch.Tensor) -> torch.Tensor:
        """The eviction order of rows ``[lo, hi)`` (the smallest go first); free rows and the
        rows in ``protect`` score ``_MAX`` (never evicted)."""
        score = self.row_seen[lo:hi].clamp(0, 2**32 - 1)
        if self.policy == "lfu":  # fewest lookups first, then the least recent
            seen, score = score, self.row_count[lo:hi].clamp(0, 2**31 - 1)
            score.bitwise_left_shift_(32).bitwise_or_(seen)
        score.masked_fill_(self.row_keys[lo:hi, 0] < 0, _MAX)
        score.index_fill_(0, protect[(protect >= lo) & (protect < hi)] - lo, _MAX)
        return score

    def _victims(self, n: int, protect: torch.Tensor) -> torch.Tensor:
        """The ``n`` rows to evict (fewer if fewer are evictable), ascending: the ``n``
        smallest scores, ties taken in row order.

        The rows are scored ``_VICTIM_CHUNK`` at a time, so choosing victims in a table of
        tens of millions of rows does not build scores of the whole table (0.6 GB at 26 M rows).
        """
        chunks = [(lo, min(lo + _VICTIM_CHUNK, self.num_rows))
                  for lo in range(0, self.num_rows, _VICTIM_CHUNK)]
        smallest, evictable = [], 0
        for lo, hi in chunks:  # each chunk's n smallest hold the whole table's n smallest
            score = self._scores(lo, hi, protect)
            evictable += int((score < _MAX).sum())
            k = min(n, hi - lo)
            smallest.append(score[score <= torch.kthvalue(score, k).values])
        n = min(n, evictable)
        if n == 0:
            return torch.zeros(0, dtype=torch.long, device=protect.device)
        threshold = torch.kthvalue(torch.cat(smallest), n).values
        below, tied = [], []
        for lo, hi in chunks:
            score = self._scores(lo, hi, protect)
            below.append((score < threshold).nonzero().squeeze(1) + lo)
            tied.append((score == threshold).nonzero().squeeze(1) + lo)
        below_rows = torch.cat(below)
        tied_rows = torch.cat(tied)[: n - below_rows.numel()]
        return torch.cat([below_rows, tied_rows]).sort().values

    def _free_rows(self, k: int, protect: torch.Tensor) -> torch.Tensor:
        """Up to ``k`` free rows (ascending within each source), evicting when needed."""
        start = int(self.next_row)
        fresh = torch.arange(start, min(start + k, self.num_rows), device=protect.device)
        self.next_row += fresh.numel()
        need = k - fresh.numel()
        if need > self._pool.numel():
            victims = self._victims(max(need - self._pool.numel(),
                                        math.ceil(self.num_rows / 100)), protect)
            if victims.numel():
                self._remove(victims)
                with self._writing([self.row_keys], victims):
                    self.row_keys.index_fill_(0, victims, -1)
                self.evictions += victims.numel()
                self._pool = torch.cat([self._pool, victims]).sort().values
                self._say("evict", logging.INFO,
                          "IdEmbedding: the table is full (%d rows); evicted %d rows of the "
                          "least %s used keys (%d evictions so far).", self.num_rows,
                          victims.numel(), "frequently" if self.policy == "lfu" else "recently",
                          int(self.evictions))
        reused, self._pool = self._pool[:need], self._pool[need:]
        if self._opt_hooks and reused.numel():
            self._reused.append(reused)
        return torch.cat([fresh, reused])

    def _assign(self, keys: torch.Tensor, protect: torch.Tensor) -> torch.Tensor:
        """Rows for the new ``keys`` (distinct, absent); the shared row for those left over."""
        k = keys.shape[0]
        if k >= 100 and k > self.num_rows // 10:
            self._say("burst", logging.WARNING,
                      "IdEmbedding: %d new ids in one batch (the budget is %d rows).",
                      k, self.num_rows)
        got = self._free_rows(k, protect)
        m = got.numel()
        out = torch.full((k,), self.num_rows, dtype=torch.long, device=keys.device)
        out[:m] = got
        if m < k:
            self.overflows += k - m
            self._say("overflow", logging.WARNING,
                      "IdEmbedding: %d ids of one batch found no row (%d rows, all in use by "
                      "the batch); they share row %d (%d such lookups so far).",
                      k - m, self.num_rows, self.num_rows, int(self.overflows))
        if m:
            fresh = self._fresh_rows(m)
            with self._writing([self.row_keys, self.weight, self.row_count], got):
                self.row_keys.index_copy_(0, got, keys[:m])
                self.weight.index_copy_(0, got, fresh)
                self.row_count[got] = 0
            self._insert(keys[:m], got)
            self._changed[got] = True
            if self._tombstones > self._capacity // 8:
                self._rebuild()
        return out

    def _fresh_rows(self, m: int) -> torch.Tensor:
        """``m`` rows from ``init``, drawn from a generator seeded by ``seed`` and the step
        counter (the same values on every rank and after a resume)."""
        w = self.weight
        devices = [w.device] if w.device.type == "cuda" else []
        # the default generator is the process's: two tables drawing at once from two threads
        # would interleave their seeded draws
        with _RNG_LOCK, torch.random.fork_rng(devices=devices):
            torch.manual_seed((self.seed * 1_000_003 + int(self.clock)) % (2**63))
            fresh = torch.empty(m, w.shape[1], dtype=w.dtype, device=w.device)
            self.init(fresh)
        return fresh

    def _say(self, what: str, level: int, msg: str, *args: Any) -> None:
        """Log ``msg``, at most once per 30 s for each kind ``what``."""
        now = time.monotonic()
        if now - self._last_log.get(what, -math.inf) >= 30.0:
            self._last_log[what] = now
            log.log(level, msg, *args)

    # ------------------------------------------------------------------ lookups
    def _keys(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() \
                or ids.dtype == torch.bool:
            raise type_error("IdEmbedding", "ids", "an integer tensor", ids)
        f = self.num_features
        if f > 1 and (ids.dim() == 0 or ids.shape[-1] != f):
            raise ValueError(
                f"For 'IdEmbedding', the argument 'ids' must have a last dimension of "
                f"num_features={f}, but got shape {tuple(ids.shape)}."
            )
        flat = ids.reshape(-1).long()
        feature = torch.arange(f, device=flat.device).repeat(flat.numel() // f)
        return torch.stack([feature, flat], dim=1)

    def _unique(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct keys and each key's index among them."""
        f, ids = self.num_features, keys[:, 1]
        if f == 1:
            joined, inverse = torch.unique(ids, return_inverse=True)
            return torch.stack([torch.zeros_like(joined), joined], dim=1), inverse
        if ids.numel() and -(2**62) // f <= int(ids.min()) and int(ids.max()) < 2**62 // f:
            joined, inverse = torch.unique(ids * f + keys[:, 0], return_inverse=True)
            feature = torch.remainder(joined, f)
            return torch.stack([feature, (joined - feature) // f], dim=1), inverse
        return torch.unique(keys, dim=0, return_inverse=True)  # ids near the int64 limits

    @torch.no_grad()
    def _rows(self, keys: torch.Tensor) -> torch.Tensor:
        """The row of each distinct key; in training new keys get rows and usage is counted
        (under DDP those of every rank, so that all ranks keep the same table)."""
        if not self.training:
            rows = self._find(keys)
            return rows.masked_fill_(rows < 0, self.num_rows)
        if world_size() == 1:
            return self._admit(keys)
        self._admit(self._unique(_all_gather_rows(keys))[0])
        rows = self._find(keys)
        return rows.masked_fill_(rows < 0, self.num_rows)  # keys that overflowed

    def _admit(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows for ``keys`` (distinct), new ones allocated; count one lookup of each."""
        rows = self._find(keys)
        new = rows < 0
        self.clock += 1
        if bool(new.any()):
            rows[new] = self._assign(keys.index_select(0, new.nonzero().squeeze(1)), rows[~new])
        held = rows[rows < self.num_rows]
        with self._writing([self.row_count, self.row_seen], held):
            self.row_count.index_add_(0, held, torch.ones_like(held))
            self.row_seen.index_fill_(0, held, int(self.clock))
        return rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look ``ids`` up: ``(...,)`` ids give ``(..., embedding_dim)`` (with
        ``num_features > 1`` the last dimension of ``ids`` is the feature).

        Raises:
            TypeError: ``ids`` is not an integer tensor.
            ValueError: the last dimension is not ``num_features``.
            RuntimeError: ``sparse=True`` while training in a process group of several ranks
                (DistributedDataParallel takes sparse gradients only from ``nn.Embedding``).
        """
        if self.sparse and self.training and torch.is_grad_enabled() and world_size() > 1:
            raise RuntimeError(
                f"For 'IdEmbedding', the argument 'sparse' must be False when training on "
                f"{world_size()} ranks, but got True: DistributedDataParallel accepts sparse "
                "gradients only from nn.Embedding / nn.EmbeddingBag and fails in backward on "
                "this module's. Use sparse=False under DDP (WideDeep(collisionless=True, "
                "sparse=False)), or train on one process."
            )
        keys, inverse = self._unique(self._keys(ids))
        rows = self._rows(keys)
        # index_select rather than [inverse]: cheaper when torch runs several CPU threads
        out = F.embedding(rows, self.weight, sparse=self.sparse).index_select(0, inverse)
        return out.reshape(*ids.shape, self.embedding_dim)

    def row_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The row each id uses now, ``num_rows`` (the shared row) for an unknown one; it
        allocates nothing."""
        keys, inverse = self._unique(self._keys(ids))
        with torch.no_grad():
            rows = self._find(keys)
        return rows.masked_fill_(rows < 0, self.num_rows)[inverse].reshape(ids.shape)

    def __len__(self) -> int:
        """Keys held."""
        return int((self.row_keys[:, 0] >= 0).sum())

    # ------------------------------------------------------------------ optimizer, state
    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Zero ``optimizer``'s state (moments, sums) of a row handed to a new key before the
        next step, so a new id does not inherit the moments of the id evicted from its row."""
        self._opt_hooks.append(optimizer.register_step_pre_hook(self._reset_moments))

    def _reset_moments(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._reused:
            return
        rows, self._reused = torch.cat(self._reused), []
        moments = [v for v in optimizer.state.get(self.weight, {}).values()
                   if torch.is_tensor(v) and v.shape[:1] == self.weight.shape[:1]]
        with self._writing(moments, rows):
            for value in moments:
                value.index_fill_(0, rows.to(value.device), 0)

    def register_row_write_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        """Call ``hook(tensors, rows)`` before this module writes ``rows`` of ``tensors`` (its
        own, or an attached optimizer's state of ``weight``) in place outside an optimizer
        step, and ``hook(tensors, None)`` once written (a snapshot of the state being written
        to a file copies those rows aside first: :mod:`lit_amp.rec.state.snapshot`)."""
        handle = RemovableHandle(self._write_hooks)
        self._write_hooks[handle.id] = hook
        return handle

    @contextlib.contextmanager
    def _writing(self, tensors: list[torch.Tensor], rows: torch.Tensor) -> Iterator[None]:
        hooks = list(self._write_hooks.values())
        for hook in hooks:
            hook(tensors, rows)
        try:
            yield
        finally:
            for hook in hooks:
                hook(tensors, None)

    def take_changed_rows(self) -> torch.Tensor:
        """Rows whose key changed since the last call (new keys; delta publishing)."""
        rows = self._changed.nonzero().squeeze(1)
        self._changed.zero_()
        return rows

    @torch.no_grad()
    def load_rows(self, name: str, rows: torch.Tensor | None, values: torch.Tensor) -> None:
        """Set the ``rows`` (None: all) of the state tensor ``name`` (``weight`` or
        ``row_keys``) to ``values``, keeping the hash table in step (a published delta)."""
        target = getattr(self, name)
        if name != "row_keys":
            target.copy_(values) if rows is None else target.index_copy_(0, rows, values)
            return
        if rows is None:
            target.copy_(values)
            self._rebuild()
            return
        old = rows[self.row_keys[:, 0].index_select(0, rows) >= 0]
        self._remove(old)
        target.index_copy_(0, rows, values)
        if rows.numel():
            self.next_row.clamp_(min=int(rows.max()) + 1)
        live = rows[values[:, 0] >= 0]
        self._insert(self.row_keys.index_select(0, live), live)
        if self._tombstones > self._capacity // 8:
            self._rebuild()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args)
        self._rebuild()
        self._changed.zero_()
