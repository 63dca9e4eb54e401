"""The course's website (``site/``, ``nox -s site``), built and read in a real browser.

The site is built with ``site/build.py`` into a temporary folder, served on loopback, and its
pages opened in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by
selenium, as ``tools/widgets_in_browser.py`` does). Checked:

- the home page and every chapter, appendix, worked solution and quiz page load with no console
  error, no failed request and no request to another host (MathJax, fonts, scripts come from the
  build);
- searching a word that occurs in the body of one chapter only finds that chapter alone;
- every internal link and anchor resolves, the chapters' exercises link to their solutions, and
  each "section N" of the prose became a link;
- each notebook page's Colab and Kaggle buttons open that notebook's file in the repository at
  the release that ``pyproject.toml`` names (``[project.urls] Repository``, tag ``"v" + version``);
- every figure a notebook stores is shown, loaded, and the math is typeset;
- the build fails on a notebook missing from the table of contents and on a stored error output.

Screenshots of the home page and chapter 04 go to ``$COURSE_SITE_SHOTS`` (default: a temporary
folder, printed). The site's packages (``pip install -e '.[site]'``) and Chromium are not needed
to run the course: where either is missing these tests skip, saying so, unless
``COURSE_REQUIRE_SITE=1`` (``.ci/run``'s site part), where they fail.
"""

from __future__ import annotations

import ast
import functools
import html.parser
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent

REQUIRE = "COURSE_REQUIRE_SITE"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SITE_MODULES = (
    "sphinx",
    "myst_nb",
    "sphinx_book_theme",
    "sphinx_design",
    "sphinx-mathjax-offline",
    "selenium",
)
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("chapter[0-9][0-9].ipynb"))
QUIZZES = sorted((ROOT / "quiz").glob("chapter[0-9][0-9].md"))


def page_of(source: Path) -> str:
    """``chapters/04_ddp.html`` for ``chapters/04_ddp.ipynb`` (and ``quiz/chapter04.md``)."""
    return f"{source.parent.name}/{source.stem}.html"


