"""The architecture lives in the repository's docs/ and names every part that exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_links_resolve_and_point_to_the_architecture():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/ARCHITECTURE.md" in readme and "shared folder" not in readme
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_architecture_names_every_package():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    packages = [p.name for p in (ROOT / "src" / "omtr").iterdir() if (p / "__init__.py").is_file()]
    missing = [p for p in packages if f"src/omtr/{p}/" not in text]
    assert not missing, f"docs/ARCHITECTURE.md does not describe {missing}; add them to its Parts table"
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        assert (ROOT / "docs" / target).exists(), target


def test_readme_is_short_and_every_docs_page_is_in_the_site_nav():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300, "README.md is for a newcomer's ten minutes: move detail to docs/"
    assert "bash .ci/run" in readme and "mlflow run . -e main --env-manager local" in readme
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    missing = [p for p in pages if f" {p}\n" not in nav]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


def test_docs_pages_links_resolve():
    for page in (ROOT / "docs").glob("*.md"):
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_readme_results_link_committed_files():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    results = re.findall(r"\]\((docs/results/[^)]+)\)", readme)
    assert results, "the README's results table links the committed result files"
    for target in results:
        assert (ROOT / target).is_file(), target
