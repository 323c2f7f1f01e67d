"""Run a command as the workers of a local ps-lite cluster, for MXNet's ``dist_sync`` kvstore.

``python -m shardloader.launch -n 2 -s 1 python train.py --lr 0.1`` starts, on 127.0.0.1:

- one **scheduler** and ``-s`` **servers** (default: as many as workers). Each runs
  ``python -c "import mxnet"``: with ``DMLC_ROLE`` set to ``scheduler`` or ``server``, importing
  MXNet enters ps-lite's serving loop (``mxnet.kvstore.kvstore_server``) and leaves the process
  once the workers have finalized;
- ``-n`` **workers**, each running the user's command. ``mx.kv.create('dist_sync')`` in a worker
  registers it with the scheduler, which assigns ``kv.rank`` once every node has registered.
  Ranks follow the scheduler's own ordering, not the launch order.

Every process gets the ps-lite variables: ``DMLC_ROLE``, ``DMLC_PS_ROOT_URI`` and
``DMLC_PS_ROOT_PORT`` (the scheduler's address), ``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, and
``DMLC_NODE_HOST`` (the address a node binds and advertises; without it ps-lite picks the first
network interface, which is not always reachable). ``DMLC_RANK`` is removed from the inherited
environment, because a node that already has one never takes the rank the scheduler assigns.
``PS_VERBOSE=1`` (``--verbose``) makes ps-lite log its connections.

Supervision and shutdown, one protocol for every way a run ends:

1. Each child starts in its own session, so its process group holds it and everything it forks
   (a loader's worker processes included), and Ctrl-C at a terminal reaches only the launcher.
   On Linux each child also asks the kernel for ``SIGTERM`` if the launcher dies, so even a
   launcher killed with ``SIGKILL`` leaves no scheduler, server or worker running. (Processes
   that a worker forked then depend on noticing their parent's death; nothing else is left to
   signal them.)
2. The launcher polls its children. The run fails at the first worker that exits non-zero (or
   is killed), at the first scheduler or server that exits non-zero, or when ``timeout``
   passes. It succeeds when every worker has exited 0; the scheduler and the servers are then
   given ``grace_period`` to exit on their own.
3. Teardown, in a ``finally`` and so also after ``KeyboardInterrupt`` or an error: ``SIGTERM``
   to every process group that still has a live member, wait up to ``grace_period``,
   ``SIGKILL`` to the groups still alive, reap. ``SIGINT`` and ``SIGTERM`` are held back while
   it runs, so an impatient second Ctrl-C cannot cut it short. A process that left its group
   (``setsid``) is outside this protocol.

With ``--hosts`` (``launch_hosts``), the same cluster is spread over several hosts: the
scheduler on the first, servers and workers round-robin, each process started through a remote
command template (``--remote``, ssh by default) under a small wrapper (``_wrapper``) that
stops the process's group on its host when the launcher closes the wrapper's stdin or dies.
Before start every host is checked through the template; a cluster that does not form within
``--connect-timeout`` ends the run (code 1) naming the hosts that cannot reach the scheduler.

The command line exits with the launcher's ``LaunchResult.returncode``: 0, the first failing
worker's exit code (``128 + signal`` for a worker killed by a signal), a failing scheduler's or
server's, 124 after ``--timeout``, ``128 + signal`` when the launcher is interrupted, 127 when
a command cannot be started.
"""

# The package: _nodes (exit codes, NodeProcess, LaunchResult), _cluster (starting, supervising
# and tearing down the processes and their groups), _local (launch_local), _hosts (parsing
# --hosts, placement, the remote template, the checks through it), _wrapper (the remote side,
# stdlib only), _remote (launch_hosts), _cli (the command line, which __main__ runs).
from ._cli import _parser as _parser
from ._cli import main
from ._cluster import _die_with_parent as _die_with_parent
from ._local import launch_local
from ._nodes import EXIT_CANNOT_START as EXIT_CANNOT_START
from ._nodes import EXIT_TIMEOUT as EXIT_TIMEOUT
from ._nodes import LaunchResult, NodeProcess
from ._remote import launch_hosts

__all__ = ["LaunchResult", "NodeProcess", "launch_hosts", "launch_local", "main"]
