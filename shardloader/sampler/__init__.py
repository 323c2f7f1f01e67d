"""Samplers: the order in which a loader visits a dataset, and how it groups it.

Index samplers yield sample indices, batch samplers yield batches (lists of indices), and
step samplers yield steps (lists of ``num_shards`` batches, one per device). Every sampler
here follows one protocol, on top of ``__iter__`` and ``__len__``:

- ``set_epoch(epoch)``: the order of the next pass is a pure function of ``(seed, epoch)``.
  Each pass advances the epoch by one, so a loop that never calls ``set_epoch`` still gets a
  new order every pass, as with Gluon. Wrappers forward the epoch to what they wrap.
- ``state_dict()`` / ``load_state_dict(state)``: a small JSON-serialisable dict (type,
  identifying arguments, seed, epoch, offset into the pass, rollover carry, wrapped sampler's
  state). Loaded into a freshly built sampler with the same arguments, it replays the rest of
  the pass exactly; a state for other arguments raises ``ValueError``.
- Random samplers take a keyword-only ``seed``; ``None`` draws one from numpy's global RNG
  when the sampler is built, and ``.seed`` tells which.

Gluon's ``SequentialSampler``, ``RandomSampler``, ``FilterSampler`` and ``BatchSampler``
keep MXNet 1.9.1's order, ``last_batch`` semantics and ``len()`` (MXNet 2.x's are the same),
and ``IntervalSampler`` keeps MXNet 2.x's order. ``SplitSampler``,
``FixedBucketSampler``, ``SortedBucketSampler`` and ``SortedSampler`` follow gluon-nlp.

Step samplers (``ShardGroupSampler``, ``FixedBucketSampler(num_shards=N)``) give every step
``num_shards`` non-empty shards by default, so that no device of a data-parallel ``Trainer``
is left with a stale gradient: a short last step is filled by spreading its samples over the
shards. Only ``last_group='partial'`` yields a step with fewer shards. Nothing is repeated
within a pass, except samples that fill a last step which has fewer samples than shards
(counted by ``repeated_samples``) and what an option (``even_size``, ``repeat``,
``last_group='pad'``) asks for.
"""

from ._base import FilledStep, Sampler
from ._batch import BatchSampler, ShardGroupSampler, fill_step
from ._bucket import FixedBucketSampler
from ._index import FilterSampler, IntervalSampler, RandomSampler, SequentialSampler
from ._scheme import BucketScheme, ConstWidthBucket, ExpWidthBucket, LinearWidthBucket
from ._sorted import SortedBucketSampler, SortedSampler
from ._split import PartitionSampler, SplitSampler

__all__ = [
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "FilterSampler",
    "IntervalSampler",
    "BatchSampler",
    "ShardGroupSampler",
    "PartitionSampler",
    "SplitSampler",
    "FixedBucketSampler",
    "SortedBucketSampler",
    "SortedSampler",
    "FilledStep",
    "fill_step",
    "BucketScheme",
    "ConstWidthBucket",
    "LinearWidthBucket",
    "ExpWidthBucket",
]
