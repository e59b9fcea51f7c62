"""The elastic options of torchrun, Paddle 3.x and Paddle 2.x (launcher.plan.elastic): the lines accepted,
as the ElasticSpec each gives, and every refusal, as its whole sentence. Pure: no process."""

import pytest

from launcher.errors import LaunchError
from launcher.plan import elastic
from launcher.plan.elastic_spec import ElasticSpec, Rendezvous
from launcher.plan.etcd import EtcdSpec


def refusal(parse, values, *args) -> str:
    with pytest.raises(LaunchError) as caught:
        parse(values, *args)
    return str(caught.value)


def torchrun(**values):
    return {"rdzv_backend": "c10d", **values}


# ---------------------------------------------------------------- torchrun


def test_torchrun_elastic_line_as_the_pytorch_docs_show_it():
    spec = elastic.from_torchrun(torchrun(nnodes="2:3", rdzv_endpoint="10.0.0.1:29500", rdzv_id="job7", max_restarts=3))
    assert spec == ElasticSpec(2, 3, "c10d", host="10.0.0.1", port=29500, job_id="job7", max_restarts=3)
    assert spec.elastic and spec.rendezvous == Rendezvous()


def test_the_rendezvous_defaults_are_written_down_ours():
    r = Rendezvous()
    assert (r.join_timeout, r.last_call_timeout, r.close_timeout, r.heartbeat_timeout, r.read_timeout,
            r.keep_alive_interval, r.keep_alive_max_attempt) == (600, 1, 30, 3, 60, 1, 3)
    assert r.heartbeat_timeout == r.keep_alive_interval * r.keep_alive_max_attempt  # torchrun's dead-node rule agrees


@pytest.mark.parametrize("endpoint, where", [
    (None, ("127.0.0.1", 29400)), ("", ("127.0.0.1", 29400)), ("node0", ("node0", 29400)),
    ("node0:1234", ("node0", 1234)), ("[::1]:1234", ("::1", 1234)), ("[fe80::1]", ("fe80::1", 29400)),
    ("fe80::1", ("fe80::1", 29400)), ("node0:1", ("node0", 1)), ("node0:65535", ("node0", 65535)),
    ("[fe80::1%eth0]:29500", ("fe80::1%eth0", 29500)), ("fe80::1:2950", ("fe80::1:2950", 29400)),
    ("compose_node-0.example:7", ("compose_node-0.example", 7)), (" 10.0.0.1:29500 ", ("10.0.0.1", 29500)),
])
def test_torchrun_endpoint_without_a_port_is_on_29400_and_without_one_at_all_on_loopback(endpoint, where):
    spec = elastic.from_torchrun(torchrun(nnodes="1:4", rdzv_endpoint=endpoint))
    assert (spec.host, spec.port) == where


def test_every_rdzv_conf_key_is_taken_with_its_value():
    conf = ("join_timeout=120, last_call_timeout=0,close_timeout=45,heartbeat_timeout=10,read_timeout=5.5,"
            "keep_alive_interval=2,keep_alive_max_attempt=4,is_host=false")
    spec = elastic.from_torchrun(torchrun(nnodes="2:4", rdzv_conf=conf))
    assert spec.rendezvous == Rendezvous(120, 0, 45, 10, 5.5, 2, 4)


def test_without_heartbeat_timeout_torchruns_interval_times_attempts_is_the_silence_allowed():
    spec = elastic.from_torchrun(torchrun(nnodes="2:4", rdzv_conf="keep_alive_interval=5,keep_alive_max_attempt=3"))
    assert spec.rendezvous.heartbeat_timeout == 15
    spec = elastic.from_torchrun(torchrun(nnodes="2:4", rdzv_conf="keep_alive_max_attempt=5"))
    assert spec.rendezvous.heartbeat_timeout == 5


def test_the_static_rendezvous_timeout_key_is_the_join_timeout():
    assert elastic.from_torchrun(torchrun(nnodes="2:4", rdzv_conf="timeout=900")).rendezvous.join_timeout == 900
    assert elastic.parse_rdzv_conf("timeout=900,join_timeout=900").join_timeout == 900


@pytest.mark.parametrize("nnodes, backend", [("2", "static"), ("3:3", "c10d"), ("1", "static")])
def test_a_fixed_count_is_no_elastic_job_and_keeps_todays_checks(nnodes, backend):
    spec = elastic.from_torchrun({"nnodes": nnodes, "rdzv_backend": backend, "node_rank": 1})
    assert not spec.elastic and spec.min_nodes == spec.max_nodes == int(nnodes.split(":")[0])
    assert elastic.from_torchrun({}) == ElasticSpec(1, 1, "static")


def test_a_node_list_of_max_nodes_may_come_with_the_range_and_names_node_0():
    spec = elastic.from_torchrun(torchrun(nnodes="2:3", cluster_node_ips="10.0.0.1,10.0.0.2,10.0.0.3"))
    assert spec.node_hosts == ("10.0.0.1", "10.0.0.2", "10.0.0.3") and (spec.host, spec.port) == ("10.0.0.1", 29400)


