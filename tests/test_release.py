"""MXNet's release of batch memory never runs Python (docs/design.md, invariant 7); and, at
the end, the package as it is released: requirements that do not pin a user's environment.

A Python deleter on MXNet's engine threads deadlocked every ``fork()`` that followed
training (MXNet's fork handler waits for the engine while the forking thread holds the
GIL), swallowed Ctrl-C, and crashed the interpreter at exit. The programs here run in a
child process with a deadline, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import mxnet as mx
import numpy as np
import pytest
from _backends import BACKENDS
from conftest import sigint_ignored

from shardloader._engine.ipc import bufferpool
from shardloader._engine.ipc import lease as _lease

_DEADLINE_S = 90


def _run_together(code: str, argvs, deadline: float = _DEADLINE_S):
    """Run ``code`` once per argument list in ``argvs``, in fresh interpreters started
    together (independent programs: each spends its first seconds importing MXNet), and
    return their ``CompletedProcess``es in order; a hang past the deadline fails the test."""
    script = textwrap.dedent(code)
    procs = [
        subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-c", script, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for argv in argvs
    ]
    end = time.monotonic() + deadline
    done = []
    try:
        for argv, proc in zip(argvs, procs):
            try:
                out, err = proc.communicate(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its session: the program and its workers
                out, err = proc.communicate()
                pytest.fail(
                    f"the program {argv} hung past {deadline}s; output so far:\n{out}\n{err}"
                )
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return done


_TRAIN_THEN_FORK = """
    import multiprocessing as mp, os, sys
    import numpy as np, mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon.data import ArrayDataset
    from shardloader import DataLoader

    mode = sys.argv[1]
    kw = {"inline": {}, "thread": {"num_workers": 2, "thread_pool": True},
          "process": {"num_workers": 2}}[mode]
    X = np.random.rand(256, 3, 16, 16).astype("float32")
    Y = (np.arange(256) % 10).astype("float32")
    train = DataLoader(ArrayDataset(X, Y), batch_size=32, shuffle=True, **kw)
    val = DataLoader(ArrayDataset(X, Y), batch_size=32, **kw)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, activation="relu"), gluon.nn.Flatten(), gluon.nn.Dense(10))
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for epoch in range(2):
        for x, y in train:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(x.shape[0])
        # The batches just freed are still being released by MXNet's engine: every one of
        # these forks used to deadlock here.
        n = sum(1 for _ in val)
        assert n == 8, n
        with mp.get_context("fork").Pool(2) as pool:
            assert pool.map(abs, [-1, -2]) == [1, 2]
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        assert os.waitpid(pid, 0)[1] >> 8 == 7
        gluon_val = gluon.data.DataLoader(ArrayDataset(X, Y), batch_size=32, num_workers=2)
        assert sum(1 for _ in gluon_val) == 8
    train.close()
    val.close()
    print("done")
"""


@pytest.mark.timeout(_DEADLINE_S + 30)
def test_forks_after_training_do_not_deadlock():
    modes = ["inline", "thread", "process"]
    # One program per worker mode, the three started together (a hang names its mode).
    for mode, proc in zip(modes, _run_together(_TRAIN_THEN_FORK, [[m] for m in modes])):
        assert proc.returncode == 0, f"{mode}:\n{proc.stdout}{proc.stderr}"
        assert proc.stdout.strip().endswith("done"), mode


_EXIT_WITH_PENDING_WORK = """
    import sys
    import numpy as np, mxnet as mx
    from mxnet import gluon
    from mxnet.gluon.data import ArrayDataset
    from shardloader import DataLoader

    X = np.random.rand(64, 3, 8, 8).astype("float32")
    net = gluon.nn.Dense(10)
    net.initialize()
    loader = DataLoader(ArrayDataset(X, np.arange(64)), batch_size=8, num_workers=2)
    for x, y in loader:
        out = net(x)  # still running when the interpreter exits
    if sys.argv[1] == "close":
        loader.close()
    print("done")
