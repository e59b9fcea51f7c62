"""torch's TCPStore protocol and store, pure (launcher/run/tcpstore_protocol.py, launcher/run/tcpstore.py):
every query decoded and carried out as torch's server does, and every malformed input refused without an exception.

The requests are written here byte by byte as torch 2.13's client writes them (recorded off the
wire; tests/integration/test_store_torch_client.py drives the real client against the launcher)."""

import struct

import pytest

from launcher.run import tcpstore_protocol as ts
from launcher.run.tcpstore import KeyValueStore
from launcher.run.tcpstore_protocol import Frame, Query

VALIDATE = bytes([0]) + struct.pack("<I", ts.MAGIC)


def s(b: bytes) -> bytes:  # a string or value as torch writes it
    return struct.pack("<Q", len(b)) + b


def n(x: int) -> bytes:
    return struct.pack("<q", x)


def req(query: Query, *parts: bytes) -> bytes:
    return bytes([query]) + b"".join(parts)


def keys(*names: bytes) -> bytes:
    return struct.pack("<Q", len(names)) + b"".join(s(k) for k in names)


WIRE = {  # each query, and the frame it is
    Query.SET: (req(Query.SET, s(b"/k"), s(b"v")), Frame(Query.SET, (b"/k",), (b"v",))),
    Query.COMPARE_SET: (req(Query.COMPARE_SET, s(b"/k"), s(b"v"), s(b"w")), Frame(Query.COMPARE_SET, (b"/k",), (b"v", b"w"))),
    Query.GET: (req(Query.GET, s(b"/k")), Frame(Query.GET, (b"/k",))),
    Query.ADD: (req(Query.ADD, s(b"/n"), n(5)), Frame(Query.ADD, (b"/n",), number=5)),
    Query.CHECK: (req(Query.CHECK, keys(b"/k", b"/zz")), Frame(Query.CHECK, (b"/k", b"/zz"))),
    Query.WAIT: (req(Query.WAIT, keys(b"/k")), Frame(Query.WAIT, (b"/k",))),
    Query.GETNUMKEYS: (req(Query.GETNUMKEYS), Frame(Query.GETNUMKEYS)),
    Query.DELETE_KEY: (req(Query.DELETE_KEY, s(b"/k")), Frame(Query.DELETE_KEY, (b"/k",))),
    Query.APPEND: (req(Query.APPEND, s(b"/a"), s(b"x")), Frame(Query.APPEND, (b"/a",), (b"x",))),
    Query.MULTI_GET: (req(Query.MULTI_GET, keys(b"/a", b"/n")), Frame(Query.MULTI_GET, (b"/a", b"/n"))),
    Query.MULTI_SET: (req(Query.MULTI_SET, struct.pack("<q", 2), s(b"/p"), s(b"1"), s(b"/q"), s(b"2")),
                      Frame(Query.MULTI_SET, (b"/p", b"/q"), (b"1", b"2"))),
    Query.CANCEL_WAIT: (req(Query.CANCEL_WAIT), Frame(Query.CANCEL_WAIT)),
    Query.PING: (req(Query.PING, struct.pack("<I", 7142)), Frame(Query.PING, number=7142)),
    Query.QUEUE_PUSH: (req(Query.QUEUE_PUSH, s(b"/qq"), s(b"item")), Frame(Query.QUEUE_PUSH, (b"/qq",), (b"item",))),
    Query.QUEUE_POP: (req(Query.QUEUE_POP, s(b"/qq")), Frame(Query.QUEUE_POP, (b"/qq",))),
    Query.QUEUE_LEN: (req(Query.QUEUE_LEN, s(b"/qq")), Frame(Query.QUEUE_LEN, (b"/qq",))),
    Query.LIST_KEYS: (req(Query.LIST_KEYS), Frame(Query.LIST_KEYS)),
    Query.BARRIER: (req(Query.BARRIER, s(b"/b"), n(2)), Frame(Query.BARRIER, (b"/b",), number=2)),
}


# ---------------------------------------------------------------- decoding


def test_the_query_numbers_are_torchs():
    assert [q.name for q in Query] == [
        "VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY", "APPEND",
        "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS", "BARRIER"]
    assert set(WIRE) == set(Query) - {Query.VALIDATE}


@pytest.mark.parametrize("query", sorted(WIRE))
def test_every_query_decodes_and_every_cut_of_it_is_incomplete(query):
    data, frame = WIRE[query]
    assert ts.decode(data) == ts.Decoded(frame, len(data))
    assert ts.decode(b"junk" + data + b"next", 4) == ts.Decoded(frame, 4 + len(data))
    for cut in range(len(data)):
        assert ts.decode(data[:cut]) == ts.Decoded(None, 0)


