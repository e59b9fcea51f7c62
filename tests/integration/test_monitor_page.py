"""The live page (--monitor_port's /) in a real headless Chromium (Debian's chromium and chromium-driver, driven by
selenium): it needs nothing but the launcher (no network beyond the node), a line a worker writes shows on its row,
and a worker's failure turns its row to failed, each without a reload. Skipped where there is no Chromium."""

import os
import shutil
import time

import pytest

from conftest import WORKERS, start_launcher, wait_for
from test_elastic import power_off

pytest.importorskip("prometheus_client")
webdriver = pytest.importorskip("selenium.webdriver")
pytestmark = pytest.mark.skipif(not (shutil.which("chromium") and shutil.which("chromedriver")),
                                reason="no chromium and chromium-driver (apt)")
REPORTER = WORKERS / "reporter.py"
WAIT = 60


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"):
        options.add_argument(arg)  # the last: no name resolves, as on a node without a network
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


def rows(driver) -> dict:
    """rank -> (state, last line) of the page's table as it is now (read in one script: the page replaces its rows
    as views come)."""
    found = driver.execute_script(
        "return Array.from(document.querySelectorAll('#rows tr')).map(tr => "
        "[Number(tr.dataset.rank), tr.cells[2].textContent, tr.cells[8].textContent, tr.className])")
    return {rank: (state, line) for rank, state, line, _ in found}


def test_the_page_follows_the_job_without_a_reload(tmp_path, browser):
    proc = start_launcher("--nproc_per_node", 2, "--monitor_port", 0, "--log_dir", tmp_path / "logs",
                          "--shutdown_timeout", 30, REPORTER, tmp_path, env={"REPORTER_SLOW_STOP": "1"})
    try:
        line = proc.stderr.readline()
        while line and "monitor: http://" not in line:
            line = proc.stderr.readline()
        url = line.split("monitor: ", 1)[1].split(" ", 1)[0]
        browser.get(url)
        wait_for(lambda: rows(browser).get(0, ("", ""))[1].startswith("step "), WAIT, "rank 0's first line on the page")
        first = rows(browser)[0][1]
        wait_for(lambda: rows(browser)[0][1] != first, WAIT, "rank 0's next line, with no reload")
        (tmp_path / "fail.1").touch()  # rank 1 exits 3; rank 0 ignores the stop for a moment (REPORTER_SLOW_STOP)
        wait_for(lambda: rows(browser).get(1, ("",))[0] == "failed", WAIT, "rank 1's row turned to failed")
        assert browser.execute_script("return document.querySelector(\"#rows tr[data-rank='1']\").className") == "failed"
        assert browser.execute_script("return performance.getEntriesByType('resource')"
                                      ".filter(e => !e.name.startsWith(location.origin)).length") == 0
    finally:
        power_off(proc)  # its workers too: rank 0 would stop 20 s after the launcher's SIGTERM
        proc.communicate()


def test_any_node_s_page_shows_the_whole_job(tmp_path, browser):
    """Two launchers (127.0.0.1 and 127.0.0.2) with the same --monitor_port: node 0's page has node 1's ranks too,
    fetched by node 0's launcher (the browser reaches node 0 only), and rank 3's failure, on node 1, turns its row."""
    from conftest import free_ports, listening

    port, monitor = free_ports(3), free_ports(1)
    procs = [start_launcher("--cluster_node_ips", "127.0.0.1,127.0.0.2", "--node_ip", ip, "--started_port", port,
                            "--nproc_per_node", 2, "--monitor_port", monitor, "--shutdown_timeout", 30,
                            "--log_dir", tmp_path / f"logs.{ip}", REPORTER, tmp_path, env={"REPORTER_SLOW_STOP": "1"})
             for ip in ("127.0.0.2", "127.0.0.1")]
    try:
        wait_for(lambda: listening("127.0.0.1", monitor), WAIT, "node 0's monitor")
        browser.get(f"http://127.0.0.1:{monitor}/")
        wait_for(lambda: set(rows(browser)) == {0, 1, 2, 3}, WAIT, "every rank of both nodes on node 0's page")
        nodes = browser.execute_script("return Array.from(document.querySelectorAll('#rows tr'))"
                                       ".map(tr => [Number(tr.dataset.rank), tr.cells[1].textContent])")
        assert dict(nodes) == {0: "0", 1: "0", 2: "1", 3: "1"}
        (tmp_path / "fail.3").touch()  # rank 3 exits 3
        wait_for(lambda: rows(browser)[3][0] == "failed", WAIT, "rank 3's row (node 1) turned to failed")
    finally:
        for proc in procs:
            power_off(proc)  # its workers too: they would stop 20 s after the launcher's SIGTERM
            proc.communicate()
