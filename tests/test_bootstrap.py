"""sdlib.core.bootstrap: the seeding rule, weights equal to explicit resampling (a slow loop over the same draws),
blocks by hand, paired identical arms exactly 1, the two-level scheme with one cluster equal to the plain one,
and coverage on synthetic normal samples (deterministic by seed, about a second)."""

import numpy as np
import pytest

from sdlib.core import bootstrap as B


def test_seeding_rule_is_stable_and_canonical():
    a = B.rng("cell", "gsm8k", 32).integers(0, 10**9, 5)
    # the same cell by any scalar type gives the same draws
    for key in [("cell", "gsm8k", np.int64(32)), ("cell", np.str_("gsm8k"), 32.0)]:
        assert (B.rng(*key).integers(0, 10**9, 5) == a).all()
    assert not (B.rng("cell", "gsm8k", 8).integers(0, 10**9, 5) == a).all()
    # the rule itself: default_rng(SeedSequence([BASE_SEED, *crc32 of each part]))
    import zlib

    ref = np.random.default_rng(np.random.SeedSequence([B.BASE_SEED, zlib.crc32(b"cell"), zlib.crc32(b"gsm8k"),
                                                         zlib.crc32(b"32")]))
    assert (ref.integers(0, 10**9, 5) == a).all()
    assert B.key_ints([None]) == B.key_ints([float("nan")]) == B.key_ints(["NA"])


def test_unit_weights_equal_explicit_resampling():
    n, n_boot = 7, 50
    W = B.unit_weights(n, n_boot, B.rng("t"))
    idx = B.rng("t").integers(0, n, size=(n_boot, n))
    slow = np.zeros((n_boot, n))
    for b in range(n_boot):
        for i in idx[b]:
            slow[b, i] += 1
    assert (W == slow).all() and (W.sum(axis=1) == n).all()
    x, y = np.arange(1.0, n + 1), np.arange(2.0, n + 2) ** 2
    # a replicate's ratio of means = the ratio over the explicitly drawn units
    np.testing.assert_allclose(B.ratio(W, x, y), x[idx].mean(axis=1) / y[idx].mean(axis=1), rtol=1e-14)
    np.testing.assert_allclose(B.mean(W, x), x[idx].mean(axis=1), rtol=1e-14)
    # cached weights are the same numbers, read-only
    K = B.keyed_unit_weights(("t",), n, n_boot)
    assert (K == W).all() and not K.flags.writeable


def test_paired_identical_arms_are_exactly_one():
    x = np.random.default_rng(0).lognormal(size=40)
    W = B.unit_weights(len(x), 300, B.rng("same"))
    assert (B.ratio(W, x, x) == 1.0).all()
    assert B.paired_ratio_interval(x, x, B.rng("same")) == (1.0, 1.0)
    # columns are paired series: the same W for every column
    M = np.column_stack([x, 2 * x])
    r = B.ratio(W, M, np.column_stack([x, x]))
    assert (r[:, 0] == 1.0).all() and np.allclose(r[:, 1], 2.0)
    assert np.isnan(B.paired_ratio_interval(x[:1], x[:1], B.rng("same"))).all()


def test_blocks_by_hand():
    # 10 steps in 3 blocks: edges round(0, 3.33, 6.67, 10) = 0, 3, 7, 10
    assert B.block_sums(np.arange(1, 11), 3).tolist() == [6.0, 22.0, 27.0]
    assert B.n_blocks(1) == 0 and B.n_blocks(2) == 2 and B.n_blocks(1000) == 100  # length 10
    # a ratio of sums over all blocks is the whole series' ratio
    t, s = np.arange(1.0, 101), np.linspace(1, 2, 100)
    nb = B.n_blocks(len(t))
    assert B.block_sums(t, nb).sum() / B.block_sums(s, nb).sum() == pytest.approx(t.sum() / s.sum(), rel=1e-14)


def test_interval_by_hand():
    assert B.interval(np.arange(101.0), level=0.9) == pytest.approx((5.0, 95.0))
    assert B.interval(np.array([np.nan, 1.0, np.inf, 3.0]), 0.5) == (1.5, 2.5)
    assert np.isnan(B.interval(np.array([np.nan]))).all()
    lo, hi = B.interval(np.column_stack([np.arange(101.0), np.full(101, np.nan)]), 0.9)
    assert lo[0] == pytest.approx(5.0) and np.isnan(lo[1]) and hi[0] == pytest.approx(95.0)


def test_two_levels_with_one_cluster_are_the_plain_bootstrap():
    W = B.unit_weights(9, 200, B.rng("c"))
    assert (B.cluster_weights([9], 200, B.rng("c")) == W).all()
    assert (B.cluster_weights([9], 200, B.rng("c"), resample_clusters=False) == W).all()
    st = B.cluster_stats([9], 200, B.rng("c"), lambda c, cnt: cnt @ np.arange(9.0))
    assert st.shape == (200, 1) and (st[:, 0] == W @ np.arange(9.0)).all()


