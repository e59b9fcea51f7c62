"""The hosts of a job started over ssh (launcher.plan.hostfile): the hostfile's three forms, horovodrun's -H list,
DeepSpeed's --include/--exclude, each host's workers and GPUs once its facts are known, and the ranks in hostfile
order; every refusal with its sentence, and the parser and the ranks on random hosts (hypothesis). Pure: no process."""

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.errors import LaunchError
from launcher.plan.hostfile import Host, parse_hostfile, parse_hosts, ranks, resolve, same_host_key, select

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None)


def refusal(call, *args) -> str:
    with pytest.raises(LaunchError) as e:
        call(*args)
    return str(e.value)


# ---------------------------------------------------------------- the hostfile's forms


@pytest.mark.parametrize("line, host", [
    ("node1 slots=4", Host("node1", 4)),  # DeepSpeed's and Open MPI's
    ("node1:4", Host("node1", 4)),  # horovodrun's
    ("node1", Host("node1")),  # the node's default
    ("10.0.0.1 slots=8", Host("10.0.0.1", 8)),
    ("10.0.0.1:8", Host("10.0.0.1", 8)),
    ("gpu-node_01.example.com slots=2", Host("gpu-node_01.example.com", 2)),
    ("node1 slots = 4", Host("node1", 4)),  # Open MPI takes spaces around =
    ("node1 slots=4 max_slots=8", Host("node1", 4)),  # Open MPI's oversubscription cap: taken, ignored
    ("node1 max-slots=8 slots=4", Host("node1", 4)),
    ("node1 max_slots=2", Host("node1")),
    ("node1 slots=007", Host("node1", 7)),
    ("   node1\tslots=4   ", Host("node1", 4)),
    ("node1 slots=4 # the fast one", Host("node1", 4)),
    ("node1:4# no space", Host("node1", 4)),
    ("[fd00::1]:4", Host("fd00::1", 4)),  # IPv6: the slots in brackets, as a port
    ("[fd00::1]", Host("fd00::1")),
    ("fd00::1", Host("fd00::1")),  # a bare IPv6 address is never split at a colon...
    ("fd00::1:4", Host("fd00::1:4")),  # ...so this is an address, not fd00::1 with 4 slots
    ("fd00::1 slots=4", Host("fd00::1", 4)),
    ("[fe80::1%eth0]:2", Host("fe80::1%eth0", 2)),
])
def test_each_form_of_a_line(line, host):
    assert parse_hostfile(line, "hosts.txt") == (host,)


def test_forms_mix_in_one_file_with_comments_and_blank_lines_in_hostfile_order():
    text = ("# the cluster\n\nnode3 slots=4\r\n  # indented comment\nnode1:2\n\t\nnode2   # default slots\n"
            "[fd00::9]:1\n")
    assert parse_hostfile(text, "h") == (Host("node3", 4), Host("node1", 2), Host("node2"), Host("fd00::9", 1))
    assert parse_hostfile("\ufeffnode1:2\n", "h") == (Host("node1", 2),)  # a UTF-8 file some editors mark first


DOCUMENTED = """\
# hosts.txt
node1 slots=8      # DeepSpeed's and Open MPI's form
node2:4            # horovodrun's form
node3              # the node's default: one worker per GPU, or its CPU default
[fd00::7]:2        # an IPv6 address takes its slots in brackets, as a port does
fd00::8 slots=1    # or stands alone
"""


def test_the_documented_hostfile():
    """docs/cluster-ssh.md shows this file, and what --include and --exclude make of it."""
    hosts = parse_hostfile(DOCUMENTED, "hosts.txt")
    assert hosts == (Host("node1", 8), Host("node2", 4), Host("node3"), Host("fd00::7", 2), Host("fd00::8", 1))
    assert select(hosts, "node2", None) == (Host("node2", 4),)
    assert select(hosts, "node1:0,2@node3", None) == (Host("node1", 8, gpus=(0, 2)), Host("node3"))
    assert select(hosts, "node1:2,0", None) == (Host("node1", 8, gpus=(2, 0)),)
    assert select(hosts, None, "node3") == (Host("node1", 8), Host("node2", 4), Host("fd00::7", 2), Host("fd00::8", 1))
    assert select(hosts, None, "node1:0@node2:0,1,2,3") == (
        Host("node1", 8, gpus=(1, 2, 3, 4, 5, 6, 7)), Host("node3"), Host("fd00::7", 2), Host("fd00::8", 1))


