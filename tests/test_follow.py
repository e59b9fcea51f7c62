"""``logs -f``'s parts: a folder's changes (``launcher.host.changes``: inotify on the real kernel,
polling with a fake clock), and the follower (``launcher.tools.follow``) fed batches of changes."""

import logging
import os
import shutil
import struct

import pytest

from launcher.host import changes
from launcher.host.changes import Changed
from launcher.output import state_file as state
from launcher.tools import follow as follow_tool
from launcher.tools import logs as log_tool


def raw_event(mask, name=b""):
    """One event as the kernel writes it: its name padded with NULs."""
    padded = name + b"\0" * (16 - len(name) % 16) if name else b""
    return struct.pack("iIII", 1, mask, 0, len(padded)) + padded


def follower_of(folder):
    files = log_tool.log_files(str(folder))
    return follow_tool.Follower(files, log_tool.sizes(files, True), None,
                                lambda found: log_tool.new_logs(str(folder), found, None))


def append(path, data: bytes):
    with open(path, "ab") as f:
        f.write(data)


# ---------------------------------------------------------------- the kernel's reports, read


def test_inotify_events_become_one_batch_in_the_order_first_reported():
    data = b"".join([raw_event(changes.IN_MODIFY, b"workerlog.1"), raw_event(changes.IN_CREATE, b"workerlog.2"),
                     raw_event(changes.IN_MODIFY, b"workerlog.1"), raw_event(changes.IN_DELETE, b"workerlog.0"),
                     raw_event(changes.IN_MOVED_TO, b"workerlog.0")])
    events = changes.parse_events(data)
    assert [name for _, name in events] == ["workerlog.1", "workerlog.2", "workerlog.1", "workerlog.0", "workerlog.0"]
    got = changes.batch(events)
    assert got == Changed(("workerlog.1", "workerlog.2", "workerlog.0"), frozenset({"workerlog.0"}))


@pytest.mark.parametrize("mask, field", [(changes.IN_Q_OVERFLOW, "everything"), (changes.IN_DELETE_SELF, "gone"),
                                         (changes.IN_MOVE_SELF, "gone"), (changes.IN_IGNORED, "gone"),
                                         (changes.IN_UNMOUNT, "gone")])
def test_an_overflow_or_the_folder_itself_is_said_so(mask, field):
    got = changes.batch(changes.parse_events(raw_event(mask)))
    assert getattr(got, field) and got.names == ()


def test_inotify_reports_writes_new_files_removals_and_the_folder_gone(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "workerlog.0").write_bytes(b"")
    watch = changes.InotifyChanges(str(folder))
    try:
        assert watch.wait(0) == Changed()
        append(folder / "workerlog.0", b"x\n")
        (folder / "workerlog.1").write_bytes(b"y\n")
        assert watch.wait(5).names == ("workerlog.0", "workerlog.1")
        os.rename(folder / "workerlog.1", folder / "moved")
        got = watch.wait(5)
        assert got.removed == {"workerlog.1"} and got.names == ("moved",)
        shutil.rmtree(folder)
        got = watch.wait(5)
        while not got.gone:  # the deletions of the files may come in a batch of their own
            got = watch.wait(5)
        assert got.gone
    finally:
        watch.close()


def test_a_folder_that_cannot_be_watched_is_unwatchable(tmp_path):
    with pytest.raises(changes.Unwatchable, match="inotify_add_watch: No such file or directory"):
        changes.InotifyChanges(str(tmp_path / "none"))
    (tmp_path / "file").write_text("")
    with pytest.raises(changes.Unwatchable, match="Not a directory") as e:
        changes.InotifyChanges(str(tmp_path / "file"))
    assert not e.value.limit


# ---------------------------------------------------------------- polling, with a fake clock


class FakeTime:
    def __init__(self, look_cost=0.0):
        self.now, self.look_cost, self.slept = 0.0, look_cost, []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_polling_finds_changes_new_files_and_replaced_ones(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"a\n")
    (tmp_path / "workerlog.1").write_bytes(b"b\n")
    (tmp_path / "other").write_bytes(b"")
    t = FakeTime()
    poll = changes.PollingChanges(str(tmp_path), lambda name: name.startswith("workerlog."), t.clock, t.sleep)
    assert poll.wait(0) == Changed()  # not yet time to look
    assert poll.wait(1.0) == Changed() and t.slept == [changes.POLL]
    append(tmp_path / "workerlog.0", b"more\n")
    (tmp_path / "workerlog.2").write_bytes(b"c\n")
    os.utime(tmp_path / "workerlog.0", ns=(1, 1))  # the order of their last writes, whatever the clock's grain
    append(tmp_path / "other", b"not wanted\n")
    assert poll.wait(1.0) == Changed(("workerlog.0", "workerlog.2"))
    (tmp_path / "new").write_bytes(b"d\n")
    os.replace(tmp_path / "new", tmp_path / "workerlog.1")  # another file under the same name
    os.unlink(tmp_path / "workerlog.2")
    got = poll.wait(1.0)
    assert got.names == ("workerlog.1",) and got.removed == {"workerlog.1", "workerlog.2"}
    shutil.rmtree(tmp_path)
    assert poll.wait(1.0).gone