"""


@pytest.mark.timeout(_DEADLINE_S + 30)
@pytest.mark.parametrize("how", ["close", "leave-open"])
def test_exit_while_mxnet_still_reads_a_batch(how):
    """Exit-time finalizers used to unmap slots that MXNet operators were still reading."""
    for proc in _run_together(_EXIT_WITH_PENDING_WORK, [[how]] * 3):  # three programs at once
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Segmentation fault" not in proc.stderr, proc.stderr
        assert "terminate called" not in proc.stderr, proc.stderr


_CTRL_C = """
    import os, random, signal, threading, time
    # Ctrl-C must raise KeyboardInterrupt here even when the caller ignores SIGINT (a shell's
    # background job starts its programs so, and Python then installs no handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy as np
    from mxnet import autograd, gluon
    from mxnet.gluon.data import ArrayDataset
    from shardloader import DataLoader

    X = np.random.rand(512, 3, 8, 8).astype("float32")
    Y = (np.arange(512) % 10).astype("float32")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = random.Random(0)
    loader = DataLoader(ArrayDataset(X, Y), batch_size=16, shuffle=True, num_workers=2)
    interrupts = 0
    for attempt in range(int(os.environ["ATTEMPTS"])):
        sent = []
        delay = rng.uniform(0.0, 0.3)

        def interrupt():
            time.sleep(delay)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        # A fresh net each time: an interrupt inside backward() leaves autograd half done.
        net = gluon.nn.Dense(10)
        net.initialize()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
        waker = threading.Thread(target=interrupt)
        try:
            waker.start()  # inside the try: the interrupt may land before start() returns
            while True:  # train until the interrupt lands, wherever it lands
                for x, y in loader:
                    with autograd.record():
                        loss = loss_fn(net(x), y)
                    loss.backward()
                    trainer.step(x.shape[0])
        except KeyboardInterrupt:
            # Scaffolding for the next attempt: an interrupt inside autograd.record() can
            # leave MXNet recording (a real program would just end here).
            autograd.set_recording(False)
            autograd.set_training(False)
            late = time.monotonic() - sent[0]
            assert late < 2.0, f"the first Ctrl-C took {late:.2f}s to arrive"
            interrupts += 1
        waker.join()
    loader.close()
    print("interrupts", interrupts)
"""


@pytest.mark.timeout(_DEADLINE_S + 30)
def test_first_ctrl_c_always_interrupts_the_training_loop():
    """Each SIGINT, sent at a random point of a training loop, ends it with
    KeyboardInterrupt at once: none is swallowed in a deleter callback."""
    attempts = 25
    env = dict(os.environ, ATTEMPTS=str(attempts))
    with sigint_ignored():  # the harder caller: the program must set its own handler
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_CTRL_C)],
            capture_output=True,
            text=True,
            timeout=_DEADLINE_S,
            env=env,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"interrupts {attempts}" in proc.stdout
    assert "Exception ignored" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------ the lease itself


def _settle(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        _lease.reap_some()
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_a_wrapped_buffer_lives_until_mxnet_releases_it(no_thread_leak):
    buf = np.arange(12, dtype=np.float32).reshape(3, 4)
    alive = []
    import weakref

    wrapped = _lease.as_ndarray(buf)
    weakref.finalize(buf, alive.append, "freed")
    del buf
    view = wrapped[1:3]  # shares the memory
    pending = mx.nd.dot(wrapped, wrapped.T)  # an operator that reads it
    del wrapped
    gc.collect()
    assert view.asnumpy().tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert not _settle(lambda: alive, timeout=0.3), "released while a view still used it"
    del view
    pending.wait_to_read()
    del pending
    assert _settle(lambda: alive == ["freed"]), "never released"


def test_release_is_a_libc_call_not_a_python_callback():
    """The deleter MXNet calls is libc's sem_post: no Python, no GIL."""
    wrapped = _lease.as_ndarray(np.ones(4, np.float32))
    lease = _lease._registry._leases[-1].lease
    assert lease.deleter == _lease._registry._native.sem_post_addr
    del wrapped


