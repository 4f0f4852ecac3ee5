import pytest

from comera_lightning.layers.shapes import balance_halves, balanced_factors, bond_rank_caps, cheapest, factorize, prod, resolve_max_ranks


@pytest.mark.parametrize(
    "n,k,expected",
    [(768, 3, (12, 8, 8)), (3072, 3, (16, 16, 12)), (1000, 3, (10, 10, 10)), (64, 2, (8, 8)), (1, 3, (1, 1, 1))],
)
def test_balanced_exact_factorisations(n, k, expected):
    assert factorize(n, k) == expected
    assert prod(factorize(n, k)) == n


@pytest.mark.parametrize("n,k", [(30522, 4), (30522, 3), (50257, 3), (10131227, 3), (7, 2), (1460, 2)])
def test_badly_factorising_sizes_are_padded_slightly(n, k):
    modes = factorize(n, k)
    assert len(modes) == k
    assert n <= prod(modes) <= n * 1.25
    assert max(modes) <= 2 * prod(modes) ** (1 / k) + 1


def test_padding_can_be_refused_with_a_helpful_message():
    with pytest.raises(ValueError, match="30522.*allow_padding=True.*pad it to"):
        factorize(30522, 4, allow_padding=False)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_bad_sizes_raise_naming_the_value(bad):
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(")):
        factorize(bad, 3)
    with pytest.raises(ValueError):
        balanced_factors(8, bad if bad != 2.5 else 0)


def test_rank_caps_follow_the_modes():
    # docs/METHOD.md §1.1: 768×768 at max_rank 30 gives [1, 12, 30, 30, 30, 12, 1]
    assert bond_rank_caps((12, 8, 8, 8, 8, 12), 30) == (12, 30, 30, 30, 12)
    assert bond_rank_caps((2, 2, 2), 100) == (2, 2)
    assert bond_rank_caps((4, 4, 4), [1, 3]) == (1, 3)


def test_rank_arguments_are_validated():
    with pytest.raises(ValueError, match="max_rank must be >= 1, got 0"):
        resolve_max_ranks(0, 3)
    with pytest.raises(ValueError, match="3 internal bonds"):
        resolve_max_ranks([4, 4], 3)


def test_balance_halves_evens_out_products():
    modes = balance_halves((8, 6, 4, 4))
    assert sorted(modes) == [4, 4, 6, 8]
    assert prod(modes[:2]) in (24, 32)


def test_cheapest_takes_the_least_cost_and_the_first_on_ties():
    assert cheapest(range(1, 5), lambda s: (abs(s - 3), 0)) == 3
    assert cheapest([4, 2, 7], lambda s: (s % 2,)) == 4
