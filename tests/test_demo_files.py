"""The demo's files and words: it writes nothing through a planted link, unpickles nothing it
did not write, refuses folders others can write to, and says what its numbers mean."""

from __future__ import annotations

import json
import os
import pickle
import pty
import re
import signal
import stat
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest
from conftest import ARRAYS
from mxnet import gluon
from test_demo_state import FakeLoader  # the checkpoint's view of a loader

from shardloader.tools import cli
from shardloader.tools.demo import stall_advice
from shardloader.tools.demo_data import MANIFEST, prepare
from shardloader.tools.demo_state import (
    Checkpoint,
    CheckpointCorrupt,
    CheckpointMismatch,
    UnsafeFolder,
    check_own_folder,
)

pytestmark = pytest.mark.timeout(60)

CONFIG = {"seed": 0, "batch_size": 4}
TINY = ["--train-size", "400", "--test-size", "100"]


def real_model():
    """A Gluon net and Trainer whose files are MXNet's own (parameters; pickled states)."""
    net = gluon.nn.Dense(3, in_units=4)
    net.initialize(mx.init.Xavier(), mx.cpu())
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    with mx.autograd.record():
        loss = net(ARRAYS.ones((2, 4))).sum()
    loss.backward()
    trainer.step(2)  # the optimizer now has states to save
    return net, trainer


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_bytes(b"precious")
    return path


# ------------------------------------------------------------------- item 10: the manifest
def test_the_manifest_is_not_written_through_a_planted_link(tmp_path, victim):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.symlink(victim, cache / f"{MANIFEST}.{os.getpid()}.tmp")  # the old predictable name
    data = prepare(str(cache), train_size=12, test_size=6, progress=False)
    assert data.rebuilt
    assert victim.read_bytes() == b"precious"
    assert json.loads((cache / MANIFEST).read_text())["sizes"] == {"train": 12, "test": 6}
    assert not prepare(str(cache), train_size=12, test_size=6, progress=False).rebuilt


# ------------------------------------------------- item 11: parameters and trainer states
@pytest.mark.parametrize("planted", ["model-e0-b1.params", "trainer-e0-b1.states"])
def test_checkpoint_files_are_not_written_through_a_planted_link(tmp_path, victim, planted):
    folder = tmp_path / "ckpt"
    folder.mkdir(mode=0o700)
    os.symlink(victim, folder / planted)  # the name the save is about to use
    net, trainer = real_model()
    Checkpoint(str(folder), CONFIG).save(net, trainer, FakeLoader(0, 1))
    assert victim.read_bytes() == b"precious"
    assert not (folder / planted).is_symlink()
    restored, restored_trainer = real_model()
    loader = FakeLoader()
    state = Checkpoint(str(folder), CONFIG).load(restored, restored_trainer, loader, mx.cpu())
    assert state["loader"] == loader.loaded == {"epoch": 0, "consumed": 1}
    assert np.array_equal(restored.weight.data().asnumpy(), net.weight.data().asnumpy())