@pytest.mark.parametrize("data, problem", [
    (bytes([19]), "unknown query type 19"),
    (bytes([255]) + b"\x00" * 40, "unknown query type 255"),
    (req(Query.SET, struct.pack("<Q", 2 ** 63)), "a key of 9223372036854775808 bytes"),
    (req(Query.SET, struct.pack("<Q", 2 ** 64 - 1)), "a key of 18446744073709551615 bytes"),
    (req(Query.SET, s(b"k" * (ts.MAX_KEY + 1))), "a key of 8193 bytes (at most 8192)"),
    (req(Query.SET, s(b"/k"), struct.pack("<Q", ts.MAX_VALUE + 1)), "a value of 8388609 bytes"),
    (req(Query.COMPARE_SET, s(b"/k"), s(b""), struct.pack("<Q", 2 ** 63)), "a value of 9223372036854775808"),
    (req(Query.WAIT, struct.pack("<Q", ts.MAX_KEYS + 1)), "131073 keys in one request"),
    (req(Query.MULTI_SET, struct.pack("<q", -1)), "18446744073709551615 keys in one request"),
    (req(Query.CHECK, struct.pack("<Q", 2), s(b"/a"), struct.pack("<Q", 2 ** 40)), "a key of 1099511627776 bytes"),
])
def test_a_bad_length_or_type_is_refused_at_once_without_an_exception(data, problem):
    frame, end, said = ts.decode(data)
    assert frame is None and end == 0 and said.startswith(problem)


