"""The README and the guide's front page: what a new user finds first. The README stays short (at most ~150
lines) and keeps the two fresh-machine commands as they are (CI's .ci/run runs the second); the front page
links in one click to the pages people look for first, and those pages are about what their link says."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

COMMANDS = [
    "bash scripts/setup.sh && .venv/bin/trainrun -np 2 examples/train_torch.py      # set up, then a 2-rank data-parallel training",
    "bash scripts/test.sh                                                          # set up (apt + pip) and run the whole test suite",
]
# the page each must-find topic lives on, and a text the page must hold for the link to be honest
ONE_CLICK = {
    "multi-host launch": ("guides/multi-host.md", "-H node1:4,node2:4"),
    "Horovod job unchanged": ("guides/horovod.md", "import horovod.torch as hvd"),
    "Slurm": ("guides/slurm.md", "salloc -N3"),
    "elastic": ("guides/elastic.md", "--min-np"),
    "stragglers": ("guides/stragglers.md", "trainrun: straggler:"),
    "--check": ("guides/check.md", "--check"),
    "exit codes": ("reference/exit-codes.md", "| 124 |"),
}


def links(markdown: str) -> list[str]:
    return [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", markdown) if not t.startswith(("http", "#"))]


def test_front_page_links_to_each_topic_in_one_click():
    front = links((DOCS / "index.md").read_text())
    for topic, (page, text) in ONE_CLICK.items():
        assert page in front, f"docs/index.md does not link to {page} ({topic})"
        assert text in (DOCS / page).read_text(), f"{page} ({topic}) does not show {text!r}"


def test_readme_is_short_and_keeps_the_two_commands():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    first = readme[readme.index("```bash\n") + 8:]
    assert first[:first.index("```")].splitlines() == COMMANDS
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci, "CI must run the README's test command"


def test_readme_links_into_the_guide_and_every_link_resolves():
    readme = (REPO / "README.md").read_text()
    targets = links(readme)
    for page, _ in ONE_CLICK.values():
        assert f"docs/{page}" in targets, f"README does not link to docs/{page}"
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_every_page_of_the_guide_is_in_the_navigation():
    """mkdocs.yml's nav lists every page (a page left out still builds, so the strict build would not say so); the
    benchmark pages are listed by benchmarks/index.md instead, so that a new one needs no edit of mkdocs.yml."""
    nav = (REPO / "mkdocs.yml").read_text()
    pages = [str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if p.parent.name != "benchmarks"]
    assert "benchmarks/index.md" in nav
    assert [p for p in pages if f": {p}\n" not in nav] == []