def test_polling_a_folder_that_costs_more_to_look_at_looks_less_often(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"")
    t, looks = FakeTime(), []

    def slow_wanted(name):
        looks.append(t.now)
        t.now += 0.05  # each look at the folder costs 0.05 s of this clock
        return True

    poll = changes.PollingChanges(str(tmp_path), slow_wanted, t.clock, t.sleep)
    for _ in range(3):
        poll.wait(10)
    gaps = [b - a for a, b in zip(looks, looks[1:])]
    assert gaps == pytest.approx([0.05 / changes.POLL_SHARE] * 3)  # 0.05 s of every 0.5 s: a tenth of a core


# ---------------------------------------------------------------- which way, and what is said


MOUNTINFO = """\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
30 22 0:40 / /shared rw,relatime shared:9 - nfs4 server:/export rw,vers=4.2
31 30 0:41 / /shared/local\\040disk rw - tmpfs tmpfs rw
32 22 0:42 / /home/me/remote rw - fuse.sshfs me@box: rw
"""


@pytest.mark.parametrize("path, kind, remote", [("/shared/job/logs", "nfs4", True), ("/sharedx", "ext4", False),
                                                ("/shared/local disk/logs", "tmpfs", False), ("/", "ext4", False),
                                                ("/home/me/remote/x", "fuse.sshfs", True)])
def test_the_file_system_of_a_log_dir_is_told_from_mountinfo(tmp_path, path, kind, remote):
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    got = changes.mount_type(path, str(tmp_path / "mountinfo"))
    assert got == kind and changes.is_remote(got) is remote


def test_the_real_mountinfo_names_this_folders_file_system(tmp_path):
    assert changes.mount_type(str(tmp_path)) not in (None, "")
    assert changes.mount_type(str(tmp_path), str(tmp_path / "none")) is None


def test_watch_polls_a_network_file_system_quietly(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(changes, "mount_type", lambda path: "nfs4")
    with caplog.at_level(logging.DEBUG, logger="launcher"):
        watch = follow_tool.watch(str(tmp_path), lambda name: True)
    assert watch.how == "polling"
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] and "is on nfs4" in caplog.text


@pytest.mark.parametrize("limit, level", [(True, logging.WARNING), (False, logging.DEBUG)])
def test_watch_polls_where_inotify_is_refused_saying_so_when_a_limit_can_be_raised(tmp_path, monkeypatch, caplog,
                                                                                   limit, level):
    def refused(folder):
        raise changes.Unwatchable("inotify_init1: Too many open files, the limit fs.inotify.max_user_instances "
                                  "is reached" if limit else "inotify is Linux's, and this is darwin", limit)

    monkeypatch.setattr(changes, "mount_type", lambda path: "ext4")
    monkeypatch.setattr(changes, "InotifyChanges", refused)
    with caplog.at_level(logging.DEBUG, logger="launcher"):
        watch = follow_tool.watch(str(tmp_path), lambda name: True)
    assert watch.how == "polling" and [r.levelno for r in caplog.records] == [level]
    assert ("raise that limit" in caplog.text) is limit


def test_watch_uses_inotify_on_a_local_file_system(tmp_path):
    watch = follow_tool.watch(str(tmp_path), lambda name: True)
    try:
        assert watch.how == "inotify"
    finally:
        watch.close()


# ---------------------------------------------------------------- the follower, fed batches


def test_changed_logs_are_read_in_the_order_reported_and_others_not_at_all(tmp_path):
    for rank in range(3):
        (tmp_path / f"workerlog.{rank}").write_bytes(b"")
    follower = follower_of(tmp_path)
    for rank in (2, 0, 1):
        append(tmp_path / f"workerlog.{rank}", f"line {rank}\n".encode())
    assert follower.apply(Changed(("workerlog.2", "workerlog.0"))) == b"[rank 2] line 2\n[rank 0] line 0\n"
    assert follower.apply(Changed(("workerlog.1",))) == b"[rank 1] line 1\n"


def test_a_new_log_is_followed_from_its_start_and_in_its_place_in_the_order(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"")
    follower = follower_of(tmp_path)
    append(tmp_path / "workerlog.0", b"a\n")
    (tmp_path / "workerlog.7").write_bytes(b"first\nsecond\n")
    (tmp_path / "stacks.txt").write_bytes(b"not a log\n")
    append(tmp_path / "workerlog.0", b"b\n")
    out = follower.apply(Changed(("workerlog.7", "stacks.txt", "workerlog.0")))
    assert out == b"[rank 7] first\n[rank 7] second\n[rank 0] a\n[rank 0] b\n"
    append(tmp_path / "workerlog.7", b"third\n")
    assert follower.apply(Changed(("workerlog.7",))) == b"[rank 7] third\n"


