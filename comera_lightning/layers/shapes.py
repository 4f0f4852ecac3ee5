"""Factorising layer sizes into tensor-train modes, padding awkward sizes, capping ranks.

docs/METHOD.md §1: a dimension ``n`` is viewed as a product of modes ``n_1 ⋯ n_d``. Balanced modes
keep every core small; a size that factorises badly (a large prime factor) is padded up to a
nearby product of small primes, the way the paper pads a 30,522-word vocabulary to 32,000.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from functools import lru_cache

__all__ = ["factorize", "balanced_factors", "balance_halves", "bond_rank_caps", "cheapest", "is_two_factor_table",
           "resolve_max_ranks", "prod"]

# A factorisation is "balanced" when its largest mode is at most this multiple of n**(1/d).
BALANCE_TOLERANCE = 2.0
# Largest relative padding ever added to make a size factorise well.
MAX_PADDING = 0.25
_SMALL_PRIMES = (2, 3, 5, 7)


def prod(values: Sequence[int]) -> int:
    """Product of a sequence of ints (1 for an empty one)."""
    return math.prod(values)


def cheapest(candidates: Sequence[int], cost: Callable[[int], tuple]) -> int:
    """The candidate of least ``cost`` (the first on ties): ``min(key=...)`` written as a loop torch.compile traces."""
    best, best_cost = candidates[0], cost(candidates[0])
    for candidate in candidates[1:]:
        candidate_cost = cost(candidate)
        if candidate_cost < best_cost:
            best, best_cost = candidate, candidate_cost
    return best


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return value


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return tuple(small + large[::-1])


def balanced_factors(n: int, num_factors: int) -> tuple[int, ...]:
    """Exact factorisation of ``n`` into ``num_factors`` modes, as balanced as possible.

    Balanced means the smallest sum of modes (a proxy for core size), ties broken by the
    smallest largest mode. Returned in descending order; modes of 1 appear only when ``n``
    has too few prime factors.
    """
    # Validate before the cache: True == 1 hashes alike, so a cached (8, 1) would answer (8, True).
    return _balanced_factors(_check_positive_int("n", n), _check_positive_int("num_factors", num_factors))


@lru_cache(maxsize=4096)
def _balanced_factors(n: int, num_factors: int) -> tuple[int, ...]:
    best: tuple[int, ...] | None = None
    best_key: tuple[int, int] | None = None

    def search(remaining: int, slots: int, min_factor: int, chosen: list[int]) -> None:
        nonlocal best, best_key
        if slots == 1:
            if remaining >= min_factor:
                candidate = chosen + [remaining]
                key = (sum(candidate), max(candidate))
                if best_key is None or key < best_key:
                    best, best_key = tuple(sorted(candidate, reverse=True)), key
            return
        for d in _divisors(remaining):
            if d < min_factor:
                continue
            if d ** slots > remaining:  # factors are non-decreasing, so d**slots <= remaining
                break
            search(remaining // d, slots - 1, d, chosen + [d])

    search(n, num_factors, 1, [])
    assert best is not None  # n = 1·1⋯n always exists
    return best


def _is_balanced(modes: Sequence[int], n: int) -> bool:
    ideal = n ** (1.0 / len(modes))
    return max(modes) <= max(2.0, BALANCE_TOLERANCE * ideal)


def _smooth_numbers(low: int, high: int) -> list[int]:
    """All numbers in [low, high] whose prime factors are 2, 3, 5 or 7, ascending."""
    found = {1}
    for p in _SMALL_PRIMES:
        frontier = list(found)
        for value in frontier:
            v = value * p
            while v <= high:
                found.add(v)
                v *= p
    return sorted(v for v in found if low <= v <= high)


def factorize(n: int, num_factors: int, *, allow_padding: bool = True) -> tuple[int, ...]:
    """Modes for a dimension of size ``n``: exact when balanced, else padded up slightly.

    Returns ``num_factors`` modes whose product is ``>= n`` (``== n`` when ``n`` factorises
    in a balanced way). With ``allow_padding=False`` a badly factorising size raises a
    ``ValueError`` that suggests the padded size instead.
    """
    _check_positive_int("size", n)
    _check_positive_int("num_factors", num_factors)
    exact = balanced_factors(n, num_factors)
    if num_factors == 1 or _is_balanced(exact, n):
        return exact
    for candidate in _smooth_numbers(n, int(n * (1 + MAX_PADDING)) + 1):
        modes = balanced_factors(candidate, num_factors)
        if _is_balanced(modes, candidate):
            if not allow_padding:
                raise ValueError(
                    f"size {n} does not factorise into {num_factors} balanced modes "
                    f"(best exact: {exact}); pass allow_padding=True to pad it to {candidate} = "
                    f"{'·'.join(map(str, modes))}, or give the modes explicitly."
                )
            return modes
    return exact  # tiny sizes: nothing better exists, the exact modes are still valid


def balance_halves(modes: Sequence[int]) -> tuple[int, ...]:
    """Reorder ``modes`` so the products of the first and second half are as close as possible.

    Batched matmuls of ``(M_L × r) @ (r × M_R)`` run several times faster on CPU when
    ``M_L ≈ M_R`` than for the same FLOPs with lopsided halves.
    """
    modes = tuple(sorted(modes, reverse=True))
    half = len(modes) // 2
    best, best_gap = modes, None
    for chosen in itertools.combinations(range(len(modes)), half):
        left = [modes[i] for i in chosen]
        right = [modes[i] for i in range(len(modes)) if i not in chosen]
        gap = abs(math.log(prod(left)) - math.log(prod(right)))
        if best_gap is None or gap < best_gap - 1e-12:
            best, best_gap = tuple(left + right), gap
    return best


def resolve_max_ranks(max_rank: int | Sequence[int], num_bonds: int) -> tuple[int, ...]:
    """Expand ``max_rank`` (one int, or one per internal bond) to a tuple of length ``num_bonds``."""
    if isinstance(max_rank, int) and not isinstance(max_rank, bool):
        if max_rank < 1:
            raise ValueError(f"max_rank must be >= 1, got {max_rank}.")
        return (max_rank,) * num_bonds
    ranks = tuple(max_rank)
    if len(ranks) != num_bonds:
        raise ValueError(
            f"max_rank has {len(ranks)} entries {ranks} but the train has {num_bonds} internal "
            f"bonds; give one int or exactly {num_bonds} values."
        )
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"every max_rank entry must be an integer >= 1, got {ranks}.")
    return ranks


def bond_rank_caps(core_sizes: Sequence[int], max_rank: int | Sequence[int]) -> tuple[int, ...]:
    """Internal bond ranks of a train whose cores have ``core_sizes`` modes each.

    Bond ``k`` (between core ``k`` and ``k+1``) cannot usefully exceed the number of entries on
    either side: ``min(∏ sizes[:k+1], ∏ sizes[k+1:], max_rank_k)``.
    """
    caps = resolve_max_ranks(max_rank, len(core_sizes) - 1)
    ranks = []
    for k, cap in enumerate(caps):
        left, right = prod(core_sizes[: k + 1]), prod(core_sizes[k + 1 :])
        ranks.append(min(left, right, cap))
    return tuple(ranks)


def table_modes(num_rows: int, dim: int, num_cores: int, row_modes: Sequence[int] | None,
                col_modes: Sequence[int] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A TT table's (row modes, column modes): the ones given (checked), else ``num_cores`` balanced factors of each
    side; one core is the table as two factors, ``(num_rows, 1)`` × ``(1, dim)``."""
    if num_cores == 1 and row_modes is None and col_modes is None:
        return (num_rows, 1), (1, dim)
    row_modes = tuple(row_modes) if row_modes is not None else factorize(num_rows, num_cores)
    col_modes = tuple(col_modes) if col_modes is not None else balance_halves(factorize(dim, len(row_modes)))
    if len(row_modes) != len(col_modes):
        raise ValueError(f"row_modes {row_modes} and col_modes {col_modes} must have the same length.")
    if prod(row_modes) < num_rows or prod(col_modes) < dim or min(row_modes + col_modes) < 1:
        raise ValueError(f"row_modes {row_modes} must multiply to >= {num_rows} and col_modes {col_modes} to >= {dim}, "
                         "all positive.")
    return row_modes, col_modes


def is_two_factor_table(row_modes: Sequence[int], col_modes: Sequence[int]) -> bool:
    """A table laid out as two factors (``table_modes`` with one core): rows × rank, then rank × dim."""
    return len(row_modes) == 2 and row_modes[1] == 1 and col_modes[0] == 1
