"""The README's commands: scripts/start.sh opens JupyterLab on 127.0.0.1 and stops cleanly."""

import os
import re
import signal
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_start_sh_serves_the_first_notebook_on_localhost():
    proc = subprocess.Popen(["bash", "scripts/start.sh"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PORT": "8950"})
    try:
        url, deadline = None, time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            found = re.search(r"http://127\.0\.0\.1:\d+/lab/tree/00_start_here\.ipynb\?token=\w+",
                              line)
            url = found.group(0) if found else None
        assert url, "start.sh printed no address"
        body = None
        while body is None and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                time.sleep(0.5)
        assert body is not None and "JupyterLab" in body
        api = url.split("/lab/")[0] + "/api/contents/00_start_here.ipynb?content=0&token="
        meta = urllib.request.urlopen(api + url.rsplit("token=", 1)[1], timeout=5).read()
        assert b'"type": "notebook"' in meta or b'"type":"notebook"' in meta
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_start_sh_refuses_unknown_options():
    out = subprocess.run(["bash", "scripts/start.sh", "--studnet"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "unknown option --studnet" in out.stderr