class _Payload:
    """Unpickling it creates ``marker``: what a planted trainer-states file could do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_resume_never_unpickles_a_planted_trainer_state(tmp_path):
    folder = tmp_path / "ckpt"
    net, trainer = real_model()
    Checkpoint(str(folder), CONFIG).save(net, trainer, FakeLoader(0, 1))
    states = next(folder.glob("trainer-*.states"))
    marker = tmp_path / "the attacker's code ran"
    states.write_bytes(pickle.dumps(_Payload(str(marker))))

    with pytest.raises(CheckpointCorrupt, match="not the file the demo wrote there") as error:
        Checkpoint(str(folder), CONFIG).load(*real_model(), FakeLoader(), mx.cpu())
    assert str(states) in str(error.value) and f"delete {folder}" in str(error.value)
    assert not marker.exists()


def test_a_checkpoint_without_checksums_is_not_loaded(tmp_path):
    folder = tmp_path / "ckpt"
    net, trainer = real_model()
    Checkpoint(str(folder), CONFIG).save(net, trainer, FakeLoader(0, 1))
    state = json.loads((folder / "state.json").read_text())
    del state["sha256"]
    (folder / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointCorrupt, match="records no SHA-256"):
        Checkpoint(str(folder), CONFIG).load(*real_model(), FakeLoader(), mx.cpu())
    state["version"] = 1  # a checkpoint of the demo before checksums
    (folder / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointMismatch, match="format version 1, expected 2"):
        Checkpoint(str(folder), CONFIG).load(*real_model(), FakeLoader(), mx.cpu())


# ------------------------------------------------------ item 11: folders others can write
def test_a_folder_others_can_write_is_refused(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(UnsafeFolder) as error:
        check_own_folder(str(folder), "checkpoint folder")
    message = str(error.value)
    assert f"the checkpoint folder {folder} can be written by others (mode drwxrwxrwx)" in message
    assert f"chmod go-w {folder}" in message and "pickles" in message
    with pytest.raises(UnsafeFolder):
        Checkpoint(str(folder), CONFIG).save(*real_model(), FakeLoader(0, 1))
    with pytest.raises(UnsafeFolder):
        Checkpoint(str(folder), CONFIG).load(*real_model(), FakeLoader(), mx.cpu())
    assert os.listdir(folder) == []  # nothing read, nothing written
    folder.chmod(0o775)
    with pytest.raises(UnsafeFolder, match="can be written by others"):
        check_own_folder(str(folder), "checkpoint folder")  # the group, too
    folder.chmod(0o755)
    check_own_folder(str(folder), "checkpoint folder")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)
    with pytest.raises(UnsafeFolder, match=r"belongs to .*uid 65534.*, not to you"):
        check_own_folder(str(folder), "cache folder")


def test_a_folder_in_a_parent_anyone_can_write_is_refused_unless_sticky(tmp_path):
    parent = tmp_path / "public"
    parent.mkdir()
    parent.chmod(0o777)
    folder = parent / "mine"
    folder.mkdir(mode=0o700)
    with pytest.raises(UnsafeFolder, match="without the sticky bit"):
        check_own_folder(str(folder), "cache folder")
    parent.chmod(0o777 | stat.S_ISVTX)  # like /tmp: others cannot rename it away
    check_own_folder(str(folder), "cache folder")


def test_the_demo_refuses_a_cache_folder_others_can_write(tmp_path, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    assert cli.main(["demo", "--cache-dir", str(cache), *TINY]) == 2
    err = capsys.readouterr().err
    assert f"error: the cache folder {cache} can be written by others" in err
    assert os.listdir(cache) == []


def test_new_folders_are_the_users_alone(tmp_path):
    cache = tmp_path / "new" / "cache"
    prepare(str(cache), train_size=12, test_size=6, progress=False)
    folder = cache / "checkpoint"
    Checkpoint(str(folder), CONFIG).save(*real_model(), FakeLoader(0, 1))
    for path in (cache, folder):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700


# ----------------------------------------------------------------- issue 24: the words
@pytest.mark.parametrize(
    "stall, workers, cores, expected",
    [
        (0.01, 2, 8, "good: the training waited for data 1% of the time"),
        (0.10, 2, 8, "fair: the training waited for data 10% of the time; try --num-workers 4"),
        (0.50, 0, 8, "poor: the training waited for data 50% of the time; run --num-workers 2"),
        (0.50, 6, 8, "poor: the training waited for data 50% of the time; try --num-workers 7"),
        (0.30, 2, 2, "the 2 workers and the training loop already use the 2 cores"),
    ],
)
def test_the_stall_is_judged_with_what_to_change(stall, workers, cores, expected):
    assert expected in stall_advice(stall, workers, cores)


_BAR = """
from shardloader.tools.demo import progress_bar

bar = progress_bar(5, "epoch 1/1")
for _ in range(5):
    bar.update(1)
bar.close()
"""


def test_progress_bars_survive_a_terminal_that_reports_no_width():
    """A pty reports 0 columns until someone sets them; tqdm then drew nothing at all."""
    controller, terminal = pty.openpty()  # its size is 0 x 0
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BAR], stdout=terminal, stderr=terminal, env=env
        )
    finally:
        os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: the program has exited and closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert proc.wait(timeout=30) == 0, output
    text = output.decode(errors="replace")
    assert re.search(r"epoch 1/1: 100%\|.*\| 5/5 ", text), text


# The demo's batch count and its words after --stop-after-batches and --resume (what to do
# next, the data stall, --gluon, no "reorder") are checked on the interrupted and resumed runs
# of tests/test_cli.py's test_demo_resumes_mid_epoch_to_the_same_result.


# Runs the demo as `python -m shardloader` does, with Ctrl-C's default handler whatever the
# caller's (a background job ignores SIGINT).
_DEMO_WITH_CTRL_C = """
import runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.argv = ["shardloader"] + sys.argv[1:]
runpy.run_module("shardloader", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ctrl_c_says_where_resume_will_continue(tmp_path):
    cache = tmp_path / "cache"
    options = ["demo", "--epochs", "200", *TINY, "--cache-dir", str(cache)]
    proc = subprocess.Popen(
        [sys.executable, "-c", _DEMO_WITH_CTRL_C, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        state = cache / "checkpoint" / "state.json"
        while not state.exists() and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, out + err
    position = json.loads(state.read_text())["loader"]
    where = (
        f"in epoch {position['epoch'] + 1}, after batch {position['consumed']}"
        if position["consumed"]
        else f"at the start of epoch {position['epoch'] + 1}"
    )
    assert (
        f"Interrupted. The last checkpoint, in {cache / 'checkpoint'}, is {where}: run the same "
        f"command with --resume to continue from there." in err
    ), err
    assert "Traceback" not in err, err