@pytest.mark.mx2_smoke  # the one property of MXNet's C API that the leases rely on
def test_mxnet_keeps_the_lease_and_releases_it_by_its_own_address():
    """The lease protocol rests on one property of MXNet's DLPack import with
    ``transient_handle=False`` (1.9.1's ``MXNDArrayFromDLPackEx``, 2.x's
    ``MXNDArrayFromDLPack``): MXNet neither copies the ``DLManagedTensor`` nor frees it, reads
    the memory in place, and calls the deleter once, with the struct's own address, where
    the semaphore lives. Checked here with a recording deleter (test-only: a Python one)."""
    import ctypes

    calls = []
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(calls.append)
    native = _lease._registry._native or _lease._Native()
    buf = np.arange(6, dtype=np.float32)
    lease = _lease._Lease()
    tensor = lease.dl_tensor
    tensor.data = buf.ctypes.data
    tensor.ctx = _lease._DLContext(1, 0)
    tensor.ndim = 1
    tensor.dtype = _lease._DLDataType(2, 32, 1)
    shape = (ctypes.c_int64 * 1)(6)
    tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    lease.deleter = ctypes.cast(deleter, ctypes.c_void_p).value
    from mxnet.base import NDArrayHandle, check_call

    handle = NDArrayHandle()
    check_call(native.from_dlpack(ctypes.byref(lease), False, ctypes.byref(handle)))
    wrapped = mx.nd.NDArray(handle=handle)
    buf[0] = 42.0  # no copy: MXNet reads this memory
    assert wrapped.asnumpy()[0] == 42.0
    assert calls == []
    del wrapped
    gc.collect()
    mx.nd.waitall()
    assert _settle(lambda: calls == [ctypes.addressof(lease)]), calls


@pytest.mark.parametrize(
    "dtype", ["float16", "float32", "float64", "uint8", "int8", "int32", ">f4", ">i8"]
)
def test_wrapped_arrays_keep_values_and_dtype(dtype):
    """Big-endian arrays (">f4": binary formats, FITS) are copied into MXNet's native order,
    never wrapped as they are: their bytes read as little-endian were garbage."""
    src = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    for numpy_array in (False, True):
        out = _lease.as_ndarray(src.copy(), numpy_array)
        assert isinstance(out, mx.np.ndarray if numpy_array else mx.nd.NDArray)
        assert out.dtype == np.dtype(dtype).newbyteorder("=")
        np.testing.assert_array_equal(out.asnumpy(), src)


def test_the_background_reaper_stops_when_nothing_is_leased(no_thread_leak):
    out = _lease.as_ndarray(np.ones(8, np.float32))
    assert any(t.name == "shardloader-release" for t in __import__("threading").enumerate())
    del out
    assert _settle(lambda: _lease._registry.pending == 0)


def test_a_forked_child_can_still_use_and_release_wrapped_arrays():
    out = _lease.as_ndarray(np.arange(5, dtype=np.float32))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            code = 0 if out.asnumpy().tolist() == [0, 1, 2, 3, 4] else 3
            _lease.reap_some()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    del out


def test_interrupts_are_not_ignored_in_the_parent(no_thread_leak):
    """A KeyboardInterrupt raised while many wrapped arrays are freed reaches the caller:
    at once, or, when it lands in a destructor (MXNet 2.x's ``NDArray.__del__`` runs
    Python), at the next check a loader makes (docs/design.md, invariant 8)."""
    from shardloader._engine import interrupts as _interrupts

    _interrupts.install()  # as every loader does
    # An interrupt that cuts MXNet's own NDArray.__del__ short (it runs Python) leaves that
    # array's handle unfreed, in MXNet, as in any MXNet program: its lease is never posted.
    cut_short = []
    hook = sys.unraisablehook

    def spy(unraisable):
        name = getattr(unraisable.object, "__qualname__", "")
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and name.endswith(
            "NDArrayBase.__del__"
        ):
            cut_short.append(name)
        hook(unraisable)

    sys.unraisablehook = spy
    arrays = [_lease.as_ndarray(np.ones(16, np.float32)) for _ in range(200)]
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        deadline = time.monotonic() + 30  # pytest-timeout's SIGALRM is ours meanwhile
        with pytest.raises(KeyboardInterrupt):
            while time.monotonic() < deadline:
                arrays.append(_lease.as_ndarray(np.ones(16, np.float32)))
                del arrays[0]
                _interrupts.raise_pending()  # what the loader's next() does
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sys.unraisablehook = hook
    del arrays
    gc.collect()  # the interrupt's traceback may hold the frame (and array) it cut into
    assert _settle(lambda: _lease._registry.pending <= len(cut_short)), cut_short


