"""A plain (non-editable) install ships what serving and training need: the model, the recipes, and
no path that only works from the checkout. Builds a wheel, installs it into a fresh venv that borrows
the heavy dependencies (torch, TVM) from this one without pip resolving anything, and serves the
README's curl request from an empty working folder."""

import json
import os
import socket
import subprocess
import sys
import sysconfig
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "cdmpp").rglob("__init__.py")}
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"


@dataclass
class Installed:
    venv: Path
    site: Path  # the venv's site-packages, where the wheel's cdmpp lies
    cwd: Path  # an empty working folder
    env: dict


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """The wheel built from this checkout and installed alone into a fresh venv (one build for the tests below)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheels, venv, cwd = tmp / "wheels", tmp / "venv", tmp / "empty"
    cwd.mkdir()
    # nothing of the caller's Python path: a checkout on PYTHONPATH would satisfy pip without installing
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDMPP_") and k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels)], check=True, cwd=cwd, timeout=300, env=env)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # --no-deps: pip installs the wheel alone (never resolves torch or TVM)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
                    *map(str, wheels.glob("cdmpp-*.whl"))], check=True, cwd=cwd, timeout=300, env=env)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # the dependencies come from this environment's site-packages, appended after the venv's own (a
    # path line in a .pth does not run that folder's .pth files, so this checkout's editable cdmpp stays out)
    (site / "zz-borrowed-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return Installed(venv, site, cwd, env)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="venv layout and /proc checks are Linux's")
def test_wheel_in_fresh_venv_serves_the_readme_request(installed):
    import httpx

    venv, site, cwd, env = installed.venv, installed.site, installed.cwd, installed.env
    py = venv / "bin" / "python"
    where = subprocess.run([str(py), "-c", "import cdmpp, cdmpp.model.training as t; print(cdmpp.__file__); "
                            "print(t.TrainConfig.recipe('default').epochs)"],
                           check=True, capture_output=True, text=True, cwd=cwd, env=env).stdout.split()
    assert where[0].startswith(str(site)) and int(where[1]) > 0

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(venv / "bin" / "cdmpp"), "serve", "--port", str(port), "--featurize-procs", "1",
                               "--no-access-log"], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "installed server did not become healthy"
            try:
                if httpx.get(url + "/healthz", timeout=2).json().get("status") == "ok":
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        body = (ROOT / "serve" / "example-request.json").read_bytes()  # the README's curl -d @...
        r = httpx.post(url + "/v1/predict", content=body, headers={"Content-Type": "application/json"}, timeout=60)
        assert r.status_code == 200, r.text
        (p,) = r.json()["predictions"]
        assert 0 < p["lo90"] <= p["seconds"] <= p["hi90"]
        models = httpx.get(url + "/v1/models").json()["models"][0]
        assert models["shipped"] is True and "path" not in models  # the wheel's model; its path is not shown
        assert json.loads(body)["device"] in models["devices"]
    finally:
        server.terminate()
        server.wait(30)
    assert not list(cwd.iterdir()), "the server wrote into its working folder"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="venv layout is Linux's")
def test_an_installed_wheel_answers_from_an_empty_folder(installed):
    """The front-door commands of the installed wheel, run from an empty folder: the shipped tables resolve
    beside the package (tests/cli/test_any_folder.py checks the same in the checkout)."""
    venv, site, cwd, env = installed.venv, installed.site, installed.cwd, installed.env

    def cdmpp(*args, rc=0):
        r = subprocess.run([str(venv / "bin" / "cdmpp"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == rc, r.stderr[-3000:]
        return r

    assert cdmpp("--version").stdout.startswith("cdmpp ")
    table = str(site / "cdmpp" / "datasets" / "devices.json")
    listing = cdmpp("devices").stdout
    assert table in listing and "amd-epyc-znver4-2t/llvm-avx512" in listing
    out = cdmpp("network", "bert_tiny@1", "--schedules", "default").stdout
    assert "schedules: 0 measured, 0 tuned, 23 default" in out
    refused = cdmpp("network", "bert_tiny@1", rc=2).stderr  # no dataset ships: every task would be default
    assert "have no measured program" in refused and "--allow-default" in refused
    sample = str(site / "cdmpp" / "samples" / "conv2d.tvmscript")
    rows = json.loads(cdmpp("predict", sample, "--trusted", "--json").stdout)["predictions"]
    assert rows and all(r["seconds"] > 0 for r in rows)
    assert not list(cwd.iterdir()), "a command wrote into the working folder"
