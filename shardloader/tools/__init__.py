"""The ``shardloader`` command line, an application of the library: ``cli`` (the parser),
``demo`` (a small training run against Gluon's loader, with checkpoints), ``bench`` (a
loader measured on your dataset) and ``measure`` (the measuring kernels ``bench`` shares with
the repository's ``benchmarks/``). Nothing in the library imports this package."""