# ---------------------------------------------------------------- Paddle 3.x and 2.x


def test_paddle3_elastic_line():
    spec = elastic.from_paddle3({"nnodes": "2:4", "master": "10.0.0.1:8090", "job_id": "j", "elastic_level": "1",
                                 "elastic_timeout": "30", "max_restart": "3", "rank": "-1"})
    assert spec == ElasticSpec(2, 4, "c10d", host="10.0.0.1", port=8090, job_id="j", max_restarts=3,
                               rendezvous=Rendezvous(last_call_timeout=30))


def test_paddle3_elastic_level_0_makes_a_failing_node_leave():
    assert elastic.from_paddle3({"nnodes": "2:4", "master": "h:1", "elastic_level": 0}).failed_node_leaves
    assert not elastic.from_paddle3({"nnodes": "2:4", "master": "h:1"}).failed_node_leaves


def test_paddle3_without_master_takes_node_0_from_ips():
    spec = elastic.from_paddle3({"nnodes": "1:2", "ips": "10.0.0.5,10.0.0.6"})
    assert (spec.host, spec.port, spec.node_hosts) == ("10.0.0.5", None, ("10.0.0.5", "10.0.0.6"))


def test_paddle3_fixed_count():
    assert elastic.from_paddle3({"nnodes": "2", "rank": "1", "elastic_level": "-1"}) == ElasticSpec(2, 2, "static")


def test_paddle2_np_range_with_job_id():
    spec = elastic.from_paddle2({"np": "2:3", "job_id": "job1", "ips": "a,b,c"})
    assert spec == ElasticSpec(2, 3, "c10d", host="a", job_id="job1", node_hosts=("a", "b", "c"))


def test_paddle2_reads_its_elastic_variables_when_the_options_are_not_given():
    env = {"PADDLE_ELASTIC_NP": "2:4", "PADDLE_ELASTIC_JOB_ID": "j9", "PADDLE_ELASTIC_TIMEOUT": "120",
           "PADDLE_ELASTIC_TTL": "60"}
    spec = elastic.from_paddle2({"master": "10.0.0.1:6000"}, env)
    assert spec == ElasticSpec(2, 4, "c10d", host="10.0.0.1", port=6000, job_id="j9",
                               rendezvous=Rendezvous(last_call_timeout=120, heartbeat_timeout=60))
    assert elastic.from_paddle2({"np": 2}, env) == ElasticSpec(2, 2, "static", job_id="j9", rendezvous=spec.rendezvous)


def test_a_short_paddle2_ttl_beats_three_times_within_it():
    spec = elastic.from_paddle2({"np": "1:2", "ips": "a,b"}, {"PADDLE_ELASTIC_TTL": "0.6"})
    assert spec.rendezvous.heartbeat_timeout == 0.6 and spec.rendezvous.keep_alive_interval == pytest.approx(0.2)


# ---------------------------------------------------------------- refusals, one sentence each


@pytest.mark.parametrize("text, sentence", [
    ("3:2", "--nnodes 3:2 has its minimum above its maximum; give MIN:MAX with MIN at most MAX, such as 2:3."),
    ("0:2", "--nnodes 0:2 has a minimum of 0 nodes; give 1 or more, such as 1:2."),
    ("0", "--nnodes 0 is not a number of nodes; give 1 or more."),
    ("2:x", "--nnodes 2:x is not a number of nodes or a MIN:MAX range; give one such as 2 or 2:4."),
    (":", "--nnodes : is not a number of nodes or a MIN:MAX range; give one such as 2 or 2:4."),
    ("1:2:3", "--nnodes 1:2:3 is not a number of nodes or a MIN:MAX range; give one such as 2 or 2:4."),
    ("-1:2", "--nnodes -1:2 is not a number of nodes or a MIN:MAX range; give one such as 2 or 2:4."),
    ("²:3", "--nnodes ²:3 is not a number of nodes or a MIN:MAX range; give one such as 2 or 2:4."),
])
def test_a_bad_node_count_is_refused_in_every_dialect(text, sentence):
    assert refusal(elastic.from_torchrun, torchrun(nnodes=text)) == sentence
    assert refusal(elastic.from_paddle3, {"nnodes": text, "master": "h:1"}) == sentence
    assert refusal(elastic.from_paddle2, {"np": text, "ips": "a"}) == sentence.replace("--nnodes", "--np")
    assert refusal(elastic.from_paddle2, {}, {"PADDLE_ELASTIC_NP": text}) == sentence.replace("--nnodes",
                                                                                              "PADDLE_ELASTIC_NP")