# ---------------------------------------------------------------- reusing host buffers
# docs/design.md, invariant 10: a large inline batch's buffer is used again once MXNet has
# released the batch, and never while anything still refers to it.
_BIG = (64, 3, 48, 48)  # 1.8 MB of float32: above the pool's 1 MiB floor


def _data_ptr(array) -> int:
    return _lease.host_view(array).__array_interface__["data"][0]


def test_an_inline_batch_reuses_the_buffer_of_a_released_one(no_thread_leak):
    from shardloader import DataLoader

    X = np.random.default_rng(0).random((4 * _BIG[0],) + _BIG[1:], dtype=np.float32)
    seen = []
    with DataLoader(X, batch_size=_BIG[0]) as loader:
        for k, batch in enumerate(loader):
            np.testing.assert_array_equal(batch.asnumpy(), X[k * _BIG[0] : (k + 1) * _BIG[0]])
            seen.append(_data_ptr(batch))
            del batch
            mx.nd.waitall()
            _lease.reap_all()  # MXNet posted the batch's lease when it dropped the array
    assert len(set(seen)) < len(seen), f"no buffer was used twice: {seen}"


@pytest.mark.parametrize("mode", ["inline", "thread"])
def test_a_held_batch_is_never_overwritten(no_leaks, mode):
    from shardloader import DataLoader

    X = np.random.default_rng(1).random((6 * _BIG[0],) + _BIG[1:], dtype=np.float32)
    with DataLoader(X, batch_size=_BIG[0], **BACKENDS[mode]) as loader:
        held = [b for b in loader]  # every batch alive at once
        assert len({_data_ptr(b) for b in held}) == len(held)
        for k, batch in enumerate(held):
            np.testing.assert_array_equal(batch.asnumpy(), X[k * _BIG[0] : (k + 1) * _BIG[0]])
        del held, batch


def test_a_buffer_that_is_still_referred_to_stays_out_of_the_pool():
    pool = bufferpool.BufferPool()
    first = pool.take(_BIG, np.dtype(np.float32))
    memo = first[:1]  # a batchify function's memo: a view of the buffer
    pool.give_back(first)
    assert not pool._free, "pooled while a view of it was alive"
    del first
    again = pool.take(_BIG, np.dtype(np.float32))
    assert not np.shares_memory(again, memo)
    raw_id = id(again.base)  # not a reference: one would keep it out of the pool
    pool.give_back(again)
    assert [id(b) for b in pool._free] == [raw_id]  # nothing else refers to it: pooled
    small = pool.take((4,), np.dtype(np.float32))
    assert small.base is None  # under the floor: plain np.empty
    for _ in range(pool.MAX_FREE + 2):
        pool.give_back(pool.take((pool.MIN_BYTES // 4 + len(pool._free),), np.dtype(np.float32)))
    assert len(pool._free) <= pool.MAX_FREE


# ---------------------------------------------------------------- the released package
def test_the_runtime_requirements_pin_nothing():
    """``pip install`` of the clone or its wheel into a user's own environment must not pin
    (or downgrade) the user's packages: the runtime requirements are ranges, and only the
    two make commands install the exact versions of constraints.txt."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parent.parent
    with open(root / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    requirements = {re.match(r"[A-Za-z0-9_.-]+", r).group(0): r for r in project["dependencies"]}
    assert sorted(requirements) == ["mxnet", "numpy", "tqdm"]
    for requirement in requirements.values():
        assert "==" not in requirement and "~=" not in requirement, requirement
    # The one upper bound that is not MXNet's own: MXNet 1.9.1 and 2.0.0b1 use np.bool.
    assert "<1.24" in requirements["numpy"]
    assert "numpy==" in (root / "constraints.txt").read_text()