@pytest.mark.parametrize("text, sentence", [
    ("", "the hostfile hosts.txt names no host; write one host a line (HOST slots=N, HOST:N or HOST alone)."),
    ("# all\n\n   # commented out\n", "the hostfile hosts.txt names no host; write one host a line (HOST slots=N, "
                                    "HOST:N or HOST alone)."),
    ("a\nnode1 slots=0", "hosts.txt:2 gives node1 the slots '0'; give a whole number of 1 or more, such as node1:4."),
    ("node1:0", "hosts.txt:1 gives node1 the slots '0'; give a whole number of 1 or more, such as node1:4."),
    ("node1 slots=-1", "hosts.txt:1 gives node1 the slots '-1'; give a whole number of 1 or more, such as node1:4."),
    ("node1 slots=2.5", "hosts.txt:1 gives node1 the slots '2.5'; give a whole number of 1 or more, such as node1:4."),
    ("node1 slots=²", "hosts.txt:1 gives node1 the slots '²'; give a whole number of 1 or more, such as node1:4."),
    ("node1 slots=", "hosts.txt:1 gives node1 the slots ''; give a whole number of 1 or more, such as node1:4."),
    ("node1:", "hosts.txt:1 gives node1 the slots ''; give a whole number of 1 or more, such as node1:4."),
    ("[fd00::1]:x", "hosts.txt:1 gives fd00::1 the slots 'x'; give a whole number of 1 or more, such as [fd00::1]:4."),
    ("node1 max_slots=0", "hosts.txt:1 gives node1 the slots '0'; give a whole number of 1 or more, such as node1:4."),
    ("node1:4 slots=4", "hosts.txt:1 gives the slots of node1 twice; give them once (HOST slots=N, HOST:N or HOST "
                        "alone)."),
    ("node1 slots=4 slots=2", "hosts.txt:1 gives the slots of node1 twice; give them once (HOST slots=N, HOST:N or "
                              "HOST alone)."),
    ("node1 4", "hosts.txt:1 has '4' after node1, which a hostfile line does not take; write HOST slots=N, HOST:N or "
                "HOST alone."),
    ("node1 slots", "hosts.txt:1 has 'slots' after node1, which a hostfile line does not take; write HOST slots=N, "
                    "HOST:N or HOST alone."),
    ("node1 cpu=4", "hosts.txt:1 has 'cpu=4' after node1, which a hostfile line does not take; write HOST slots=N, "
                    "HOST:N or HOST alone."),
    ("node1 node2", "hosts.txt:1 has 'node2' after node1, which a hostfile line does not take; write HOST slots=N, "
                    "HOST:N or HOST alone."),
])
def test_a_bad_file_is_refused_naming_its_line_and_the_fix(text, sentence):
    assert refusal(parse_hostfile, text, "hosts.txt") == sentence


BAD_HOST = ("which is no host name or IP address; write HOST slots=N, HOST:N or HOST alone (an IPv6 address takes its "
            "slots in brackets, [fd00::1]:4; a login user goes in ~/.ssh/config).")


@pytest.mark.parametrize("word", [
    "alice@node1", "-oProxyCommand=x", "-node1", "node/1", "héte", "10.0.0", "1234", "[node1]:4", "[fd00::1", "[]:4",
    "[fd00::1]x", ":4", "slots=4", "a:b:c", "node1:4:5",
])
def test_a_bad_host_is_refused_naming_its_line(word):
    assert refusal(parse_hostfile, f"ok\n\n{word}", "hosts.txt") == f"hosts.txt:3 has {word!r}, {BAD_HOST}"


