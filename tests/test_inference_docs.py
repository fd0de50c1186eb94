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