def test_a_range_with_a_fixed_node_rank_is_refused():
    assert refusal(elastic.from_torchrun, torchrun(nnodes="2:3", node_rank=1)) == (
        "--node-rank 1 fixes this node's rank, but the ranks of an elastic job (--nnodes 2:3) come from the order "
        "the nodes join; drop --node-rank.")
    assert refusal(elastic.from_paddle3, {"nnodes": "2:3", "master": "h:1", "rank": "0"}) == (
        "--rank 0 fixes this node's rank, but the ranks of an elastic job (--nnodes 2:3) come from the order "
        "the nodes join; drop --rank.")


def test_a_range_with_a_node_list_of_another_size_is_refused():
    assert refusal(elastic.from_torchrun, torchrun(nnodes="2:3", cluster_node_ips="10.0.0.1,10.0.0.2")) == (
        "--cluster_node_ips 10.0.0.1,10.0.0.2 lists 2 node(s), but --nnodes 2:3 lets 3 join; give all 3 addresses, "
        "node 0 first, or no --cluster_node_ips.")
    assert refusal(elastic.from_paddle2, {"np": "1:2", "ips": "a,b,c"}) == (
        "--ips a,b,c lists 3 node(s), but --nnodes 1:2 lets 2 join; give all 2 addresses, node 0 first, or no --ips.")



def test_nodes_of_an_elastic_job_may_share_a_host():
    assert elastic.from_paddle3({"nnodes": "1:2", "ips": "b,b"}).node_hosts == ("b", "b")


def test_a_range_on_the_static_backend_is_refused():
    assert refusal(elastic.from_torchrun, {"nnodes": "2:3"}) == (
        "--nnodes 2:3 with --rdzv-backend static: a static rendezvous has a fixed number of nodes; give "
        "--rdzv-backend c10d for an elastic job, or --nnodes 3.")


def test_an_unknown_backend_is_refused():
    assert refusal(elastic.from_torchrun, {"rdzv_backend": "zmq"}) == (
        "--rdzv-backend zmq is not a rendezvous backend of this launcher; give c10d, etcd or static.")


def test_an_unknown_rdzv_conf_key_is_refused_naming_the_known_ones():
    assert refusal(elastic.from_torchrun, torchrun(nnodes="2:3", rdzv_conf="join_timout=60")) == (
        "--rdzv-conf has the unknown key 'join_timout'; the known keys are close_timeout, heartbeat_timeout, is_host, "
        "join_timeout, keep_alive_interval, keep_alive_max_attempt, last_call_timeout, read_timeout, timeout: drop it "
        "or correct its spelling.")


@pytest.mark.parametrize("conf, sentence", [
    ("join_timeout=0", "--rdzv-conf join_timeout=0 is outside 0.5 to 86400 seconds; give a value in that range, "
                       "such as join_timeout=600."),
    ("last_call_timeout=-1", "--rdzv-conf last_call_timeout=-1 is outside 0 to 3600 seconds; give a value in that "
                             "range, such as last_call_timeout=1."),
    ("heartbeat_timeout=1e9", "--rdzv-conf heartbeat_timeout=1e9 is outside 0.5 to 3600 seconds; give a value in "
                              "that range, such as heartbeat_timeout=3."),
    ("keep_alive_max_attempt=0", "--rdzv-conf keep_alive_max_attempt=0 is outside 1 to 1000; give a value in that "
                                 "range, such as keep_alive_max_attempt=3."),
    ("close_timeout=abc", "--rdzv-conf close_timeout=abc is not a number of seconds; give one from 0.5 to 86400, "
                          "such as close_timeout=30."),
    ("read_timeout=nan", "--rdzv-conf read_timeout=nan is not a number of seconds; give one from 0.5 to 3600, "
                         "such as read_timeout=60."),
    ("read_timeout=inf", "--rdzv-conf read_timeout=inf is not a number of seconds; give one from 0.5 to 3600, "
                         "such as read_timeout=60."),
    ("keep_alive_interval=１", "--rdzv-conf keep_alive_interval=１ is not a number of seconds; give one from 0.05 to "
                              "600, such as keep_alive_interval=1."),
    ("keep_alive_max_attempt=2.5", "--rdzv-conf keep_alive_max_attempt=2.5 is not a whole number; give one from 1 "
                                   "to 1000, such as keep_alive_max_attempt=3."),
    ("is_host=perhaps", "--rdzv-conf is_host=perhaps is not true or false; give true, false, 1 or 0."),
    ("join_timeout", "--rdzv-conf join_timeout is not KEY=VALUE; give KEY=VALUE pairs separated by commas, such as "
                     "join_timeout=600,last_call_timeout=1."),
    ("join_timeout=60,=3", "--rdzv-conf join_timeout=60,=3 has '=3', which is not KEY=VALUE; give KEY=VALUE pairs "
                           "separated by commas, such as join_timeout=600,last_call_timeout=1."),
    ("read_timeout=", "--rdzv-conf read_timeout= is not KEY=VALUE; give KEY=VALUE pairs separated by commas, such as "
                      "join_timeout=600,last_call_timeout=1."),
    ("timeout=60,join_timeout=90", "--rdzv-conf gives join_timeout twice (timeout=60, join_timeout=90); give it once."),
    ("heartbeat_timeout=1,keep_alive_interval=2", "--rdzv-conf heartbeat_timeout=1 is not longer than "
     "keep_alive_interval=2: a node would count as lost between two of its heartbeats; give a heartbeat_timeout of "
     "a few intervals."),
])
def test_a_bad_rdzv_conf_value_is_refused(conf, sentence):
    assert refusal(elastic.from_torchrun, torchrun(nnodes="2:3", rdzv_conf=conf)) == sentence