@pytest.mark.parametrize("text, sentence", [
    ("node1\nnode1:2", "hosts.txt:2 names node1 again (first at hosts.txt:1); give each host once, with all its slots."),
    ("Node1 slots=2\n#\nnode1", "hosts.txt:3 names node1 again (first at hosts.txt:1); give each host once, with all "
                                "its slots."),  # a host name has no case
    ("fd00::1\n[fd00:0::1]:2", "hosts.txt:2 names fd00:0::1 again (first at hosts.txt:1); give each host once, with all "
                               "its slots."),  # nor an address its spelling
])
def test_a_host_listed_twice_is_refused_naming_both_lines(text, sentence):
    assert refusal(parse_hostfile, text, "hosts.txt") == sentence


def test_line_numbers_count_newlines_only():
    """A form feed or a line separator (which str.splitlines breaks at) stays within its line, as an editor shows it."""
    assert refusal(parse_hostfile, "a\x0cb\nnode1:0", "f").startswith("f:1 has 'b' after a")
    assert refusal(parse_hostfile, "a\nc\u2028d\nnode1:0", "f").startswith("f:2 has 'd' after c")
    assert refusal(parse_hostfile, "a\nc\x1cd\nnode1:0", "f").startswith("f:2 has 'd' after c")


# ---------------------------------------------------------------- --hosts (horovodrun's -H)


@pytest.mark.parametrize("value, hosts", [
    ("node1:4,node2:2,node3", (Host("node1", 4), Host("node2", 2), Host("node3"))),
    ("node1", (Host("node1"),)),
    (" node1:4 , node2 ", (Host("node1", 4), Host("node2"))),
    ("[fd00::1]:4,fd00::2,10.0.0.1:1", (Host("fd00::1", 4), Host("fd00::2"), Host("10.0.0.1", 1))),
])
def test_hosts_forms(value, hosts):
    assert parse_hosts(value) == hosts


@pytest.mark.parametrize("value, sentence", [
    ("", "--hosts  has an empty item; give comma-separated hosts such as node1:4,node2:4."),
    ("node1:4,,node2", "--hosts node1:4,,node2 has an empty item; give comma-separated hosts such as node1:4,node2:4."),
    ("node1:4,", "--hosts node1:4, has an empty item; give comma-separated hosts such as node1:4,node2:4."),
    ("node1:0,node2", "--hosts node1:0,node2 gives node1 the slots '0'; give a whole number of 1 or more, such as "
                      "node1:4."),
    ("node1 slots=4", f"--hosts node1 slots=4 has 'node1 slots=4', {BAD_HOST}"),
    ("node1:4,u@node2:2", f"--hosts node1:4,u@node2:2 has 'u@node2:2', {BAD_HOST}"),
    ("node1:4,NODE1:2", "--hosts node1:4,NODE1:2 names NODE1 again; give each host once, with all its slots."),
])
def test_hosts_refusals_name_the_item(value, sentence):
    assert refusal(parse_hosts, value) == sentence


def test_hosts_takes_the_name_of_the_option_it_came_from():
    assert refusal(parse_hosts, "a:x", "-H").startswith("-H a:x gives a the slots 'x'")


# ---------------------------------------------------------------- --include and --exclude

HOSTS = (Host("node1", 4), Host("node2", 2), Host("node3"), Host("fd00::1", 2))


