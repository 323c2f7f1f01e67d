"""MXNet 2.x's C++ data pipeline, for ``try_nopython=True`` (docs/switching.md,
"try_nopython"): where Gluon would use it, the loader hands its epochs to it instead of
shardloader's own stages."""

from __future__ import annotations

from .._compat import MX2

__all__ = ["cpp_pipeline"]

# shardloader's options that MXNet 2.x's C++ pipeline cannot honour, with their defaults.
_NOT_IN_CPP = (
    ("seed", None),
    ("mxnet_seed", "batch"),
    ("num_shards", 0),
    ("num_parts", 1),
    ("even_size", False),
    ("worker_init_fn", None),
    ("on_worker_death", "raise"),
)


def cpp_pipeline(
    opts, dataset, sampler, batch_sampler, batchify_fn, start_method, default_batchify: bool
):
    """MXNet 2.x's C++ pipeline for this loader, where ``try_nopython=True`` asks for it and
    Gluon would use it; else ``None``.

    Gluon (2.0.0b1) asks ``_check_mx_loader_capability`` whether the dataset, the batch
    sampler and the batchify function it would use all have C++ counterparts. Where they do,
    the C++ pipeline loads the batches here too, so they are Gluon's, whatever its
    conventions (tuples, float32 values). Where they do not, Gluon's ``RuntimeError`` is
    raised, with Gluon's message. ``try_nopython=None`` does not take this path: Gluon would
    switch silently, but shardloader keeps its own workers and the batches of Gluon's
    Python pipeline (docs/switching.md says why).
    """
    if not MX2 or not opts.try_nopython or opts.num_workers == 0:
        return None  # Gluon ignores try_nopython without workers too
    from mxnet.gluon.data import batchify as gluon_batchify
    from mxnet.gluon.data import dataloader as gluon_loader
    from mxnet.gluon.data import sampler as gluon_sampler

    check = getattr(gluon_loader, "_check_mx_loader_capability", None)
    pipeline = getattr(gluon_loader, "_MXThreadedDataLoader", None)
    if check is None or pipeline is None:
        import mxnet as mx

        raise ValueError(
            f"try_nopython=True: this MXNet ({mx.__version__}) has no C++ data pipeline that "
            "shardloader knows (it uses MXNet 2.0's); use try_nopython=None or False"
        )
    if batch_sampler is None:  # the batch sampler Gluon would build from these arguments
        if sampler is None:
            length = len(dataset)
            sampler = (
                gluon_sampler.RandomSampler(length)
                if opts.shuffle
                else gluon_sampler.SequentialSampler(length)
            )
        batch_sampler = gluon_sampler.BatchSampler(
            sampler, opts.batch_size, opts.last_batch or "keep"
        )
    if default_batchify:  # the installed Gluon's default batchify, as Gluon has it
        batchify_fn = gluon_batchify.Stack(use_shared_mem=True)
    usable, args = check(dataset, batch_sampler, batchify_fn)
    if not usable:
        raise RuntimeError(args)  # Gluon's message, word for word
    _refuse_options(opts, start_method)
    return pipeline(
        num_workers=opts.num_workers,
        pin_memory=opts.pin_memory,
        pin_device_id=opts.pin_device_id,
        prefetch=opts.prefetch,
        **args,
    )


def _refuse_options(opts, start_method) -> None:
    """Refuse the options the C++ pipeline cannot honour, naming them."""
    given = [
        f"{name}={getattr(opts, name)!r}"
        for name, default in _NOT_IN_CPP
        if getattr(opts, name) != default
    ]
    if start_method is not None:
        given.append(f"start_method={start_method!r}")
    if given:
        raise ValueError(
            "try_nopython=True hands this loader to MXNet's C++ pipeline, which cannot honour "
            f"{', '.join(given)}; drop {'it' if len(given) == 1 else 'them'}, or use "
            "try_nopython=None for shardloader's own workers, which give the batches of "
            "Gluon's Python pipeline"
        )
