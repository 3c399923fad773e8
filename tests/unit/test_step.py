"""Forward/backward passes built by token budget: whole groups, in order, each pass within the budget unless a
single group exceeds it."""

from coati.distributed.trainer.forward import token_budget_chunks


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


def test_the_layout_of_fewest_estimated_flops_is_chosen_among_the_allowed():
    from coati.distributed.trainer.forward import choose_layout

    every = ("rows", "prompt_cache", "packed")
    # 2 groups of 4, prompts of 60, responses of 10 but one of 48 (padding): tokens + 0.001 x attention pairs.
    p, r = [60] * 8, [10, 10, 10, 48, 10, 10, 10, 10]
    # rows: 8 x 108 + 0.001 x 8 x 108^2 = 957.3; prompt_cache: 2 x 60 + 8 x 48 + 0.001 x (2 x 3600 + 8 x 48 x 108)
    # = 504 + 48.7 = 552.7; packed: longest group 60 + 78 = 138: 2 x 138 + 0.001 x 2 x 138^2 = 314.1.
    assert choose_layout(p, r, 4, 0.001, every) == "packed"
    assert choose_layout(p, r, 4, 0.001, ("rows", "prompt_cache")) == "prompt_cache"
    assert choose_layout(p, r, 4, 0.001, ("rows",)) == "rows"
    assert choose_layout(p[:3], r[:3], 4, 0.001, ("rows",)) == "rows"  # passes of single rows, not whole groups
    # 16 responses of 500 after a prompt of 100: packing one group in a row of 8100 tokens makes its dense attention
    # (0.001 x 8100^2 = 65,610) cost more than the shared cache (0.001 x (100^2 + 16 x 500 x 600) = 4,810 plus 8,100
    # tokens).
    assert choose_layout([100] * 16, [500] * 16, 16, 0.001, every) == "prompt_cache"
    # Groups of one: nothing to share, and rows cost what the others cost; the first allowed wins a tie.
    assert choose_layout([5, 7], [3, 3], 1, 0.0, every) == "rows"


def test_a_step_plan_trains_every_row_once_per_pass_in_its_rank_s_shard():
    """StepPlan: each DP rank's minibatches partition its shard, and minibatch m's global rows (the loss's
    normalisation) are exactly the ranks' minibatch m, so over the ranks every row of the batch is trained once per
    pass."""
    import numpy as np

    from coati.distributed.trainer.step import StepPlan

    rows, dp, minibatches = 24, 3, 2
    plans = [StepPlan(rows, dp, rank, minibatches, num_iterations=2) for rank in range(dp)]
    assert plans[0].optimizer_steps == 4 and plans[0].minibatch == 4
    trained = []
    for m in range(minibatches):
        mine = [plan.shard_rows[plan.local(m)] for plan in plans]
        assert sorted(np.concatenate(mine)) == sorted(plans[0].global_rows(m))
        trained += [int(r) for rows_m in mine for r in rows_m]
    assert sorted(trained) == list(range(rows))
    for plan in plans:
        assert list(plan.shard_rows) == list(range(plan.dp_rank * 8, plan.dp_rank * 8 + 8))  # contiguous: whole groups