@pytest.mark.parametrize("endpoint", ["node0:0", "node0:65536", "node0:x", ":29400", "[::1]:", "[::1]x", "[::1",
                                      "[node0]:29400", "fe80::1:x", "h/x:29400", "u@h:29400", "10.0.0:29400", "29400",
                                      "node0:²", "node0: 29400"])
def test_a_bad_endpoint_is_refused(endpoint):
    assert refusal(elastic.from_torchrun, torchrun(nnodes="2:3", rdzv_endpoint=endpoint)) == (
        f"--rdzv-endpoint {endpoint} is not HOST:PORT; give node 0's address and a port such as 10.0.0.1:29400.")


@pytest.mark.parametrize("values, sentence", [
    ({"max_restarts": -1}, "--max-restarts -1 is not a number of restarts; give 0 (no restart) or more."),
    ({"max_restarts": "x"}, "--max-restarts x is not a number of restarts; give 0 (no restart) or more."),
])
def test_a_bad_restart_count_is_refused(values, sentence):
    assert refusal(elastic.from_torchrun, torchrun(nnodes="2:3", **values)) == sentence


@pytest.mark.parametrize("values, sentence", [
    ({"elastic_level": "2"}, "--elastic_level 2 is not one of -1, 0, 1; give -1 or 1 (a worker failure restarts the "
                             "job, up to --max_restart) or 0 (the failing node leaves, the others go on)."),
    ({"elastic_timeout": "-5"}, "--elastic_timeout -5 is outside 0 to 3600 seconds; give a value in that range, such "
                                "as --elastic_timeout 1."),
    ({"max_restart": "1.5"}, "--max_restart 1.5 is not a number of restarts; give 0 (no restart) or more."),
    ({"master": "10.0.0.1"}, "--master 10.0.0.1 is not IP:PORT; give node 0's address and a free port, such as "
                             "10.0.0.1:8090."),
    ({"master": "10.0.0.9:8090", "ips": "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4"},
     "--master 10.0.0.9:8090 is not on node 0 (10.0.0.1, the first of --ips): the rendezvous is node 0's; give --master "
     "10.0.0.1:8090."),
    ({"master": None}, "--nnodes 2:4 needs node 0's address: give --master IP:PORT (the same on every node) or --ips "
                       "with node 0 first."),
])
def test_paddle3_refusals(values, sentence):
    assert refusal(elastic.from_paddle3, {"nnodes": "2:4", "master": "10.0.0.1:8090", **values}) == sentence


def test_paddle2_without_node_0_is_refused():
    assert refusal(elastic.from_paddle2, {"np": "2:4", "job_id": "j"}) == (
        "--np 2:4 needs node 0's address: give --master IP:PORT (the same on every node) or --ips with node 0 first.")
    assert refusal(elastic.from_paddle2, {}, {"PADDLE_ELASTIC_NP": "2:4", "PADDLE_ELASTIC_TIMEOUT": "x"}) == (
        "PADDLE_ELASTIC_TIMEOUT=x is not a number of seconds; give one from 0 to 3600, such as PADDLE_ELASTIC_TIMEOUT=1.")


# ---------------------------------------------------------------- etcd: the three spellings accepted


def in_etcd(**values):
    return {"rdzv_backend": "etcd", "nnodes": "2:3", "rdzv_endpoint": "10.0.0.5:2379", **values}


def test_torchrun_etcd_line_as_the_docs_show_it():
    spec = elastic.from_torchrun(in_etcd(rdzv_id="job1", max_restarts=2, rdzv_conf="join_timeout=60"))
    assert spec == ElasticSpec(2, 3, "etcd", host="10.0.0.5", port=2379, job_id="job1", max_restarts=2,
                               rendezvous=Rendezvous(join_timeout=60, heartbeat_timeout=10),
                               etcd=EtcdSpec((("10.0.0.5", 2379),)))
    assert spec.elastic and spec.etcd.shown() == "http://10.0.0.5:2379"