def notebook(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def markdown_prose(path: Path) -> str:
    """A notebook's markdown cells without code (fenced blocks, inline spans) or link targets."""
    text = "\n".join("".join(c["source"]) for c in notebook(path)["cells"] if c["cell_type"] == "markdown")
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


# --- what needs no build ----------------------------------------------------------------------


def quiz_page(questions: Path, chapter_link: str) -> str:
    """site/_ext/quiz_pages.py's ``quiz_page`` (standard library only), loaded from its file."""
    spec = importlib.util.spec_from_file_location("quiz_pages", ROOT / "site" / "_ext" / "quiz_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.quiz_page(questions, chapter_link)


def reference_pattern(path: Path) -> str:
    """The regular expression of ``REFERENCE = re.compile(...)`` in ``path``, read without importing it."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "REFERENCE":
            return ast.literal_eval(node.value.args[0])
    raise AssertionError(f"{path}: no REFERENCE = re.compile(...)")


SECTION_REFERENCE = reference_pattern(ROOT / "site" / "_ext" / "section_links.py")


def test_the_site_links_the_section_references_that_test_cross_references_checks():
    """site/_ext/section_links.py and tests/test_cross_references.py read one grammar."""
    site = SECTION_REFERENCE
    assert site == reference_pattern(ROOT / "tests" / "test_cross_references.py")
    found = re.search(site, "as appendix 04a, section 2 shows")
    assert (found["chapter"], found["first"]) == ("04a", "2")


@pytest.mark.parametrize("questions", QUIZZES, ids=lambda p: p.stem)
def test_a_quiz_page_has_every_question_with_its_answer_folded(questions):
    page = quiz_page(questions, "../chapters/x.ipynb")
    answers = questions.with_name(questions.stem + "-answers.md").read_text(encoding="utf-8")
    right = re.findall(r"^\*\*([A-D])\. (.*)\*\*$", answers, flags=re.M)
    assert page.count(":::{dropdown} Answer") == len(right) == 8
    folds = re.findall(r":::\{dropdown\} Answer\n\*\*([A-D])\. (.*)\*\*\n", page)
    assert folds == right  # each fold opens with its question's right option, in order


def test_the_readme_and_the_pages_workflow_build_the_site_with_one_command():
    """The README's command, the GitHub Pages workflow and this test all end in site/build.py."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- site-command.*?-->\n```bash\n(.*?)\n```", readme, flags=re.S)
    assert block and block[1].endswith("nox -s site"), "README: no site command after its marker"
    workflow = (ROOT / ".github" / "workflows" / "site.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+nox -s site$", workflow, flags=re.M) and "path: build/site" in workflow
    session = re.search(r"def site\(session.*?(?=\n@nox|\Z)", (ROOT / "noxfile.py").read_text(), flags=re.S)
    assert session and '"site/build.py"' in session[0]


# --- the built site, in a browser --------------------------------------------------------------


def site_missing() -> str | None:
    """Why the site cannot be built and browsed here, or None."""
    absent = [m for m in SITE_MODULES if importlib.util.find_spec(m) is None]
    absent += [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    return f"missing: {', '.join(absent)}" if absent else None


@pytest.fixture(scope="module")
def requirements():
    why = site_missing()
    if why and os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1, but the site cannot be built and browsed here ({why})")
    if why:
        pytest.skip(
            f"the website's test needs the site extra and Debian's Chromium ({why}): "
            "pip install -e '.[site]' && apt-get install chromium chromium-driver"
        )


def build(root: Path, out: Path) -> subprocess.CompletedProcess:
    """``root/site/build.py --out out``, with its output."""
    command = [sys.executable, str(root / "site" / "build.py"), "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def built(requirements, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("website") / "site"
    start = time.perf_counter()
    run = build(ROOT, out)
    took = time.perf_counter() - start
    assert run.returncode == 0, f"the site's build failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    print(f"site built in ⏱ {took:.0f} s")
    return out


class Handler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass


@pytest.fixture(scope="module")
def server(built):
    """The built site over HTTP on 127.0.0.1 (a free port), for this module's tests."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(built)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(requirements):
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


SETTLED = """
const done = arguments[arguments.length - 1];
const typeset = window.MathJax && MathJax.startup && MathJax.startup.promise;
Promise.resolve(typeset).then(() => document.fonts.ready).then(() => done(true), () => done(false));
"""
PAGE_FACTS = """
const images = [...document.querySelectorAll('.cell_output img')];
const launch = [...document.querySelectorAll('.dropdown-launch-buttons a')].map(a => a.href);
return {
  images: images.map(i => [i.complete, i.naturalWidth]),
  math: document.querySelectorAll('mjx-container').length,
  markerNotes: document.querySelectorAll('.admonition.course-markers').length,
  markers: document.querySelectorAll('abbr.course-marker[title]').length,
  launch: launch,
};
"""


def visit(driver, url: str) -> dict:
    """Open ``url``, wait for math and fonts, and return what went wrong and what the page holds."""
    driver.get(url)
    driver.execute_async_script(SETTLED)
    facts = driver.execute_script(PAGE_FACTS)
    origin = url.split("/", 3)[:3]
    facts["console"] = [
        e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")
    ]
    facts["outside"], facts["failed"] = [], []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            requested = params["request"]["url"]
            if requested.split("/", 3)[:3] != origin and not requested.startswith(("data:", "blob:")):
                facts["outside"].append(requested)
        elif message["method"] == "Network.loadingFailed":
            facts["failed"].append(f"{params.get('errorText')} ({params.get('type')})")
        elif message["method"] == "Network.responseReceived" and params["response"]["status"] >= 400:
            facts["failed"].append(f"{params['response']['status']} {params['response']['url']}")
    return facts


@pytest.fixture(scope="module")
def pages(built, server, browser, tmp_path_factory) -> dict[str, dict]:
    """Every page a learner reads, visited once: ``{page: visit(...)}``; screenshots saved."""
    shots = Path(os.environ.get("COURSE_SITE_SHOTS") or tmp_path_factory.mktemp("site-shots"))
    shots.mkdir(parents=True, exist_ok=True)
    names = ["index.html", "reading-outputs.html", "search.html"]
    names += [page_of(p) for p in [*CHAPTERS, *SOLUTIONS, *QUIZZES]]
    missing = [n for n in names if not (built / n).is_file()]
    assert not missing, f"pages not built: {missing}"
    visited = {}
    for name in names:
        visited[name] = visit(browser, server + name)
        if name == "index.html":
            browser.save_screenshot(str(shots / "home.png"))
        if re.match(r"chapters/04_", name):
            browser.save_screenshot(str(shots / "chapter04.png"))
            figure = browser.find_elements("css selector", ".cell_output img")
            if figure:
                browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", figure[0])
                browser.save_screenshot(str(shots / "chapter04-figure.png"))
    print(f"screenshots: {shots}")
    return visited


@pytest.mark.launches
def test_every_page_loads_with_no_console_error_and_no_failed_or_outside_request(pages):
    problems = {
        name: {k: facts[k] for k in ("console", "failed", "outside") if facts[k]}
        for name, facts in pages.items()
        if facts["console"] or facts["failed"] or facts["outside"]
    }
    assert not problems, json.dumps(problems, indent=1)[:4000]
    assert {page_of(p) for p in CHAPTERS} <= set(pages)  # every chapter and appendix, 07a included


@pytest.mark.launches
def test_every_stored_figure_is_shown_and_the_math_is_typeset(pages):
    wrong = {}
    for source in [*CHAPTERS, *SOLUTIONS]:
        stored = sum(
            "image/png" in output.get("data", {})
            for cell in notebook(source)["cells"]
            for output in cell.get("outputs", [])
        )
        shown = pages[page_of(source)]["images"]
        if len(shown) != stored or not all(complete and width > 0 for complete, width in shown):
            wrong[source.name] = f"{stored} stored, shown (loaded, width): {shown}"
        formulas = len(re.findall(r"\$\$.+?\$\$", markdown_prose(source), flags=re.S))
        if pages[page_of(source)]["math"] < formulas:
            wrong[source.name] = f"{formulas} formulas, {pages[page_of(source)]['math']} typeset"
    assert not wrong, wrong
    assert pages["chapters/06_pipeline_parallel.html"]["math"] >= 1  # the bubble fraction's formula


@pytest.mark.launches
def test_the_markers_are_explained_where_they_appear(pages):
    """A page whose outputs hold ⏱ or ⚙ has one note on them, and a tooltip on every marker."""
    wrong = {}
    for source in [*CHAPTERS, *SOLUTIONS]:
        printed = "".join(
            "".join(output.get("text", ""))
            for cell in notebook(source)["cells"]
            for output in cell.get("outputs", [])
            if output.get("output_type") == "stream"
        )
        marks = printed.count("⏱") + printed.count("⚙")
        facts = pages[page_of(source)]
        if facts["markerNotes"] != (1 if marks else 0) or facts["markers"] < marks:
            wrong[source.name] = (
                f"{marks} markers printed; notes {facts['markerNotes']}, tooltips {facts['markers']}"
            )
    assert not wrong, wrong


def expected_launch(source: Path) -> set[str]:
    """The Colab and Kaggle addresses of ``source`` at the release pyproject.toml names."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    repository = project["urls"]["Repository"].rstrip("/")
    org_repo = repository.removeprefix("https://github.com/")
    path = f"{source.parent.name}/{source.name}"
    return {
        f"https://colab.research.google.com/github/{org_repo}/blob/v{project['version']}/{path}",
        f"https://www.kaggle.com/kernels/welcome?src={repository}/blob/v{project['version']}/{path}",
    }


@pytest.mark.launches
def test_each_launch_button_opens_its_notebook_at_the_configured_release(pages):
    wrong = {}
    for source in [*CHAPTERS, *SOLUTIONS]:
        found = set(pages[page_of(source)]["launch"])
        if found != expected_launch(source):
            wrong[source.name] = sorted(found)
    assert not wrong, f"expected each notebook's own Colab and Kaggle address, found: {wrong}"
    assert not pages["index.html"]["launch"] and not pages[page_of(QUIZZES[0])]["launch"]


def word_of_one_chapter(built: Path) -> tuple[str, str]:
    """A word of a chapter's prose that no other page holds, not even as the start of a word."""
    text = {
        str(p.relative_to(built)): re.sub(r"<[^>]+>", " ", p.read_text(encoding="utf-8")).lower()
        for p in built.rglob("*.html")
        if not p.name.startswith(("genindex", "search"))
    }
    for source in [p for p in CHAPTERS if re.match(r"\d\d_", p.name)]:
        words = sorted(set(re.findall(r"\b[a-z]{9,}\b", markdown_prose(source))), key=lambda w: (-len(w), w))
        for word in words:
            stem = word[: max(6, len(word) - 4)]
            if not any(stem in body for name, body in text.items() if name != page_of(source)):
                return word, page_of(source)
    raise AssertionError("no chapter has a word of its own")


@pytest.mark.launches
def test_search_finds_a_word_of_one_chapter_on_that_chapter_alone(built, server, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    word, chapter = word_of_one_chapter(built)
    browser.get(f"{server}search.html?q={word}")
    summary = WebDriverWait(browser, 60).until(
        lambda d: d.execute_script(
            "const s = document.querySelector('.search-summary'); return s && s.textContent"
        )
    )
    found = browser.execute_script(
        "return [...document.querySelectorAll('#search-results ul.search li a')].map(a => a.href)"
    )
    pages = {urllib.parse.urlsplit(url).path.removeprefix("/") for url in found}
    assert pages == {chapter}, f"searched {word!r}: {summary!r}, found {sorted(pages)}"
    print(f"searched {word!r}: {summary}")


class Links(html.parser.HTMLParser):
    """The ids of a page and the addresses its links, images, styles and scripts name."""

    def __init__(self):
        super().__init__()
        self.ids, self.targets, self.classes = set(), [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key) and tag in ("a", "link", "script", "img"):
                self.targets.append((attrs[key], attrs.get("class") or ""))


@pytest.mark.launches
def test_every_internal_link_resolves_and_the_cross_links_are_made(built, server):
    parsed = {}
    for path in built.rglob("*.html"):
        if path.relative_to(built).parts[0] in ("_static", "_sources"):
            continue  # the theme's template files, not pages
        parsed[path.relative_to(built).as_posix()] = parser = Links()
        parser.feed(path.read_text(encoding="utf-8"))
    broken, fetched = [], {}
    for name, page in parsed.items():
        for target, _ in page.targets:
            parts = urllib.parse.urlsplit(urllib.parse.urljoin(f"/{name}", target))
            if parts.scheme or parts.netloc or target.startswith(("mailto:", "javascript:")):
                continue  # another host: not reachable here
            path = urllib.parse.unquote(parts.path).removeprefix("/") or "index.html"
            if path not in fetched:
                try:
                    with urllib.request.urlopen(server + urllib.parse.quote(path), timeout=30) as response:
                        response.read()
                        fetched[path] = response.status
                except urllib.error.HTTPError as error:
                    fetched[path] = error.code
            if fetched[path] != 200:
                broken.append(f"{name}: {target} ({fetched[path]})")
            elif parts.fragment and path in parsed and parts.fragment not in parsed[path].ids:
                broken.append(f"{name}: {target} (no id {parts.fragment!r})")
    assert not broken, "\n".join(broken[:50])

    home = [t for t, _ in parsed["index.html"].targets if t.startswith("chapters/")]
    assert list(dict.fromkeys(home)) == [page_of(p) for p in CHAPTERS]  # course order: 00, 00a, 01 ...

    for source in CHAPTERS:
        page = parsed[page_of(source)]
        prose = markdown_prose(source)
        exercises = re.findall(
            r"\.\./solutions/(chapter\d\d)\.ipynb#Exercise-(\d+)",
            "".join("".join(c["source"]) for c in notebook(source)["cells"] if c["cell_type"] == "markdown"),
        )
        linked = [t for t, _ in page.targets if re.match(r"\.\./solutions/chapter\d\d\.html#.+", t)]
        assert len(linked) >= len(exercises), f"{source.name}: {exercises} -> {linked}"
        quiz = ROOT / "quiz" / f"chapter{source.name[:2]}.md"
        if re.match(r"\d\d_", source.name) and quiz.exists():
            assert f"../quiz/{quiz.stem}.html" in [t for t, _ in page.targets], (
                f"{source.name}: no link to its quiz"
            )
        references = len(re.findall(SECTION_REFERENCE, prose))
        sections = [t for t, cls in page.targets if "section-link" in cls]
        assert len(sections) == references, f"{source.name}: {references} references, {len(sections)} links"


@pytest.mark.launches
def test_the_build_fails_on_a_notebook_left_out_of_the_contents_or_a_stored_error(requirements, tmp_path):
    copy = tmp_path / "repo"
    for name in ("site", "chapters", "solutions", "quiz"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb*"))
    for name in ("README.md", "pyproject.toml", "course_utils/notebook/quiz_parse.py"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    clean = build(copy, tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr[-3000:]

    shutil.copy2(copy / "chapters" / CHAPTERS[0].name, copy / "chapters" / "99_left_out.ipynb")
    faulty = notebook(copy / "solutions" / SOLUTIONS[0].name)
    cell = next(c for c in faulty["cells"] if c["cell_type"] == "code")
    cell["outputs"].append(
        {"output_type": "error", "ename": "ValueError", "evalue": "planted", "traceback": []}
    )
    (copy / "solutions" / SOLUTIONS[0].name).write_text(json.dumps(faulty), encoding="utf-8")
    failed = build(copy, tmp_path / "failed")
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0
    assert re.search(r"99_left_out\.ipynb.*document isn't included in any toctree", said), said[-3000:]
    assert re.search(
        rf"{SOLUTIONS[0].name}.*stored output is an error \(cell \d+: ValueError: planted\)", said
    )