@pytest.mark.parametrize("include, kept", [
    ("node2", (Host("node2", 2),)),
    ("node3@node1", (Host("node1", 4), Host("node3"))),  # hostfile order, not the order named
    ("node1:0,2@node2", (Host("node1", 4, gpus=(0, 2)), Host("node2", 2))),
    ("node1:2,0", (Host("node1", 4, gpus=(2, 0)),)),  # the order given is the local ranks' order (DeepSpeed's)
    ("node1:1,1", (Host("node1", 4, gpus=(1,)),)),  # a GPU named twice is one GPU (DeepSpeed's)
    ("node1:1@node1:3", (Host("node1", 4, gpus=(1, 3)),)),  # a host named twice takes both
    ("node1:1@node1", (Host("node1", 4),)),  # ... and the whole host where one names it alone
    ("node3:5,7", (Host("node3", gpus=(5, 7)),)),  # slots not known: the ids are checked by resolve
    ("NODE2", (Host("node2", 2),)),
    ("[fd00::1]:1@fd00:0::1", (Host("fd00::1", 2),)),
    ("[fd00::1]:1", (Host("fd00::1", 2, gpus=(1,)),)),
])
def test_include_keeps_what_it_names_in_hostfile_order(include, kept):
    assert select(HOSTS, include, None) == kept
    assert select(HOSTS, include, "") == kept


@pytest.mark.parametrize("exclude, kept", [
    ("node2", (Host("node1", 4), Host("node3"), Host("fd00::1", 2))),
    ("node1:0,2", (Host("node1", 4, gpus=(1, 3)), Host("node2", 2), Host("node3"), Host("fd00::1", 2))),
    ("node2:0,1@node1:3", (Host("node1", 4, gpus=(0, 1, 2)), Host("node3"), Host("fd00::1", 2))),  # all GPUs: no host
    ("node2:1@node2:0", (Host("node1", 4), Host("node3"), Host("fd00::1", 2))),
    ("node3:5,1", (Host("node1", 4), Host("node2", 2), Host("node3", excluded=(1, 5)), Host("fd00::1", 2))),
    ("fd00::1@node3", (Host("node1", 4), Host("node2", 2))),
])
def test_exclude_removes_what_it_names(exclude, kept):
    assert select(HOSTS, None, exclude) == kept
    assert select(HOSTS, "", exclude) == kept


def test_neither_given_keeps_every_host():
    assert select(HOSTS, None, None) == HOSTS == select(HOSTS, "", "")


@pytest.mark.parametrize("include, exclude, sentence", [
    ("node1", "node2", "--include node1 and --exclude node2 were both given; give one of them (--include keeps only "
                       "what it names, --exclude keeps all but what it names)."),
    ("node9", None, "--include node9 names 'node9', which is not one of the job's hosts; write HOST[:GPU,GPU...] items "
                    "joined by @, each host as the hostfile (or --hosts) names it."),
    (None, "node1@node9:0", "--exclude node1@node9:0 names 'node9', which is not one of the job's hosts; write "
                            "HOST[:GPU,GPU...] items joined by @, each host as the hostfile (or --hosts) names it."),
    ("node1@@node2", None, "--include node1@@node2 names '', which is not one of the job's hosts; write "
                           "HOST[:GPU,GPU...] items joined by @, each host as the hostfile (or --hosts) names it."),
    ("node1,node2", None, "--include node1,node2 names 'node1,node2', which is not one of the job's hosts; write "
                          "HOST[:GPU,GPU...] items joined by @, each host as the hostfile (or --hosts) names it."),
    ("node1:4", None, "--include node1:4 names GPU 4 of node1, which has slots=4; give GPU ids from 0 to 3."),
    (None, "node2:0,2", "--exclude node2:0,2 names GPU 2 of node2, which has slots=2; give GPU ids from 0 to 1."),
    ("node1:", None, "--include node1: gives node1 the GPU ids ''; give comma-separated whole numbers, such as "
                     "node1:0,1."),
    ("node1:0,,1", None, "--include node1:0,,1 gives node1 the GPU ids '0,,1'; give comma-separated whole numbers, "
                         "such as node1:0,1."),
    ("node1:-1", None, "--include node1:-1 gives node1 the GPU ids '-1'; give comma-separated whole numbers, such as "
                       "node1:0,1."),
    (None, "node1@node2@node3@fd00::1", "--exclude node1@node2@node3@fd00::1 leaves no host to run on; exclude fewer "
                                        "hosts or GPUs."),
    (None, "node1:0,1,2,3@node2@node3@fd00::1:0,1", None),  # fd00::1:0,1 is no address: refused as a host below
])
def test_selection_refusals(include, exclude, sentence):
    said = refusal(select, HOSTS, include, exclude)
    assert said == sentence if sentence else "which is not one of the job's hosts" in said