def test_a_log_deleted_and_written_anew_is_shown_from_its_start(tmp_path):
    """Even when the new file gets the inode of the old one (ext4 reuses them): the removal was reported."""
    (tmp_path / "workerlog.0").write_bytes(b"old one\n")
    follower = follower_of(tmp_path)
    append(tmp_path / "workerlog.0", b"old two\nunfinished")
    assert follower.apply(Changed(("workerlog.0",))) == b"[rank 0] old two\n"
    os.unlink(tmp_path / "workerlog.0")
    (tmp_path / "workerlog.0").write_bytes(b"new one\nnew two\nnew three\n")
    out = follower.apply(Changed(("workerlog.0",), frozenset({"workerlog.0"})))
    assert out == b"[rank 0] unfinished\n[rank 0] new one\n[rank 0] new two\n[rank 0] new three\n"


def test_a_log_renamed_over_is_shown_from_its_start_without_a_reported_removal(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"one\ntwo\nthree\n")
    follower = follower_of(tmp_path)
    (tmp_path / "next").write_bytes(b"rotated\n")
    os.replace(tmp_path / "next", tmp_path / "workerlog.0")
    assert follower.apply(Changed(("workerlog.0",))) == b"[rank 0] rotated\n"


def test_a_log_truncated_and_rewritten_longer_in_place_is_shown_from_its_start(tmp_path):
    """One report for both (open with O_TRUNC, then a write): the size alone would not tell."""
    (tmp_path / "workerlog.0").write_bytes(b"short\n")
    follower = follower_of(tmp_path)
    with open(tmp_path / "workerlog.0", "r+b") as f:  # the same file (its inode), truncated, written again
        f.truncate(0)
        f.write(b"a much longer first line\nand a second\n")
    assert follower.apply(Changed(("workerlog.0",))) == b"[rank 0] a much longer first line\n[rank 0] and a second\n"
    append(tmp_path / "workerlog.0", b"then appended\n")
    assert follower.apply(Changed(("workerlog.0",))) == b"[rank 0] then appended\n"


def test_a_log_deleted_is_no_error_and_its_unfinished_line_is_shown_at_the_end(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"one\n")
    follower = follower_of(tmp_path)
    append(tmp_path / "workerlog.0", b"half")
    assert follower.apply(Changed(("workerlog.0",))) == b""
    os.unlink(tmp_path / "workerlog.0")
    assert follower.apply(Changed((), frozenset({"workerlog.0"}))) == b""
    assert follower.read(final=True) == b"[rank 0] half\n"


def test_a_big_change_is_read_in_pieces_without_waiting_for_another_report(tmp_path, monkeypatch):
    monkeypatch.setattr(follow_tool, "READ_LIMIT", 10)
    (tmp_path / "workerlog.0").write_bytes(b"")
    follower = follower_of(tmp_path)
    append(tmp_path / "workerlog.0", b"".join(b"line %d\n" % i for i in range(5)))
    out = follower.apply(Changed(("workerlog.0",)))
    while follower.pending:
        out += follower.apply(Changed())
    assert out == b"".join(b"[rank 0] line %d\n" % i for i in range(5))


ENDED = state.NodeState(node=0, node_ip="127.0.0.1", nodes=1, host="h", run_id="r", launcher_pid=1, launcher_start=1,
                        attempt=0, max_restarts=0, phase="ended", exit_code=0, started=1.0, updated=2.0, processes=())


class Replay:
    """A folder's history: each wait does the next step to the folder and gives its batch."""

    how = "test"

    def __init__(self, *steps) -> None:
        self.steps = list(steps)

    def wait(self, timeout):
        assert self.steps, "followed on after the job had ended"
        return self.steps.pop(0)()

    def close(self):
        pass


def test_an_overflow_reads_every_log_finds_new_ones_and_the_job_end_is_seen_at_once(tmp_path):
    (tmp_path / "workerlog.0").write_bytes(b"")
    (tmp_path / "workerlog.1").write_bytes(b"")
    follower = follower_of(tmp_path)

    def overflow():  # the reports of these were lost
        append(tmp_path / "workerlog.1", b"b\n")
        (tmp_path / "workerlog.2").write_bytes(b"c\n")
        return Changed(everything=True)

    def job_ends():
        append(tmp_path / "workerlog.0", b"unfinished")
        (tmp_path / "launcher.node0.json").write_bytes(state.to_json(ENDED))
        return Changed(("launcher.node0.json",))

    shown, now = [], iter(range(10 ** 6))
    clock = lambda: 1000.0 + next(now) * 0.001  # the job's end is not left to the once-a-second look
    assert follow_tool.follow(str(tmp_path), follower, Replay(Changed, overflow, job_ends), shown.append, clock) is None
    assert b"".join(shown) == b"[rank 2] c\n[rank 1] b\n[rank 0] unfinished\n"
