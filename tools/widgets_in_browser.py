"""Open an explorer in JupyterLab in a headless Chromium, move a slider, screenshot before and after.

    python tools/widgets_in_browser.py --out /tmp/shots            # the pipeline explorer (chapter 06)
    python tools/widgets_in_browser.py --explorer allreduce --out /tmp/shots

Needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install chromium chromium-driver``)
and ``selenium`` in the Python that runs this script (a separate venv is fine); JupyterLab and the
course run from ``--python`` (default: this repository's ``.venv``). It writes a two-cell notebook
that calls ``explore(...)``, starts JupyterLab on it, runs all cells, waits for the sliders, takes
``before.png``, presses the right-arrow key on the first slider ``--steps`` times, waits for the
figure to be redrawn, takes ``after.png``, and prints what changed (the slider's label and the
figure's image size in bytes, which differ when the figure was redrawn).

Not taught in a chapter: maintainers' check that the explorers render and update in a browser.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPLORERS = {
    "pipeline": "from course_utils.explorers.pipeline import draw_pipeline as draw, CONTROLS",
    "allreduce": "from course_utils.explorers.allreduce import draw_allreduce as draw, CONTROLS",
    "sharding": "from course_utils.explorers.sharding import draw_sharding as draw, CONTROLS",
}


def notebook(explorer: str) -> dict:
    code = [
        "%matplotlib inline\nfrom course_utils.explorers import explore\n" + EXPLORERS[explorer],
        "explore(draw, CONTROLS)",
    ]
    cells = [
        {
            "cell_type": "code",
            "id": f"c{i}",
            "metadata": {},
            "execution_count": None,
            "outputs": [],
            "source": c,
        }
        for i, c in enumerate(code)
    ]
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return {"cells": cells, "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--explorer", choices=sorted(EXPLORERS), default="pipeline")
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp()))
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--steps", type=int, default=4, help="right-arrow presses on the first slider")
    args = parser.parse_args()

    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    (work / "explorer.ipynb").write_text(json.dumps(notebook(args.explorer)))
    port, token = free_port(), "explorer-check"
    command = [args.python, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--allow-root"]
    command += [f"--ServerApp.root_dir={work}", f"--IdentityProvider.token={token}"]
    command += ["--ServerApp.disable_check_xsrf=True", "--LabApp.expose_app_in_browser=True"]
    lab = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # JupyterLab takes a while to start on a busy machine
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(1)
        time.sleep(2)
        service = webdriver.ChromeService(executable_path="/usr/bin/chromedriver")
        driver = webdriver.Chrome(options=options, service=service)
        driver.get(f"http://127.0.0.1:{port}/lab/tree/explorer.ipynb?token={token}")
        wait = WebDriverWait(driver, 120)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell"))
        wait.until(lambda d: d.execute_script(  # the kernel is up
            "const w = window.jupyterapp.shell.currentWidget;"
            "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
            " && w.sessionContext.session.kernel.connectionStatus === 'connected');"))  # fmt: skip
        time.sleep(2)
        driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        sliders = wait.until(
            lambda d: d.find_elements(By.CSS_SELECTOR, ".widget-slider, .jupyter-widget-slider")
        )
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")) >= 1)
        time.sleep(2)
        images = driver.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
        before_images = [img.get_attribute("src") for img in images]
        readout = driver.find_elements(By.CSS_SELECTOR, ".widget-readout")
        before_value = readout[0].text if readout else "?"
        driver.save_screenshot(str(args.out / "before.png"))
        handle = sliders[0].find_element(By.CSS_SELECTOR, ".noUi-handle, .ui-slider-handle")
        handle.click()
        for _ in range(args.steps):
            handle.send_keys(Keys.ARROW_RIGHT)
            time.sleep(0.2)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")) > len(images))
        time.sleep(3)
        after_images = [
            img.get_attribute("src")
            for img in driver.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
        ]
        after_value = readout[0].text if readout else "?"
        driver.save_screenshot(str(args.out / "after.png"))
        print(f"first slider: {before_value} -> {after_value}")
        sizes = [len(s) for s in before_images], [len(s) for s in after_images]
        print(
            f"figures: {len(before_images)} before, {len(after_images)} after; sizes {sizes[0]} -> {sizes[1]}"
        )
        print(f"screenshots: {args.out / 'before.png'}, {args.out / 'after.png'}")
        return 0 if after_value != before_value and len(after_images) > len(before_images) else 1
    except Exception:
        if driver is not None:
            driver.save_screenshot(str(args.out / "failure.png"))
            print(f"failed; the page as it was: {args.out / 'failure.png'}", file=sys.stderr)
        raise
    finally:
        if driver is not None:
            driver.quit()
        lab.terminate()
        lab.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
