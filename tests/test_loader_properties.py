"""Property test: random mixes of sampler, workers, prefetch, early break and failures."""

from __future__ import annotations

import pytest
from _datasets import FailingDataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardloader import ShardedDataLoader

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.usefixtures("no_leaks")]

POOLS = st.sampled_from(
    [
        dict(num_workers=0),
        dict(num_workers=1),
        dict(num_workers=2),
        dict(num_workers=2, thread_pool=True),
        dict(num_workers=3, on_worker_death="restart"),
    ]
)


def ids(batch):
    return [int(v) for v in batch[1].asnumpy()]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 7),
    pool=POOLS,
    prefetch=st.one_of(st.none(), st.integers(0, 6)),
    shuffle=st.booleans(),
    seed=st.integers(0, 1000),
    last_batch=st.sampled_from(["keep", "discard", "rollover"]),
    break_at=st.one_of(st.none(), st.integers(0, 8)),
    fail_at=st.one_of(st.none(), st.integers(0, 39)),
)
def test_order_completeness_and_failures(
    n, batch_size, pool, prefetch, shuffle, seed, last_batch, break_at, fail_at
):
    common = dict(batch_size=batch_size, shuffle=shuffle, seed=seed, last_batch=last_batch)
    # Ground truth: the sampler order, loaded inline from a dataset that never fails.
    with ShardedDataLoader(FailingDataset(n, bad=-1), **common) as reference:
        expected = [[ids(b) for b in reference] for _ in range(2)]

    ds = FailingDataset(n, bad=-1 if fail_at is None else fail_at)
    disturbed = False  # an epoch ended early: with rollover, the next epoch's carry differs
    with ShardedDataLoader(ds, prefetch=prefetch, **common, **pool) as loader:
        for epoch in range(2):
            exact = not (disturbed and last_batch == "rollover")
            got = []
            try:
                for i, batch in enumerate(loader):
                    if break_at is not None and i == break_at and epoch == 0:
                        disturbed = True
                        break
                    got.append(ids(batch))
            except KeyError as err:
                disturbed = True
                assert f"sample {fail_at} is broken" in str(err)
                assert not any(fail_at in b for b in got)
                if exact:
                    # The error surfaces exactly at the first batch holding the bad sample.
                    first_bad = next(j for j, b in enumerate(expected[epoch]) if fail_at in b)
                    assert got == expected[epoch][:first_bad]
                continue
            flat = [i for b in got for i in b]
            assert len(flat) == len(set(flat)) or last_batch == "rollover"
            if exact and break_at is not None and epoch == 0:
                assert got == expected[0][:break_at]
            elif exact:
                assert got == expected[epoch]
