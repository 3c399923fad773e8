"""Forward/backward passes built by token budget: whole groups, in order, each pass within the budget unless a
single group exceeds it."""

from coati.distributed.forward import token_budget_chunks


def covered(chunks, n):
    rows = [i for c in chunks for i in range(n)[c]]
    return rows == list(range(n))


def test_chunks_cover_every_row_once_in_order_and_keep_groups_whole():
    p, r = [10] * 4 + [20] * 4 + [30] * 4, [5] * 4 + [6] * 4 + [40] * 4
    for budget in (1, 50, 100, 200, 10**6):
        for shared in (False, True):
            chunks = token_budget_chunks(p, r, 4, budget, shared)
            assert covered(chunks, 12) and all(c.start % 4 == 0 and c.stop % 4 == 0 for c in chunks), chunks


def test_each_pass_fits_the_budget_counting_shared_prompts_once():
    p, r = [10] * 4 + [20] * 4 + [30] * 4, [5] * 4 + [6] * 4 + [40] * 4
    # Unshared: 8 rows x (20 + 6) = 208 fits 210, the third group would make 12 x 70.
    assert token_budget_chunks(p, r, 4, 210, shared=False) == [slice(0, 8), slice(8, 12)]
    # Shared: 2 groups x 20 + 8 rows x 6 = 88; all three: 3 x 30 + 12 x 40 = 570.
    assert token_budget_chunks(p, r, 4, 88, shared=True) == [slice(0, 8), slice(8, 12)]
    assert token_budget_chunks(p, r, 4, 570, shared=True) == [slice(0, 12)]
    assert token_budget_chunks(p, r, 4, 87, shared=True) == [slice(0, 4), slice(4, 8), slice(8, 12)]


def test_a_group_larger_than_the_budget_still_gets_a_pass_of_its_own():
    assert token_budget_chunks([100] * 4, [100] * 4, 4, 10, shared=False) == [slice(0, 4)]
    assert token_budget_chunks([1, 1, 3], [1, 1, 1], 1, 4, shared=False) == [slice(0, 2), slice(2, 3)]
