"""MkDocs hook (mkdocs.yml ``hooks:``): links from docs/*.md to files outside docs/, such as
``[examples/x.py](../examples/x.py)``, work where the Markdown is read in the repository but
point nowhere on the site. Each becomes its plain text there, after checking that the file
exists; a link to a missing file is left as it is, so ``mkdocs build --strict`` reports it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

OUTSIDE_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>\.\./[^)#\s]+)(?:#[^)]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The page's Markdown with each link to an existing file outside docs/ as plain text."""
    folder = Path(page.file.abs_src_path).parent
    docs = Path(config["docs_dir"]).resolve()

    def unlink(match: re.Match[str]) -> str:
        target = (folder / match["target"]).resolve()
        outside = docs not in target.parents
        return match["text"] if outside and target.is_file() else match[0]

    return OUTSIDE_LINK.sub(unlink, markdown)
