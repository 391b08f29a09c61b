"""The viewer on a 50-step run with 1,000 training episodes: time to first paint and memory.

    python bench/bench_viewer.py [--steps 50 --tasks 5 --group-size 4]

Writes a synthetic run folder (bench/synthetic_run.py), then:

* ``view``: starts ``agentgym-lightning view`` in its own process, opens the overview in headless
  Chromium (cold: the first request parses and draws everything; warm: again), then the last
  step's episodes and one episode; prints the browser's first-contentful-paint for each and the
  server's resident memory after them;
* ``report``: writes the report, prints its time and size, and its first paint in Chromium.

Needs chromium, chromium-driver (``make browser``) and selenium.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_run import write_run  # noqa: E402


def browser():  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def first_paint(driver, url: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(the browser's first-contentful-paint, its first byte) in seconds from the navigation's start."""
    driver.get(url)
    for _ in range(50):  # the paint entry may land just after the load event
        paint, first_byte = driver.execute_script(
            "var p=performance.getEntriesByType('paint').filter(function(e){return e.name==='first-contentful-paint'})[0];"
            "var n=performance.getEntriesByType('navigation')[0];return [p?p.startTime:null, n?n.responseStart:null]")
        if paint is not None:
            return paint / 1000, (first_byte or 0) / 1000
        time.sleep(0.1)
    return float("nan"), (first_byte or 0) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp) / "run", steps=args.steps, tasks=args.tasks, group_size=args.group_size)
        size = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
        print(f"run: {args.steps} steps, {args.steps * args.tasks * args.group_size} training episodes, {size / 1e6:.1f} MB on disk")
        server = subprocess.Popen([sys.executable, "-m", "agentgym_lightning", "view", str(run), "--port", "0"],
                                  stdout=subprocess.PIPE, text=True)
        driver = browser()
        try:
            line = server.stdout.readline()
            url = re.search(r"http://\S+", line).group(0)
            proc = psutil.Process(server.pid)
            print(f"view server at start: RSS {proc.memory_info().rss / 2**20:.0f} MiB")
            for name, path in (("overview (cold)", "/"), ("overview (warm)", "/"),
                               (f"episodes of step {args.steps}", f"/runs/0/train/{args.steps}"),
                               ("one episode", f"/runs/0/train/{args.steps}/s{args.steps}-t0-m0")):
                fcp, first_byte = first_paint(driver, url + path)
                print(f"view {name:<24} first paint {fcp:6.2f} s  (first byte {first_byte:.2f} s)  server RSS {proc.memory_info().rss / 2**20:.0f} MiB")
            for step in range(1, args.steps + 1):  # every step's episodes parsed once: the most it holds
                driver.get(f"{url}/runs/0/train/{step}")
            print(f"view after opening all {args.steps} steps: server RSS {proc.memory_info().rss / 2**20:.0f} MiB")
            out = Path(tmp) / "report.html"
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "agentgym_lightning", "report", str(run), "-o", str(out)], check=True, capture_output=True)
            print(f"report: written in {time.perf_counter() - start:.1f} s (a fresh process), {out.stat().st_size / 1024:.0f} KB")
            fcp, _ = first_paint(driver, out.as_uri())
            print(f"report first paint {fcp:.2f} s")
        finally:
            driver.quit()
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