def test_etcds_heartbeat_timeout_is_10_s_unless_given_or_made_from_the_interval():
    """10 s (torchrun's etcd lease) outlasts the election of etcd's next leader (1-2 s), during which no lease can
    be renewed; what the user gives, or torchrun's interval x attempts, is kept as given; c10d keeps 3 s."""
    def timeout(conf=None):
        return elastic.from_torchrun(in_etcd(rdzv_conf=conf)).rendezvous.heartbeat_timeout

    assert timeout() == 10 and timeout("join_timeout=60") == 10
    assert timeout("heartbeat_timeout=2") == 2
    assert timeout("keep_alive_interval=0.5") == 1.5 and timeout("keep_alive_max_attempt=5") == 5
    assert elastic.from_torchrun(in_etcd(rdzv_backend="c10d")).rendezvous.heartbeat_timeout == 3
    assert elastic.from_paddle3({"nnodes": "2", "master": "etcd://10.0.0.5:2379"}).rendezvous.heartbeat_timeout == 10
    paddle2 = {"np": "2", "elastic_server": "10.0.0.5:2379", "job_id": "j"}
    assert elastic.from_paddle2(paddle2).rendezvous.heartbeat_timeout == 10
    assert elastic.from_paddle2(paddle2, {"PADDLE_ELASTIC_TTL": "30"}).rendezvous.heartbeat_timeout == 30


@pytest.mark.parametrize("backend", ["etcd", "etcd-v2", "ETCD"])
def test_etcd_v2_is_etcd_here(backend):
    assert elastic.from_torchrun(in_etcd(rdzv_backend=backend)).backend == "etcd"


@pytest.mark.parametrize("nnodes", [None, "1", "2", "3:3"])
def test_with_etcd_a_fixed_count_is_elastic_too(nnodes):
    spec = elastic.from_torchrun(in_etcd(nnodes=nnodes))
    assert spec.backend == "etcd" and spec.elastic and spec.min_nodes == spec.max_nodes
    assert elastic.from_paddle3({"nnodes": nnodes, "master": "etcd://10.0.0.5:2379"}).elastic
    assert elastic.from_paddle2({"np": nnodes, "elastic_server": "10.0.0.5:2379", "job_id": "j"}).elastic


@pytest.mark.parametrize("endpoint, endpoints, protocol", [
    ("h1:2379,h2", (("h1", 2379), ("h2", 2379)), "http"),  # no port: etcd's client port
    (" h1:2380 , h2:2381 ,", (("h1", 2380), ("h2", 2381)), "http"),
    ("[::1]:2379", (("::1", 2379),), "http"),
    ("[::1]", (("::1", 2379),), "http"),
    ("::1", (("::1", 2379),), "http"),
    ("[fe80::1]:2380,10.0.0.2", (("fe80::1", 2380), ("10.0.0.2", 2379)), "http"),
    ("https://[fe80::1%eth0]:2380,fe80::2", (("fe80::1%eth0", 2380), ("fe80::2", 2379)), "https"),
    ("etcd_1:2379,etcd-2.example.com", (("etcd_1", 2379), ("etcd-2.example.com", 2379)), "http"),
    ("http://h1:2379", (("h1", 2379),), "http"),
    ("https://h1:2379/,HTTPS://h2", (("h1", 2379), ("h2", 2379)), "https"),
])
def test_etcd_endpoints_their_ports_and_protocol(endpoint, endpoints, protocol):
    spec = elastic.from_torchrun(in_etcd(rdzv_endpoint=endpoint))
    assert (spec.etcd.endpoints, spec.etcd.protocol) == (endpoints, protocol)
    assert (spec.host, spec.port) == endpoints[0]  # host:port name the first member


def test_the_etcd_keys_of_rdzv_conf_are_taken_beside_the_rendezvous_settings():
    conf = "protocol=https,cacert=ca.pem,cert=client.pem,key=client-key.pem,user=root,password=pw,last_call_timeout=5"
    spec = elastic.from_torchrun(in_etcd(rdzv_conf=conf))
    assert spec.etcd == EtcdSpec((("10.0.0.5", 2379),), "https", "ca.pem", "client.pem", "client-key.pem", "root", "pw")
    assert spec.rendezvous == Rendezvous(last_call_timeout=5, heartbeat_timeout=10)
    assert "pw" not in repr(spec)  # the password is never shown


@pytest.mark.parametrize("conf", ["cacert=ca.pem", "cert=c.pem,key=k.pem", "cacert=ca.pem,cert=c.pem,key=k.pem"])
def test_a_certificate_without_protocol_means_https(conf):
    assert elastic.from_torchrun(in_etcd(rdzv_conf=conf)).etcd.protocol == "https"
    assert elastic.from_torchrun(in_etcd(rdzv_conf=conf + ",protocol=http")).etcd.protocol == "http"  # as told


