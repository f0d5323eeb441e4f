"""The user documentation: README.md (the first run) and the docs/ pages it links to, which hold
the reference text that used to be in the README (tests that check our vocabulary read them all)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The pages the README's reference sections moved to, README first.
USER_DOCS = (
    README,
    DOCS / "install.md",
    DOCS / "policies.md",
    DOCS / "what-you-see.md",
    DOCS / "metrics.md",
    DOCS / "troubleshooting.md",
    DOCS / "safety.md",
    DOCS / "cli.md",
    DOCS / "developing.md",
)
#: Where `make docs` writes the generated sections.
POLICY_REFERENCE = DOCS / "policies.md"
SETTINGS_REFERENCE = DOCS / "cli.md"


def user_docs_text() -> str:
    """Every user page's text, one after the other."""
    return "\n\n".join(page.read_text() for page in USER_DOCS)