def test_the_decoder_never_raises_on_any_byte_string():
    import random

    rng = random.Random(24)
    for _ in range(3000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        frame, end, problem = ts.decode(data, rng.randrange(len(data) + 1))
        assert (frame is None) or end <= len(data)


# ---------------------------------------------------------------- one client's input


def frames_of(inp: ts.Input, data: bytes):
    inp.feed(data)
    out = []
    while True:
        frame, problem = inp.take()
        if frame is None:
            return out, problem
        out.append(frame)


def test_validate_first_then_requests_in_any_cut():
    data = VALIDATE + b"".join(d for d, _ in WIRE.values())
    inp = ts.Input()
    got = []
    for i in range(0, len(data), 3):
        found, problem = frames_of(inp, data[i:i + 3])
        assert problem == ""
        got += found
    assert got == [f for _, f in WIRE.values()] and inp.held() == 0


@pytest.mark.parametrize("data, problem", [
    (WIRE[Query.GET][0], "no VALIDATE with torch's magic number first"),
    (bytes([0]) + struct.pack("<I", ts.MAGIC ^ 1), "no VALIDATE with torch's magic number first"),
    (b"GET / HTTP/1.1\r\n\r\n", "unknown query type 71"),  # a browser, a port scanner
    (VALIDATE + VALIDATE, "VALIDATE again"),
    (VALIDATE + bytes([77]), "unknown query type 77"),
])
def test_a_client_that_breaks_the_order_is_refused(data, problem):
    assert frames_of(ts.Input(), data)[1].startswith(problem)


def test_an_unfinished_request_is_bounded():
    inp = ts.Input(limit=1000)
    frames, problem = frames_of(inp, VALIDATE + req(Query.SET, s(b"/k"), struct.pack("<Q", 5000)) + b"x" * 900)
    assert frames == [] and problem == ""
    assert frames_of(inp, b"x" * 100)[1] == "an unfinished request of over 1000 bytes"


def test_a_truncated_request_waits_for_the_rest():
    inp = ts.Input()
    data = WIRE[Query.MULTI_SET][0]
    assert frames_of(inp, VALIDATE + data[:-1]) == ([], "")
    assert frames_of(inp, data[-1:]) == ([WIRE[Query.MULTI_SET][1]], "")


# ---------------------------------------------------------------- the store's semantics


def run(store, client, query, *args, **kw):
    result = store.apply(client, Frame(query, *args, **kw))
    assert result.refused == "", result.refused
    return result.replies


def value(b: bytes) -> bytes:
    return s(b)


def test_set_get_add_delete_and_numkeys():
    st = KeyValueStore()
    assert run(st, "c", Query.SET, (b"/k",), (b"v",)) == []
    assert run(st, "c", Query.GET, (b"/k",)) == [("c", value(b"v"))]
    assert run(st, "c", Query.GET, (b"/missing",)) == [("c", value(b""))]
    assert run(st, "c", Query.ADD, (b"/n",), number=5) == [("c", n(5))]
    assert run(st, "c", Query.ADD, (b"/n",), number=-7) == [("c", n(-2))]
    assert run(st, "c", Query.GET, (b"/n",)) == [("c", value(b"-2"))]
    assert run(st, "c", Query.GETNUMKEYS) == [("c", n(2))]
    assert run(st, "c", Query.DELETE_KEY, (b"/k",)) == [("c", n(1))]
    assert run(st, "c", Query.DELETE_KEY, (b"/k",)) == [("c", n(0))]
    assert run(st, "c", Query.GETNUMKEYS) == [("c", n(1))]


def test_add_reads_a_value_as_strtoll_does_and_wraps_as_int64():
    st = KeyValueStore()
    run(st, "c", Query.SET, (b"/n",), (b"  12abc",))
    assert run(st, "c", Query.ADD, (b"/n",), number=1) == [("c", n(13))]
    run(st, "c", Query.SET, (b"/n",), (str(2 ** 63 - 1).encode(),))
    assert run(st, "c", Query.ADD, (b"/n",), number=1) == [("c", n(-2 ** 63))]
    for bad in (b"abc", b"", str(2 ** 63).encode(), b"-"):
        run(st, "c", Query.SET, (b"/n",), (bad,))
        result = st.apply("c", Frame(Query.ADD, (b"/n",), number=1))
        assert result.replies == [] and "is not a whole number" in result.refused and not result.full


def test_compare_set_as_torchs_server():
    st = KeyValueStore()
    assert run(st, "c", Query.COMPARE_SET, (b"/k",), (b"x", b"y")) == [("c", value(b"x"))]  # missing: the expected
    assert run(st, "c", Query.GET, (b"/k",)) == [("c", value(b""))]
    assert run(st, "c", Query.COMPARE_SET, (b"/k",), (b"", b"new")) == [("c", value(b"new"))]
    assert run(st, "c", Query.COMPARE_SET, (b"/k",), (b"other", b"z")) == [("c", value(b"new"))]
    assert run(st, "c", Query.COMPARE_SET, (b"/k",), (b"new", b"z")) == [("c", value(b"z"))]


def test_append_multi_set_multi_get_and_list_keys():
    st = KeyValueStore()
    run(st, "c", Query.APPEND, (b"/a",), (b"x",))
    run(st, "c", Query.APPEND, (b"/a",), (b"yz",))
    run(st, "c", Query.MULTI_SET, (b"/p", b"/q"), (b"1", b"2"))
    assert run(st, "c", Query.MULTI_GET, (b"/a", b"/q", b"/none")) == [("c", value(b"xyz") + value(b"2") + value(b""))]
    (who, answer), = run(st, "c", Query.LIST_KEYS)
    entries = [answer[8 + i * 10:8 + (i + 1) * 10] for i in range(3)]  # each: its length, then 2 bytes
    assert answer[:8] == n(3) and len(answer) == 38 and sorted(e[8:] for e in entries) == [b"/a", b"/p", b"/q"]


def test_check_counts_a_key_or_a_queue_with_items():
    st = KeyValueStore()
    assert run(st, "c", Query.CHECK, (b"/k", b"/q")) == [("c", ts.NOT_READY)]
    run(st, "c", Query.SET, (b"/k",), (b"v",))
    run(st, "c", Query.QUEUE_PUSH, (b"/q",), (b"i",))
    assert run(st, "c", Query.CHECK, (b"/k", b"/q")) == [("c", ts.READY)]
    assert run(st, "c", Query.CHECK, ()) == [("c", ts.READY)]


def test_wait_answers_once_every_key_is_there_and_wakes_on_set_add_append_and_compare_set():
    st = KeyValueStore()
    run(st, "c", Query.SET, (b"/a",), (b"1",))
    assert run(st, "c", Query.WAIT, (b"/a",)) == [("c", ts.STOP_WAITING)]
    assert run(st, "w", Query.WAIT, (b"/a", b"/b", b"/c", b"/d")) == []
    assert run(st, "c", Query.SET, (b"/b",), (b"1",)) == []
    assert run(st, "c", Query.SET, (b"/b",), (b"again",)) == []  # counted once
    assert run(st, "c", Query.ADD, (b"/c",), number=1) == [("c", n(1))]
    assert run(st, "c", Query.APPEND, (b"/d",), (b"x",)) == [("w", ts.STOP_WAITING)]
    assert run(st, "w2", Query.WAIT, (b"/e",)) == []
    assert run(st, "c", Query.COMPARE_SET, (b"/e",), (b"", b"v")) == [("w2", ts.STOP_WAITING), ("c", value(b"v"))]
    assert st.waiting == {} and st.awaited == {}


def test_cancel_wait_answers_wait_canceled_and_forgets_the_wait():
    st = KeyValueStore()
    assert run(st, "w", Query.WAIT, (b"/x", b"/y")) == []
    assert run(st, "w", Query.CANCEL_WAIT) == [("w", ts.WAIT_CANCELED)]
    assert run(st, "c", Query.MULTI_SET, (b"/x", b"/y"), (b"1", b"2")) == []  # nobody to wake
    assert run(st, "c", Query.CANCEL_WAIT) == [("c", ts.WAIT_CANCELED)]  # no wait: the same answer
    assert st.waiting == {} and st.awaited == {} and st.waits_of == {}


def test_a_client_gone_is_forgotten():
    st = KeyValueStore()
    run(st, "w", Query.WAIT, (b"/x",))
    run(st, "v", Query.WAIT, (b"/x",))
    st.forget("w")
    assert run(st, "c", Query.SET, (b"/x",), (b"1",)) == [("v", ts.STOP_WAITING)]
    size = st.size
    st.forget("nobody")
    assert st.size == size


def test_queues_push_pop_len_and_a_push_wakes_one_waiter():
    st = KeyValueStore()
    assert run(st, "c", Query.QUEUE_POP, (b"/q",)) == [("c", n(0))]
    assert run(st, "c", Query.QUEUE_LEN, (b"/q",)) == [("c", n(0))]
    assert run(st, "a", Query.WAIT, (b"/q",)) == []  # queue_pop(block=True) waits first
    assert run(st, "b", Query.WAIT, (b"/q",)) == []
    assert run(st, "c", Query.QUEUE_PUSH, (b"/q",), (b"one",)) == [("a", ts.STOP_WAITING)]
    assert run(st, "c", Query.QUEUE_PUSH, (b"/q",), (b"two",)) == [("b", ts.STOP_WAITING)]
    assert run(st, "c", Query.QUEUE_LEN, (b"/q",)) == [("c", n(2))]
    assert run(st, "a", Query.QUEUE_POP, (b"/q",)) == [("a", n(2) + value(b"one"))]
    assert run(st, "b", Query.QUEUE_POP, (b"/q",)) == [("b", n(1) + value(b"two"))]
    assert run(st, "c", Query.GETNUMKEYS) == [("c", n(0))]  # queues are not keys
    assert st.size == 0


def test_barrier_counts_in_its_key_and_answers_everyone_at_the_last():
    st = KeyValueStore()
    assert run(st, "a", Query.BARRIER, (b"/b",), number=3) == []
    assert run(st, "b", Query.BARRIER, (b"/b",), number=3) == []
    assert run(st, "c", Query.BARRIER, (b"/b",), number=3) == [("a", ts.STOP_WAITING), ("b", ts.STOP_WAITING),
                                                               ("c", ts.STOP_WAITING)]
    assert run(st, "c", Query.GET, (b"/b",)) == [("c", value(b"3"))]
    assert run(st, "d", Query.BARRIER, (b"/one",), number=1) == [("d", ts.STOP_WAITING)]
    run(st, "c", Query.SET, (b"/text",), (b"x",))
    assert "not a whole number" in st.apply("c", Frame(Query.BARRIER, (b"/text",), number=2)).refused


def test_ping_answers_its_nonce():
    assert run(KeyValueStore(), "c", Query.PING, number=0xDEADBEEF) == [("c", struct.pack("<I", 0xDEADBEEF))]


def test_the_store_is_bounded_and_refuses_what_would_pass_its_limit():
    st = KeyValueStore(limit=10_000)
    run(st, "c", Query.SET, (b"/k",), (b"x" * 5000,))
    for query, args in [(Query.SET, ((b"/j",), (b"x" * 6000,))), (Query.APPEND, ((b"/k",), (b"x" * 6000,))),
                        (Query.QUEUE_PUSH, ((b"/q",), (b"x" * 6000,))),
                        (Query.MULTI_SET, ((b"/m", b"/o"), (b"x" * 3000, b"x" * 3000)))]:
        result = st.apply("c", Frame(query, *args))
        assert result.full and "over 10000 bytes" in result.refused and result.replies == []
    run(st, "c", Query.SET, (b"/k",), (b"x" * 9000,))  # a replacement counts what it frees
    assert 9000 < st.size <= 10_000
    run(st, "c", Query.DELETE_KEY, (b"/k",))
    assert st.size == 0


def test_waiting_clients_count_against_the_limit():
    st = KeyValueStore(limit=1000)
    results = [st.apply(f"w{i}", Frame(Query.WAIT, (b"/never",))) for i in range(20)]
    assert any(r.full for r in results) and st.size <= 1000
    for i in range(20):
        st.forget(f"w{i}")
    assert st.size == 0


def test_an_answer_too_large_is_refused():
    st = KeyValueStore()
    run(st, "c", Query.SET, (b"/big",), (b"x" * ts.MAX_VALUE,))
    result = st.apply("c", Frame(Query.MULTI_GET, (b"/big",) * 9))
    assert result.replies == [] and "an answer of" in result.refused and not result.full


def test_an_unforeseen_request_is_refused_not_raised():
    result = KeyValueStore().apply("c", Frame(Query.VALIDATE))  # never passed on by Input
    assert result.replies == [] and result.refused.startswith("request not carried out")