def test_an_https_endpoint_says_https_and_protocol_may_repeat_it():
    assert elastic.from_torchrun(in_etcd(rdzv_endpoint="https://h1")).etcd.protocol == "https"
    assert elastic.from_torchrun(in_etcd(rdzv_endpoint="https://h1", rdzv_conf="protocol=HTTPS")).etcd.protocol == "https"
    assert elastic.from_torchrun(in_etcd(rdzv_conf="protocol=https")).etcd.protocol == "https"


@pytest.mark.parametrize("conf, env, user, password", [
    ("user=root,password=pw", {}, "root", "pw"),
    ("user=root:pw", {}, "root", "pw"),  # etcdctl's --user NAME:PASSWORD
    ("user=root:p:w", {}, "root", "p:w"),  # the password after the first colon
    ("user=root", {"LAUNCHER_ETCD_PASSWORD": "pw"}, "root", "pw"),
    ("user=root,password=pw", {"LAUNCHER_ETCD_PASSWORD": "other"}, "root", "pw"),  # the option first
    ("", {"LAUNCHER_ETCD_PASSWORD": "pw"}, None, None),  # no user: no password
])
def test_the_etcd_user_and_its_password(conf, env, user, password):
    spec = elastic.from_torchrun(in_etcd(rdzv_conf=conf), env).etcd
    assert (spec.user, spec.password) == (user, password)


def test_paddle3_etcd_master_with_user_and_several_members():
    spec = elastic.from_paddle3({"nnodes": "2:4", "master": "etcd://user:pass@h1:2379,h2", "job_id": "j",
                                 "elastic_level": "0", "max_restart": "2"})
    assert spec == ElasticSpec(2, 4, "etcd", host="h1", port=2379, job_id="j", max_restarts=2, failed_node_leaves=True,
                               etcd=EtcdSpec((("h1", 2379), ("h2", 2379)), user="user", password="pass"),
                               rendezvous=Rendezvous(heartbeat_timeout=10))


@pytest.mark.parametrize("master, endpoints, user, password", [
    ("etcd://[::1]:2379", (("::1", 2379),), None, None),
    ("ETCD://h1", (("h1", 2379),), None, None),
    ("etcd://u:p@ss@h1:2380", (("h1", 2380),), "u", "p@ss"),  # the last '@' ends the credentials
])
def test_paddle3_etcd_master_spellings(master, endpoints, user, password):
    spec = elastic.from_paddle3({"nnodes": "2:3", "master": master}).etcd
    assert (spec.endpoints, spec.user, spec.password) == (endpoints, user, password)


def test_paddle3_etcd_user_takes_its_password_from_the_environment():
    spec = elastic.from_paddle3({"nnodes": "2:3", "master": "etcd://u@h1"}, {"LAUNCHER_ETCD_PASSWORD": "pw"})
    assert (spec.etcd.user, spec.etcd.password) == ("u", "pw")


def test_an_https_endpoint_keeps_its_protocol_in_paddles_spellings():
    assert elastic.from_paddle3({"nnodes": "2:3", "master": "etcd://https://h1:2379"}).etcd.protocol == "https"
    spec = elastic.from_paddle2({"np": "2", "elastic_server": "https://h1:2379,https://h2", "job_id": "j"})
    assert (spec.etcd.protocol, spec.etcd.endpoints) == ("https", (("h1", 2379), ("h2", 2379)))


def test_paddle2_elastic_server_with_job_id():
    spec = elastic.from_paddle2({"np": "2:4", "elastic_server": "10.0.0.5:2379", "job_id": "job1"})
    assert spec == ElasticSpec(2, 4, "etcd", host="10.0.0.5", port=2379, job_id="job1",
                               etcd=EtcdSpec((("10.0.0.5", 2379),)), rendezvous=Rendezvous(heartbeat_timeout=10))
    assert elastic.from_paddle2({"np": "2", "elastic_server": "etcd://10.0.0.5", "job_id": "j"}).etcd == spec.etcd


def test_paddle2_reads_its_etcd_variables():
    env = {"PADDLE_ELASTIC_SERVER": "10.0.0.5:2379", "PADDLE_ELASTIC_JOB_ID": "j9", "PADDLE_ELASTIC_NP": "2:3"}
    spec = elastic.from_paddle2({}, env)
    assert (spec.backend, spec.job_id, spec.min_nodes, spec.max_nodes, spec.etcd.endpoints) == (
        "etcd", "j9", 2, 3, (("10.0.0.5", 2379),))
    assert elastic.from_paddle2({"elastic_server": "h9:1", "job_id": "k"}, env).etcd.endpoints == (("h9", 1),)


# ---------------------------------------------------------------- etcd: refusals, one sentence each


def test_etcd_without_its_endpoint_is_refused():
    sentence = ("--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT of etcd (2379 is etcd's client port), the same on "
                "every node.")
    assert refusal(elastic.from_torchrun, in_etcd(rdzv_endpoint=None)) == sentence
    assert refusal(elastic.from_torchrun, {"rdzv_backend": "etcd-v2", "rdzv_endpoint": ""}) == sentence


