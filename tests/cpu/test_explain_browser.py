"""The HTML report of `pyfuser explain` in a real headless browser (Debian's Chromium, driven by
Playwright): it loads with no console error and no request beyond the file itself, shows every
fusion group of a traced BERT-like model (HF transformers, small random-weight config), and a
click on a kernel shows its figures and CUDA source. Skipped where Chromium (/usr/bin/chromium)
or the playwright package is missing (.ci/run installs both where it can)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

import model_corpus as M

CHROMIUM = os.environ.get("PYFUSER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# No background networking: the machine's closed network refuses Chromium's own connections.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")


@pytest.fixture(scope="module")
def bert_report(tmp_path_factory):
    case = next(c for c in M.CASES if c.name.startswith("bert"))
    if not M.available(case):
        pytest.skip(f"{case.needs} is not installed")
    import pyfuser
    model, inputs = case.build("cpu")
    traced = M.compile_case(case, model, inputs)
    with torch.no_grad():
        e = pyfuser.explain(traced, *inputs)
    path = tmp_path_factory.mktemp("report") / "bert.html"
    e.to_html(path)
    return e, path


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def _open(browser, path):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems, requests = [], []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_selector("#panel h2")
    return page, problems, requests


def test_bert_report_loads_cleanly_and_shows_every_group(bert_report, browser):
    e, path = bert_report
    assert len(e.groups) >= 10 and e.summary()["kernels"] >= 10
    page, problems, requests = _open(browser, path)
    try:
        assert requests == [path.as_uri()], requests
        page.click("#fit")
        canvas = page.locator("#canvas").bounding_box()
        for g in e.groups:
            box = page.locator(f'.group[data-group="{g.index}"] > .group-box')
            assert box.is_visible(), f"group {g.index}"
            bb = box.bounding_box()
            assert bb["width"] > 0 and bb["height"] > 0
            assert canvas["x"] - 1 <= bb["x"] and bb["x"] + bb["width"] <= canvas["x"] + canvas["width"] + 1
            assert canvas["y"] - 1 <= bb["y"] and bb["y"] + bb["height"] <= canvas["y"] + canvas["height"] + 1
        assert page.locator(".group").count() == len(e.groups)
        # the side panel lists every group and the ops outside them
        assert page.locator("#panel li").count() >= len(e.groups) + len(e.fallbacks)
        assert page.locator(".node.eager").count() >= 1          # linear, embedding, attention
        assert problems == [], problems
    finally:
        page.close()


def test_click_on_a_kernel_shows_its_figures_and_cuda(bert_report, browser):
    e, path = bert_report
    g = next(g for g in e.groups if g.kernels)
    s = next(s for s in g.segments if s.kernel is not None)
    page, problems, _ = _open(browser, path)
    try:
        page.click(f"#panel li:nth-child({g.index + 1}) button")      # centres the group
        seg = page.locator(f'.segment[data-group="{g.index}"][data-segment="{s.index}"] > .segment-box')
        seg.hover()
        tip = page.locator("#tooltip")
        assert tip.is_visible() and s.kernel.name in tip.inner_text()
        seg.click()
        panel = page.locator("#panel")
        text = panel.inner_text()
        assert s.kernel.name in text and "heuristic parameters" in text and "launch" in text
        cuda = page.locator("#panel pre.cuda").inner_text()
        assert "__global__" in cuda and s.kernel.name in cuda
        page.click("text=show the prelude too")
        assert len(page.locator("#panel pre.cuda").inner_text()) > len(cuda)
        page.fill("#search", "linear")
        assert page.locator(".node.match").count() >= 1
        assert problems == [], problems
    finally:
        page.close()


def test_cut_is_drawn_and_clickable(browser, tmp_path):
    import segment_cases as C
    from pyfuser.explainer import explain
    e = explain(C.two_reduction_domains(), torch.randn(16, 24))
    (cut,) = e.groups[0].cuts
    path = tmp_path / "cut.html"
    e.to_html(path)
    page, problems, _ = _open(browser, path)
    try:
        assert page.locator(".segment").count() == len(e.groups[0].segments)
        page.click("text.cut-label")
        text = page.locator("#panel").inner_text()
        assert f"cut {cut.tensor}" in text and "no scheduler takes them together" in text
        assert problems == [], problems
    finally:
        page.close()