# ---------------------------------------------------------------- each host's workers, once its facts are known


@pytest.mark.parametrize("host, default, gpus, expected", [
    (Host("n"), 8, (0, 1, 2, 3, 4, 5, 6, 7), (8, None)),  # nothing said: the node's default
    (Host("n"), 2, (), (2, None)),  # a CPU host: its CPU default
    (Host("n", 4), 8, tuple(range(8)), (4, (0, 1, 2, 3))),  # slots=N on a GPU host: its first N GPUs (DeepSpeed)
    (Host("n", 8), 8, tuple(range(8)), (8, None)),  # all of them: the node's default
    (Host("n", 2), 4, (2, 3, 5, 7), (2, (2, 3))),  # its first N GPUs, as --selected_gpus names them there
    (Host("n", 6), 2, (), (6, None)),  # slots=N on a CPU host: N CPU workers
    (Host("n", 4, gpus=(2, 0)), 8, tuple(range(8)), (2, (2, 0))),  # --include
    (Host("n", 2, gpus=(0, 1)), 2, (0, 1), (2, None)),
    (Host("n", gpus=(1,)), 4, (0, 1, 2, 3), (1, (1,))),
    (Host("n", excluded=(1, 3)), 4, (0, 1, 2, 3), (2, (0, 2))),  # --exclude where slots were not known
])
def test_resolve(host, default, gpus, expected):
    assert resolve(host, default, gpus) == expected


@pytest.mark.parametrize("host, gpus, sentence", [
    (Host("n", 8), (0, 1, 2, 3), "n has slots=8 but 4 GPU(s) (0,1,2,3); give it slots=4 or fewer."),
    (Host("n", gpus=(0, 5)), (0, 1, 2, 3), "--include or --exclude names GPU 5 of n, which has the GPUs 0,1,2,3; name "
                                           "only those."),
    (Host("n", excluded=(4,)), (0, 1), "--include or --exclude names GPU 4 of n, which has the GPUs 0,1; name only "
                                       "those."),
    (Host("n", excluded=(0, 1)), (0, 1), "--exclude leaves n no GPU (it has 0,1); exclude the whole host by its name "
                                         "alone, n, to run without it."),
    (Host("n", 4, gpus=(0,)), (), "n has no GPU, but --include or --exclude names GPU ids of it; name the host alone to "
                                  "keep or leave out the whole host."),
    (Host("n", excluded=(0,)), (), "n has no GPU, but --include or --exclude names GPU ids of it; name the host alone "
                                   "to keep or leave out the whole host."),
])
def test_resolve_refusals(host, gpus, sentence):
    assert refusal(resolve, host, 2, gpus) == sentence


# ---------------------------------------------------------------- ranks


def test_ranks_are_the_running_sum_of_each_nodes_workers():
    assert ranks([4, 2, 8, 1]) == (range(0, 4), range(4, 6), range(6, 14), range(14, 15))
    assert ranks([]) == ()


@given(st.lists(st.integers(1, 64), max_size=40))
@SETTINGS
def test_ranks_are_contiguous_disjoint_in_order_and_cover_the_world(counts):
    given_ranks = ranks(counts)
    assert [len(r) for r in given_ranks] == counts
    assert [rank for r in given_ranks for rank in r] == list(range(sum(counts)))  # in order, no gap, no overlap
    assert all(r.step == 1 for r in given_ranks)


# ---------------------------------------------------------------- random hosts, written in any form

LABEL = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=1, max_size=12)
NAMES = st.builds(".".join, st.lists(LABEL, min_size=1, max_size=3)).filter(
    lambda n: not n.startswith("-") and not n.replace(".", "").isdigit())