@pytest.mark.parametrize("endpoint, item", [
    ("h1:x", "h1:x"), ("h1:0", "h1:0"), ("h1:65536", "h1:65536"), (":2379", ":2379"), ("h1:2379,h2:", "h2:"),
    ("[::1]:", "[::1]:"), ("[::1]x", "[::1]x"), ("[::1", "[::1"), ("h1:2379:1", "h1:2379:1"),
    ("u:pw@h1:2379", "u:pw@h1:2379"), ("u@h1:2379", "u@h1:2379"), ("h1/v3:2379", "h1/v3:2379"), ("http://", ""),
    ("h1:²", "h1:²"), ("2379", "2379"), ("10.0.0:2379", "10.0.0:2379"),
])
def test_a_bad_etcd_endpoint_is_refused_naming_it(endpoint, item):
    assert refusal(elastic.from_torchrun, in_etcd(rdzv_endpoint=endpoint)) == (
        f"--rdzv-endpoint {endpoint} has the endpoint {item!r}, which is not HOST:PORT; give etcd's address and client "
        "port, such as 10.0.0.1:2379.")


@pytest.mark.parametrize("endpoint", [",", " , "])
def test_an_etcd_endpoint_list_of_nothing_is_refused(endpoint):
    assert refusal(elastic.from_torchrun, in_etcd(rdzv_endpoint=endpoint)) == (
        f"--rdzv-endpoint {endpoint!r} names no etcd endpoint; give HOST:PORT of etcd, such as 10.0.0.1:2379.")


def test_etcd_endpoints_of_mixed_protocols_are_refused():
    assert refusal(elastic.from_torchrun, in_etcd(rdzv_endpoint="http://h1:2379,https://h2:2379")) == (
        "--rdzv-endpoint http://h1:2379,https://h2:2379 mixes http:// and https:// endpoints; give one protocol for "
        "every member.")


@pytest.mark.parametrize("endpoint, scheme", [("ftp://h1:2379", "ftp"), ("h1:2379,etcd://h2", "etcd"),
                                              ("unix://run/etcd.sock", "unix")])
def test_an_etcd_endpoint_of_another_scheme_is_refused(endpoint, scheme):
    assert refusal(elastic.from_torchrun, in_etcd(rdzv_endpoint=endpoint)) == (
        f"--rdzv-endpoint {endpoint} names the scheme {scheme!r}; give HOST:PORT of etcd, or http:// or https:// "
        "before it.")


@pytest.mark.parametrize("conf, sentence", [
    ("cert=c.pem", "--rdzv-conf gives cert without key (or key without cert); a client certificate needs both: "
                   "cert=CLIENT.pem,key=CLIENT-key.pem."),
    ("cacert=ca.pem,key=k.pem", "--rdzv-conf gives cert without key (or key without cert); a client certificate needs "
                                "both: cert=CLIENT.pem,key=CLIENT-key.pem."),
    ("protocol=ftp", "--rdzv-conf protocol=ftp is not http or https; give protocol=https for TLS, or leave it out."),
    ("user=root", "the etcd user root has no password; give it in LAUNCHER_ETCD_PASSWORD (or user=NAME:PASSWORD)."),
    ("password=pw", "an etcd password was given without a user; give --rdzv-conf user=NAME too."),
    ("user=:pw", "an etcd password was given without a user; give --rdzv-conf user=NAME too."),
    ("user=a,user=b", "--rdzv-conf gives user twice (user=a, user=b); give it once."),
    ("join_timout=60", "--rdzv-conf has the unknown key 'join_timout'; the known keys are close_timeout, "
     "heartbeat_timeout, is_host, join_timeout, keep_alive_interval, keep_alive_max_attempt, last_call_timeout, "
     "read_timeout, timeout: drop it or correct its spelling."),
])
def test_a_bad_etcd_rdzv_conf_is_refused(conf, sentence):
    assert refusal(elastic.from_torchrun, in_etcd(rdzv_conf=conf), {}) == sentence


def test_the_password_variable_does_not_stand_in_for_the_user_or_a_refusal():
    assert refusal(elastic.from_torchrun, in_etcd(rdzv_conf="user=root"), {"LAUNCHER_ETCD_PASSWORD": ""}) == (
        "the etcd user root has no password; give it in LAUNCHER_ETCD_PASSWORD (or user=NAME:PASSWORD).")


def test_a_protocol_that_disagrees_with_the_endpoints_is_refused():
    assert refusal(elastic.from_torchrun, in_etcd(rdzv_endpoint="https://h1", rdzv_conf="protocol=http")) == (
        "--rdzv-conf protocol=http disagrees with the https:// endpoints; give one of them.")


