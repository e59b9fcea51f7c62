"""Kubeflow Trainer's TrainJob status (KEP-2779) pushed by node 0's launcher to an HTTPS server this test starts, with a
CA of its own (openssl): the token as a bearer, the progress from ``total_steps``, the scalars as metrics; a server
that is down or not trusted costs one warning and never the job."""

import http.server
import json
import shutil
import ssl
import subprocess
import threading

import pytest

from conftest import WORKERS, start_launcher, wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make the test's CA")
REPORTER = WORKERS / "reporter.py"
PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/job1/status"
WAIT = 60


def make_ca(folder, name):
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    run = lambda *args: subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)  # noqa: E731
    ca_key, ca, key, csr, cert = (folder / f"{name}.{x}" for x in ("ca.key", "ca.pem", "key", "csr", "pem"))
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", f"/CN={name} CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    ext = folder / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
        "-extfile", ext)
    return ca, cert, key


@pytest.fixture
def server(tmp_path):
    """An HTTPS server on 127.0.0.1 recording each POST: (url, CA file, what it heard)."""
    ca, cert, key = make_ca(tmp_path, "trainer")
    heard = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            heard.append((self.path, self.headers.get("Authorization"), json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}{PATH}", ca, heard
    httpd.shutdown()
    httpd.server_close()


def job(tmp_path, url, ca):
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    return start_launcher("--nproc_per_node", 2, "--log_dir", tmp_path / "logs", REPORTER, tmp_path, env={
        "KUBEFLOW_TRAINER_SERVER_URL": url, "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(ca),
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token), "REPORTER_TOTAL_STEPS": "500"})


def test_node_0_posts_the_progress_with_the_token(tmp_path, server):
    url, ca, heard = server
    proc = job(tmp_path, url, ca)
    try:
        wait_for(lambda: any(h[2]["trainerStatus"].get("progressPercentage", 0) >= 1 for h in heard), WAIT,
                 "a status with some progress")
    finally:
        (tmp_path / "stop").touch()
        out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    path, auth, body = heard[-1]
    status = body["trainerStatus"]
    assert path == PATH and auth == "Bearer tok-123"
    assert 0 <= status["progressPercentage"] <= 100 and status["estimatedRemainingSeconds"] >= 0
    names = {m["name"]: m["value"] for m in status["metrics"]}
    assert {"step", "loss", "lr"} <= set(names) and all(isinstance(v, str) for v in names.values())
    assert status["lastUpdatedTime"].endswith("Z") and "T" in status["lastUpdatedTime"]
    assert "Kubeflow Trainer status" not in err


@pytest.mark.parametrize("where", ["down", "another CA"])
def test_a_server_down_or_not_trusted_is_one_warning(tmp_path, server, where):
    url, ca, heard = server
    if where == "down":
        url = "https://127.0.0.1:9" + PATH
    else:
        ca = make_ca(tmp_path, "other")[0]
    proc = job(tmp_path, url, ca)
    try:
        log = tmp_path / "logs" / "workerlog.0"
        wait_for(lambda: log.exists() and "step 5" in log.read_text(), WAIT, "rank 0's steps (reported, then pushed)")
    finally:
        (tmp_path / "stop").touch()
        out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert err.count("Kubeflow Trainer status: could not post") == 1, err
    assert heard == []
