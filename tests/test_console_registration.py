"""The event loop watches a console stream with output pending until the console takes it; a console that is a
regular file (``> out.log``) or /dev/null is always writable and epoll refuses to watch it: its output is written at
once instead (a log line of another thread, caught between being added and being written, once stopped the
launcher with an internal error)."""

import selectors

from launcher.output.console_stream import Stream
from launcher.run.loop import ConsoleTag, _register_or_push


def test_a_console_on_a_regular_file_is_written_not_watched(tmp_path):
    path = tmp_path / "out.log"
    with open(path, "wb") as f, selectors.DefaultSelector() as selector:
        stream = Stream(f.fileno())
        stream.pending += b"launcher: elastic job: node n2 (127.0.0.1) joined (3 node(s))\n"
        _register_or_push(selector, f.fileno(), selectors.EVENT_WRITE, ConsoleTag(stream))
        assert f.fileno() not in selector.get_map() and not stream.pending
    assert path.read_bytes().endswith(b"joined (3 node(s))\n")


def test_a_console_on_dev_null_is_written_not_watched():
    with open("/dev/null", "wb") as f, selectors.DefaultSelector() as selector:
        stream = Stream(f.fileno())
        stream.pending += b"a line\n"
        _register_or_push(selector, f.fileno(), selectors.EVENT_WRITE, ConsoleTag(stream))
        assert not stream.pending


def test_a_console_on_a_pipe_is_watched(tmp_path):
    import os

    read_end, write_end = os.pipe()
    try:
        with selectors.DefaultSelector() as selector:
            stream = Stream(write_end)
            stream.pending += b"x"
            _register_or_push(selector, write_end, selectors.EVENT_WRITE, ConsoleTag(stream))
            assert write_end in selector.get_map() and stream.pending == b"x"
    finally:
        os.close(read_end)
        os.close(write_end)