@pytest.mark.parametrize("backend", [None, "static", "c10d"])
def test_etcd_keys_in_rdzv_conf_without_etcd_are_refused(backend):
    values = {"nnodes": "2:3", "rdzv_backend": backend, "rdzv_conf": "join_timeout=60,cacert=ca.pem,user=u"}
    assert refusal(elastic.from_torchrun, values) == (
        "--rdzv-conf cacert,user= is for an etcd rendezvous; give --rdzv-backend etcd, or drop it.")


def test_a_fixed_node_rank_or_a_short_node_list_is_refused_with_etcd_too():
    assert refusal(elastic.from_torchrun, in_etcd(nnodes="2", node_rank=0)) == (
        "--node-rank 0 fixes this node's rank, but the ranks of an elastic job (--nnodes 2) come from the order the "
        "nodes join; drop --node-rank.")
    assert refusal(elastic.from_torchrun, in_etcd(cluster_node_ips="10.0.0.1,10.0.0.2")) == (
        "--cluster_node_ips 10.0.0.1,10.0.0.2 lists 2 node(s), but --nnodes 2:3 lets 3 join; give all 3 addresses, "
        "node 0 first, or no --cluster_node_ips.")


@pytest.mark.parametrize("master, sentence", [
    ("etcd://", "--master 'etcd://' names no etcd endpoint; give HOST:PORT of etcd, such as 10.0.0.1:2379."),
    ("etcd://h1:x", "--master etcd://h1:x has the endpoint 'h1:x', which is not HOST:PORT; give etcd's address and "
                    "client port, such as 10.0.0.1:2379."),
    ("etcd://u:secret@h1:x", "--master etcd://...@h1:x has the endpoint 'h1:x', which is not HOST:PORT; give etcd's "
                             "address and client port, such as 10.0.0.1:2379."),
    ("etcd://@h1", "--master etcd://...@h1 names no user before '@'; give etcd://USER:PASSWORD@HOST:PORT or no '@'."),
    ("etcd://:secret@h1", "--master etcd://...@h1 names no user before '@'; give etcd://USER:PASSWORD@HOST:PORT or no "
                          "'@'."),
    ("etcd://u@h1", "the etcd user u has no password; give it in LAUNCHER_ETCD_PASSWORD (or "
                    "etcd://NAME:PASSWORD@HOST:PORT)."),
    ("etcd://http://h1,https://h2", "--master etcd://http://h1,https://h2 mixes http:// and https:// endpoints; give "
                                    "one protocol for every member."),
    ("http://h1:2379", "--master http://h1:2379 is not IP:PORT; give node 0's address and a free port, such as "
                       "10.0.0.1:8090 (or etcd://HOST:PORT of etcd, with --nnodes)."),
    ("ftp://u:secret@h1", "--master ftp://...@h1 is not IP:PORT; give node 0's address and a free port, such as "
                          "10.0.0.1:8090 (or etcd://HOST:PORT of etcd, with --nnodes)."),
])
def test_a_bad_paddle3_etcd_master_is_refused_never_showing_the_password(master, sentence):
    assert refusal(elastic.from_paddle3, {"nnodes": "2:3", "master": master}, {}) == sentence
    assert "secret" not in sentence


def test_paddle2_etcd_without_job_id_is_refused():
    assert refusal(elastic.from_paddle2, {"np": "2", "elastic_server": "127.0.0.1:2379"}) == (
        "--elastic_server 127.0.0.1:2379 keeps the membership of many jobs in etcd: give --job_id ID (or "
        "PADDLE_ELASTIC_JOB_ID), the same on every node of this job.")
    assert refusal(elastic.from_paddle2, {}, {"PADDLE_ELASTIC_SERVER": "h1:2379", "PADDLE_ELASTIC_NP": "2:3"}) == (
        "PADDLE_ELASTIC_SERVER h1:2379 keeps the membership of many jobs in etcd: give --job_id ID (or "
        "PADDLE_ELASTIC_JOB_ID), the same on every node of this job.")
    assert refusal(elastic.from_paddle2, {"elastic_server": "etcd://u:secret@h1"}) == (
        "--elastic_server etcd://...@h1 keeps the membership of many jobs in etcd: give --job_id ID (or "
        "PADDLE_ELASTIC_JOB_ID), the same on every node of this job.")


@pytest.mark.parametrize("server, sentence", [
    ("h1:x", "--elastic_server h1:x has the endpoint 'h1:x', which is not HOST:PORT; give etcd's address and client "
             "port, such as 10.0.0.1:2379."),
    ("ftp://h1", "--elastic_server ftp://h1 names the scheme 'ftp'; give HOST:PORT of etcd, or http:// or https:// "
                 "before it."),
    ("etcd://u@h1", "the etcd user u has no password; give it in LAUNCHER_ETCD_PASSWORD (or "
                    "etcd://NAME:PASSWORD@HOST:PORT)."),
])
def test_a_bad_paddle2_elastic_server_is_refused(server, sentence):
    assert refusal(elastic.from_paddle2, {"np": "2:3", "elastic_server": server, "job_id": "j"}) == sentence