def test_cluster_ratio_interval():
    g = np.random.default_rng(3)
    x, y = g.lognormal(size=30), g.lognormal(size=30)
    # one cluster: the plain paired interval, draw for draw
    assert B.cluster_ratio_interval(x, y, np.zeros(30), B.rng("r")) == B.paired_ratio_interval(x, y, B.rng("r"))
    # units are laid out cluster by cluster (stable): the same as cluster_weights on the sorted units
    c = np.tile([2, 0, 1], 10)
    o = np.argsort(c, kind="stable")
    W = B.cluster_weights([10, 10, 10], B.N_BOOT, B.rng("r"))
    assert B.cluster_ratio_interval(x, y, c, B.rng("r")) == B.interval(B.ratio(W, x[o], y[o]))
    assert B.cluster_ratio_interval(x, x, c, B.rng("r")) == (1.0, 1.0)


def test_two_levels_equal_a_slow_loop():
    sizes, n_boot = [3, 5, 2], 40
    W = B.cluster_weights(sizes, n_boot, B.rng("h"))
    # the documented draw order: clusters per slot, then per cluster the slots that drew it (row-major)
    g = B.rng("h")
    cl = g.integers(0, 3, size=(n_boot, 3))
    units = {c: iter(g.integers(0, n, size=(int((cl == c).sum()), n))) for c, n in enumerate(sizes)}
    start = [0, 3, 8]
    slow = np.zeros((n_boot, 10))
    for b in range(n_boot):
        for s in range(3):
            c = cl[b, s]
            for i in next(units[c]):
                slow[b, start[c] + i] += 1
    assert (W == slow).all()
    # every replicate draws 3 clusters: its total weight is the drawn clusters' sizes
    assert (W.sum(axis=1) == np.array(sizes)[cl].sum(axis=1)).all()
    # per-slot statistics from the same draws add up to the weights' statistic
    x = np.arange(10.0)
    st = B.cluster_stats(sizes, n_boot, B.rng("h"), lambda c, cnt: cnt @ x[start[c]:start[c] + sizes[c]])
    np.testing.assert_allclose(st.sum(axis=1), W @ x)
    # stratified: every cluster kept, each with its own count of units
    S = B.cluster_weights(sizes, n_boot, B.rng("h"), resample_clusters=False)
    assert (S[:, :3].sum(axis=1) == 3).all() and (S[:, 3:8].sum(axis=1) == 5).all() and (S[:, 8:].sum(axis=1) == 2).all()


def _coverage(draw, ci, reps):
    return np.mean([lo <= 0.0 <= hi for lo, hi in (ci(draw(np.random.default_rng(r)), r) for r in range(reps))])


def test_coverage_on_normal_samples():
    """95% intervals of a mean of 40 N(0, 1) draws cover 0 in about 95% of 300 samples (sd of the share ~1.3%)."""
    def ci(x, r):
        return B.interval(B.mean(B.unit_weights(len(x), 400, B.rng("coverage", r)), x))

    cov = _coverage(lambda g: g.normal(size=40), ci, 300)
    assert 0.91 <= cov <= 0.98, cov


def test_two_levels_cover_where_units_alone_do_not():
    """30 clusters x 5 units, cluster effect sd 1, unit sd 1: the mean's variance is (1 + 1/5)/30, three times
    what treating the 150 units as independent assumes; the two-level interval covers, the one-level one not."""
    sizes = [5] * 30

    def draw(g):
        return (g.normal(size=30)[:, None] + g.normal(size=(30, 5))).ravel()

    def two(x, r):
        return B.interval(B.mean(B.cluster_weights(sizes, 300, B.rng("two", r)), x))

    def one(x, r):
        return B.interval(B.mean(B.unit_weights(len(x), 300, B.rng("one", r)), x))

    assert _coverage(draw, two, 200) >= 0.88
    assert _coverage(draw, one, 200) <= 0.80


def test_few_cluster_interval_is_a_t_interval_on_the_log_scale():
    from sdlib.core import bootstrap as B

    assert B.t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert B.t_quantile(0.975, 3) == pytest.approx(3.18245, abs=1e-5)
    assert np.isnan(B.t_quantile(0.975, 0))
    reps = np.exp(np.array([-0.1, 0.0, 0.1, 0.0]))  # sd of the logs 0.0816...
    lo, hi = B.few_cluster_interval(1.0, reps, n_clusters=4)
    se = np.std(np.log(reps), ddof=1) * np.sqrt(4 / 3)
    assert (lo, hi) == pytest.approx((np.exp(-3.18245 * se), np.exp(3.18245 * se)), rel=1e-5)
    assert B.few_cluster_interval(1.2, np.full(10, 1.2), 4) == pytest.approx((1.2, 1.2))  # no spread, no width
    assert np.isnan(B.few_cluster_interval(1.0, reps, 1)[0])  # one cluster: no between-cluster variance to see