ADDRESSES = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))
HOST_LISTS = st.lists(st.builds(Host, st.one_of(NAMES, ADDRESSES), st.one_of(st.none(), st.integers(1, 512))),
                      min_size=1, max_size=12, unique_by=lambda h: same_host_key(h.name))


def _written(host: Host, form: int) -> str:
    v6 = ":" in host.name
    if host.slots is None:
        return (f"[{host.name}]" if v6 and form % 2 else host.name) + (" max_slots=9" if form == 2 else "")
    return [f"{host.name} slots={host.slots}", f"[{host.name}]:{host.slots}" if v6 else f"{host.name}:{host.slots}",
            f"{host.name}   slots = {host.slots}  max-slots={host.slots + 1}"][form % 3]


@given(HOST_LISTS, st.data())
@SETTINGS
def test_random_hosts_written_in_any_form_read_back_the_same(hosts, data):
    lines = []
    for host in hosts:
        lines += data.draw(st.lists(st.sampled_from(["", "   ", "# a comment", "\t# x slots=0", "#node9"]), max_size=2))
        comment = data.draw(st.sampled_from(["", " # trailing", "#x:0", "\t"]))
        lines.append(data.draw(st.sampled_from(["", " ", "\t"])) + _written(host, data.draw(st.integers(0, 2))) + comment)
    ending = data.draw(st.sampled_from(["\n", "\r\n"]))
    assert parse_hostfile(ending.join(lines), "hosts.txt") == tuple(hosts)


@given(HOST_LISTS)
@SETTINGS
def test_random_hosts_given_to_hosts_read_back_the_same(hosts):
    written = ",".join(_written(h, 1) for h in hosts)
    assert parse_hosts(written) == tuple(hosts)


@given(HOST_LISTS, st.data())
@SETTINGS
def test_a_host_written_twice_is_refused_naming_both_lines(hosts, data):
    twice = data.draw(st.sampled_from(hosts))
    lines = [_written(h, data.draw(st.integers(0, 2))) for h in hosts]
    at = data.draw(st.integers(0, len(lines)))
    first = hosts.index(twice) + 1 + (at <= hosts.index(twice))
    lines.insert(at, twice.name.upper() if ":" not in twice.name else str(ipaddress.ip_address(twice.name).exploded))
    said = refusal(parse_hostfile, "\n".join(lines), "f")
    assert said.startswith(f"f:{max(first, at + 1)} names ") and f"again (first at f:{min(first, at + 1)})" in said


def _selection(hosts, data):
    """A random --include/--exclude value over ``hosts``, and the hosts it names."""
    specs, named = [], set()
    for host in data.draw(st.lists(st.sampled_from(hosts), min_size=1, max_size=4)):
        name = f"[{host.name}]" if ":" in host.name else host.name
        top = host.slots or 8
        ids = data.draw(st.one_of(st.none(), st.lists(st.integers(0, top - 1), min_size=1, max_size=top)))
        specs.append(name if ids is None else name + ":" + ",".join(map(str, ids)))
        named.add(host.name)
    return "@".join(specs), named


def _gpus_of(host: Host) -> set:
    return set(host.gpus) if host.gpus is not None else set(range(host.slots or 8)) - set(host.excluded)


@given(HOST_LISTS, st.data())
@SETTINGS
def test_include_and_exclude_keep_order_and_only_remove(hosts, data):
    text, named = _selection(hosts, data)
    for include, exclude in ((text, None), (None, text)):
        try:
            kept = select(hosts, include, exclude)
        except LaunchError as e:
            assert exclude and "leaves no host" in str(e)
            continue
        names = [h.name for h in kept]
        assert names == [h.name for h in hosts if h.name in names]  # hostfile order, each once
        before = {h.name: h for h in hosts}
        for host in kept:
            assert host.slots == before[host.name].slots and _gpus_of(host) <= _gpus_of(before[host.name])
            assert _gpus_of(host) or host.slots is None  # never kept with no GPU left (unknown slots: resolve says)
        if include:
            assert set(names) == named
        else:
            assert all(h in kept for h in hosts if h.name not in named)  # the rest, untouched
